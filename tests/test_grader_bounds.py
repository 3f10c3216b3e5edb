"""The grader's own resources are bounded, whatever a submission sends, and its feedback
pages run nothing the student wrote (issue 22).

Outputs and widget (comm) messages are counted and dropped, not stored; results written
by the student's kernel are validated (``outcomes.py``) and verdict messages capped, so
an oversized or malformed one costs only the affected tests, with a message. Feedback
pages are sanitised (``safe_feedback.py``), checked in headless Chromium."""

import json
import random
import shutil
import subprocess
import sys
import textwrap

import nbformat
import pytest
import torch

from autograder import paths
from autograder.grading.judging import judge
from autograder.grading.judging.prepare import prepare
from autograder.grading.judging.spec import load_chapter_tests
from autograder.grading.running.student_code import StudentCode
from tests.browser import Browser, Site
from tests.notebooks import (
    student_notebook,
    user_environment,
    with_extra_cell,
    write,
)

CHAPTER = "03_self_attention"
HUGE_ERROR = 20_000_000  # characters of a forged error message

# A cell that sends 1.5 GB of widget state, 1 MB at a time.
COMM_FLOOD = """
from comm import create_comm
chunk = 'x' * 2**20
state = {'_model_module': 'm', '_model_name': 'n'}
c = create_comm(target_name='jupyter.widget', data={'state': state, 'buffer_paths': []})
for i in range(1500):
    c.send(data={'method': 'update', 'state': {f'k{i}': chunk}, 'buffer_paths': []})
"""

# Replaces open(), which the probe uses to write each hidden test's result file, so that
# the 1st test's result becomes a 20 MB error, the 4th's outcomes lack their keys and the
# 5th's is no list. Test i writes result_i.res (probe.result_name).
FORGE_RESULTS = f"""
import builtins, json
_real_open = builtins.open

def _result(outcomes):
    header = json.dumps({{"outcomes": outcomes, "tensors": []}}).encode()
    return b"AGR1" + len(header).to_bytes(4, "little") + header

class _Forging:
    def __init__(self, file, name):
        self.file, self.name = file, name
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.file.close()
    def write(self, data):
        if "result_0.res" in self.name:
            data = _result([{{"error": "E" * {HUGE_ERROR}}}])
        elif "result_3.res" in self.name:
            data = _result([{{"valu": 1}}])
        elif "result_4.res" in self.name:
            data = _result("passed")
        return self.file.write(data)

def _open(file, mode="r", *args, **kwargs):
    opened = _real_open(file, mode, *args, **kwargs)
    return _Forging(opened, str(file)) if "result_" in str(file) else opened

builtins.open = _open
"""
FORGED = {"sdpa_basic", "causal_mask_values", "padding_mask_values"}

# Grades one notebook in a fresh process; prints the result and how much the grading
# process's peak memory grew while it graded (after the course's imports).
GRADE_AND_MEASURE = """
import json, resource, sys
from autograder.grading.grade import grade_notebook
from autograder.grading.judging.spec import load_chapter_tests
load_chapter_tests(sys.argv[2]).reference()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = grade_notebook(sys.argv[1], sys.argv[2], seed=7)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"result": result, "grown_mb": grown / 1024}))
"""


def _grade_and_measure(path):
    run = subprocess.run(
        [sys.executable, "-c", GRADE_AND_MEASURE, str(path), CHAPTER],
        cwd=paths.REPO, capture_output=True, text=True, timeout=600,
        env=user_environment(PYTHONPATH=str(paths.REPO)),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def _with_cell(source):
    return with_extra_cell(student_notebook(CHAPTER), source, "exercise_SelfAttention")


@pytest.mark.slow
def test_a_flood_of_widget_messages_costs_the_grader_little(tmp_path):
    graded = _grade_and_measure(write(_with_cell(COMM_FLOOD), tmp_path / "c.ipynb"))
    result = graded["result"]
    assert result["graded"] and result["score"] == 10.0, result
    assert "printed more than 10 MB and was interrupted" in result["message"]
    # without the cap, nbclient kept every message's widget state: +2.3 GB
    assert graded["grown_mb"] < 300, graded["grown_mb"]


@pytest.mark.slow
def test_forged_results_fail_only_their_tests_with_a_message(tmp_path):
    graded = _grade_and_measure(write(_with_cell(FORGE_RESULTS), tmp_path / "f.ipynb"))
    result = graded["result"]
    assert result["graded"], result["message"]  # the student's doing, no grader fault
    tests = {t["id"]: t for t in result["tests"]}
    for test_id, test in tests.items():
        # reading the code takes no point: only the forged files' tests fail
        assert test["passed"] == (test_id not in FORGED), test
        assert len(test["message"]) <= judge.MAX_MESSAGE
    # the forged 20 MB error is past the header's limit: no result, as for the others
    for test_id in ("sdpa_basic", "causal_mask_values", "padding_mask_values"):
        assert "could not be read" in tests[test_id]["message"], tests[test_id]
    assert len(json.dumps(result)) < 20_000
    assert graded["grown_mb"] < 300, graded["grown_mb"]


# In the sealed child, the first call writes five sparse result files of 256 MB (no disk
# used) for the tests still to come, and ends the child; the cells leave one more before
# the window opens. Read whole, they cost the grader 1.5 GB per notebook.
SPARSE_RESULTS = """
import os
from ipykernel import get_connection_file
_kernel, _folder = os.getpid(), os.path.dirname(get_connection_file())
_answer = scaled_dot_product_attention

def scaled_dot_product_attention(q, k, v, mask=None):
    if os.getpid() != _kernel:  # the sealed child
        for i in range(1, 6):
            with open(os.path.join(_folder, f"result_{i}.res"), "wb") as f:
                f.truncate(256 * 2**20)
        os._exit(0)
    return _answer(q, k, v, mask)

with open(os.path.join(_folder, "result_7.res"), "wb") as f:
    f.truncate(256 * 2**20)
"""


@pytest.mark.slow
def test_sparse_result_files_leave_the_grader_within_its_bound(tmp_path):
    graded = _grade_and_measure(write(_with_cell(SPARSE_RESULTS), tmp_path / "s.ipynb"))
    result = graded["result"]
    # the first phase's results (the masks) were read before the second phase began:
    # the sparse files written over them later change nothing
    passed = {t["id"] for t in result["tests"] if t["passed"]}
    assert result["graded"] and passed == {"causal_mask_values", "padding_mask_values"}
    messages = " ".join(t["message"] for t in result["tests"])
    assert "could not be read" in messages or "ended" in messages, messages
    # read whole, the files would have cost 6 x 256 MB
    assert graded["grown_mb"] < 300, graded["grown_mb"]


def test_a_verdict_message_is_capped():
    long = judge.Verdict("t", 1.0, False, "x" * HUGE_ERROR)
    assert len(long.message) == judge.MAX_MESSAGE and long.message.endswith("...")


# Junk a forged result may hold, and containers to nest it in.
def _junk(rng, depth=0):
    leaves = [
        None, True, 3, -(10**400), 1.5, float("nan"), "s", "y" * 50_000, b"bytes",
        (1, 2), {1, 2}, {"unsupported": 7}, {3: "non-str key"}, torch.float32,
        torch.ones(3), torch.ones(2, 2, dtype=torch.bool), torch.zeros(1).expand(2**40),
        torch.ones(3).to_sparse(), torch.empty(3, device="meta"),
        torch.nn.Parameter(torch.ones(2)), torch.ones(2, 3, 4).transpose(0, 2),
        torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8),
    ]  # fmt: skip
    if depth > 8 or rng.random() < 0.4:
        return rng.choice(leaves)
    if rng.random() < 0.5:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["value", "error", "used", "x"]): _junk(rng, depth + 1)}


def _junk_outcome(rng):
    keys = rng.sample(["value", "error", "used", "extra"], rng.randrange(4))
    if rng.random() < 0.5:
        keys = ["value"] + rng.sample(["used", "extra"], rng.randrange(2))
    return {k: _junk(rng) for k in keys} if rng.random() < 0.9 else _junk(rng)


def test_the_judge_never_raises_on_what_a_result_may_hold():
    """Whatever outcomes the student's code wrote, a verdict with a short message."""
    tests = load_chapter_tests(CHAPTER)
    rng = random.Random(22)
    code = StudentCode([], [])
    for prepared in prepare(tests, tests.tests, seed=7):
        n = len(prepared.cases)
        for _ in range(15):
            got = [_junk_outcome(rng) for _ in range(n)]
            if rng.random() < 0.1:
                got = rng.choice([got[:-1], got * 2, "passed", {"value": 1}])
            found = judge.verdict(tests, prepared, got, code)
            assert not found.passed and len(found.message) <= judge.MAX_MESSAGE


def test_the_validator_keeps_what_the_probe_writes_and_bounds_the_rest():
    from autograder.grading.judging import outcomes

    good = [{"value": [torch.ones(2), 3, "s", None]}, {"error": "E"}]
    assert outcomes.validated(good, 2)[0]["value"][1] == 3
    assert isinstance(outcomes.validated(good, 3), str)
    assert isinstance(outcomes.validated("passed"), str)
    (cut,) = outcomes.validated([{"error": "E" * HUGE_ERROR}])
    assert len(cut["error"]) == outcomes.MAX_ERROR
    for bad in (
        {"value": torch.zeros(1).expand(2**40)},  # 1 element stored, 2**40 seen
        {"value": torch.ones(3).to_sparse()},
        {"value": 10**400},
        {"valu": 1},
        {"value": 1, "error": "both"},
        {"error": "E", "used": ["a name the old watch wrote"]},
        {"value": {"k" * (outcomes.MAX_NAME + 1): 1}},
    ):
        (refused,) = outcomes.validated([bad])
        assert set(refused) == {"error"} and outcomes.UNREADABLE in refused["error"]


# Feedback pages -------------------------------------------------------------------------

HOSTILE_MARKDOWN = """
## My notes
<script>document.title = 'pwned'; window.pwned = 'markdown'</script>
<img src=x onerror="window.pwned = 'onerror'">
<img src="http://evil.example/track.png">
<a href="javascript:window.pwned = 'link'">a link</a>

TeX asks for links and styles: $\\href{javascript:window.pwned='tex'}{a link}$,
$\\mmlToken{mi}[href=javascript:window.pwned='token']{a}$,
$\\style{background:url(http://evil.example/tex.png)}{b}$, $\\require{html}$,
$\\text{<script>window.pwned='text'</script>}$, $x</math><img src=x onerror="window.pwned='math'">$,
$$\\class{x}{\\cssId{top}{\\href{javascript:window.pwned='display'}{y}}}$$
and one formula nested too deep to convert: ${{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{x}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}$
"""
HOSTILE_OUTPUTS = [
    nbformat.v4.new_output(
        "display_data",
        data={"text/html": "<b>bold</b><script>window.pwned = 'html'</script>"},
    ),
    nbformat.v4.new_output(
        "display_data",
        data={
            "image/svg+xml": '<svg xmlns="http://www.w3.org/2000/svg" '
            "onload=\"window.pwned = 'svg'\"><script>window.pwned = 'svg'</script></svg>"
        },
    ),
    nbformat.v4.new_output(
        "display_data", data={"application/javascript": "window.pwned = 'js'"}
    ),
]


def _hostile_submission():
    nb = _with_cell(FORGE_RESULTS)
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(HOSTILE_MARKDOWN))
    nb.cells.insert(
        2, nbformat.v4.new_raw_cell("<script>window.pwned = 'raw'</script>")
    )
    return nb


@pytest.fixture(scope="module")
def feedback(tmp_path_factory):
    """nbgrader autograde and generate_feedback in a copy of the course root: alice's
    submission forges results and holds scripts, bob's is right."""
    root = tmp_path_factory.mktemp("course")
    shutil.copy(paths.COURSE_ROOT / "nbgrader_config.py", root)
    shutil.copytree(paths.COURSE_ROOT / "source", root / "source")

    def nbgrader(*args):
        run = subprocess.run(
            [sys.executable, "-m", "nbgrader", *args], cwd=root, capture_output=True,
            text=True, timeout=900, env=user_environment(PYTHONPATH=str(paths.REPO)),
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    nbgrader("generate_assignment", CHAPTER, "--force")
    for student, nb in (
        ("alice", _hostile_submission()),
        ("bob", student_notebook(CHAPTER)),
    ):
        nbgrader("db", "student", "add", student)
        folder = root / "submitted" / student / CHAPTER
        folder.mkdir(parents=True)
        write(nb, folder / f"{CHAPTER}.ipynb")
    nbgrader("autograde", CHAPTER, "--force")
    # autograde clears outputs; a pipeline that kept them must not run them either
    autograded = root / "autograded" / "alice" / CHAPTER / f"{CHAPTER}.ipynb"
    nb = nbformat.read(autograded, as_version=4)
    next(c for c in nb.cells if c.cell_type == "code").outputs = HOSTILE_OUTPUTS
    size = autograded.stat().st_size
    nbformat.write(nb, autograded)
    nbgrader("generate_feedback", CHAPTER, "--force")
    return root, size


def test_forged_results_leave_the_autograded_notebook_and_feedback_small(feedback):
    root, autograded_size = feedback
    page = root / "feedback" / "alice" / CHAPTER / f"{CHAPTER}.html"
    assert autograded_size < 150_000, autograded_size  # the release notebook: 66 KB
    # the page stays small, and carries no script (its math is MathML)
    size = page.stat().st_size
    assert size < 300_000, size
    assert "<script" not in page.read_text().lower()
    bob = (root / "feedback" / "bob" / CHAPTER / f"{CHAPTER}.html").read_text()
    assert bob.count("HiddenTestFailed") == 0  # the other student lost nothing


def test_the_feedback_page_runs_no_student_script(feedback, tmp_path):
    root, _ = feedback
    site = Site(root / "feedback" / "alice" / CHAPTER, "/")
    browser = Browser()
    try:
        seen = browser.visit(
            site.url + f"{CHAPTER}.html",
            textwrap.dedent("""
                await new Promise((done) => setTimeout(done, 1000));  // onerror, onload
                for (const a of document.querySelectorAll("a, [href]")) {
                  if (a.textContent === "a link" || a.closest("math")) {
                    a.dispatchEvent(new MouseEvent("click", {bubbles: true}));
                  }
                }
                const links = [...document.querySelectorAll("[href]")];
                return {title: document.title, pwned: String(window.pwned),
                        text: document.body.innerText,
                        math: document.querySelectorAll("math").length,
                        asText: [...document.querySelectorAll("code.tex-inline")]
                          .map((c) => c.textContent),
                        styled: document.querySelectorAll(
                          "math [style], math [href], math [class], math [id]").length,
                        scripts: links.map((a) => a.getAttribute("href"))
                          .filter((h) => /^\\s*javascript:/i.test(h))};
            """),
        )
    finally:
        browser.close()
        site.close()
    report = seen.value
    assert report["pwned"] == "undefined", report["pwned"]
    assert report["math"] > 0 and report["scripts"] == [], report["scripts"]
    assert report["styled"] == 0  # TeX's links, styles, classes and ids were dropped
    assert any(t.startswith("${{{{") for t in report["asText"]), report["asText"]
    assert report["title"] != "pwned"
    assert not [u for u in seen.requested if "evil.example" in u], seen.requested
    # the course's content and the verdicts still show
    assert "My notes" in report["text"] and "bold" in report["text"]
    assert "HiddenTestFailed" in report["text"]
    assert "could not be read" in report["text"]


def test_a_huge_scratch_cell_is_not_graded_and_costs_the_grader_little(tmp_path):
    """6 MB of code in a scratch cell: parsed, it took 1.1 GB of the grader's memory. Its
    size is read before a line is parsed: not graded, with a message that says why."""
    scratch = "numbers = [" + ",".join(["1"] * 3_000_000) + "]\n"
    graded = _grade_and_measure(write(_with_cell(scratch), tmp_path / "big.ipynb"))
    result = graded["result"]
    assert not result["graded"], result["message"]
    assert "KB, more than the 256 KB the grader reads" in result["message"]
    assert graded["grown_mb"] < 100, graded["grown_mb"]


# Reads the largest code the grader reads (just under ``Limits.code_kb``), the way
# grading does (flags once, a remark per test), in a fresh process; prints the peak of
# what it allocated meanwhile (tracemalloc: the process's own peak may predate it).
READ_AND_MEASURE = """
import json, sys, tracemalloc
from autograder.grading.judging import delegation
from autograder.grading.running.limits import Limits
delegation.flags(["import torch"], [("f", ("sdpa",))], [], "08_efficient_attention")
body = "".join(
    f"    x{i} = torch.nn.functional.softmax(q.a.b + getattr(x{i - 1}, 'c'), -1)\\n"
    for i in range(1, 100_000)
)
answer = "import torch\\ndef f(q, x0=0):\\n"
while len(answer) < Limits().code_kb * 1024 * 0.8:
    answer += body[len(answer) : len(answer) + 4096]
answer = answer[: answer.rfind("\\n") + 1] + "    return q\\n"
scratch = "numbers = [" + ",".join(["1"] * 20_000) + "]\\n"
assert len(answer) + len(scratch) < Limits().code_kb * 1024
tracemalloc.start()
found = delegation.flags([answer, scratch], [("f", ("sdpa", "softmax"))], [],
                         "08_efficient_attention")
for _ in range(3):
    delegation.remarks([answer, scratch], "f", ("sdpa", "softmax"))
grown = tracemalloc.get_traced_memory()[1]
print(json.dumps({"flags": found, "grown_mb": grown / 2**20}))
"""


def test_reading_the_largest_code_it_reads_costs_the_grader_under_100_mb():
    run = subprocess.run(
        [sys.executable, "-c", READ_AND_MEASURE],
        cwd=paths.REPO, capture_output=True, text=True, timeout=600,
        env=user_environment(PYTHONPATH=str(paths.REPO)),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    measured = json.loads(run.stdout.splitlines()[-1])
    assert 10 < measured["grown_mb"] < 100, measured  # it did read the code
