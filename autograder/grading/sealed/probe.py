"""Call a notebook's exercises on given inputs and return their raw outputs as plain data.

This file runs in two places: inside the student's kernel (the grader sends its source
text, so it must need nothing but the standard library and torch), and in the grader
itself, on the reference and on known mistakes. It judges nothing: it only calls and
records. A :class:`TestPlan` (one hidden test) holds the :class:`CallPlan` of each of its
calls; an outcome is, per call, either ``{"value": ...}`` with tensors, numbers, strings,
lists and dicts only, or ``{"error": "..."}``. Nothing here watches what the student's
code calls: the tests that forbid PyTorch's attention run where it does not compute
(``grading/sealed/guard``), so there is nothing to watch and no report to forge.
"""

import contextvars
import copy
import functools
from typing import Any, TypedDict

import torch


class CallPlan(TypedDict):
    """One call of an exercise, as plain data (``spec.Case.to_plan``)."""

    args: list  # positional arguments
    kwargs: dict  # keyword arguments
    init: list | None  # [args, kwargs] to build the module first; None for a function
    state: dict | None  # the weights to load into that module
    # the module's method to call (without init: the exercise's own attribute, such as
    # an autograd Function's ``apply``); None: call the module (the function) itself
    method: str | None
    setup: list  # [method name, args] pairs called on the module before the call
    # a kernel exercise: the course's launcher (``LAUNCHERS``) that launches the
    # exercise, a Triton kernel, on the call's buffers; None for any other exercise
    launch: str | None
    # None: the call runs without gradients and returns its output. A tensor: the upstream
    # gradient dL/d(output); the call runs with gradients and returns [output, then the
    # gradient of every floating-point tensor among the positional arguments, in order]
    upstream_grad: Any
    # with upstream_grad: also return what the output's autograd node saved for the
    # backward (``ctx.save_for_backward``), after the gradients: a hand-written backward
    # is graded by what it keeps, not only by the numbers it makes
    saved: bool


class TestPlan(TypedDict):
    """One hidden test: the exercise and its calls; ``guarded``: it forbids PyTorch's
    attention, so it runs in the second phase, with the attention guard armed."""

    exercise: str
    calls: list[CallPlan]
    guarded: bool


Outcome = dict[str, Any]

_MAX_MESSAGE = 400
# PyTorch layers a plan may ask for as an argument (``{"torch.nn": name, ...}``), built
# here from plain data: e.g. the nn.MultiheadAttention a ``load_torch_weights`` copies.
_TORCH_LAYERS = (
    "MultiheadAttention",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "Linear",
    "LayerNorm",
    "Embedding",
    "GRU",
    "GRUCell",
)


class _Missing(Exception):
    pass


# The grader's float64 run of a reference (``prepare``, the exact answer a case is judged
# against): the modules and layers a call builds are made float64 too. A context
# variable, so another thread of the grader (a stand-in's reply, a known mistake) is
# never touched.
IN_FLOAT64 = contextvars.ContextVar("in_float64", default=False)


def _built(module):
    """A module a call built, in float64 during the grader's float64 run."""
    return module.double() if IN_FLOAT64.get() else module


def _to_plain(value, depth=0):
    """Tensors to detached CPU copies, containers to lists and dicts, anything else to a tag."""
    if depth > 4:
        return {"unsupported": "nesting deeper than 4 levels"}
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").clone()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_to_plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_plain(v, depth + 1) for k, v in value.items()}
    return {"unsupported": type(value).__module__ + "." + type(value).__qualname__}


def map_tensors(value, change):
    """``value`` with ``change`` applied to every tensor in it, containers kept (the
    grader's: a plan in float64, a request on the meta device)."""
    if isinstance(value, torch.Tensor):
        return change(value)
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, change) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, change) for k, v in value.items()}
    return value


NOT_IMPLEMENTED = (
    "not implemented yet"  # a stub that still raises (the class report reads it)
)


def _describe(exc):
    # Triton's interpreter wraps what a kernel raised (a stub's NotImplementedError too)
    while type(exc).__name__ == "InterpreterError" and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, NotImplementedError):
        return (
            f"NotImplementedError: {NOT_IMPLEMENTED} (the stub still raises "
            "NotImplementedError)"
        )
    if isinstance(exc, _Missing):
        return str(exc)
    text = f"{type(exc).__name__}: {exc}"
    refused = text.find("PyTorch's attention (")  # the guard's message, however wrapped
    if refused > 0:
        text = "RuntimeError: " + text[refused:]
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _materialise(value, namespace):
    """Plain data to call arguments: ``{"torch.nn": ...}`` entries become PyTorch layers,
    ``{"notebook": name, "kwargs": ...}`` entries the namespace's own function ``name`` with
    those keyword arguments bound (the student's, or the reference's in the grader),
    ``{"notebook": name, "init": ..., "state": ...}`` a module of the namespace's own class
    ``name`` with the test's weights, and ``{"torch.Generator": seed}`` a seeded
    ``torch.Generator``."""
    if isinstance(value, dict) and "torch.Generator" in value:
        # a seeded random-number generator: the same draws in the student's call and the
        # reference's
        return torch.Generator().manual_seed(int(value["torch.Generator"]))
    if isinstance(value, dict) and "notebook" in value and "init" in value:
        # one of the notebook's own classes, built and loaded with the test's weights
        cls = namespace.get(value["notebook"])
        if not callable(cls):
            raise _Missing(
                f"this test passes a model built from your `{value['notebook']}`, "
                "but the notebook does not define it"
            )
        init_args, init_kwargs = _materialise(value["init"], namespace)
        module = _built(cls(*init_args, **init_kwargs))
        if value.get("state") is not None:
            _load_state(module, value["state"], value["notebook"])
        return module.eval()
    if isinstance(value, dict) and "notebook" in value:
        function = namespace.get(value["notebook"])
        if not callable(function):
            raise _Missing(
                f"this test passes your `{value['notebook']}` as an argument, "
                "but the notebook does not define it"
            )
        return functools.partial(function, **_materialise(value["kwargs"], namespace))
    if isinstance(value, dict) and "torch.nn" in value:
        name = value["torch.nn"]
        if name not in _TORCH_LAYERS:
            raise ValueError(f"a plan may not build torch.nn.{name}")
        layer = _built(getattr(torch.nn, name)(*value["args"], **value["kwargs"]))
        if value["state"] is not None:
            layer.load_state_dict(value["state"])
        # each part of the layer knows how it was made, so that a stand-in can send it
        # to the grader (``_sendable``): nn.Module attributes would register, so not so
        made = {"torch.nn": name, "args": value["args"], "kwargs": value["kwargs"]}
        for path, part in layer.named_modules():
            object.__setattr__(part, "_course_layer", (made, layer, path))
        return layer.eval()
    if isinstance(value, list):
        return [_materialise(v, namespace) for v in value]
    if isinstance(value, dict):
        return {k: _materialise(v, namespace) for k, v in value.items()}
    return value


# Chapter 11's kernels are graded by launching them: the course's launchers below start
# the notebook's own ``@triton.jit`` kernel, by the signature the chapter documents, on
# buffers the test made and with the tile sizes it chose, never through the notebook's
# wrapper. They need no Triton import: a kernel launches itself (``kernel[grid](...)``).
# What a kernel never stores stays NaN.
KERNEL_TYPES = ("JITFunction", "InterpretedFunction")  # what @triton.jit makes


def is_triton_kernel(target) -> bool:
    """Whether ``target`` is a kernel made by ``@triton.jit`` (of Triton's own classes,
    as imported in this process: none where Triton was never imported)."""
    import sys

    kinds = []
    for module_name in ("triton.runtime.jit", "triton.runtime.interpreter"):
        module = sys.modules.get(module_name)
        kinds += [getattr(module, k) for k in KERNEL_TYPES if hasattr(module, k)]
    return type(target) in kinds


def _triton_kernel(target, exercise):
    """``target`` if it is a kernel made by ``@triton.jit``."""
    if not is_triton_kernel(target):
        raise _Missing(
            f"`{exercise}` is not a Triton kernel: the kernel tests launch it themselves "
            "(write it as a plain @triton.jit function with the chapter's signature)"
        )
    return target


def _nan(*shape):
    return torch.full(shape, float("nan"))


def _launch(kernel, tiles, buffers, q, k, v, causal, block_q, block_k):
    """``kernel`` on the grid (tiles, BH), by the chapter's signature, in its order (the
    names are the notebook's): the buffers, n_q, n_k, scale, then the compile-time
    constants D, DV, BLOCK_Q, BLOCK_K and CAUSAL."""
    heads, n_q, d = q.shape
    kernel[(tiles, heads)](
        *buffers, n_q, k.size(1), 1.0 / d**0.5, d, v.size(2), block_q, block_k, causal
    )


def _launch_forward(kernel, q, k, v, causal=False, block_q=16, block_k=16):
    """flash_fwd_kernel on q (BH, n_q, D), k (BH, n_k, D), v (BH, n_k, DV), grid
    (cdiv(n_q, block_q), BH) -> out (BH, n_q, DV), L (BH, n_q)."""
    (heads, n_q, _), d_v = q.shape, v.size(2)
    out, lse = _nan(heads, n_q, d_v), _nan(heads, n_q)
    tiles = -(-n_q // block_q)
    _launch(kernel, tiles, (q, k, v, out, lse), q, k, v, causal, block_q, block_k)
    return out, lse


def _launch_dkdv(kernel, q, k, v, do, lse, delta, causal=False, block_q=16, block_k=16):
    """flash_bwd_dkdv_kernel, grid (cdiv(n_k, block_k), BH) -> dk (BH, n_k, D) and dv
    (BH, n_k, DV); do (BH, n_q, DV), lse = L and delta = D (BH, n_q)."""
    dk, dv = _nan(*k.shape), _nan(*v.shape)
    tiles = -(-k.size(1) // block_k)
    buffers = (q, k, v, do, lse, delta, dk, dv)
    _launch(kernel, tiles, buffers, q, k, v, causal, block_q, block_k)
    return dk, dv


def _launch_dq(kernel, q, k, v, do, lse, delta, causal=False, block_q=16, block_k=16):
    """flash_bwd_dq_kernel, grid (cdiv(n_q, block_q), BH) -> dq (BH, n_q, D)."""
    dq = _nan(*q.shape)
    tiles = -(-q.size(1) // block_q)
    buffers = (q, k, v, do, lse, delta, dq)
    _launch(kernel, tiles, buffers, q, k, v, causal, block_q, block_k)
    return dq


LAUNCHERS = {"forward": _launch_forward, "dkdv": _launch_dkdv, "dq": _launch_dq}


def call(namespace, exercise, plan: CallPlan):
    """Make one planned call of ``namespace[exercise]``; returns the raw result."""
    target = namespace.get(exercise)
    if target is None:
        raise _Missing(
            f"the notebook does not define `{exercise}` (was it renamed or its cell not run?)"
        )
    # a copy per call: a student may modify inputs in place
    args = _materialise(copy.deepcopy(plan["args"]), namespace)
    kwargs = _materialise(copy.deepcopy(plan["kwargs"]), namespace)
    if plan.get("launch") is not None:
        kernel = _triton_kernel(target, exercise)
        with torch.no_grad():
            return LAUNCHERS[plan["launch"]](kernel, *args, **kwargs)
    if plan["init"] is None and plan["method"] is not None:
        target = getattr(target, plan["method"])  # a class's own, e.g. Function.apply
    if plan.get("upstream_grad") is not None:
        return _with_gradients(
            target, args, kwargs, plan["upstream_grad"], exercise, plan.get("saved")
        )
    with torch.no_grad():
        if plan["init"] is None:
            return target(*args, **kwargs)
        init_args, init_kwargs = plan["init"]
        module = _built(target(*init_args, **init_kwargs))
        if plan["state"] is not None:
            _load_state(module, plan["state"], exercise)
        for name, setup_args in plan.get("setup") or []:
            getattr(module, name)(*_materialise(copy.deepcopy(setup_args), namespace))
        module.eval()
        method = module if plan["method"] is None else getattr(module, plan["method"])
        return method(*args, **kwargs)


def _saved_tensors(out, exercise):
    """What the autograd Function that made ``out`` saved with ``ctx.save_for_backward``."""
    saved = getattr(out.grad_fn, "saved_tensors", None)
    if saved is None:
        raise _Missing(
            f"the output of your `{exercise}` was not made by its forward: autograd ran "
            "through your operations, so its backward is autograd's, not yours (return "
            "the output of forward, with what backward needs saved by ctx.save_for_backward)"
        )
    return list(saved)


def _with_gradients(target, args, kwargs, upstream, exercise, saved=False):
    """The output and the gradients of sum(output * upstream) with respect to the floating-
    point tensors among ``args``, computed by the exercise's own backward pass: plain
    tensors (None for an input the output does not depend on)."""
    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    for a in inputs:
        a.requires_grad_(True)
    with torch.enable_grad():
        out = target(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or not out.requires_grad:
            raise _Missing(
                f"your `{exercise}` returned no tensor that gradients flow back through: "
                "return the output of your autograd function, not a detached copy"
            )
        kept = _saved_tensors(out, exercise) if saved else []
        grads = torch.autograd.grad(out, inputs, upstream, allow_unused=True)
    return [out, *grads, *([kept] if saved else [])]


def _load_state(module, state, exercise):
    """Load the test's weights; the student's module may hold extra buffers, not lack any."""
    try:
        result = module.load_state_dict(state, strict=False)
    except (RuntimeError, AttributeError, TypeError) as exc:
        raise _Missing(
            f"could not load the test's weights into your `{exercise}`: {_describe(exc)}. "
            "Shape the parameters exactly as the docstring says."
        ) from None
    if result.unexpected_keys:
        raise _Missing(
            f"your `{exercise}` has no parameters named {', '.join(result.unexpected_keys)}; "
            f"it has {', '.join(module.state_dict()) or 'none'}. Name them as the docstring says."
        )


def run_test(namespace, plan: TestPlan, kept=None) -> list[Outcome]:
    """Every call of one hidden test, in order; the student's errors are outcomes. The
    values returned are appended to ``kept`` when given (kept alive by the caller)."""
    outcomes = []
    for one in plan["calls"]:
        try:
            value = call(namespace, plan["exercise"], one)
            outcome = {"value": _to_plain(value)}
            if kept is not None:
                kept.append(value)
        except (
            Exception,
            SystemExit,
        ) as exc:  # the student's error is data, not a crash
            outcome = {"error": _describe(exc)}
        outcomes.append(outcome)
    return outcomes


# The sealed run. The kernel has run every student cell; now it forks one child, which
# is the only process that ever holds the hidden tests. The child keeps one thread (a
# fork copies only the calling one), clears Python's tracing hooks, switches off the
# garbage collector (no finaliser runs between calls) and seals itself with seccomp: no
# new thread or process, no exec, no ptrace, no signal to another process. Only then
# does the grader, outside the jail, freeze every other process of the submission and
# hand over the plans (``window.SealedWindow``) in two phases:
#
# 1. the tests that allow PyTorch's attention (``PLANS``);
# 2. the child arms the attention guard (``grading/guard``, loaded before any student
#    code) by adding one more seccomp filter, which nothing can take away; the grader
#    sees from outside that it has (two filters more than the kernel, the guard mapped)
#    and only then hands over the tests that forbid PyTorch's attention
#    (``GUARDED_PLANS``). Their first call is the proof: PyTorch's attention must fail
#    with the guard's message, or no test of the phase is graded.
#
# The child writes one result file per test and exits, and the grader reads and deletes
# them before anything else runs again.

PLANS = "plans.pt"  # written by the grader into the kernel's folder, once sealed
GUARDED_PLANS = "plans_guarded.pt"  # written once the child has armed the guard
PROOF = "proof.txt"  # the child's proof that the armed guard refuses: "refused"
UNARMED = "unarmed"  # why the child could not arm the guard
# A test of a later exercise runs a second time with the earlier exercises it uses
# replaced by the course's (``upstream.py``): one such run at a time, each handed over
# by the grader once the run before has been read (``window.SealedWindow``). The course's
# code never enters this process: its stand-ins ask the grader, which computes the
# reference outside the jail and answers only for the run it handed over.
REFERENCE_PLAN = "reference_plan_{}.pt"  # a test index
# the plan handed over for a run not needed (its test passed with the student's own
# code): the child goes on to the next, and writes no result for it
SKIP_PLAN = {"skip": True}
READY = "ready_{}"  # the child waits for that run's plan (its own tests are done)
ORACLE_REQUEST = "oracle_{}.req"  # a request number: the child's question...
ORACLE_REPLY = "oracle_{}.rep"  # ...and the grader's answer
# what a stand-in says when it cannot stand in (an argument it cannot send, a gradient
# it cannot carry): the second run then counts for nothing, and the first decides
CANNOT_STAND_IN = "this run counts for nothing"


def result_name(index):
    return f"result_{index}.res"


# A result file is data, never code: MAGIC, the header's length (4 bytes, little-endian),
# a JSON header (the outcomes, each tensor replaced by {"__tensor__": i}, and each
# tensor's dtype, shape and place in the blob), then the tensors' raw bytes. The grader
# reads it with ``result_reader``, whose cost is bounded by the file's size.
RESULT_MAGIC = b"AGR1"


def encode_result(outcomes) -> bytes:
    import json

    blobs, tensors, offset = [], [], 0

    def plain(value):
        nonlocal offset
        if isinstance(value, torch.Tensor):
            t = value.detach().to("cpu").contiguous()
            raw = (
                t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            )
            tensors.append(
                {
                    "dtype": str(t.dtype).removeprefix("torch."),
                    "shape": list(t.shape),
                    "offset": offset,
                    "nbytes": len(raw),
                }
            )
            blobs.append(raw)
            offset += len(raw)
            return {"__tensor__": len(tensors) - 1}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    header = json.dumps({"outcomes": plain(outcomes), "tensors": tensors}).encode()
    return RESULT_MAGIC + len(header).to_bytes(4, "little") + header + b"".join(blobs)


_SEALED_SYSCALLS = {
    # (audit arch, {syscall: number}): no thread, process, exec, ptrace or signal, and no
    # anonymous file to load code from (memfd_create)
    "x86_64": (
        0xC000003E,
        dict(
            clone=56, fork=57, vfork=58, execve=59, kill=62, ptrace=101,
            rt_sigqueueinfo=129, tkill=200, tgkill=234, rt_tgsigqueueinfo=297,
            process_vm_readv=310, process_vm_writev=311, memfd_create=319,
            execveat=322, pidfd_send_signal=424, clone3=435, pidfd_getfd=438,
        ),
    ),
    "aarch64": (
        0xC00000B7,
        dict(
            kill=129, tkill=130, tgkill=131, rt_sigqueueinfo=138, ptrace=117,
            clone=220, execve=221, rt_tgsigqueueinfo=240, process_vm_readv=270,
            process_vm_writev=271, memfd_create=279, execveat=281,
            pidfd_send_signal=424, clone3=435, pidfd_getfd=438,
        ),
    ),
}  # fmt: skip
# Calls that may not make memory executable once sealed (their third argument, the
# protection, may not hold PROT_EXEC): no new machine code in the tests' process.
_NO_EXEC_MAPPING = {
    "x86_64": dict(mmap=9, mprotect=10, pkey_mprotect=329),
    "aarch64": dict(mmap=222, mprotect=226, pkey_mprotect=288),
}


def seal():
    """Install the seccomp filter on this process (irreversible; needs no privilege).
    Raises OSError where the kernel or the architecture does not allow it."""
    import ctypes
    import platform
    import struct

    machine = platform.machine()
    if machine not in _SEALED_SYSCALLS:
        raise OSError(f"no seccomp filter for {machine}")
    arch, numbers = _SEALED_SYSCALLS[machine]
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    denied = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
    program = [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (load, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI's numbers would bypass the list
        program.append((jge, 0, 1, 0x40000000))
        program.append((ret, 0, 0, denied))
    for number in sorted(numbers.values()):
        program += [(jeq, 0, 1, number), (ret, 0, 0, denied)]
    prot_exec, third_argument = 0x4, 32  # offset of args[2]'s low word in seccomp_data
    for number in sorted(_NO_EXEC_MAPPING[machine].values()):
        program += [
            (jeq, 0, 4, number),  # another call: skip this check
            (load, 0, 0, third_argument),
            (jset, 0, 1, prot_exec),
            (ret, 0, 0, denied),
            (load, 0, 0, 0),  # the call's number again, for the next check
        ]
    program.append((ret, 0, 0, allow))
    raw = b"".join(struct.pack("HBBI", *step) for step in program)
    filters = ctypes.create_string_buffer(raw)

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Program(len(program), ctypes.cast(filters, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    libc.prctl.restype = ctypes.c_int
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(22, 2, ctypes.addressof(prog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


def _clear_hooks():
    """Python's tracing, profiling and monitoring hooks, which student code may have left
    behind to run inside the tests, are removed (audit hooks cannot be: nothing of the
    verdict rests on what they could change, and the attention guard is native)."""
    import gc
    import sys
    import threading

    sys.settrace(None)
    sys.setprofile(None)
    threading.settrace(None)
    threading.setprofile(None)
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        for tool in range(6):
            try:
                monitoring.set_events(tool, 0)
            except ValueError:
                pass
    gc.disable()
    gc.callbacks.clear()


def _silence():
    """The child must not talk to the kernel's ZeroMQ threads, which it does not have."""
    import os
    import sys

    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115


def _load_guard(path):
    """The attention guard, where the zygote has not loaded it already (a kernel outside
    the jail, ``--no-sandbox``): a trusted set-up, since students' code ran first."""
    import os

    if not path:
        return
    try:
        with open("/proc/self/maps") as f:
            if any(line.rstrip().endswith(os.path.basename(path)) for line in f):
                return
        torch.ops.load_library(path)
    except Exception:  # noqa: BLE001 (the grader sees it unmapped: phase 2 is not graded)
        pass


# PyTorch's attention written in Python, switched off in the second phase. The grader
# sets both when it loads this module into the kernel (``execute._probe_setup_cell``):
# each function of ``python_attention.ATTENTION`` as (its file under site-packages, its
# qualified name) -> how the refusal names it, and the refusal's wording (``guard``).
PYTHON_ATTENTION = {}
REFUSAL_TAIL = "is switched off while this exercise's hidden tests run."


def refusing_code(code, name):
    """A code object that raises the guard's refusal for ``name`` and has the free
    variables of ``code``, so that it can replace ``code`` in any function (a function's
    code can only be replaced by code with as many free variables). It uses no global
    name but ``RuntimeError``, a builtin."""
    free = code.co_freevars
    message = f"PyTorch's attention ({name}) {REFUSAL_TAIL}"
    body = "".join(f"    {v} = None\n" for v in free)
    body += "    def refuse(*args, **kwargs):\n"
    if free:  # named, never run: they make the function's free variables
        body += f"        if False:\n            print({', '.join(free)},)\n"
    body += f"        raise RuntimeError({message!r})\n"
    body += "    return refuse\n"
    namespace = {}
    exec(compile("def make():\n" + body, "<refusal>", "exec"), namespace)
    return namespace["make"]().__code__


def _attention_key(code):
    """(file under site-packages, qualified name) of a code object, or None."""
    path = code.co_filename.replace("\\", "/")
    at = path.rfind("/torch/")
    return (path[at + 1 :], code.co_qualname) if at >= 0 else None


def switch_off_python_attention():
    """Every function whose code is one of PyTorch's attention functions in Python
    (``PYTHON_ATTENTION``) raises the guard's refusal from now on, wherever it is held:
    the module's own, a name the student bound to it earlier, a function built from its
    code object, a copy of that code object. Found among all the process's functions
    (``gc``: about 0.04 s, and 40 MB of the child's pages copied, measured)."""
    import gc
    import types

    # the jail's warm process froze what it imported (PyTorch's own functions among
    # them), where gc.get_objects does not look: unfrozen (the child collects nothing)
    gc.unfreeze()
    replacements = {}
    for function in gc.get_objects():
        if type(function) is not types.FunctionType:
            continue
        code = function.__code__
        key = _attention_key(code)
        name = PYTHON_ATTENTION.get(key) if key else None
        if name is None:
            continue
        if code not in replacements:
            replacements[code] = refusing_code(code, name)
        # no exception is caught: one that is not switched off leaves the phase ungraded
        function.__code__ = replacements[code]


def _prove_guard():
    """``"refused"`` when PyTorch's attention fails with the guard's message here."""
    q = torch.ones(1, 1, 2, 4)
    try:
        torch.ops.aten.scaled_dot_product_attention.default(q, q, q)
    except Exception as exc:  # noqa: BLE001
        if "PyTorch's attention (" in str(exc):
            return "refused"
        return f"failed otherwise: {type(exc).__name__}"
    return "computed"


def _await(path, wait):
    import os
    import time

    deadline = time.monotonic() + wait
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def _sealed_child(namespace, folder, wait, guard):
    import os

    _silence()
    _clear_hooks()
    _load_guard(guard)
    # sealed, the child cannot start OpenMP's worker threads: one thread does the work
    torch.set_num_threads(1)
    try:
        seal()
    except Exception as exc:  # the grader sees no sealed child and grades nothing
        with open(os.path.join(folder, "unsealed"), "w") as f:
            f.write(f"{type(exc).__name__}: {exc}"[:300])
        return
    if not _await(os.path.join(folder, PLANS), wait):
        return
    plans = torch.load(os.path.join(folder, PLANS), weights_only=True)
    _run_plans(namespace, folder, plans)
    _run_reference_plans(namespace, folder, plans, wait)
    if not plans["guarded"]:
        return
    try:
        seal()  # one filter more: the attention guard is armed, for good
    except Exception as exc:  # noqa: BLE001
        with open(os.path.join(folder, UNARMED), "w") as f:
            f.write(f"{type(exc).__name__}: {exc}"[:300])
        return
    if not _await(os.path.join(folder, GUARDED_PLANS), wait):
        return
    try:
        switch_off_python_attention()
    except BaseException as exc:  # noqa: BLE001 (a hook of the student's raised)
        proof = f"PyTorch's attention in Python was not switched off: {exc!r}"[:300]
    else:
        proof = _prove_guard()
    with open(os.path.join(folder, PROOF), "w") as f:
        f.write(proof)
    if proof == "refused":
        guarded = torch.load(os.path.join(folder, GUARDED_PLANS), weights_only=True)
        _run_plans(namespace, folder, guarded)
        _run_reference_plans(namespace, folder, guarded, wait)


_ARMED = [False]
_KEPT = []  # the student's objects stay alive until the end: no finaliser runs


def _late(signum, frame):
    if _ARMED[0]:
        raise TimeoutError("past its time limit")


def _run_plans(namespace, folder, plans):
    import signal

    signal.signal(signal.SIGALRM, _late)
    for index, plan in zip(plans["indices"], plans["tests"], strict=True):
        _run_one(namespace, folder, index, plan, plans["seconds"])


def _run_reference_plans(namespace, folder, plans, wait):
    """The phase's second runs, with the course's stand-ins: each plan comes once the
    grader has read the result before it."""
    import os

    for index in plans.get("references", []):
        with open(os.path.join(folder, READY.format(index)), "w"):
            pass
        path = os.path.join(folder, REFERENCE_PLAN.format(index))
        if not _await(path, wait):
            return
        plan = torch.load(path, weights_only=True)
        if plan == SKIP_PLAN:  # the test passed without the stand-ins
            continue
        oracle = _Oracle(folder, index)
        _run_one(namespace, folder, index, plan, plans["seconds"], oracle)


def _run_one(namespace, folder, index, plan, seconds, oracle=None):
    import os
    import signal

    # past the limit, and again every 50 ms: a call that swallows the first interrupt,
    # and the test's later calls, end too
    _ARMED[0] = True
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
    try:
        if oracle is None:
            outcomes = run_test(namespace, plan, _KEPT)
        else:
            outcomes = _run_with_stand_ins(namespace, plan, oracle)
    except BaseException as exc:  # a timeout between two calls, say
        outcomes = [{"error": _describe(exc)}]
    finally:
        _ARMED[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
    partial = os.path.join(folder, result_name(index) + ".part")
    with open(partial, "wb") as f:
        f.write(encode_result(outcomes))
    os.rename(partial, os.path.join(folder, result_name(index)))


def _run_with_stand_ins(namespace, plan, oracle):
    """The test's calls with the plan's earlier exercises replaced, in the notebook's
    own namespace (where the student's code looks them up), by the course's stand-ins;
    the student's own are put back after."""
    stand_ins = {n: _remote_function(oracle, n) for n in plan["oracle"]["functions"]}
    stand_ins.update({n: _remote_module(oracle, n) for n in plan["oracle"]["modules"]})
    saved = {n: namespace[n] for n in stand_ins if n in namespace}
    namespace.update(stand_ins)
    try:
        return run_test(namespace, plan, _KEPT)
    finally:
        for name in stand_ins:
            if name in saved:
                namespace[name] = saved[name]
            else:
                namespace.pop(name, None)


class _Oracle:
    """Asks the grader for the course's answer, one request at a time, and waits (the
    test's time limit interrupts the wait)."""

    def __init__(self, folder, index):
        self.folder, self.index, self.count = folder, index, 0

    def ask(self, name, request):
        import os
        import time

        _check_plain(name, request)
        number, self.count = f"{self.index}_{self.count}", self.count + 1
        path = os.path.join(self.folder, ORACLE_REQUEST.format(number))
        with open(path + ".part", "wb") as f:
            f.write(encode_result([{"name": name, **request}]))
        os.rename(path + ".part", path)
        answer = os.path.join(self.folder, ORACLE_REPLY.format(number))
        while not os.path.exists(answer):
            time.sleep(0.0005)
        reply = torch.load(answer, weights_only=True)
        os.remove(answer)
        if "refused" in reply:
            raise RuntimeError(
                f"the course's `{name}` was not computed ({reply['refused']}): "
                f"{CANNOT_STAND_IN}"
            )
        if "error" in reply:
            raise RuntimeError(
                f"the course's `{name}` raised {reply['error']} on what your code "
                "passed it"
            )
        return reply["value"]


def _check_plain(name, value, depth=0):
    """What a stand-in can send: tensors, numbers, strings, None, and lists, tuples and
    dicts of them; no gradients, which it cannot carry back."""
    if isinstance(value, torch.Tensor):
        if value.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(
                f"the course's `{name}` cannot carry gradients here: {CANNOT_STAND_IN}"
            )
        return
    if value is None or isinstance(value, (bool, int, float, str)):
        return
    if isinstance(value, (list, tuple)) and depth < 8:
        for v in value:
            _check_plain(name, v, depth + 1)
        return
    if isinstance(value, dict) and depth < 8:
        for v in value.values():
            _check_plain(name, v, depth + 1)
        return
    raise TypeError(
        f"the course's `{name}` takes tensors, numbers and None here, not "
        f"{type(value).__name__}: {CANNOT_STAND_IN}"
    )


def _sendable(value):
    """Arguments with each PyTorch layer a plan built (or a part of one) as how it was
    made and its weights now, which the grader builds again (``upstream``)."""
    if isinstance(value, torch.nn.Module) and hasattr(value, "_course_layer"):
        made, layer, path = value._course_layer
        state = {k: v.detach() for k, v in layer.state_dict().items()}
        return {"torch.nn layer": {**made, "state": state}, "path": path}
    if isinstance(value, (list, tuple)):
        return [_sendable(v) for v in value]
    if isinstance(value, dict):
        return {k: _sendable(v) for k, v in value.items()}
    return value


def _remote_function(oracle, name):
    def stand_in(*args, **kwargs):
        return oracle.ask(name, {"kind": "call", "args": list(args), "kwargs": kwargs})

    stand_in.__name__ = stand_in.__qualname__ = name
    return stand_in


def _place(module, key, value, buffer):
    """Register ``value`` under a dotted ``key`` (``w_q.weight``), making the
    submodules on the way."""
    *path, leaf = key.split(".")
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, torch.nn.Module())
        module = getattr(module, part)
    if buffer:
        module.register_buffer(leaf, value)
    else:
        module.register_parameter(leaf, torch.nn.Parameter(value))


def _remote_module(oracle, name):
    class StandIn(torch.nn.Module):
        """The course's module: its parameters here (so that the test's weights load
        into the student's module around it), its computation in the grader."""

        def __init__(self, *args, **kwargs):
            super().__init__()
            self._course_init = [list(args), dict(kwargs)]
            layout = oracle.ask(name, {"kind": "init", "init": self._course_init})
            for key, value in layout["parameters"].items():
                _place(self, key, value, buffer=False)
            for key, value in layout["buffers"].items():
                _place(self, key, value, buffer=True)

            object.__setattr__(self, "_course_methods", tuple(layout["methods"]))

        def __getattr__(self, attribute):
            try:  # its parameters, buffers and submodules
                return super().__getattr__(attribute)
            except AttributeError:
                pass
            if attribute in self.__dict__.get("_course_methods", ()):
                return lambda *args, **kwargs: self._course_method(
                    attribute, args, kwargs
                )
            raise AttributeError(
                f"the course's `{name}` has no `{attribute}` here: {CANNOT_STAND_IN}"
            )

        def _ask(self, kind, **request):
            """The grader's answer for this module: how it was built, its weights now."""
            state = {k: v.detach() for k, v in self.state_dict().items()}
            request.update(kind=kind, init=self._course_init, state=state)
            return oracle.ask(name, request)

        def _course_method(self, method, args, kwargs):
            """One of the course's own methods (``load_torch_weights``): run in the
            grader on this module's weights, which come back changed."""
            args, kwargs = _sendable(list(args)), _sendable(kwargs)
            reply = self._ask("method", method=method, args=args, kwargs=kwargs)
            with torch.no_grad():
                self.load_state_dict(reply["state"])
            return reply["value"]

        def forward(self, *args, **kwargs):
            return self._ask(
                "forward", training=self.training, args=list(args), kwargs=kwargs
            )

    StandIn.__name__ = StandIn.__qualname__ = name
    return StandIn


def _reap():
    import os

    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def run_sealed(namespace, folder, wait=60.0, guard=None):
    """The kernel-side entry point: fork the sealed child that runs the hidden tests on
    ``namespace`` (the student's) and wait for it. ``guard``: the attention guard's
    library, loaded here where the zygote has not."""
    import os
    import time

    deadline = time.monotonic() + wait / 2
    while True:  # the grader is ending the processes the cells left: room comes
        try:
            child = os.fork()
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            _reap()  # the cells' dead children hold their places until reaped
            time.sleep(0.05)
    if child == 0:
        try:
            _sealed_child(namespace, folder, wait, guard)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
