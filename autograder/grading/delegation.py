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

Reading the code also refuses a test (``static_tampering``) for what could switch the
run-time watch off or forge it from inside the kernel. It reads only the student's own
cells (exercise cells and cells the student added: the course's read-only cells are
restored before grading and never read), follows names bound anywhere in the module's
scope (under ``if``, ``for``, ``while``, ``with``, ``try``, ``match``; not inside function
bodies), and refuses only what no honest answer to these exercises writes:

- anywhere (top-level code and the exercise's call path): reaching into PyTorch's
  dispatcher, modes or profiler (``torch._C``, ``torch._ops``, ``torch.library``,
  ``torch.overrides``, ``torch.utils._python_dispatch``, the mode-stack functions,
  ``TorchFunctionMode``/``TorchDispatchMode``, ``_enable_profiler``/``_disable_profiler``);
  reaching into the interpreter (``ctypes``, ``cffi``, ``sys.settrace``/``setprofile``/
  ``addaudithook``/``monitoring``, ``gc.get_objects``/``get_referrers``/``get_referents``,
  ``sys._getframe``, ``inspect.currentframe``/``stack``/``trace``, frame attributes
  ``f_back``/``f_locals``/``f_globals``/``f_builtins``/``tb_frame``/``gi_frame``/
  ``cr_frame``, ``__code__``, ``__globals__``, ``__closure__``, ``marshal``, ``builtins``,
  ``__builtins__``); replacing what an imported module holds (``torch.load = ...``,
  ``os.fork = ...``, ``setattr(torch, ...)``, ``del F.x``, ``sys.modules[...] = ...``;
  not ``torch.backends.*`` settings); injecting names through ``globals()`` (writing to
  it; reading it is fine); IPython's hooks on running cells (``events.register``,
  ``ast_transformers``, ``input_transformers_cleanup``/``_post``, ``set_custom_exc``);
  running code built at run time (``eval``, ``exec``, ``compile``, ``__import__``);
- on the exercise's call path only: fetching by names built at run time (``importlib``,
  ``vars``, ``globals``, ``locals``, ``__dict__``, ``__getattribute__``, ``getattr``/
  ``setattr``/``delattr``/``attrgetter``/``methodcaller`` with a name that is not a
  written-out string), importing a module the grader cannot read, and using a name
  nothing in the notebook defines (in a passed test only).

Not refused by reading (an honest notebook does these): threads, processes and sockets
(``threading``, ``multiprocessing``, ``subprocess``, ``concurrent``, ``asyncio``,
``queue``, ``socket``, ``os.system``, ``os.fork``): the hidden inputs reach only a
sealed process forked after the last student cell, which nothing left behind can see
or change; measuring with ``torch.profiler``; ``torch.backends`` settings; IPython's
``!`` shell escapes and magics; Colab set-up (``sys.modules`` read,
``importlib.util.find_spec``, ``google.colab``).
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


# Nodes that open a scope of their own: what they bind is not the module's.
_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Lambda,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)


def _in_module_scope(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` in the module's own scope, in every statement (``if``,
    ``for``, ``try``, ``with``, ``match`` bodies too): definitions, but not their bodies."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if node is tree or not isinstance(node, _SCOPES):
            todo.extend(reversed(list(ast.iter_child_nodes(node))))


def _stored_names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _binds(node: ast.AST) -> list[tuple[str, ast.AST]]:
    """The module-level names ``node`` binds, each with what gives it its value: the
    definition, import, assignment or ``match`` itself, or the expression a loop,
    ``with``, ``except`` or ``:=`` takes it from."""
    match node:
        case ast.FunctionDef() | ast.AsyncFunctionDef() | ast.ClassDef():
            return [(node.name, node)]
        case ast.Import() | ast.ImportFrom():
            return [(a.asname or a.name.split(".")[0], node) for a in node.names]
        case ast.Assign(targets=targets):
            return [(n, node) for t in targets for n in _stored_names(t)]
        case ast.AnnAssign(target=target) | ast.AugAssign(target=target):
            return [(n, node) for n in _stored_names(target)]
        case (
            ast.For(target=target, iter=source)
            | ast.AsyncFor(target=target, iter=source)
        ):
            return [(n, source) for n in _stored_names(target)]
        case ast.withitem(optional_vars=target, context_expr=source) if target:
            return [(n, source) for n in _stored_names(target)]
        case ast.NamedExpr(target=target, value=source):
            return [(target.id, source)]
        case ast.ExceptHandler(name=name, type=source) if name and source:
            return [(name, source)]
        case ast.Match(cases=cases):
            captured = (
                getattr(p, "name", None) or getattr(p, "rest", None)
                for case in cases
                for p in ast.walk(case.pattern)
            )
            return [(n, node) for n in captured if n]  # patterns name attributes too
    return []


def _top_level_bindings(trees: list[ast.Module]) -> dict[str, list[ast.AST]]:
    """Every function, class, assignment and import of the module's scope, by the name
    it binds, wherever it stands (under an ``if``, a ``try``, a ``with``...)."""
    bound: dict[str, list[ast.AST]] = {}
    for tree in trees:
        for node in _in_module_scope(tree):
            for name, value in _binds(node):
                bound.setdefault(name, []).append(value)
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
        elif isinstance(sub, ast.MatchClass):  # case F(scaled_dot_product_attention=f)
            words.update(sub.kwd_attrs)
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


# Code that switches the run-time watch off or hides what it calls from it, wherever it
# stands (the exercise's call path, top-level code): words are attribute names, imported
# names and modules. Only what no honest answer to these exercises writes: reaching into
# PyTorch's dispatcher, modes and profiler, or into the interpreter.
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
        word: f"switches PyTorch's profiler on or off (`{word}`)"
        for word in (
            "_disable_profiler",
            "_enable_profiler",
            "_disable_profiler_legacy",
            "_enable_profiler_legacy",
            "_prepare_profiler",
        )
    },
    **{
        word: f"reaches into the interpreter (`{word}`)"
        for word in (
            "ctypes",
            "cffi",
            "settrace",
            "setprofile",
            "addaudithook",
            "get_objects",
            "get_referrers",
            "get_referents",
            "_getframe",
            "currentframe",
            "f_back",
            "f_locals",
            "f_globals",
            "f_builtins",
            "tb_frame",
            "gi_frame",
            "cr_frame",
            "__code__",
            "__globals__",
            "__closure__",
            "marshal",
        )
    },
    "builtins": "changes Python's builtins",
    "__builtins__": "changes Python's builtins",
    **{
        word: f"hooks into IPython's running of cells (`{word}`)"
        for word in (
            "ast_transformers",
            "input_transformers_cleanup",
            "input_transformers_post",
            "set_custom_exc",
        )
    },
}
# The same for an attribute of one particular owner: ``sys.monitoring``, not any
# ``monitoring``; ``inspect.stack``, not ``torch.stack``.
_OWNED_WORDS = {
    ("sys", "monitoring"): "reaches into the interpreter (`sys.monitoring`)",
    ("inspect", "stack"): "reaches into the interpreter (`inspect.stack`)",
    ("inspect", "trace"): "reaches into the interpreter (`inspect.trace`)",
    ("events", "register"): "hooks into IPython's running of cells (`events.register`)",
}
# What hides a name from this reading: only on the exercise's own call path, where an
# answer has no reason to build names at run time (a Colab set-up cell does, with
# ``importlib``, at top level).
_CODE_WORDS = {
    "importlib": "imports modules by names built at run time (`importlib`)",
    "__dict__": "fetches attributes through `__dict__`",
    "__getattribute__": "fetches attributes through `__getattribute__`",
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
# Top-level code runs the code it builds at run time unread, before the watch is set up.
_TOP_LEVEL_NAMES = {
    n: _CODE_NAMES[n] for n in ("eval", "exec", "compile", "__import__", "__builtins__")
}
# Settings an honest notebook changes: ``torch.backends.cudnn.deterministic = True``.
_SETTINGS = {"backends"}
# What changes the namespace through ``globals()`` (reading it is harmless).
_NAMESPACE_WRITES = {
    "update",
    "setdefault",
    "pop",
    "clear",
    "__setitem__",
    "__delitem__",
}
_COURSE_MODULES = {"course_utils"}
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


def _owner(node: ast.Attribute) -> str | None:
    """The name an attribute is taken from: ``sys`` in ``sys.monitoring``, ``events`` in
    ``ip.events.register``."""
    value = node.value
    return getattr(value, "id", None) or getattr(value, "attr", None)


def _root(node: ast.AST) -> tuple[str | None, set[str]]:
    """The name an attribute or subscript chain starts from, and its attribute names:
    ``("torch", {"backends", "cudnn", "deterministic"})``."""
    attrs = set()
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute):
            attrs.add(node.attr)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), attrs


def _is_call_of(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == name
    )


def _patching(sub: ast.AST, modules: set[str]) -> str | None:
    """Why ``sub`` changes a module from outside (``torch.load = ...``, ``setattr(F,
    ...)``, ``sys.modules[...] = ...``) or the notebook's namespace unseen
    (``globals()[...] = ...``); None when it does not."""
    if isinstance(sub, ast.Attribute | ast.Subscript) and isinstance(
        sub.ctx, ast.Store | ast.Del
    ):
        if isinstance(sub, ast.Subscript) and _is_call_of(sub.value, "globals"):
            return "injects names through `globals()`"
        root, attrs = _root(sub)
        if root in modules and not attrs & _SETTINGS:
            return f"replaces an attribute of an imported module (`{root}`)"
    elif isinstance(sub, ast.Attribute) and sub.attr in _NAMESPACE_WRITES:
        if _is_call_of(sub.value, "globals"):
            return "injects names through `globals()`"
        if _root(sub.value) == ("sys", {"modules"}):
            return "replaces modules in `sys.modules`"
    elif (
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Name)
        and sub.func.id in ("setattr", "delattr")
        and sub.args
        and _root(sub.args[0])[0] in modules
    ):
        return f"replaces an attribute of an imported module (`{sub.func.id}`)"
    return None


def _tampering(
    node: ast.AST, top_level: bool = False, modules: frozenset[str] = frozenset()
) -> set[str]:
    """What, under ``node``, switches the watch off or hides a call from it; on the
    exercise's call path (not ``top_level``), also what hides a name from this reading.
    ``modules`` are the notebook's names of imported modules."""
    words = _WATCH_WORDS if top_level else _WATCH_WORDS | _CODE_WORDS
    names = _TOP_LEVEL_NAMES if top_level else _CODE_NAMES
    skip = _not_calls(node)
    literal = _literal_loop_names(node)
    found = set()
    for sub in _walk(node, lambda n: id(n) in skip):
        patching = _patching(sub, modules)
        if patching:
            found.add(patching)
        if isinstance(sub, ast.Name) and sub.id in names:
            found.add(names[sub.id])
        elif isinstance(sub, ast.Attribute):
            if sub.attr in words:
                found.add(words[sub.attr])
            elif (_owner(sub), sub.attr) in _OWNED_WORDS:
                found.add(_OWNED_WORDS[_owner(sub), sub.attr])
        elif not top_level and isinstance(sub, ast.Import | ast.ImportFrom):
            for module in _unreadable_modules(sub):
                found.add(f"imports `{module}`, code the grader cannot read")
        if isinstance(sub, ast.alias | ast.ImportFrom):
            module = sub.name if isinstance(sub, ast.alias) else sub.module or ""
            for part in module.split("."):
                if part in words:
                    found.add(words[part])
        elif isinstance(sub, ast.Call) and not top_level:
            found |= _fetching_by_built_names(sub, literal)
    return found


def _fetching_by_built_names(call: ast.Call, literal: set[str]) -> set[str]:
    """``getattr(F, name)``, ``attrgetter(name)`` with a name built at run time (not a
    written-out string, and not from the object's own ``self``)."""
    func = call.func
    fname = func.id if isinstance(func, ast.Name) else None
    found = set()
    if fname in _FETCHERS and len(call.args) >= 2:
        target, attr = call.args[0], call.args[1]
        own = isinstance(target, ast.Name) and target.id in _OWN
        if not own and not _is_literal(attr, literal):
            found.add(f"fetches attributes by names built at run time (`{fname}`)")
    attr_name = func.attr if isinstance(func, ast.Attribute) else fname
    if attr_name in ("attrgetter", "methodcaller") and not all(
        _is_literal(a, literal) for a in call.args
    ):
        found.add(f"fetches attributes by names built at run time (`{attr_name}`)")
    return found


def _module_names(bound: dict[str, list[ast.AST]]) -> frozenset[str]:
    """The names bound to modules and what they hold: by an import, or by an assignment
    of a plain attribute chain of one (``P = torch.autograd.profiler``)."""
    modules = {
        name
        for name, nodes in bound.items()
        if any(isinstance(n, ast.Import | ast.ImportFrom) for n in nodes)
    }
    for name, nodes in bound.items():
        for node in nodes:
            value = getattr(node, "value", None)
            if isinstance(node, ast.Assign) and isinstance(value, ast.Attribute):
                if _root(value)[0] in modules:
                    modules.add(name)
    return frozenset(modules)


def _runs_at_top_level(node: ast.AST) -> list[ast.AST]:
    """The parts of a cell that run when it runs: every statement, in ``if``, ``for``,
    ``try``, ``with``, ``match`` and class bodies too, but not the bodies of functions
    (their decorators and default values do run)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        defaults = node.args.defaults + [d for d in node.args.kw_defaults if d]
        return node.decorator_list + defaults
    compound = any(
        isinstance(value, list) and any(isinstance(v, ast.stmt) for v in value)
        for _, value in ast.iter_fields(node)
    )
    if not compound:
        return [node]
    return [
        r for child in ast.iter_child_nodes(node) for r in _runs_at_top_level(child)
    ]


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
    """What in ``sources`` (the student's own code cells) switches the grader's run-time
    watch off or hides calls from it: on the call path of ``exercise`` (its definition
    and what it refers to, as for ``static_uses``), and in top-level code, which runs in
    the same process. ``given`` are the course's cells: their names are not injected,
    and the modules they import are modules."""
    trees = [t for t in map(_parse, sources) if t is not None]
    bound = _top_level_bindings(trees)
    given_trees = [t for t in map(_parse, given) if t is not None]
    modules = _module_names(_top_level_bindings(given_trees + trees))
    found, called = set(), []
    for root in (r for tree in trees for r in _runs_at_top_level(tree)):
        found |= _tampering(root, top_level=True, modules=modules)
        called.extend(_words(root)[0])
    # and what top-level code calls: ``def patch(): ...`` then ``patch()``
    for node, _ in _reached(bound, called):
        found |= _tampering(node, top_level=True, modules=modules)
    defined: set[str] | None = set()
    for source in [*sources, *given]:
        names = _cell_bindings(source)
        defined = None if names is None or defined is None else defined | names
    for node, _ in _reached(bound, [exercise]):
        found |= _tampering(node, modules=modules)
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
    found = refused(sources, exercise, forbidden, given, passed)
    return found[0] if found else None


def refused(
    sources: list[str],
    exercise: str,
    forbidden: tuple[str, ...],
    given: list[str] = (),
    passed: bool = True,
) -> tuple[str, str] | None:
    """:func:`refusal`'s message and the route it refused (:func:`route`), or None."""
    if not forbidden:
        return None
    tampering = static_tampering(sources, exercise, given)
    if not passed:
        tampering = [t for t in tampering if UNDEFINED not in t]
    if tampering:
        return (
            tamper_message(exercise, tampering),
            route(tampering, "the watch worked around in its code"),
        )
    found = static_uses(sources, exercise, forbidden)
    where = "found in its code"
    return (message(exercise, found, where), route(found, where)) if found else None


def route(what: list[str], where: str) -> str:
    """The route a refusal refused, for the instructor's class report: the forbidden
    features (``FEATURES``' keys) or the ways around the watch, and where they were seen."""
    return f"{', '.join(what[:3])}{', ...' if len(what) > 3 else ''} ({where})"
