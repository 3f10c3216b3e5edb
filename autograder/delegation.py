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
from typing import NamedTuple


class Feature(NamedTuple):
    description: str  # how the feedback names it
    names: tuple[str, ...]  # identifiers or strings, looked for in the student's code
    ops: tuple[str, ...]  # substrings of PyTorch function and ATen operator names
    modules: tuple[str, ...] = ()  # torch.nn classes a module exercise may not hold


FEATURES: dict[str, Feature] = {
    "sdpa": Feature(
        "PyTorch's fused attention (F.scaled_dot_product_attention, flash attention)",
        names=(
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
            "scaled_dot_product",
            "_flash_attention",
            "_efficient_attention",
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
    "softmax": Feature(
        "PyTorch's softmax (torch.softmax, F.softmax, Tensor.softmax, nn.Softmax)",
        names=("softmax", "log_softmax", "Softmax", "LogSoftmax", "_softmax"),
        ops=("softmax",),
        modules=("Softmax", "LogSoftmax"),
    ),
}


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


def message(exercise: str, features: list[str], where: str) -> str:
    described = " and ".join(FEATURES[f].description for f in features)
    return (
        f"`{exercise}` uses {described} ({where}). This exercise asks you to write it "
        "yourself, so this test earns no points; compare with PyTorch in a scratch cell "
        "instead, outside your answer."
    )


# The student's code, read without running it.


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


def _words(node: ast.AST) -> tuple[set[str], set[str]]:
    """Under ``node``: bare names (which may be the student's own, to follow), and words
    that always refer to something else: attribute names, imported names, strings."""
    names, words = set(), set()
    skip = _not_calls(node)
    todo = [node]
    while todo:
        sub = todo.pop()
        if id(sub) in skip:
            continue
        todo.extend(ast.iter_child_nodes(sub))
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
    trees = []
    for source in sources:
        try:
            trees.append(ast.parse(source))
        except SyntaxError:
            continue
    bound = _top_level_bindings(trees)
    seen, todo, found = set(), [exercise], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in bound.get(name, []):
            names, words = _words(node)
            found |= words
            for n in names:
                # a name bound by the student's code is followed to its definition (the
                # chapter 3 exercise *is* called scaled_dot_product_attention); any other
                # bare name (a star import, a builtin) is taken at its word
                if n in bound:
                    todo.append(n)
                else:
                    found.add(n)
    return [f for f in forbidden if found & set(FEATURES[f].names)]
