"""The benchmarks run: a GPU figure the book quotes comes from a script that still works."""

import json
import re
import subprocess
import sys

from autograder import paths


def test_the_gpu_benchmark_runs_and_records_machine_versions_and_date(tmp_path):
    out = tmp_path / "gpu_attention.json"
    run = subprocess.run(
        [sys.executable, "benchmarks/gpu_attention.py", str(out), "--device", "cpu",
         "--lengths", "64", "--reps", "1"],
        cwd=paths.REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads(out.read_text())
    assert {"device", "torch", "python", "date"} <= set(record["machine"])
    unfused = [r for r in record["rows"] if r["method"] == "unfused"]
    assert len(unfused) == 2 and all(
        r["ms"] > 0 for r in unfused
    )  # forward, and backward
    assert any(r["method"].startswith("course flash_attention") for r in record["rows"])
    # chapter 8's autograd function and chapter 11's Triton kernels (here through the
    # interpreter), forward and forward + backward, with the Triton version recorded
    assert record["machine"]["triton"] and record["machine"]["triton_interpreter"]
    for method in ("course FlashAttentionFunction", "Triton kernels, chapter 11"):
        rows = [r for r in record["rows"] if r["method"].startswith(method)]
        assert sorted(r["backward"] for r in rows) == [False, True], method
        assert all(r.get("ms", 0) > 0 for r in rows), rows


def test_the_kernel_tolerance_benchmark_prints_every_output_within_its_budget():
    run = subprocess.run(
        [sys.executable, "benchmarks/kernel_tolerance.py", "--seeds", "1"],
        cwd=paths.REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines()[2:]]
    assert {(who, name) for who, name, *_ in rows} == {
        (who, name)
        for who in ("independent", "reference")
        for name in ("out", "L", "dq", "dk", "dv")
    }
    assert all(float(used) < 1 for *_, used in rows), run.stdout


def test_the_submit_latency_benchmark_prints_median_worst_and_machine():
    run = subprocess.run(
        [sys.executable, "benchmarks/submit_latency.py", "--class-size", "2",
         "--window", "2"],
        cwd=paths.REPO, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith("2 students submitting within 2 s (seed 0)"), lines
    assert re.fullmatch(
        r"submit-to-feedback latency: median \d+\.\d s, worst \d+\.\d s \(goal: worst "
        r"<= 30 s: (met|NOT met)\)",
        lines[1],
    ), lines
    assert re.fullmatch(r"machine: .+, \d+ cores, .+, Python [\d.]+", lines[2]), lines
