"""The quadratic wall on a GPU: PyTorch's unfused attention against its fused kernels, the
course's own tiled ``flash_attention`` and ``FlashAttentionFunction`` (chapter 8) and the
Triton kernels of chapter 11 (``solutions/kernels.py``), time and peak memory, forward and
forward + backward.

    python benchmarks/gpu_attention.py OUT.json [--device cuda] [--lengths 1024 2048 ...]

Chapter 8 quotes GPU figures only from such a recording: the JSON this writes names the
machine (device, CPU count), the versions (Python, PyTorch, CUDA, Triton) and the date with every
row, so no figure is typed by hand. Run it on a GPU and commit its output under
``book/measurements/``. With ``--device cpu`` it runs anywhere (the test suite runs it so,
on small sizes, so that it cannot rot).

Each time is the mean of ``--reps`` calls after two warm-up calls (CUDA events on a GPU);
each memory figure is the peak allocated beyond the inputs (on a GPU only). "unfused" is
``F.scaled_dot_product_attention`` forced onto PyTorch's math path, which forms the n x n
matrix: the naive attention of chapter 3. The course's PyTorch loops run up to
``--loop-max`` (one Python step per tile: slow at large n on any device). Without a GPU the
Triton kernels run in Triton's interpreter (``solutions/kernels.py`` sets it up), which
times Python, not a kernel.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from solutions.efficient_attention import (  # noqa: E402
    flash_attention,
    flash_attention_autograd,
)
from solutions.kernels import FlashAttentionTriton, triton  # noqa: E402

BACKENDS = {
    "unfused": SDPBackend.MATH,
    "flash kernel": SDPBackend.FLASH_ATTENTION,
    "memory-efficient kernel": SDPBackend.EFFICIENT_ATTENTION,
}


def _sdpa(backend):
    def attend(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)

    return attend


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(fn, q, k, v, backward: bool, reps: int) -> tuple[float, float | None]:
    """Mean milliseconds per call, and the peak MiB allocated beyond the inputs (GPU)."""
    device = q.device.type

    def once():
        out = fn(q, k, v)
        if backward:
            out.sum().backward()
            q.grad = k.grad = v.grad = None

    for _ in range(2):
        once()
    _sync(device)
    base = None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    for _ in range(reps):
        once()
    _sync(device)
    ms = (time.perf_counter() - start) / reps * 1e3
    peak = None
    if device == "cuda":
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return ms, peak


def machine(device: str) -> dict:
    return {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device == "cuda" else None,
        "triton": triton.__version__,
        "triton_interpreter": os.environ.get("TRITON_INTERPRET") == "1",
        "date": datetime.date.today().isoformat(),
    }  # fmt: skip


def _float32(attend):
    """The course's own implementations take float32 (the kernels' tiles are float32)."""
    return lambda q, k, v: attend(q.float(), k.float(), v.float())


def run(
    device: str, lengths: list[int], reps: int, dtype: torch.dtype, loop_max: int
) -> list[dict]:
    batch, heads, d = (4, 16, 64) if device == "cuda" else (1, 2, 32)
    rows = []
    for n in lengths:
        for backward in (False, True):
            q, k, v = (
                torch.randn(batch, heads, n, d, device=device, dtype=dtype, requires_grad=backward)
                for _ in range(3)
            )  # fmt: skip
            ways = {name: _sdpa(b) for name, b in BACKENDS.items()}
            if not backward and n <= loop_max:  # the course's loop: forward only
                ways["course flash_attention (float32)"] = lambda q, k, v: (
                    flash_attention(q.float(), k.float(), v.float(), block_size=64)
                )
            if n <= loop_max:  # chapter 8's autograd function: its own backward
                ways["course FlashAttentionFunction (float32)"] = _float32(
                    flash_attention_autograd
                )
            ways["Triton kernels, chapter 11 (float32)"] = _float32(
                FlashAttentionTriton.apply
            )
            for name, fn in ways.items():
                row = {"n": n, "batch": batch, "heads": heads, "d": d, "dtype": str(dtype),
                       "backward": backward, "method": name}  # fmt: skip
                try:
                    row["ms"], row["peak_mib"] = measure(fn, q, k, v, backward, reps)
                except (
                    RuntimeError,
                    torch.OutOfMemoryError,
                ) as exc:  # a kernel this GPU lacks
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    if device == "cuda":
                        torch.cuda.empty_cache()
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the JSON file to write")
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu"
    )
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384]
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--loop-max", type=int, default=4096, help="the longest n for the PyTorch loops"
    )
    args = parser.parse_args(argv)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    record = {
        "machine": machine(args.device),
        "rows": run(args.device, args.lengths, args.reps, dtype, args.loop_max),
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
