"""Run in a fresh process by tests/test_guard.py: load the attention guard, check that
PyTorch's attention computes while unarmed, arm it (two seccomp filters), then try every
route to PyTorch's attention a student's code could take, and print one JSON object:
route name to "refused" (the guard's message), "computed", or "error: ..." (refused by
something else). Routes that prepare something before arming get their chance first."""

import gc
import json
import sys
import threading

import torch
import torch.nn.functional as F

sys.path.insert(0, sys.argv[1])
from autograder.grading.sealed import guard, probe  # noqa: E402

torch.ops.load_library(str(guard.library_path()))
torch.manual_seed(0)
q = torch.randn(2, 2, 5, 8)
E = 8
x3 = torch.randn(2, 5, E)
mha = torch.nn.MultiheadAttention(E, 2, batch_first=True).eval()
layer = torch.nn.TransformerEncoderLayer(E, 2, 16, batch_first=True).eval()
results = {}


def sdpa(a):
    return F.scaled_dot_product_attention(a, a, a)


def attempt(name, fn):
    try:
        with torch.no_grad():
            fn()
        results[name] = "computed"
    except Exception as exc:  # noqa: BLE001
        text = str(exc)
        results[name] = "refused" if guard.MARK in text else "error: " + text[:200]


# before arming: all of PyTorch's attention computes (honest scratch cells work)
attempt("unarmed sdpa", lambda: sdpa(q))
attempt("unarmed mha fast path", lambda: mha(x3, x3, x3, need_weights=False))
attempt("unarmed encoder layer", lambda: layer(x3))
attempt(
    "unarmed masked softmax",
    lambda: torch._masked_softmax(
        q @ q.mT, torch.zeros(5, 5, dtype=torch.bool), None, 0
    ),
)
unarmed = dict(results)
results.clear()

# prepared while unarmed: handles, scripted functions, registrations
scripted = torch.jit.script(sdpa)
traced = torch.jit.trace(sdpa, (q,))
packet = torch.ops.aten.scaled_dot_product_attention.default
flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
try:
    handle = torch.library.get_kernel(  # the computed kernel, as a callable
        "aten::_scaled_dot_product_flash_attention_for_cpu", "CPU"
    )
except Exception:  # noqa: BLE001
    handle = None
grad_q = q.clone().requires_grad_()
loss_for_backward = torch.nn.functional.scaled_dot_product_attention(
    grad_q, grad_q, grad_q
).sum()

probe.seal()
attempt("one filter: still computes", lambda: sdpa(q))
probe.seal()

attempt("F.scaled_dot_product_attention", lambda: sdpa(q))
attempt(
    "torch._C._nn.scaled_dot_product_attention",
    lambda: torch._C._nn.scaled_dot_product_attention(q, q, q),
)
attempt("aten sdpa packet", lambda: packet(q, q, q))
attempt(
    "aten._scaled_dot_product_attention_math",
    lambda: torch.ops.aten._scaled_dot_product_attention_math(q, q, q),
)
attempt("aten flash for cpu", lambda: flash(q, q, q))
attempt(
    "aten fused overrideable",
    lambda: torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, q, q),
)
attempt("aten _fused_sdp_choice", lambda: torch.ops.aten._fused_sdp_choice(q, q, q))
attempt("nn.MultiheadAttention fast path", lambda: mha(x3, x3, x3, need_weights=False))
attempt("nn.TransformerEncoderLayer fast path", lambda: layer(x3))
attempt(
    "aten._native_multi_head_attention",
    lambda: torch._native_multi_head_attention(
        x3,
        x3,
        x3,
        E,
        2,
        mha.in_proj_weight,
        mha.in_proj_bias,
        mha.out_proj.weight,
        mha.out_proj.bias,
    ),
)
attempt(
    "torch._masked_softmax",
    lambda: torch._masked_softmax(
        q @ q.mT, torch.zeros(5, 5, dtype=torch.bool), None, 0
    ),
)
attempt("torch.vmap over sdpa", lambda: torch.vmap(sdpa)(q))
attempt("torch.func.grad route", lambda: torch.func.vmap(torch.vmap(sdpa))(q[None]))
attempt("torch.jit.script", lambda: scripted(q))
attempt("torch.jit.trace", lambda: traced(q))
attempt(
    "backward of a graph built unarmed",
    lambda: torch.autograd.grad(loss_for_backward, grad_q),
)
attempt(
    "autograd forward",
    lambda: torch.enable_grad().__enter__() or sdpa(q.clone().requires_grad_()),
)
attempt(
    "torch.library.get_kernel handle",
    lambda: (
        handle.call_boxed(torch._C._dispatch_keyset_full(), q, q, q)
        if handle is not None
        else sdpa(q)
    ),
)


def in_thread():
    box = {}

    def run():
        try:
            sdpa(q)
            box["r"] = "computed"
        except Exception as exc:  # noqa: BLE001
            box["r"] = exc

    t = threading.Thread(target=run)
    t.run()  # no new thread under the seal: the same code path on this one
    if isinstance(box.get("r"), Exception):
        raise box["r"]


attempt("a thread's body", in_thread)


def disabled():
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
        sdpa(q)


attempt("DisableTorchFunction and _DisableTorchDispatch", disabled)


def excluded():
    keys = [
        torch._C.DispatchKey.CompositeImplicitAutograd,
        torch._C.DispatchKey.FuncTorchVmapMode,
        torch._C.DispatchKey.AutogradCPU,
        torch._C.DispatchKey.ADInplaceOrView,
    ]
    for key in keys:
        try:
            with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
                sdpa(q)
                flash(q, q, q)
        except Exception as exc:  # noqa: BLE001
            if guard.MARK not in str(exc):
                continue
            raise


attempt("_ExcludeDispatchKeyGuard", excluded)


def library_over():
    lib = torch.library.Library("aten", "IMPL")
    lib.impl(
        "_scaled_dot_product_flash_attention_for_cpu",
        lambda *a, **k: (
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default.redispatch(
                torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *a, **k
            )
        ),
        "CPU",
    )
    try:
        flash(q, q, q)
    finally:
        lib._destroy()


attempt("torch.library impl over the guard, redispatching", library_over)


def destroy_all():
    for obj in gc.get_objects():
        if isinstance(obj, torch.library.Library):
            obj._destroy()
    sdpa(q)


attempt("_destroy of every Python Library", destroy_all)


def fallthrough():
    lib = torch.library.Library("aten", "IMPL")
    lib.impl(
        "scaled_dot_product_attention",
        torch.library.fallthrough_kernel,
        "CompositeImplicitAutograd",
    )
    sdpa(q)


attempt("fallthrough registered over the guard", fallthrough)


def python_dispatcher():
    with torch._C._EnablePythonDispatcher():
        sdpa(q)


attempt("python dispatcher", python_dispatcher)


def decomposition():
    from torch._decomp import decomposition_table

    for op, fn in decomposition_table.items():
        if "scaled_dot_product" in str(op):
            fn(q, q, q)
            return
    raise RuntimeError("no decomposition")


attempt("torch._decomp decomposition", decomposition)


def meta_then_cpu():
    sdpa(q.to("meta"))


attempt("meta tensors", meta_then_cpu)


def nested():
    nt = torch.nested.nested_tensor([q[0, :, :3], q[0, :, :4]]).transpose(1, 2)
    sdpa(nt)


attempt("nested tensors", nested)


def cpu_autocast():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sdpa(q)


attempt("CPU autocast", cpu_autocast)

print(json.dumps({"unarmed": unarmed, "armed": results}))
