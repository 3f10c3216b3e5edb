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
- flag a submission for the instructor's review (:func:`flags`): constructs that no
  honest answer needs (calls into native code, raw memory, PyTorch's dispatcher, code
  objects, ``exec``) and code that reads like PyTorch's own attention pasted in. A flag
  goes to the gradebook, the summary and the class report, and never changes a score.
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
    found = static_uses(sources, exercise, others)
    if not found:
        return ""
    described = " and ".join(FEATURES[f].description for f in found)
    return (
        f"Remark on your code, not on a test's result (it took no point): `{exercise}` "
        f"seems to call {described}, which this exercise asks you to write yourself."
    )


# Flags for the instructor's review. Constructs no honest answer to these exercises
# needs, by what they reach: native code and raw memory, PyTorch's dispatcher and
# operator registry, code objects, code built at run time.
_FLAGGED_MODULES = {
    "ctypes": "calls native code (ctypes)",
    "cffi": "calls native code (cffi)",
    "_ctypes": "calls native code (ctypes)",
    "mmap": "maps raw memory (mmap)",
}
_FLAGGED_ATTRIBUTES = {
    "__array_interface__": "reads raw memory (__array_interface__)",
    "__cuda_array_interface__": "reads raw memory (__cuda_array_interface__)",
    "data_ptr": "takes raw pointers (data_ptr)",
    "untyped_storage": "reaches tensor storage (untyped_storage)",
    "_construct_storage_from_data_pointer": "builds tensors from raw pointers",
    "from_address": "reads raw memory (from_address)",
    "_C": "reaches into PyTorch's C++ bindings (torch._C)",
    "ops": "calls PyTorch's operators directly (torch.ops)",
    "library": "registers PyTorch operator kernels (torch.library)",
    "__code__": "edits code objects (__code__)",
    "_destroy": "removes PyTorch registrations (_destroy)",
    "_grader_probe": "reaches into the grader's probe",
}
_FLAGGED_CALLS = {
    "exec": "runs code built at run time (exec)",
    "eval": "runs code built at run time (eval)",
    "compile": "compiles code at run time (compile)",
    "__import__": "imports by a name built at run time (__import__)",
}
_FLAGGED_STRINGS = {
    "_C",
    "ops",
    "library",
    "__code__",
    "ctypes",
    "cffi",
    "_grader_probe",
}


def constructs(sources: list[str]) -> list[str]:
    """What in the student's own cells no honest answer needs (sorted, each once)."""
    found = set()
    for tree in (t for t in map(_parse, sources) if t is not None):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [a.name for a in node.names]
                if isinstance(node, ast.ImportFrom) and node.module:
                    modules = [node.module] + [
                        f"{node.module}.{a.name}" for a in node.names
                    ]
                for module in modules:
                    parts = module.split(".")
                    for part in parts:
                        if part in _FLAGGED_MODULES:
                            found.add(_FLAGGED_MODULES[part])
                    if parts[0] == "torch" and len(parts) > 1:
                        if parts[1] in ("_C", "ops", "library"):
                            found.add(_FLAGGED_ATTRIBUTES[parts[1]])
            elif isinstance(node, ast.Attribute) and node.attr in _FLAGGED_ATTRIBUTES:
                if node.attr in ("ops", "library", "_C"):
                    owner = node.value
                    if not (isinstance(owner, ast.Name) and owner.id == "torch"):
                        continue
                found.add(_FLAGGED_ATTRIBUTES[node.attr])
            elif isinstance(node, ast.Name) and node.id == "_grader_probe":
                found.add(_FLAGGED_ATTRIBUTES["_grader_probe"])
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in _FLAGGED_CALLS:
                    found.add(_FLAGGED_CALLS[node.func.id])
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value in _FLAGGED_STRINGS:
                    found.add(f"names {node.value!r} in a string (getattr?)")
    return sorted(found)


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
    sources: list[str], exercises: list[tuple[str, tuple[str, ...]]] = ()
) -> list[str]:
    """What the instructor should look at in these cells (the student's own): never a
    point, only a list for review. ``exercises``: each exercise with the features it
    forbids; one whose call path names PyTorch's attention is flagged too (a dead first
    try is flagged as well: only a person can tell)."""
    from autograder.grading.sealed.guard import ATTENTION_FEATURES

    with READING_CODE:
        found = constructs(sources) + similarity(sources)
        for exercise, forbidden in exercises:
            attention = tuple(f for f in forbidden if f in ATTENTION_FEATURES)
            if attention and static_uses(sources, exercise, attention):
                found.append(f"`{exercise}` names PyTorch's attention in its code")
    return list(dict.fromkeys(found))
