"""PyTorch features an exercise reimplements, and what reading the student's code may
say about them: never a point.

A hidden test names the features its exercise reimplements (``HiddenTest.forbidden``).
For PyTorch's attention ("sdpa", "mha", "transformer_layer") nothing here decides
anything: those tests run with PyTorch's attention kernels switched off
(``grading/sealed/guard``), and a call fails the test with the guard's message. Reading the code
may only

- add a remark to a test's feedback (:func:`remarks`) where an exercise's code calls a
  feature that is not attention and that the exercise asks the student to write
  (``softmax`` in the flash tiles, ``cross_entropy`` in label smoothing): a hint, no
  point taken;
- flag a submission for the instructor's review (:func:`flags`): wherever it stands,
  what changes the process for good (native code, PyTorch's dispatcher, code objects,
  shell hooks, ``exec`` of a built string: :func:`constructs`); on the path the tests
  reach, whatever the reader cannot vouch for (``call_path``), PyTorch's attention named,
  or its source pasted in. A flag goes to the gradebook, the summary and the class
  report, and never changes a score.
"""

from __future__ import annotations

import ast
import functools
import threading
from collections.abc import Iterator
from typing import NamedTuple


class Feature(NamedTuple):
    description: str  # how the feedback names it
    names: tuple[str, ...]  # identifiers or strings, looked for in the student's code


FEATURES: dict[str, Feature] = {
    # PyTorch's attention, however reached (switched off by the guard while these tests
    # run; the names serve the flags for review)
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
    ),
    "mha": Feature(
        "PyTorch's nn.MultiheadAttention",
        names=(
            "MultiheadAttention",
            "multi_head_attention_forward",
            "_native_multi_head_attention",
        ),
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
    ),
    "cross_entropy": Feature(
        "PyTorch's cross-entropy loss (F.cross_entropy, nn.CrossEntropyLoss)",
        names=("cross_entropy", "CrossEntropyLoss", "cross_entropy_loss"),
    ),
    "softmax": Feature(
        "PyTorch's softmax (torch.softmax, F.softmax, Tensor.softmax, nn.Softmax)",
        names=("softmax", "log_softmax", "Softmax", "LogSoftmax", "_softmax"),
    ),
}


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
    """The names a target binds (``x``, ``a, *b``), not those an item or attribute
    hangs from (``cache[k] = ...`` binds nothing)."""
    return [
        n.id
        for n in ast.walk(target)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    ]


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
    it binds, wherever it stands (under an ``if``, a ``try``, a ``with``...), in the
    order the cells run; but a binding that a later one replaces for good is left out
    (``_live``): the tests, which run after every cell, never see a dead first try."""
    bound: dict[str, list[ast.AST]] = {}
    for tree in trees:
        for node in _in_module_scope(tree):
            for name, value in _binds(node):
                bound.setdefault(name, []).append(value)
    return _live(bound, trees)


def _live(bound: dict[str, list[ast.AST]], trees: list[ast.Module]):
    """``bound`` without the bindings a later one replaces for good: when a name's last
    binding is a statement of its own (not under an ``if``, a ``try``, a loop...) and no
    code that runs as the cells run (outside a function's body) reads the name, the
    earlier ones are dead for everything the tests call."""
    direct = {id(statement) for tree in trees for statement in tree.body}
    read_at_the_top = set()
    for tree in trees:
        for statement in tree.body:
            read_at_the_top |= _names_read_as_cells_run(statement)
    live = {}
    for name, nodes in bound.items():
        last = nodes[-1]
        if len(nodes) > 1 and id(last) in direct and name not in read_at_the_top:
            nodes = [last]
        live[name] = nodes
    return live


def _names_read_as_cells_run(statement: ast.AST) -> set[str]:
    """The names ``statement`` reads while its cell runs: everywhere but in the bodies of
    the functions it defines (decorators, defaults and class bodies run at once)."""
    names, todo = set(), [statement]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            names.add(node.id)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            todo += node.decorator_list + node.args.defaults
            todo += [d for d in node.args.kw_defaults if d is not None]
        elif isinstance(node, ast.Lambda):
            todo += node.args.defaults
        else:
            todo.extend(ast.iter_child_nodes(node))
    return names


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
    """Under ``node``: bare names looked up in the notebook's scope (which may be the
    student's own, to follow; a function's own names are its own), and words
    that always refer to something else: attribute names, imported names, strings."""
    from autograder.grading.judging.call_path import module_scope_names

    words = set()
    skip = _not_calls(node)
    skipped = {
        id(n) for sub in ast.walk(node) if id(sub) in skip for n in ast.walk(sub)
    }
    names = {n.id for n in module_scope_names(node) if id(n) not in skipped}
    for sub in _walk(node, lambda n: id(n) in skip):
        if isinstance(sub, ast.Attribute):
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


def remarks(
    sources: list[str], exercise: str, forbidden: tuple[str, ...], given: list[str] = ()
) -> str:
    """A remark for the feedback when ``exercise``'s code calls a feature it is asked to
    write that is not attention (the guard covers attention); empty otherwise. Never a
    point: a name read in the code may be dead or a comparison."""
    from autograder.grading.sealed.guard import ATTENTION_FEATURES

    others = tuple(f for f in forbidden if f not in ATTENTION_FEATURES)
    if not others:
        return ""
    try:
        found = static_uses(sources, exercise, others)
    except RecursionError:  # nested too deep to read: flagged (``flags``), no remark
        return ""
    if not found:
        return ""
    described = " and ".join(FEATURES[f].description for f in found)
    return (
        f"Remark on your code, not on a test's result (it took no point): `{exercise}` "
        f"seems to call {described}, which this exercise asks you to write yourself."
    )


# Flags for the instructor's review, wherever the code stands: what changes the process
# for good before the hidden tests run (native code and raw memory, PyTorch's dispatcher
# and operator registry, code objects, hooks that run around every cell, the grader's
# own objects), and code the reader cannot read (``exec`` of a string built at run time).
# What an exercise's tests reach is read more strictly (``call_path``).
_NATIVE_MODULES = {
    "ctypes": "calls native code (ctypes)",
    "cffi": "calls native code (cffi)",
    "_ctypes": "calls native code (ctypes)",
    "mmap": "maps raw memory (mmap)",
}
_DISPATCH = {
    "_C": "reaches into PyTorch's C++ bindings (torch._C)",
    "ops": "calls PyTorch's operators directly (torch.ops)",
    "library": "registers PyTorch operator kernels (torch.library)",
}
_ANYWHERE_ATTRIBUTES = {
    "_destroy": "removes PyTorch registrations (_destroy)",
    "_construct_storage_from_data_pointer": "builds tensors from raw pointers",
    "from_address": "reads raw memory (from_address)",
    "settrace": "installs a tracer (settrace)",
    "setprofile": "installs a profiler hook (setprofile)",
    "addaudithook": "installs an audit hook (addaudithook)",
    "monitoring": "installs monitoring callbacks (sys.monitoring)",
}
# what IPython's shell exposes that runs code around every cell, the grader's too
_SHELL_HOOKS = {
    "events",
    "user_ns",
    "user_global_ns",
    "user_ns_hidden",
    "ast_transformers",
    "input_transformers_post",
    "input_transformers_cleanup",
    "set_hook",
    "set_custom_exc",
}
_CODE_AT_RUN_TIME = {
    "exec": "runs code built at run time (exec)",
    "eval": "runs code built at run time (eval)",
    "compile": "compiles code at run time (compile)",
}


def _is_shell(node: ast.AST, shells: set[str]) -> bool:
    """``get_ipython()``, or a name bound to it."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id == "get_ipython"
    return isinstance(node, ast.Name) and node.id in shells


def _literal_code(call: ast.Call) -> ast.AST | None:
    """The code a string literal handed to exec/eval/compile is, or None."""
    if call.args and isinstance(call.args[0], ast.Constant):
        text = call.args[0].value
        if isinstance(text, str):
            tree = _parse(text)
            if tree is None:
                try:
                    tree = ast.parse(text, mode="eval")
                except SyntaxError:
                    return None
            return tree
    return None


def constructs(sources: list[str]) -> list[str]:
    """What in the student's own cells changes the process for good or cannot be read,
    wherever it stands (sorted, each once)."""
    found = set()
    todo = [t for t in map(_parse, sources) if t is not None]
    depth = 0
    while todo and depth < 4:
        trees, todo, depth = todo, [], depth + 1
        for tree in trees:
            _constructs_of(tree, found, todo)
    return sorted(found)


def _constructs_of(tree: ast.AST, found: set[str], literal_code: list) -> None:
    torches = {"torch"}
    shells = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    torches.add(a.asname or "torch")
        elif isinstance(node, ast.Assign) and _is_shell(node.value, set()):
            shells |= {
                n.id
                for t in node.targets
                for n in ast.walk(t)
                if isinstance(n, ast.Name)
            }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names]
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module] + [
                    f"{node.module}.{a.name}" for a in node.names
                ]
            for parts in (m.split(".") for m in modules):
                found.update(_NATIVE_MODULES[p] for p in parts if p in _NATIVE_MODULES)
                if parts[0] == "torch" and len(parts) > 1 and parts[1] in _DISPATCH:
                    found.add(_DISPATCH[parts[1]])
        elif isinstance(node, ast.Attribute):
            if node.attr in _DISPATCH:
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in torches:
                    found.add(_DISPATCH[node.attr])
            elif node.attr in _ANYWHERE_ATTRIBUTES:
                found.add(_ANYWHERE_ATTRIBUTES[node.attr])
            elif node.attr == "__code__" and isinstance(node.ctx, ast.Store):
                found.add("edits code objects (__code__)")
            elif node.attr in _SHELL_HOOKS and _is_shell(node.value, shells):
                found.add(
                    f"reaches the notebook shell's {node.attr} (runs code around "
                    "every cell, the grader's too)"
                )
        elif isinstance(node, ast.Name) and node.id == "_grader_probe":
            found.add("reaches into the grader's probe")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "_grader" in node.value:
                found.add("names the grader's objects in a string")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            if name in _CODE_AT_RUN_TIME:
                code = _literal_code(node)
                if code is None:
                    found.add(_CODE_AT_RUN_TIME[name])
                else:
                    literal_code.append(code)  # read as the code it is
            elif name == "getattr" and len(node.args) >= 2:
                owner, attr = node.args[0], node.args[1]
                if (
                    isinstance(owner, ast.Name)
                    and owner.id in torches
                    and isinstance(attr, ast.Constant)
                    and attr.value in _DISPATCH
                ):
                    found.add(_DISPATCH[attr.value])


SIMILARITY_THRESHOLD = 0.6  # share of PyTorch's attention source's 5-token runs


@functools.cache
def _pytorch_attention_shingles() -> dict[str, frozenset]:
    """PyTorch's own attention in Python, as sets of 5-token runs per source."""
    import inspect

    import torch.nn.functional as functional

    sources = {
        "F.multi_head_attention_forward": functional.multi_head_attention_forward
    }
    try:
        from torch.nn.attention import flex_attention

        sources["flex_attention"] = flex_attention.flex_attention
    except Exception:  # noqa: BLE001 (not in this PyTorch)
        pass
    shingles = {}
    for name, function in sources.items():
        try:
            text = inspect.getsource(function)
        except (OSError, TypeError):
            continue
        shingles[name] = _shingles(_without_docstrings(text))
    # the reference implementation F.scaled_dot_product_attention documents
    doc = functional.scaled_dot_product_attention.__doc__ or ""
    start = doc.find("def scaled_dot_product_attention")
    if start >= 0:
        block = doc[start:].split("\n\n    Args", 1)[0]
        shingles["F.scaled_dot_product_attention (documented)"] = _shingles(block)
    return shingles


def _without_docstrings(text: str) -> str:
    try:
        tree = ast.parse(__import__("textwrap").dedent(text))
    except SyntaxError:
        return text
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body[0] = ast.Pass()
    return ast.unparse(tree)


def _shingles(text: str, n: int = 5) -> frozenset:
    import io
    import tokenize

    tokens = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER):
                tokens.append(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return frozenset(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def similarity(sources: list[str]) -> list[str]:
    """PyTorch's attention sources that the student's cells contain in large part."""
    mine = _shingles("\n".join(_without_docstrings(s) for s in sources))
    found = []
    for name, theirs in _pytorch_attention_shingles().items():
        if len(theirs) >= 20:
            share = len(theirs & mine) / len(theirs)
            if share >= SIMILARITY_THRESHOLD:
                found.append(f"reads like PyTorch's {name} ({share:.0%} of it)")
    return found


def flags(
    sources: list[str],
    exercises: list[tuple[str, tuple[str, ...]]] = (),
    given: list[str] = (),
    chapter: str | None = None,
) -> list[str]:
    """What the instructor should look at in these cells (the student's own; ``given``:
    the course's cells of the notebook): never a point, only a list for review.
    ``exercises``: each graded exercise with the features it forbids. Flagged: what
    changes the process for good wherever it stands (``constructs``); on the exercises'
    call path, what the reader cannot vouch for (``call_path``), PyTorch's attention
    named or pasted in. A first try that a later definition replaced for good is not on
    the path (``_live``)."""
    with READING_CODE:
        try:
            return _flags(sources, exercises, given, chapter)
        except RecursionError:  # Python's own parser and unparser recurse
            return ["code nested too deep to read: the reader cannot vouch for it"]


def _flags(sources, exercises, given, chapter) -> list[str]:
    from autograder.grading.judging.call_path import Reader
    from autograder.grading.sealed.guard import ATTENTION_FEATURES

    found = constructs(sources)
    if exercises:
        reader = Reader(sources, list(given), chapter)
        names = [exercise for exercise, _ in exercises]
        found += reader.problems(names)
        found += similarity([ast.unparse(n) for n in reader.path(names)])
    for exercise, forbidden in exercises:
        attention = tuple(f for f in forbidden if f in ATTENTION_FEATURES)
        if attention and static_uses(sources, exercise, attention):
            found.append(f"`{exercise}` names PyTorch's attention in its code")
    return list(dict.fromkeys(found))
