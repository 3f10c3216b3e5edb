"""What a submission's sealed child writes is data, read at a cost bounded before loading
(issue 38): no unpickling, no decompression, no sparse or oversized file read, one byte
budget for all of a submission's result files, only the files of tests handed over."""

import json
import os
import pickle
import subprocess
import sys
import zipfile

import torch

from autograder import paths
from autograder.grading.judging import outcomes
from autograder.grading.sealed import probe, result_reader
from autograder.grading.sealed.result_reader import Budget, decode, read_file
from tests.notebooks import user_environment

MB = 2**20


def _write(path, outcome_list):
    path.write_bytes(probe.encode_result(outcome_list))
    return path


def test_a_result_comes_back_as_it_was_written(tmp_path):
    values = [
        {"value": [torch.randn(3, 4), torch.arange(5), torch.tensor(True), 2.5, "s"]},
        {"value": {"out": torch.randn(2, 1, 3).to(torch.bfloat16), "n": None}},
        {"value": torch.empty(0, 3)},
        {"value": torch.tensor(float("nan"))},
        {"error": "ValueError: bad"},
    ]
    got = decode(read_file(_write(tmp_path / "r", values), Budget(MB)))
    assert isinstance(got, list) and len(got) == 5
    first = got[0]["value"]
    assert torch.equal(first[0], values[0]["value"][0])
    assert (
        torch.equal(first[1], values[0]["value"][1]) and first[1].dtype == torch.int64
    )
    assert first[2].dtype == torch.bool and first[2].item() is True
    assert first[3:] == [2.5, "s"]
    assert torch.equal(got[1]["value"]["out"], values[1]["value"]["out"])
    assert got[2]["value"].shape == (0, 3)
    assert torch.isnan(got[3]["value"])
    assert got[4] == {"error": "ValueError: bad"}


def test_a_pickle_or_a_zip_is_no_result_and_runs_nothing(tmp_path):
    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    pickled = tmp_path / "p"
    pickled.write_bytes(pickle.dumps([Boom()]))
    torch.save([{"value": torch.ones(3)}], tmp_path / "t")  # the old format
    zipped = tmp_path / "z"
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("data", b"\0" * MB)
    for path in (pickled, tmp_path / "t", zipped):
        got = decode(read_file(path, Budget(32 * MB)))
        assert isinstance(got, str) and got.startswith(outcomes.UNREADABLE), got
    assert not (tmp_path / "ran").exists()


def test_a_sparse_file_is_refused_from_its_size_before_a_byte_is_read(tmp_path):
    sparse = tmp_path / "result_0.res"
    with open(sparse, "wb") as f:
        f.truncate(256 * MB)  # no disk used, 256 MB long
    budget = Budget(32 * MB)
    got = read_file(sparse, budget)
    assert isinstance(got, str) and "exceed 32 MB" in got
    assert budget.left == 32 * MB  # nothing was charged: nothing was read


def test_one_budget_holds_for_all_of_a_submissions_files(tmp_path):
    files = [
        _write(tmp_path / f"r{i}", [{"value": torch.zeros(MB // 4)}]) for i in range(5)
    ]
    budget = Budget(5 * MB // 2)  # each file is a little over 1 MB
    got = [read_file(path, budget) for path in files]
    assert [isinstance(g, bytes) for g in got] == [True, True, False, False, False]
    assert budget.left >= 0


def test_links_fifos_and_folders_are_not_followed(tmp_path):
    secret = _write(tmp_path / "secret", [{"value": 1}])
    (tmp_path / "link").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    for name in ("link", "fifo", "folder"):
        got = read_file(tmp_path / name, Budget(MB))
        assert isinstance(got, str) and got.startswith(outcomes.UNREADABLE), name
    assert read_file(tmp_path / "none", Budget(MB)) is None


def _raw(header: bytes, blob: bytes = b"") -> bytes:
    return probe.RESULT_MAGIC + len(header).to_bytes(4, "little") + header + blob


def _forged(header: dict, blob: bytes = b"") -> bytes:
    return _raw(json.dumps(header).encode(), blob)


def test_a_forged_header_costs_nothing_and_says_why():
    big = {"dtype": "float32", "shape": [2**20, 2**20], "offset": 0, "nbytes": 16}
    small = {"dtype": "float32", "shape": [4], "offset": 0, "nbytes": 16}
    cases = {
        # a tensor that claims far more bytes than the file holds
        "size does not match": _forged({"outcomes": [{"value": {"__tensor__": 0}}], "tensors": [big]}, b"\0" * 16),
        "not there": _forged({"outcomes": [{"value": {"__tensor__": 3}}], "tensors": []}),
        "type the grader": _forged({"outcomes": [], "tensors": [{**big, "dtype": "object"}]}),
        "header is larger": probe.RESULT_MAGIC + (2**31).to_bytes(4, "little") + b"{}",
        "not the probe's": _forged({"outcomes": [], "tensors": [], "x": 1}),
        "RecursionError": _raw(b'{"outcomes": ' + b"[" * 100_000 + b"]" * 100_000 + b', "tensors": []}'),
        # entries that all name the same bytes would each be decoded: refused
        "overlap or are out of order": _forged({"outcomes": [{"value": [{"__tensor__": 0}, {"__tensor__": 1}]}], "tensors": [small, small]}, b"\0" * 16),
        # a gap: bytes no entry names
        "out of order": _forged({"outcomes": [{"value": {"__tensor__": 0}}], "tensors": [{**small, "offset": 4}]}, b"\0" * 20),
        "referenced twice": _forged({"outcomes": [{"value": [{"__tensor__": 0}, {"__tensor__": 0}]}], "tensors": [small]}, b"\0" * 16),
        # a header past the cap, though the file is within the budget
        "header is larger than the file or the limit": _raw(json.dumps({"outcomes": [0] * 200_000, "tensors": []}).encode()),
    }  # fmt: skip
    for why, raw in cases.items():
        got = decode(raw)
        assert isinstance(got, str) and why in got, (why, got)


# Measures the grader's peak memory while it reads a 256 MB result file of each kind.
MEASURE = """
import os, resource, sys
from autograder.grading.sealed.result_reader import Budget, decode, read_file
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for name in os.listdir(sys.argv[1]):
    got = read_file(os.path.join(sys.argv[1], name), Budget(32 * 2**20))
    if isinstance(got, bytes):
        decode(got)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


def test_a_256_mb_result_leaves_the_graders_memory_within_its_bound(tmp_path):
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(256 * MB)
    with open(tmp_path / "dense", "wb") as f:  # real bytes on disk
        f.write(_forged({"outcomes": [], "tensors": []}))
        for _ in range(256):
            f.write(b"\0" * MB)
    # 1000 entries naming the same 8 MiB: decoded once per entry, 8 GB
    entry = {"dtype": "uint8", "shape": [8 * MB], "offset": 0, "nbytes": 8 * MB}
    aliased = {"outcomes": [{"value": {"__tensor__": i}} for i in range(1000)]}
    (tmp_path / "aliased").write_bytes(
        _forged({**aliased, "tensors": [entry] * 1000}, b"\0" * 8 * MB)
    )
    zipped = tmp_path / "zip"  # 256 MB of zeros deflated to about 256 KB
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("data", b"\0" * 256 * MB)
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tmp_path)],
        cwd=paths.REPO, capture_output=True, text=True, timeout=300,
        env=user_environment(PYTHONPATH=str(paths.REPO)),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    grown_mb = float(run.stdout.split()[-1])
    assert grown_mb < result_reader.MEMORY_FACTOR * 32, grown_mb
