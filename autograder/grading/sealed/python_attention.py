"""PyTorch's attention written in Python: every function of the installed PyTorch that
computes attention without the dispatcher's attention kernels (which the guard switches
off), found by reading PyTorch's source, and classified here by hand.

While the tests that forbid PyTorch's attention run, the sealed child replaces the code
of every function in ``ATTENTION`` with a refusal, wherever the function is held (a name
bound before arming, a function built from its code object: ``probe.switch_off``).
``tests/test_python_attention.py`` reads the installed PyTorch with ``discover`` and
fails when it finds a function this table has not classified (a new PyTorch).
"""

from __future__ import annotations

import ast
import functools
import os

# Computes attention in Python when called: switched off in the guarded phase.
ATTENTION = {
    "torch.nn.functional:multi_head_attention_forward": "F.multi_head_attention_forward",
    "torch.nn.modules.activation:MultiheadAttention.forward": "nn.MultiheadAttention",
    "torch.nn.attention.flex_attention:flex_attention": "flex_attention",
    "torch.nn.attention.bias:CausalBias._dispatch": "CausalBias attention",
    "torch.nn.attention.bias:CausalBias.__torch_function__": "CausalBias attention",
    "torch.nested._internal.sdpa:jagged_scaled_dot_product_attention": (
        "nested tensors' attention"
    ),
    "torch.onnx.ops._impl:attention_23": "ONNX's reference attention",
    "torch._higher_order_ops.flex_attention:math_attention": "flex attention's maths",
    "torch._higher_order_ops.flex_attention:sdpa_dense": "flex attention's maths",
    "torch._higher_order_ops.flex_attention:_flex_attention_autocast_impl": (
        "flex attention"
    ),
    "torch._higher_order_ops.flex_attention:flex_attention_autocast_cuda": (
        "flex attention"
    ),
    "torch._higher_order_ops.flex_attention:flex_attention_autocast_cpu": (
        "flex attention"
    ),
    "torch._higher_order_ops.flex_attention:FlexAttentionAutogradOp.forward": (
        "flex attention"
    ),
    "torch._higher_order_ops.flex_attention:flex_attention_autograd": "flex attention",
    "torch._higher_order_ops.flex_attention:flex_attention_functionalize": (
        "flex attention"
    ),
    "torch.ao.nn.quantizable.modules.activation:MultiheadAttention.forward": (
        "the quantizable nn.MultiheadAttention"
    ),
    "torch.ao.nn.quantizable.modules.activation:MultiheadAttention._forward_impl": (
        "the quantizable nn.MultiheadAttention"
    ),
    "torch._decomp.decompositions:scaled_dot_product_flash_attention_for_cpu": (
        "the flash attention decomposition"
    ),
    "torch.testing._internal.distributed._tensor.common_dtensor:Attention.forward": (
        "a test model's attention"
    ),
    **{
        f"torch._inductor.fx_passes.fuse_attention:_sfdp_pattern_{i}": (
            "inductor's attention patterns"
        )
        for i in (*range(1, 28), 29, 30)
    },
    "torch._inductor.fx_passes.fuse_attention:_sfdp_replacement_16": (
        "inductor's attention patterns"
    ),
}

# Switched off though ``discover`` does not find them (they call what it finds).
BY_HAND = {
    "torch.nn.attention.flex_attention:flex_attention",
    "torch.ao.nn.quantizable.modules.activation:MultiheadAttention.forward",
}

# Found by ``discover`` but computes no attention when called: it registers, traces,
# lowers, counts or describes it.
NOT_ATTENTION = {
    "torch._meta_registrations:native_multi_head_attention_fake": "shapes only",
    "torch.overrides:get_testing_overrides": "a table of signatures",
    "torch.nested._internal.ops:jagged_torch_function": "dispatches every op",
    "torch.onnx._internal.exporter._torchlib.ops.nn:"
    "aten_scaled_dot_product_attention_23": "builds an ONNX graph",
    "torch._higher_order_ops.flex_attention:trace_flex_attention": "traces",
    "torch._higher_order_ops.flex_attention:flex_attention_proxy_torch_dispatch_mode": (
        "traces"
    ),
    "torch._higher_order_ops.flex_attention:flex_attention_fake_impl": "shapes only",
    "torch._decomp:_core_aten_decompositions_post_autograd": "a table",
    "torch.distributed.tensor.experimental._context_parallel._attention:"
    "_enable_context_parallel_dispatcher_impl": "registers",
    "torch.distributed.tensor.experimental._context_parallel._attention:"
    "_disable_context_parallel_dispatcher_impl": "registers",
    "torch.testing._internal.common_nn:get_new_module_tests": "a table of tests",
    "torch._dynamo.variables.higher_order_ops:"
    "FlexAttentionBackwardHighOrderVariable._call_function": "traces",
    "torch._dynamo.variables.higher_order_ops:"
    "FlexAttentionHigherOrderVariable._call_function": "traces",
    "torch.utils.flop_counter:_register_flex_attention_flops": "counts flops",
    "torch.utils.flop_counter:_register_flex_attention_flops.<locals>."
    "flex_attention_forward_flop": "counts flops",
    "torch._inductor.fx_utils:_extract_subgraphs_and_args": "traces",
    "torch._inductor.fx_utils:count_flops_fx": "counts flops",
    "torch._inductor.kernel.flex.flex_attention:flex_attention": "lowers to a kernel",
}

# What marks a function as a candidate: it calls PyTorch's attention by name, is named
# so, or takes a softmax of a product.
_ATTENTION_NAMES = {
    "scaled_dot_product_attention",
    "multi_head_attention_forward",
    "_native_multi_head_attention",
    "flex_attention",
    "_scaled_dot_product_attention_math",
}
_SOFTMAX = {"softmax", "_softmax", "log_softmax", "_safe_softmax"}
_PRODUCTS = {"matmul", "bmm", "baddbmm", "einsum", "mm"}


def _is_candidate(function: ast.AST) -> bool:
    words, product = set(), False
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            product = True
    return bool(words & _ATTENTION_NAMES) or bool(
        words & _SOFTMAX and (product or words & _PRODUCTS)
    )


@functools.cache
def discover(root: str | None = None) -> set[str]:
    """Every candidate function of the installed PyTorch, as ``module:qualname`` (a few
    seconds: only files that mention softmax or attention are parsed)."""
    if root is None:
        import torch

        root = os.path.dirname(torch.__file__)
    top = os.path.dirname(root)
    found = set()
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            if "softmax" not in text and "attention" not in text:
                continue
            try:
                tree = ast.parse(text)
            except SyntaxError:
                continue
            module = os.path.relpath(path, top)[:-3].replace(os.sep, ".")
            module = module.removesuffix(".__init__")
            found |= {f"{module}:{q}" for q in _candidates(tree, "")}
    return found


def _candidates(node: ast.AST, prefix: str):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + child.name
            if _is_candidate(child):
                yield name
            yield from _candidates(child, name + ".<locals>.")
        elif isinstance(child, ast.ClassDef):
            yield from _candidates(child, prefix + child.name + ".")


def by_code_key() -> dict[tuple[str, str], str]:
    """``ATTENTION`` as the sealed child looks it up: by a code object's file (from the
    ``torch`` folder on) and qualified name."""
    import importlib.util

    root = os.path.dirname(importlib.util.find_spec("torch").origin)
    found = {}
    for entry, name in ATTENTION.items():
        module, qualname = entry.split(":")
        relative = os.path.join(*module.split("."))
        path = relative + ".py"
        if not os.path.exists(os.path.join(os.path.dirname(root), path)):
            path = os.path.join(relative, "__init__.py")
        found[(path.replace(os.sep, "/"), qualname)] = name
    return found
