"""A class graded in parallel into nbgrader's gradebook records what serial
``nbgrader autograde`` records; shards run as separate processes merge into one gradebook."""

import csv
import datetime
import json
import re
import shutil
import sqlite3
import subprocess
import sys

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder import paths
from autograder.grading.nbgrader_bridge import COURSE_ID
from autograder.grading.recording.autograde import in_shard
from autograder.grading.recording.provenance import TABLE, assignment_digest, recorded
from tests.browser import Browser, Site
from tests.notebooks import (
    class_course,
    gradebook_entries,
    release_notebook,
    student_notebook,
    user_environment,
)

pytestmark = pytest.mark.slow
CHAPTER = "03_self_attention"
DUE = datetime.datetime(2026, 1, 15, 12, 0, 0)


def _edited_locked_cell(nb):
    """A student who edited a locked cell: nbgrader restores it before grading."""
    for cell in nb.cells:
        if (
            cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            == "course_utils"
        ):
            cell.source += "\nprint('my own line')"
    return nb


SUBMISSIONS = {
    "alice": lambda: student_notebook(CHAPTER),
    "bob": lambda: release_notebook(CHAPTER),
    "carol": lambda: student_notebook(
        CHAPTER, lambda s: s.replace(" / math.sqrt(d_k)", "")
    ),
    "erin": lambda: student_notebook(CHAPTER),  # late: the late policy takes it all
    "frank": lambda: _edited_locked_cell(student_notebook(CHAPTER)),
    "gus": None,  # not a notebook: nbgrader cannot process it either way, the rest go on
}
TIMESTAMPS = {s: "2026-01-14 10:00:00.000000 UTC" for s in SUBMISSIONS} | {
    "erin": "2026-01-16 10:00:00.000000 UTC"
}


# the same times as an instructor who placed the submissions by hand writes them down
# for `autograde --timestamps` (erin's 11:00 in Berlin is 10:00 UTC)
HAND_TIMES = (
    "student_id,timestamp\n"
    + "".join(f"{s},2026-01-14 10:00:00\n" for s in SUBMISSIONS if s != "erin")
    + "erin,2026-01-16 11:00:00 Europe/Berlin\n"
)


def _course(root, stamped=True):
    class_course(
        root, CHAPTER, SUBMISSIONS, TIMESTAMPS if stamped else None
    )  # the course's config: late work 0
    _run(root, "-m", "nbgrader", "db", "assignment", "add", CHAPTER,
         f"--duedate={DUE.isoformat()}")  # fmt: skip
    return root


def _run(cwd, *args, status=0):
    run = subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=900,
        env=user_environment(PYTHONPATH=str(paths.REPO)),
    )  # fmt: skip
    assert run.returncode == status, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def _gradebook(root):
    """What the gradebook holds for each student (``gradebook_entries``)."""
    return gradebook_entries(root, CHAPTER, SUBMISSIONS)


def _feedback_text(root, student):
    notebook = root / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb"
    return "".join(
        o.get("evalue", "") + o.get("text", "")
        for cell in __import__("nbformat").read(notebook, as_version=4).cells
        for o in cell.get("outputs", [])
    )


@pytest.fixture(scope="module")
def courses(tmp_path_factory):
    base = tmp_path_factory.mktemp("class")
    serial, sharded = _course(base / "serial"), _course(base / "shard")
    parallel = _course(base / "par", stamped=False)  # placed by hand: no times
    (base / "times.csv").write_text(HAND_TIMES)
    _run(serial, "-m", "nbgrader", "generate_assignment", CHAPTER, "--force")
    # gus's file is no notebook: nbgrader says so and exits 1 after grading the rest
    serial_run = _run(serial, "-m", "nbgrader", "autograde", CHAPTER,
                      "--SandboxedExecute.seed=7", status=1)  # fmt: skip
    _run(serial, "-m", "nbgrader", "generate_feedback", CHAPTER)
    # the README's shortcut: no generate_assignment, the assignment is entered itself;
    # recording and feedback on two workers, each over half of the class
    run = _run(
        paths.REPO, "-m", "autograder", "autograde", CHAPTER, "--jobs", "2",
        "--feedback", "--seed", "7", "--course-dir", str(parallel),
        "--timestamps", str(base / "times.csv"), status=1,
    )  # fmt: skip
    shard_files = []
    for k in (1, 2):
        out = base / f"shard{k}.jsonl"
        _run(
            paths.REPO, "-m", "autograder", "autograde", CHAPTER, "--shard", f"{k}/2",
            "--seed", "7", "--course-dir", str(sharded), "--results", str(out),
        )  # fmt: skip
        shard_files.append(str(out))
    merged = _run(
        paths.REPO, "-m", "autograder", "merge", CHAPTER, *shard_files, "--jobs", "2",
        "--course-dir", str(sharded), status=1,
    )  # fmt: skip
    return serial, parallel, sharded, run, merged, serial_run


def test_parallel_autograde_records_what_serial_nbgrader_records(courses):
    serial, parallel, _, run, _, _ = courses
    expected = _gradebook(serial)
    assert _gradebook(parallel) == expected
    scores = {s: r["total"] for s, r in expected.items()}
    assert scores == {
        "alice": 10,
        "bob": 0,
        "carol": 4,  # her unscaled attention costs that exercise only
        "erin": 10,
        "frank": 10,
        "gus": 0,
    }
    assert (
        expected["erin"]["penalty"] == 10
    )  # raw score 10, late penalty 10: 0 in the export
    assert "NOT AUTOGRADED gus" in run.stdout  # nbgrader could not read it, either way
    # the parallel class was placed by hand, its times given with --timestamps: nbgrader
    # recorded the same times as the exchange's, and the same late penalty
    assert "time of erin: submitted 2026-01-16 10:00:00 UTC" in run.stderr
    assert "carry no time" not in run.stderr
    for student in set(SUBMISSIONS) - {"gus"}:
        assert _feedback_text(parallel, student) == _feedback_text(serial, student)
    # frank's edited locked cell is restored before his fingerprint is taken, as nbgrader
    # restores it: no one is graded a second time
    assert "graded again here" not in run.stderr
    assert "full marks" in run.stdout and "slowest:" in run.stdout
    # while it ran, the bar counted the grades as they came (before late penalties)
    (counts, *_) = re.findall(
        r"full=(\d+), zero=(\d+), problems=(\d+), not graded=(\d+)\]", run.stderr
    )[::-1]
    assert counts == ("3", "2", "2", "0"), counts  # bob and gus raised while running
    for root in (serial, parallel):  # nbgrader's own steps work unchanged after it
        _run(root, "-m", "nbgrader", "generate_feedback", CHAPTER)
        _run(root, "-m", "nbgrader", "export")
    assert (parallel / "grades.csv").read_text() == (serial / "grades.csv").read_text()
    assert (parallel / "feedback" / "bob" / CHAPTER / f"{CHAPTER}.html").is_file()


def _page(root, student):
    return (root / "feedback" / student / CHAPTER / f"{CHAPTER}.html").read_text()


def test_parallel_feedback_pages_are_serial_nbgraders(courses):
    """``autograde --jobs 2 --feedback`` writes, on its two workers, the very pages
    ``nbgrader generate_feedback`` writes after serial ``nbgrader autograde``; gus's
    file was no notebook, so neither way has a page for him."""
    serial, parallel, _, run, _, _ = courses
    for student in set(SUBMISSIONS) - {"gus"}:
        assert _page(parallel, student) == _page(serial, student), student
    for root in (serial, parallel):
        assert not (root / "feedback" / "gus").exists()
    assert "2 worker(s)" in run.stdout and "generate_feedback" in run.stdout


def test_shards_merge_into_the_same_gradebook(courses):
    serial, _, sharded, _, merged, _ = courses
    assert _gradebook(sharded) == _gradebook(serial)
    assert "graded" in merged.stdout


def test_every_grade_records_the_version_and_digest_that_graded_it(courses):
    """The gradebook's provenance table, the shards' results, the summary and the
    feedback page all name the course version and the digest that graded each grade."""
    serial, parallel, sharded, run, merged, _ = courses
    digest, version = assignment_digest(CHAPTER), paths.course_version()
    for root in (serial, parallel, sharded):
        rows = recorded(root / "gradebook.db", CHAPTER)
        # a row for every grade the grader made (gus's file is no notebook: nbgrader
        # enters him with nothing graded, and says so)
        assert set(rows) == set(_gradebook(root)) - {"gus"}, root
        for student, row in rows.items():
            assert (row["course_version"], row["digest"], row["seed"]) == (
                version, digest, 7,
            ), student  # fmt: skip
    for k in (1, 2):
        for line in (sharded.parent / f"shard{k}.jsonl").read_text().splitlines():
            result = json.loads(line)
            assert (result["course_version"], result["digest"]) == (version, digest)
    for out in (run.stdout, merged.stdout):
        assert f"graded by: course version {version}, digest {digest[:12]}" in out
        assert re.search(r"re-graded under another digest +0", out)
    notebook = parallel / "autograded" / "alice" / CHAPTER / f"{CHAPTER}.ipynb"
    note = nbformat.read(notebook, as_version=4).cells[0]
    assert note.metadata.get("autograder") == "provenance"
    assert digest in note.source and f"course version {version}" in note.source
    _run(sharded, "-m", "nbgrader", "generate_feedback", CHAPTER)
    page = (sharded / "feedback" / "alice" / CHAPTER / f"{CHAPTER}.html").read_text()
    assert digest in page and f"course version {version}" in page


def test_regrading_under_another_digest_says_so(courses, tmp_path):
    """A student whose recorded grade came from other tests (here: the provenance table
    says so) is re-graded: the summary names them, and nbgrader's log warns."""
    _, parallel, _, _, _, _ = courses
    root = tmp_path / "course"
    shutil.copytree(parallel, root)
    with sqlite3.connect(root / "gradebook.db") as db:
        db.execute(
            f"UPDATE {TABLE} SET digest = ?, course_version = ? WHERE student = ?",
            ("0" * 64, "0.9.0", "alice"),
        )
    run = _run(
        paths.REPO, "-m", "autograder", "autograde", CHAPTER, "--student", "alice",
        "--force", "--seed", "7", "--course-dir", str(root),
    )  # fmt: skip
    assert re.search(r"re-graded under another digest +1", run.stdout), run.stdout
    assert (
        "RE-GRADED UNDER ANOTHER DIGEST alice: was course version 0.9.0" in run.stdout
    )
    assert "alice: re-graded under another digest" in run.stderr
    assert recorded(root / "gradebook.db", CHAPTER)["alice"]["digest"] == (
        assignment_digest(CHAPTER)
    )


def test_the_summary_prints_scores_as_the_gradebook_records_them(courses):
    """erin handed in a right notebook a day late: the course config's late penalty
    ("zero") takes her 10 points, and the summary says 0, as the gradebook does."""
    serial, _, _, run, merged, _ = courses
    erin = _gradebook(serial)["erin"]
    assert (erin["total"], erin["penalty"]) == (10, 10)  # graded 10, penalty 10
    for out in (run.stdout, merged.stdout):
        assert "LATE erin: 0/10 recorded (10 graded, late penalty 10)" in out, out
        assert re.search(r"late \(after the due date\) +1\n", out), out
        assert re.search(r"full marks +2\n", out), out  # alice, frank; not erin
        assert re.search(r"zero +3\n", out), out  # bob (untouched), erin (late), gus
        assert not re.search(r"erin .* 10/10", out), out


def test_the_lms_export_gives_each_student_what_nbgrader_export_gives(
    courses, tmp_path
):
    """The class autograded for real (erin late, gus's file no notebook): each LMS's
    file carries, for every roster student, the score `nbgrader export` gives."""
    _, parallel, *_ = courses
    _run(parallel, "-m", "nbgrader", "export", "--to", str(tmp_path / "grades.csv"))
    with open(tmp_path / "grades.csv") as f:
        expected = {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}
    assert expected["erin"] == 0 and expected["alice"] == 10
    for lms, who in (("moodle", "Username"), ("blackboard", "Username")):
        out = tmp_path / f"{lms}.csv"
        run = _run(
            paths.REPO, "-m", "autograder", "export", "--lms", lms, "--assignment",
            CHAPTER, "--course-dir", str(parallel), "--out", str(out),
        )  # fmt: skip
        with open(out, encoding="utf-8") as f:
            got = {r[who]: float(r[CHAPTER]) for r in csv.DictReader(f)}
        assert got == expected
        assert f"LATE erin {CHAPTER}: 0 (graded 10, late penalty 10)" in run.stdout
        assert f"NOT AUTOGRADED gus {CHAPTER}" in run.stdout
        assert "PENALTY CHANGED" not in run.stdout  # the settings recorded it so


CHECKSUM_CHANGED = re.compile(r"Attribute 'checksum' for cell (\S+) has changed")


def test_only_an_edited_locked_cell_is_logged_as_changed(courses):
    """nbgrader #1961: the released hidden-test cells hold only comments, so nbgrader
    used to log "Attribute 'checksum' ... has changed!" for each of them in every
    submission. Now only frank's edited cell is logged, by serial nbgrader and by the
    parallel command alike."""
    *_, run, _, serial_run = courses
    for log in (serial_run.stderr, run.stderr):
        assert CHECKSUM_CHANGED.findall(log) == ["course_utils"], log[-3000:]


def test_no_sqlalchemy_warning_reads_like_an_error(courses):
    """nbgrader 0.9 with SQLAlchemy 2 warned "Object of type <SubmittedAssignment> not
    in session" for every new submission (harmless: the course config says why, and
    filters exactly that): not in serial nbgrader's log, the class run's or a merge's."""
    *_, run, merged, serial_run = courses
    for log in (serial_run.stderr, run.stderr, merged.stderr):
        assert "SAWarning" not in log and "not in session" not in log, log[-3000:]


def test_the_feedback_step_warns_of_no_option(courses):
    """nbconvert sets ``display_data_priority`` for every class it configures, and
    nbgrader's ``ClearHiddenTests`` does not take it as an option: the feedback step
    warned "Config option `display_data_priority` not recognized" for every page."""
    *_, run, _, _ = courses
    assert "GenerateFeedbackApp" in run.stderr  # the test of the test: its log is here
    assert "not recognized" not in run.stderr, run.stderr[-3000:]


# Measures the verdict that names carol's mistake at 1280 px: the <pre> holding it and
# its output box must not scroll sideways, and its right edge must lie in the window;
# the score in the page's heading too; and no word that fits on a line is split across
# two (a line may end at a space or a hyphen). Then the same without the course's CSS (the test of the test: nbgrader's own page
# fails it). And the math: MathML, none left raw; the contents and the "Read again" link.
FEEDBACK_PAGE = """
const splitWords = (pre) => {
  const split = [];
  const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
  const range = document.createRange();
  let node;
  while ((node = walker.nextNode())) {
    for (const m of node.data.matchAll(/[^\\s-]+/g)) {  // a hyphen may end a line
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const rects = [...range.getClientRects()].filter((r) => r.width > 0);
      const width = rects.reduce((sum, r) => sum + r.width, 0);  // laid out in one line
      if (new Set(rects.map((r) => Math.round(r.top))).size > 1 &&
          width < pre.clientWidth) split.push(m[0]);
    }
  }
  return split;
};
const measure = () => {
  const pre = [...document.querySelectorAll("div.output_area pre")]
    .find((p) => p.innerText.includes("Likely mistake"));
  const box = pre.parentElement;
  const score = document.querySelector(".panel-heading h1");
  return {
    text: pre.innerText, score: score.innerText,
    fits: pre.scrollWidth <= pre.clientWidth && box.scrollWidth <= box.clientWidth,
    inside: pre.getBoundingClientRect().right <= window.innerWidth &&
      score.getBoundingClientRect().right <= window.innerWidth,
    split: [...document.querySelectorAll("div.output_area pre")].flatMap(splitWords),
    wrap: getComputedStyle(pre).overflowWrap,
  };
};
const course = measure();
const readAgain = [...document.querySelectorAll("div.output_area pre a")]
  .map((a) => a.getAttribute("href"));
const contents = [...document.querySelectorAll("#toc li a")].map((a) => a.innerText);
const style = document.getElementById("course-feedback-style");
style.textContent += "pre { word-break: break-all; }";  // breaks words: the check sees it
const broken = measure().split;
style.remove();
const nbgrader = measure();
const markdown = [...document.querySelectorAll(".text_cell_render")];
return {
  course, nbgrader, width: window.innerWidth, readAgain, contents, broken,
  typeset: markdown.filter((c) => c.querySelector("math")).length,
  raw: markdown.filter((c) => c.innerText.includes("$")).map((c) => c.innerText),
};
"""


def test_the_feedback_page_shows_the_named_mistake_and_math_offline(courses):
    """carol's feedback page, opened with no network (tests/browser.py resolves no host
    but 127.0.0.1) at 1280 x 800: the score and the whole verdict naming her mistake
    (unscaled scores) in view, wrapped at spaces, with its "Read again" a link to the
    section; the hidden tests named in the contents; the chapter's math MathML, which
    the page carries with no script, in at most 200 KB (issue 44); axe-core finds no
    WCAG 2.1 A or AA violation."""
    _, parallel, *_ = courses
    _run(parallel, "-m", "nbgrader", "generate_feedback", CHAPTER, "--student",
         "carol", "--force")  # fmt: skip
    html = parallel / "feedback" / "carol" / CHAPTER / f"{CHAPTER}.html"
    assert html.stat().st_size <= 200_000, html.stat().st_size  # it was 2.6 MB
    assert "<script" not in html.read_text().lower()
    site = Site(html.parent, "/")
    browser = Browser()
    try:
        page, visit = browser.open(site.url + html.name)
        try:
            page.set_viewport_size({"width": 1280, "height": 800})
            seen = page.evaluate(f"async () => {{ {FEEDBACK_PAGE} }}")
        finally:
            page.context.close()
        violations = browser.accessibility_violations(site.url + html.name)
    finally:
        browser.close()
        site.close()
    assert seen["width"] == 1280
    assert "Likely mistake: your scores look unscaled" in seen["course"]["text"]
    assert "Score: 4" in seen["course"]["score"]  # her SelfAttention is right
    assert seen["course"]["fits"] and seen["course"]["inside"], seen["course"]
    assert seen["course"]["split"] == [] and seen["course"]["wrap"] == "break-word"
    assert seen["broken"], "the check saw no broken word"  # the test of the test
    assert not (seen["nbgrader"]["fits"] and seen["nbgrader"]["inside"])
    assert seen["typeset"] >= 5 and seen["raw"] == [], seen["raw"]
    section = paths.chapter_page(CHAPTER, "scaled-dot-product-attention")
    assert section in seen["readAgain"], seen["readAgain"]
    assert seen["contents"][0].startswith("sdpa_basic: output and weights"), seen
    assert not [c for c in seen["contents"] if c.startswith("Test cell")]
    assert visit.requested == [site.url + html.name], visit.requested
    assert not visit.errors, visit.errors
    assert violations == [], [(v["id"], v["nodes"][0]["html"]) for v in violations]


def test_shards_split_a_class_deterministically():
    students = [f"s{i:03d}" for i in range(200)]
    shards = [[s for s in students if in_shard(s, k, 4)] for k in (1, 2, 3, 4)]
    assert sorted(sum(shards, [])) == students  # each student in exactly one shard
    assert all(30 <= len(s) <= 70 for s in shards)


@pytest.mark.parametrize("command", ["nbgrader", "autograder"])
def test_a_refused_jail_records_nothing_in_the_gradebook(tmp_path, command):
    """Where the jail cannot start (here: unshare refused, as Docker's default seccomp
    profile does), both ways stop with exit status 3 before anything is recorded."""
    root = _course(tmp_path / "course")
    _run(root, "-m", "nbgrader", "generate_assignment", CHAPTER, "--force")
    deny = [
        str(paths.REPO / "tests" / "deny_syscalls.py"),
        "unshare",
        "--",
        sys.executable,
    ]
    if command == "nbgrader":
        run = _run(root, *deny, "-m", "nbgrader", "autograde", CHAPTER, status=3)
    else:
        run = _run(
            paths.REPO, *deny, "-m", "autograder", "autograde", CHAPTER,
            "--course-dir", str(root), status=3,
        )  # fmt: skip
    assert "The grading sandbox cannot start" in run.stderr
    assert not (root / "autograded").exists()
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE_ID) as gb:
        assert gb.find_assignment(CHAPTER).submissions == []


def test_a_course_root_that_cannot_load_the_grader_records_nothing(tmp_path):
    """nbgrader logs a config file that fails and goes on with its own defaults, which
    would run every submission unjailed and record its score: ours stops nbgrader
    instead (exit 3), before anything is graded. Here the course root lies outside the
    repository and nothing puts the grader on the path."""
    root = _course(tmp_path / "course")
    env = user_environment()
    run = subprocess.run(
        [sys.executable, "-m", "nbgrader", "autograde", CHAPTER],
        cwd=root, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert run.returncode == 3, run.stderr[-3000:]
    assert "cannot load the course's grader" in run.stderr
    assert not (root / "autograded").exists()
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE_ID) as gb:
        assert gb.find_assignment(CHAPTER).submissions == []
