"""PyTorch features an exercise may not delegate to, and how each is recognised.

A hidden test names the features its exercise reimplements (``HiddenTest.forbidden``).
A submission that uses one of them from its exercise earns no points for that test, and
the feedback says why. Two independent checks, so that hiding a call from one does not
hide it from the other:

- in the grader, which never runs the student's code: the identifiers and strings in the
  exercise's definition and in every function, class or name of the student's code it
  refers to, directly or through others (``names``);
- in the sandbox, while the student's code runs on the hidden inputs: the PyTorch
  functions and ATen operators called (``ops``, substrings of their names) and the PyTorch
  layers held by a module exercise (``modules``).
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.util
import re
import symtable
import sys
import threading
from collections.abc import Iterator
from typing import NamedTuple


class Feature(NamedTuple):
    description: str  # how the feedback names it
    names: tuple[str, ...]  # identifiers or strings, looked for in the student's code
    ops: tuple[str, ...]  # substrings of PyTorch function and ATen operator names
    modules: tuple[str, ...] = ()  # torch.nn classes a module exercise may not hold


FEATURES: dict[str, Feature] = {
    # Every route into a library attention, however reached: any PyTorch function or
    # ATen operator with "attention" in its name (the fused, flash, memory-efficient,
    # cuDNN, flex and multi-head ones, in this PyTorch and the next), and the fused
    # transformer layer that calls one inside.
    "sdpa": Feature(
        "PyTorch's own attention (F.scaled_dot_product_attention, "
        "F.multi_head_attention_forward, nn.MultiheadAttention, flash or flex attention)",
        names=(
            "multi_head_attention_forward",
            "_native_multi_head_attention",
            "MultiheadAttention",
            "scaled_dot_product_attention",
            "_scaled_dot_product_attention_math",
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention",
            "_fused_sdp_choice",
            "sdpa_kernel",
            "sdp_kernel",
            "flex_attention",
        ),
        ops=(
            "attention",
            "scaled_dot_product",
            "_fused_sdp_choice",
            "_transformer_encoder_layer_fwd",
            "_transformer_decoder_only_layer_fwd",
        ),
        modules=(
            "MultiheadAttention",
            "TransformerEncoderLayer",
            "TransformerDecoderLayer",
            "TransformerEncoder",
            "TransformerDecoder",
            "Transformer",
        ),
    ),
    "mha": Feature(
        "PyTorch's nn.MultiheadAttention",
        names=(
            "MultiheadAttention",
            "multi_head_attention_forward",
            "_native_multi_head_attention",
        ),
        ops=("multi_head_attention_forward", "_native_multi_head_attention"),
        modules=("MultiheadAttention",),
    ),
    "transformer_layer": Feature(
        "PyTorch's nn.Transformer layers",
        names=(
            "TransformerEncoderLayer",
            "TransformerDecoderLayer",
            "TransformerEncoder",
            "TransformerDecoder",
            "_transformer_encoder_layer_fwd",
        ),
        ops=("_transformer_encoder_layer_fwd", "_transformer_decoder_only_layer_fwd"),
        modules=(
            "TransformerEncoderLayer",
            "TransformerDecoderLayer",
            "TransformerEncoder",
            "TransformerDecoder",
            "Transformer",
        ),
    ),
    "cross_entropy": Feature(
        "PyTorch's cross-entropy loss (F.cross_entropy, nn.CrossEntropyLoss)",
        names=("cross_entropy", "CrossEntropyLoss", "cross_entropy_loss"),
        ops=("cross_entropy",),
        modules=("CrossEntropyLoss",),
    ),
    "softmax": Feature(
        "PyTorch's softmax (torch.softmax, F.softmax, Tensor.softmax, nn.Softmax)",
        names=("softmax", "log_softmax", "Softmax", "LogSoftmax", "_softmax"),
        ops=("softmax",),
        modules=("Softmax", "LogSoftmax"),
    ),
}


def watched_anywhere() -> list[str]:
    """Every name any feature is recognised by at run time: what the sealed child
    records outside the tests' calls."""
    return sorted({op for f in FEATURES.values() for op in f.ops})


def watch_plan(forbidden: tuple[str, ...]) -> dict:
    """What the probe watches for while the student's code runs."""
    return {
        "watch": sorted({op for f in forbidden for op in FEATURES[f].ops}),
        "watch_modules": sorted({m for f in forbidden for m in FEATURES[f].modules}),
    }


def features_in(used: list[str], forbidden: tuple[str, ...]) -> list[str]:
    """The forbidden features that the names the probe recorded belong to."""
    found = []
    for key in forbidden:
        feature = FEATURES[key]
        if any(
            any(op in name for op in feature.ops)
            or name.removeprefix("torch.nn.") in feature.modules
            for name in used
        ):
            found.append(key)
    return found


# What the probe records when the watch was switched off (``probe.TAMPERED``).
TAMPERED = "<watch disabled>"


def tampering_in(used: list[str]) -> list[str]:
    """What the probe saw of the student's code switching its watch off."""
    return sorted(
        {u.removeprefix(TAMPERED + ": ") for u in used if u.startswith(TAMPERED)}
    )


def tamper_message(exercise: str, found: list[str]) -> str:
    return (
        f"`{exercise}`'s code switches off or works around the grader's watch on PyTorch "
        f"calls ({'; '.join(found[:3])}{'; ...' if len(found) > 3 else ''}). This test earns no points; if you believe this is "
        "wrong, ask your instructor to review it."
    )


def message(exercise: str, features: list[str], where: str) -> str:
    described = " and ".join(FEATURES[f].description for f in features)
    return (
        f"`{exercise}` uses {described} ({where}). This exercise asks you to write it "
        "yourself, so this test earns no points; compare with PyTorch in a scratch cell "
        "instead, outside your answer."
    )


# The student's code, read without running it.

# CPython 3.11's ast.parse is not thread-safe ("SystemError: AST constructor recursion
# depth mismatch" when two threads parse at once): the workers of a batch take turns to
# read code.
READING_CODE = threading.Lock()


def _top_level_bindings(trees: list[ast.Module]) -> dict[str, list[ast.AST]]:
    """Every top-level function, class, assignment and import, by the name it binds."""
    bound: dict[str, list[ast.AST]] = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bound.setdefault(node.name, []).append(node)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = (
                    node.targets if isinstance(node, ast.Assign) else [node.target]
                )
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            bound.setdefault(name.id, []).append(node)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    name = alias.asname or alias.name.split(".")[0]
                    bound.setdefault(name, []).append(node)
    return bound


def _not_calls(node: ast.AST) -> set[int]:
    """Subtrees that name a class without using it: type annotations, and the class
    argument of isinstance/issubclass (``def load(self, mha: nn.MultiheadAttention)``)."""
    skip = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.arg) and sub.annotation is not None:
            skip.add(id(sub.annotation))
        elif isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef) and sub.returns:
            skip.add(id(sub.returns))
        elif isinstance(sub, ast.AnnAssign):
            skip.add(id(sub.annotation))
        elif (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Name)
            and sub.func.id in ("isinstance", "issubclass")
            and len(sub.args) == 2
        ):
            skip.add(id(sub.args[1]))
    return skip


def _walk(node: ast.AST, skip) -> Iterator[ast.AST]:
    """Every node under ``node`` (itself included) but the subtrees for which
    ``skip(subnode)`` holds."""
    todo = [node]
    while todo:
        sub = todo.pop()
        if skip(sub):
            continue
        todo.extend(ast.iter_child_nodes(sub))
        yield sub


def _words(node: ast.AST) -> tuple[set[str], set[str]]:
    """Under ``node``: bare names (which may be the student's own, to follow), and words
    that always refer to something else: attribute names, imported names, strings."""
    names, words = set(), set()
    skip = _not_calls(node)
    for sub in _walk(node, lambda n: id(n) in skip):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            words.add(sub.attr)
        elif isinstance(sub, ast.alias):
            words.update(sub.name.split("."))
        elif isinstance(sub, ast.ImportFrom) and sub.module:
            words.update(sub.module.split("."))
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            words.add(sub.value.strip())
    return names, words


def static_uses(
    sources: list[str], exercise: str, forbidden: tuple[str, ...]
) -> list[str]:
    """The forbidden features that the definition of ``exercise`` reaches in ``sources``
    (the student's code cells), following the names it uses to their definitions."""
    trees = [t for t in map(_parse, sources) if t is not None]
    bound = _top_level_bindings(trees)
    found = set()
    for _, (names, words) in _reached(bound, [exercise]):
        # a name bound by the student's code is followed to its definition (the chapter 3
        # exercise *is* called scaled_dot_product_attention); any other bare name (a star
        # import, a builtin) is taken at its word
        found |= words | {n for n in names if n not in bound}
    return [f for f in forbidden if found & set(FEATURES[f].names)]


def _reached(
    bound: dict[str, list[ast.AST]], names
) -> Iterator[tuple[ast.AST, tuple[set[str], set[str]]]]:
    """Each top-level definition bound to one of ``names``, and, in turn, those bound to
    the names they use (each once), with its ``_words``."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in bound.get(name, []):
            words = _words(node)
            yield node, words
            todo.extend(n for n in words[0] if n in bound)


# Code that switches the run-time watch off or hides what it calls from it. Words are
# attribute names, imported names and modules; bare names are builtins called by name.
_WATCH_WORDS = {
    "_C": "reaches into `torch._C`",
    "library": "uses `torch.library`",
    "_ops": "reaches into `torch._ops`",
    "_python_dispatch": "manipulates PyTorch's dispatch modes",
    "overrides": "manipulates PyTorch's function modes (`torch.overrides`)",
    **{
        word: f"manipulates PyTorch's function or dispatch modes (`{word}`)"
        for word in (
            "DisableTorchFunction",
            "DisableTorchFunctionSubclass",
            "_DisableTorchDispatch",
            "_disable_current_modes",
            "_push_mode",
            "_pop_mode",
            "_pop_mode_temporarily",
            "_pop_torch_function_stack",
            "_push_on_torch_function_stack",
            "_len_torch_function_stack",
            "_get_function_stack_at",
            "_set_torch_function_mode",
            "_get_current_function_mode_stack",
            "_get_current_dispatch_mode",
            "_get_current_dispatch_mode_stack",
            "_set_dispatch_mode",
            "_unset_dispatch_mode",
            "_disable_infra_mode",
            "TorchFunctionMode",
            "BaseTorchFunctionMode",
            "TorchDispatchMode",
        )
    },
    **{
        word: f"controls PyTorch's profiler (`{word}`)"
        for word in (
            "profiler",
            "_disable_profiler",
            "_enable_profiler",
            "_disable_profiler_legacy",
            "_enable_profiler_legacy",
            "_prepare_profiler",
            "record_function",
        )
    },
}
_CODE_WORDS = {
    "importlib": "imports modules by names built at run time (`importlib`)",
    "builtins": "changes Python's builtins",
    "__builtins__": "changes Python's builtins",
    "__dict__": "fetches attributes through `__dict__`",
    "__getattribute__": "fetches attributes through `__getattribute__`",
    "__globals__": "reaches into a function's globals",
    "__code__": "rewrites a function's code",
    "marshal": "loads code at run time (`marshal`)",
}
_CODE_NAMES = {
    "eval": "runs code built at run time (`eval`)",
    "exec": "runs code built at run time (`exec`)",
    "compile": "runs code built at run time (`compile`)",
    "__import__": "imports modules by names built at run time (`__import__`)",
    "__builtins__": "changes Python's builtins",
    "vars": "fetches attributes through `vars`",
    "globals": "fetches or injects names through `globals()`",
    "locals": "fetches names through `locals()`",
}
# Work done in another thread or process is invisible to the in-process watch.
_ELSEWHERE_WORDS = {
    word: f"runs work in another thread or process (`{word}`)"
    for word in (
        "fork",
        "_fork",
        "forkpty",
        "multiprocessing",
        "subprocess",
        "ctypes",
        "cffi",
        "threading",
        "_thread",
        "Thread",
        "concurrent",
        "ThreadPoolExecutor",
        "ProcessPoolExecutor",
        "asyncio",
        "queue",
        "Queue",
        "SimpleQueue",
        "socket",
        "system",
        "popen",
        "Popen",
    )
}
# Top-level code runs before the grader's watch is set up and can patch PyTorch or the
# builtins so that the exercise's own code names nothing suspicious; there only these.
_TOP_LEVEL_WORDS = {
    w: d for w, d in _WATCH_WORDS.items() if w not in ("profiler", "library")
} | {
    "library": _WATCH_WORDS["library"],
    "importlib": _CODE_WORDS["importlib"],
    "builtins": _CODE_WORDS["builtins"],
    "__builtins__": _CODE_WORDS["__builtins__"],
    "__globals__": _CODE_WORDS["__globals__"],
    "__code__": _CODE_WORDS["__code__"],
    "marshal": _CODE_WORDS["marshal"],
    "threading": _ELSEWHERE_WORDS["threading"],
    "_thread": _ELSEWHERE_WORDS["_thread"],
    "multiprocessing": _ELSEWHERE_WORDS["multiprocessing"],
    "ctypes": _ELSEWHERE_WORDS["ctypes"],
    # a worker started here could compute for the exercise through files or pipes
    **{
        w: _ELSEWHERE_WORDS[w]
        for w in ("fork", "subprocess", "Popen", "popen", "system", "concurrent")
    },
}
_TOP_LEVEL_NAMES = {
    n: _CODE_NAMES[n]
    for n in ("eval", "exec", "compile", "__import__", "__builtins__", "globals")
}
_COURSE_MODULES = {"course_utils"}
# what top-level code may not assign to: the profiler the watch relies on
_PROFILER_PARTS = (
    "profiler",
    "autograd",
    "profile",
    "record_function",
    "function_events",
    "_profiler_enabled",
)
_FETCHERS = ("getattr", "setattr", "delattr")
_OWN = ("self", "cls")
# names IPython defines in a notebook's namespace
_IPYTHON = {"display", "get_ipython", "In", "Out", "exit", "quit", "_", "__", "___"}
_IPYTHON_RE = re.compile(
    r"_i{0,3}\d*|_[oid]h|_ih|__(name|file|doc|spec|loader|package)__"
)


def _unreadable_modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    """Modules an import brings in that are neither installed nor the course's: a file
    the student's code wrote, say, whose code the static check never sees."""
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return ["." * node.level + (node.module or "")]
        modules = [node.module or ""]
    else:
        modules = [a.name for a in node.names]
    unreadable = []
    for module in modules:
        top = module.split(".")[0]
        if top in sys.stdlib_module_names or top in _COURSE_MODULES:
            continue
        try:
            installed = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            installed = False
        if not installed:
            unreadable.append(module)
    return unreadable


def _is_ipython(node: ast.AST) -> bool:
    """``get_ipython()``, as IPython writes ``!command`` and ``%magic`` lines."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "get_ipython"
    )


def _literal_loop_names(node: ast.AST) -> set[str]:
    """Loop variables over a written-out list of strings: ``for name in ("w", "b")``."""
    names = set()
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.For | ast.comprehension)
            and isinstance(sub.target, ast.Name)
            and isinstance(sub.iter, ast.Tuple | ast.List | ast.Set)
            and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str)
                for e in sub.iter.elts
            )
        ):
            names.add(sub.target.id)
    return names


def _is_literal(node: ast.AST, literal_names: set[str]) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or (
        isinstance(node, ast.Name) and node.id in literal_names
    )


def _tampering(node: ast.AST, top_level: bool = False) -> set[str]:
    """What, under ``node``, switches the watch off or hides a call from it."""
    words = (
        _TOP_LEVEL_WORDS if top_level else _WATCH_WORDS | _CODE_WORDS | _ELSEWHERE_WORDS
    )
    names = _TOP_LEVEL_NAMES if top_level else _CODE_NAMES
    skip = _not_calls(node)
    literal = _literal_loop_names(node)
    with_items = {
        id(part)
        for sub in ast.walk(node)
        if isinstance(sub, ast.With | ast.AsyncWith)
        for item in sub.items
        for part in ast.walk(item.context_expr)
    }
    found = set()
    for sub in _walk(node, lambda n: id(n) in skip):
        if isinstance(sub, ast.Name) and sub.id in names:
            found.add(names[sub.id])
        elif isinstance(sub, ast.Attribute):
            if sub.attr == "system" and _is_ipython(sub.value):
                pass  # ``!pip install ...``: IPython's shell escape, not a worker
            elif sub.attr in words:
                found.add(words[sub.attr])
            elif (
                sub.attr == "modules"
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "sys"
            ):
                found.add("reaches into `sys.modules`")
            elif (
                top_level
                and sub.attr == "profiler"
                and id(sub) not in with_items
                and isinstance(sub.ctx, ast.Load)
            ):
                # ``with torch.profiler.profile() as prof:`` measures; anything else
                # (keeping the module, subclassing its profile) may patch the watch
                found.add(_WATCH_WORDS["profiler"])
            elif top_level and isinstance(sub.ctx, ast.Store | ast.Del):
                # patching the profiler or the watch from top-level code
                chain = sub
                while isinstance(chain, ast.Attribute):
                    if chain.attr in _PROFILER_PARTS:
                        found.add(_WATCH_WORDS["profiler"])
                    chain = chain.value
        elif not top_level and isinstance(sub, ast.Import | ast.ImportFrom):
            for module in _unreadable_modules(sub):
                found.add(f"imports `{module}`, code the grader cannot read")
        if isinstance(sub, ast.alias | ast.ImportFrom):
            module = sub.name if isinstance(sub, ast.alias) else sub.module or ""
            for part in module.split("."):
                if part in words:
                    found.add(words[part])
            if isinstance(sub, ast.ImportFrom) and module == "sys":
                if any(a.name in ("modules", "*") for a in sub.names):
                    found.add("reaches into `sys.modules`")
        elif isinstance(sub, ast.Call):
            func = sub.func
            fname = func.id if isinstance(func, ast.Name) else None
            if fname in _FETCHERS and len(sub.args) >= 2:
                target, attr = sub.args[0], sub.args[1]
                own = isinstance(target, ast.Name) and target.id in _OWN
                if not own and not _is_literal(attr, literal):
                    found.add(
                        f"fetches attributes by names built at run time (`{fname}`)"
                    )
                if top_level and fname != "getattr" and not own:
                    # a top-level setattr/delattr patches something
                    if isinstance(attr, ast.Constant) and attr.value in _PROFILER_PARTS:
                        found.add(f"patches PyTorch's profiler (`{fname}`)")
                    for w in ast.walk(sub.args[0]):
                        if isinstance(w, ast.Attribute | ast.Name) and (
                            getattr(w, "attr", None) or getattr(w, "id", None)
                        ) in ("profiler", "autograd", "builtins", "torch", "_C"):
                            found.add(f"patches PyTorch or the builtins (`{fname}`)")
            attr_name = func.attr if isinstance(func, ast.Attribute) else fname
            if attr_name in ("attrgetter", "methodcaller") and not all(
                _is_literal(a, literal) for a in sub.args
            ):
                found.add(
                    f"fetches attributes by names built at run time (`{attr_name}`)"
                )
    return found


def _runs_at_top_level(tree: ast.Module) -> list[ast.AST]:
    """The parts of a cell that run when it runs: every statement but the bodies of its
    functions (decorators, default values and class bodies do run)."""
    roots = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            roots += node.decorator_list + node.args.defaults
            roots += [d for d in node.args.kw_defaults if d is not None]
        elif isinstance(node, ast.ClassDef):
            roots += node.decorator_list + node.bases + node.keywords
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    roots += item.decorator_list + item.args.defaults
                else:
                    roots.append(item)
        else:
            roots.append(node)
    return roots


@functools.lru_cache(maxsize=4096)
def _parse(source: str) -> ast.Module | None:
    """A cell's code; IPython's ``%magics`` and ``!commands`` as the kernel would run them.
    Cached (the course's given cells are read for every test): callers never change the
    tree."""
    try:
        return ast.parse(source)
    except SyntaxError:
        pass
    if source.lstrip().startswith("%%"):  # %%time, %%capture: the body runs as Python
        body = _parse(source.lstrip().partition("\n")[2])
        if body is not None:
            return body
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return ast.parse(TransformerManager().transform_cell(source))
    except Exception:  # noqa: BLE001 (no IPython here, or not Python even so)
        return None


def _symbols(node: ast.AST, keep) -> set[str]:
    """The names of ``node``'s symbols, in every scope, for which ``keep(symbol,
    top_level)`` holds; none when it cannot be compiled."""
    try:
        table = symtable.symtable(ast.unparse(node), "<cell>", "exec")
    except (SyntaxError, ValueError):
        return set()
    names = set()

    def visit(t, top):
        names.update(s.get_name() for s in t.get_symbols() if keep(s, top))
        for child in t.get_children():
            visit(child, False)

    visit(table, True)
    return names


@functools.lru_cache(maxsize=4096)
def _cell_bindings(source: str) -> frozenset[str] | None:
    """Every name a cell binds at top level (or declares global and assigns); None when it
    star-imports (then what it binds is unknown), none when it cannot be read. Cached:
    the course's given cells are read for every test."""
    tree = _parse(source)
    if tree is None:
        return frozenset()
    if any(
        isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)
        for n in ast.walk(tree)
    ):
        return None
    return frozenset(
        _symbols(
            tree,
            lambda s, top: (
                (top and (s.is_assigned() or s.is_imported()))
                or (s.is_declared_global() and s.is_assigned())
            ),
        )
    )


def _global_references(node: ast.AST) -> set[str]:
    """The global names a top-level definition or statement reads."""
    return _symbols(
        node,
        lambda s, top: (
            s.is_referenced()
            and (
                (top and not (s.is_assigned() or s.is_imported()))
                or (not top and s.is_global())
            )
        ),
    )


def _names_outside_raise(node: ast.AST) -> set[str]:
    """The names ``node`` reads anywhere but in a ``raise`` statement: what is only raised
    can never compute a result."""
    return {
        n.id
        for n in _walk(node, lambda n: isinstance(n, ast.Raise))
        if isinstance(n, ast.Name)
    }


def _is_provided(name: str) -> bool:
    return (
        name in dir(builtins) or name in _IPYTHON or bool(_IPYTHON_RE.fullmatch(name))
    )


def static_tampering(
    sources: list[str], exercise: str, given: list[str] = ()
) -> list[str]:
    """What in ``sources`` (the student's code cells) switches the grader's run-time watch
    off or hides calls from it: on the call path of ``exercise`` (its definition and what
    it refers to, as for ``static_uses``), and in top-level code, which runs in the same
    namespace. ``given`` are the course's cells, whose names are not injected."""
    trees = [t for t in map(_parse, sources) if t is not None]
    bound = _top_level_bindings(trees)
    found, called = set(), []
    for root in (r for tree in trees for r in _runs_at_top_level(tree)):
        found |= _tampering(root, top_level=True)
        called.extend(_words(root)[0])
    # and what top-level code calls: ``def patch(): ...`` then ``patch()``
    for node, _ in _reached(bound, called):
        found |= _tampering(node, top_level=True)
    defined: set[str] | None = set()
    for source in [*sources, *given]:
        names = _cell_bindings(source)
        defined = None if names is None or defined is None else defined | names
    for node, _ in _reached(bound, [exercise]):
        found |= _tampering(node)
        if defined is not None:
            used = _names_outside_raise(node)  # a misspelt exception is a bug
            for n in sorted(_global_references(node) & used):
                if n not in defined and not _is_provided(n):
                    found.add(f"uses `{n}`, {UNDEFINED}")
    return sorted(found)


UNDEFINED = "which nothing in the notebook defines"


def refusal(
    sources: list[str],
    exercise: str,
    forbidden: tuple[str, ...],
    given: list[str] = (),
    passed: bool = True,
) -> str | None:
    """Why a test that forbids ``forbidden`` earns nothing, read from the code; or None.
    A name nothing defines counts only against a ``passed`` test: in a failed one it is
    a plain bug (a NameError), and the failure's own message says more."""
    if not forbidden:
        return None
    tampering = static_tampering(sources, exercise, given)
    if not passed:
        tampering = [t for t in tampering if UNDEFINED not in t]
    if tampering:
        return tamper_message(exercise, tampering)
    found = static_uses(sources, exercise, forbidden)
    return message(exercise, found, "found in its code") if found else None
