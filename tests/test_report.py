"""The instructor's class report: a class of chapter-3 submissions with known mistakes
planted is autograded for real, and the report counts exactly what was planted."""

import csv
import importlib
import importlib.util
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import yaml
from docutils.nodes import make_id
from nbgrader.api import Gradebook
from PIL import Image

from autograder import paths
from autograder.grading.judging.spec import graded_chapters, load_chapter_tests
from autograder.grading.nbgrader_bridge import COURSE_ID
from autograder.grading.recording import verdict_record
from autograder.report import data
from tests.browser import Browser, Site
from tests.notebooks import (
    class_course,
    release_notebook,
    student_notebook,
    with_extra_cell,
)
from tests.test_class_autograde import _run

CHAPTER = "03_self_attention"
# set to a PNG path to save the picture of the report in the instructor guide:
# COURSE_REPORT_SCREENSHOT=book/images/class_report.png python -m pytest tests/test_report.py
SCREENSHOT = "COURSE_REPORT_SCREENSHOT"
SDPA = "scaled_dot_product_attention"

UNSCALED = ("/ math.sqrt(d_k)", "")
INVERTED_PADDING = ("(positions < lengths[:, None])", "(positions >= lengths[:, None])")
DELEGATES = """import torch.nn.functional as F


def scaled_dot_product_attention(q, k, v, mask=None):
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), weights
"""


ROSTER_ONLY = "ivy"


def _planted(old, new):
    """A submission with one known mistake planted in the reference answers."""
    return lambda: student_notebook(CHAPTER, lambda source: source.replace(old, new))


SUBMISSIONS = {
    "alice": lambda: student_notebook(CHAPTER),
    "bob": lambda: release_notebook(CHAPTER),  # untouched: NotImplementedError
    "carol": _planted(*UNSCALED),
    "dave": _planted(*UNSCALED),
    "erin": _planted(*INVERTED_PADDING),
    "frank": lambda: with_extra_cell(
        student_notebook(CHAPTER), DELEGATES, f"exercise_{SDPA}"
    ),
    "gus": None,  # no notebook at all: nbgrader cannot process it
    "hank": lambda: with_extra_cell(  # a cell that runs past its time limit
        student_notebook(CHAPTER), "while True:\n    pass", "exercise_causal_mask"
    ),
}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = class_course(
        tmp_path_factory.mktemp("report") / "course", CHAPTER, SUBMISSIONS
    )
    # ivy is on the roster and submitted nothing
    _run(root, "-m", "nbgrader", "db", "student", "add", ROSTER_ONLY)
    # hank's loop waits out its cell's 14 s: longer than the progress line's "runs long"
    run = _run(
        paths.REPO, "-m", "autograder", "autograde", CHAPTER, "--jobs", "2",
        "--seed", "7", "--cell-timeout", "14", "--course-dir", str(root), status=1,
    )  # fmt: skip
    (root / "autograde.log").write_text(run.stderr)
    for args in ([CHAPTER], [CHAPTER, "--names"], []):
        _run(paths.REPO, "-m", "autograder", "report", *args, "--course-dir", str(root))
    return root


@pytest.fixture(scope="module")
def browser():
    b = Browser()
    yield b
    b.close()


@pytest.mark.slow
def test_the_report_counts_what_the_class_did(course):
    a = data.read_assignment(course / "gradebook.db", CHAPTER)
    scores = {s.id: s.score for s in a.students}
    # carol's, dave's and frank's SelfAttention is right: their mistake (or refusal) in
    # scaled_dot_product_attention costs that exercise only (one mistake, charged once)
    assert scores == {"alice": 10, "bob": 0, "carol": 4, "dave": 4, "erin": 9,
                      "frank": 4, "hank": 10}  # fmt: skip
    mistakes = {(f.exercise, f.what): f.students for f in a.mistakes}
    assert mistakes[SDPA, "unscaled"] == ["carol", "dave"]
    (unscaled,) = [f for f in a.mistakes if (f.exercise, f.what) == (SDPA, "unscaled")]
    assert unscaled.section == paths.chapter_page(
        CHAPTER, "scaled-dot-product-attention"
    )
    assert mistakes["padding_mask", "inverted"] == ["erin"]
    assert {s for f in a.mistakes for s in f.students} == {"carol", "dave", "erin"}
    assert "SelfAttention" not in {f.exercise for f in a.mistakes}
    # the untouched notebook is no mistake: bob did not attempt any exercise, and is
    # kept out of the mistakes and of the candidates for a new known mistake
    exercises = {SDPA, "causal_mask", "padding_mask", "SelfAttention"}
    assert a.not_attempted == dict.fromkeys(exercises, ["bob"])
    assert a.unmatched == [] and a.no_result == {}
    # the class as it is: the roster, who submitted and who did not
    assert a.roster == sorted([*SUBMISSIONS, ROSTER_ONLY])
    assert a.submitted == sorted(SUBMISSIONS) and a.not_submitted == [ROSTER_ONLY]
    # the mean nbgrader export gives: everyone on the roster, gus and ivy as 0
    assert a.export_mean == pytest.approx(sum(scores.values()) / 9)
    # each hidden test's pass rate, of the 7 students with a grade
    passed = {t["test"]: t["passed"] for t in a.tests}
    assert set(passed) == {t.id for t in load_chapter_tests(CHAPTER).tests}
    assert passed["causal_mask_values"] == 6  # all but bob
    # frank's call of PyTorch's attention was refused by the guard, not a wrong answer
    assert {(r["student"], r["exercise"]) for r in a.refusals} == {("frank", SDPA)}
    assert all(
        r["route"] == f"PyTorch's attention ({SDPA}) switched off" for r in a.refusals
    )
    # and his code is flagged for review (no points taken for it)
    assert [r["student"] for r in a.for_review] == ["frank"]
    assert any("names PyTorch's attention" in f for f in a.for_review[0]["flags"])
    again = {t["student"]: t for t in a.to_grade_again}
    assert set(again) == {"gus", "hank"}
    assert again["gus"]["outcome"] == verdict_record.NOT_AUTOGRADED
    assert again["hank"]["limits"] == "time"
    assert "past its time limit" in again["hank"]["message"]
    # the feedback names the mistake and the section of the chapter that teaches it
    feedback = nbformat.read(
        course / "autograded" / "carol" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4
    )
    errors = [o.get("evalue", "") for c in feedback.cells for o in c.get("outputs", [])]
    address = paths.chapter_page(CHAPTER, "scaled-dot-product-attention")
    assert any(
        "Likely mistake: your scores look unscaled" in e
        and f"Read again: {address}" in e
        for e in errors
    )
    # and SelfAttention's feedback names the exercise to fix
    messages = [o.get("text", "") for c in feedback.cells for o in c.get("outputs", [])]
    assert any(f"Fix `{SDPA}` first" in m for m in messages), messages
    assert a.hardest_first()[0] == SDPA  # lost by bob, carol, dave, frank
    assert a.lost_by(SDPA) == 4 and a.lost_by("causal_mask") == 1
    assert a.lost_by("SelfAttention") == 1  # bob only: never attempted


@pytest.mark.slow
def test_the_progress_line_names_a_submission_that_runs_long(course):
    log = (course / "autograde.log").read_text()
    assert re.search(r"running long=hank 1\d s, full=", log), log[-2000:]
    assert "running long=alice" not in log  # seconds: never long


@pytest.mark.slow
def test_a_regrade_replaces_the_students_rows(course, tmp_path):
    """Recorded again (as a re-grade records it), carol's rows are replaced: her
    mistake is gone from the report, and she has one row per hidden test."""
    db = shutil.copy(course / "gradebook.db", tmp_path / "gradebook.db")
    _, verdicts = verdict_record.read(db, CHAPTER)
    tests = [v for v in verdicts if v["student"] == "alice"]
    result = {"tests": [{**v, "id": v["test"]} for v in tests], "message": ""}
    verdict_record.record_graded(db, CHAPTER, "carol", result)
    _, verdicts = verdict_record.read(db, CHAPTER)
    assert sorted(v["test"] for v in verdicts if v["student"] == "carol") == sorted(
        v["test"] for v in tests
    )
    a = data.read_assignment(db, CHAPTER)
    mistakes = {(f.exercise, f.what): f.students for f in a.mistakes}
    assert mistakes[SDPA, "unscaled"] == ["dave"]
    # carol's verdicts recorded here are no longer the gradebook's scores (as if her
    # three failed tests had been given full points by hand): the report counts them
    assert a.hand_changed == 3
    # a score the instructor changed by hand counts as they set it, and is counted
    with Gradebook(f"sqlite:///{db}", COURSE_ID) as gb:
        gb.find_grade("sdpa_basic", CHAPTER, CHAPTER, "dave").manual_score = 2.0
        gb.db.commit()
    a = data.read_assignment(db, CHAPTER)
    assert a.hand_changed == 4
    assert {s.id: s.score for s in a.students}["dave"] == 6


@pytest.mark.slow
def test_the_csv_holds_the_pages_numbers_and_hides_names(course):
    rows = list(csv.DictReader(open(course / "reports" / f"{CHAPTER}.csv")))
    totals = sorted(float(r["score"]) for r in rows if r["exercise"] == "(total)")
    assert totals == [0, 4, 4, 4, 9, 10, 10]
    unscaled = [
        r for r in rows if r["exercise"] == SDPA and "unscaled" in r["mistakes"]
    ]
    assert len(unscaled) == 2
    apart = {(r["student"], r["exercise"]) for r in rows if r["set_apart"]}
    assert len(apart) == 4  # bob's four exercises, not attempted
    assert all(r["set_apart"] in ("", "not attempted") for r in rows)
    assert all(r["student"].startswith("student ") for r in rows)
    named = list(csv.DictReader(open(course / "reports" / f"{CHAPTER}-named.csv")))
    assert {r["student"] for r in named} == set(SUBMISSIONS) - {"gus"}


@pytest.mark.slow
def test_names_are_shown_only_when_asked(course):
    hidden = (course / "reports" / f"{CHAPTER}.html").read_text()
    hidden += (course / "reports" / "class.html").read_text()
    named = (course / "reports" / f"{CHAPTER}-named.html").read_text()
    for student in SUBMISSIONS:
        assert student not in hidden
    # no path of the grading machine on the page that can be shared
    assert str(course) not in hidden and str(paths.REPO) not in hidden
    assert "/tmp" not in hidden and "/home" not in hidden
    for student in set(SUBMISSIONS) - {"alice"}:  # full marks: in no list to name
        assert student in named  # the test of the test: the same check finds them


@pytest.mark.slow
@pytest.mark.parametrize("page", [f"reports/{CHAPTER}.html", "reports/class.html"])
def test_the_page_is_self_contained_and_accessible(course, browser, page, tmp_path):
    site = Site(course, "/")
    try:
        script = """return [...document.querySelectorAll('img, svg')].map(
            e => e.getAttribute('alt') || e.getAttribute('aria-label') || '')"""
        shot = os.environ.get(SCREENSHOT) if "class" not in page else None
        visit = browser.visit(site.url + page, script, Path(shot) if shot else None)
        if shot:  # the instructor guide's picture: the top of the page
            with Image.open(shot) as image:
                image.crop((0, 0, image.width, min(image.height, 1700))).save(shot)
        assert visit.requested == [site.url + page] and not visit.errors
        assert visit.value and all(len(alt) > 40 for alt in visit.value)
        assert browser.accessibility_violations(site.url + page) == []
        # the test of the test: a page that loads anything else is caught
        leaky = course / "leaky.html"
        leaky.write_text(
            (course / page)
            .read_text()
            .replace(
                "</main>", '<img src="/elsewhere.png" alt="a picture elsewhere"></main>'
            )
        )
        assert browser.visit(site.url + "leaky.html", "return 1").requested != [
            site.url + "leaky.html"
        ]
    finally:
        site.close()
    if page.endswith("class.html"):
        text = (course / page).read_text()
        assert "Heat map of 7 students by 4 exercises" in text


def _heading_ids(chapter: str) -> set[str]:
    """The ids the book gives the chapter's headings (docutils' ``make_id`` of their
    text), read from its MyST source outside code cells."""
    ids, fenced = set(), False
    for line in paths.chapter_source(chapter).read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            ids.add(make_id(re.sub(r"[`*$]", "", line.lstrip("#"))))
    return ids


def test_every_section_a_mistake_links_to_is_a_heading_of_its_chapter():
    for chapter in graded_chapters():
        for m in load_chapter_tests(chapter).mistakes:
            if m.section:
                teaches, anchor = m.section.split("#")
                assert anchor in _heading_ids(teaches), (
                    f"{chapter}: {m.exercise} {m.name!r}"
                )
    # chapters 3 and 4 link every known mistake they define
    for chapter in (CHAPTER, "04_multi_head"):
        module = importlib.import_module(
            f"autograder.known_mistakes.{paths.module_name(chapter)}"
        )
        assert all(m.section.startswith(f"{chapter}#") for m in module.MISTAKES)
    # the test of the test: headings are found, code comments are not
    ids = _heading_ids(CHAPTER)
    assert "exercise-3-a-self-attention-layer" in ids and "learning-goals" in ids
    assert not any(i.startswith("book-build-only") for i in ids)
    built = os.environ.get("COURSE_BUILT_BOOK")  # a built book: its pages have the ids
    if built:
        page = Path(built) / "chapters" / CHAPTER / f"{CHAPTER}.html"
        for m in load_chapter_tests(CHAPTER).mistakes:
            assert f'id="{m.section.split("#")[1]}"' in page.read_text()


def test_the_feedbacks_links_lead_to_the_books_address():
    """The address in "Read again" is the one the book is published at (its
    ``html_baseurl``, set by book/_ext from the same _config.yml)."""
    spec = importlib.util.spec_from_file_location(
        "course_book", paths.REPO / "book" / "_ext" / "course_book.py"
    )
    course_book = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(course_book)
    url = yaml.safe_load((paths.REPO / "_config.yml").read_text())["repository"]["url"]
    config = SimpleNamespace(
        html_theme_options={"repository_url": url}, root_doc="intro"
    )
    course_book.publish_under_project_path(None, config)
    assert paths.book_address() == config.html_baseurl


def test_the_feedbacks_links_lead_to_the_edition_when_students_read_it(
    tmp_path, monkeypatch
):
    """A course taught for credit publishes only the student edition's book: with
    ``edition.feedback_links_here`` the links lead there."""
    config = yaml.safe_load((paths.REPO / "_config.yml").read_text())
    (tmp_path / "_config.yml").write_text(yaml.safe_dump(config))
    monkeypatch.setattr(paths, "REPO", tmp_path)
    assert paths.book_address() == paths.pages_address(config["repository"]["url"])
    config["edition"]["feedback_links_here"] = True
    (tmp_path / "_config.yml").write_text(yaml.safe_dump(config))
    edition_book = paths.pages_address(config["edition"]["url"])
    assert (
        paths.book_address()
        == edition_book
        != paths.pages_address(config["repository"]["url"])
    )
    assert paths.chapter_page(CHAPTER, "x").startswith(edition_book)


def test_plain_nbgrader_records_why_a_submission_was_not_graded(tmp_path):
    """``nbgrader autograde`` records no grade for a submission a grader fault spoiled;
    the bridge records the attempt and its reason for the report's list to grade again."""
    from autograder.grading.nbgrader_bridge import _record_verdicts

    db = tmp_path / "gradebook.db"
    info = {"student": "ivy", "db_url": f"sqlite:///{db}"}
    why = "not graded: grader fault: killed from outside. This is no grade: grade again"
    _record_verdicts(info, CHAPTER, {"graded": False, "message": why, "tests": []})
    attempts, verdicts = verdict_record.read(db, CHAPTER)
    assert attempts["ivy"]["outcome"] == verdict_record.NOT_GRADED
    assert attempts["ivy"]["message"] == why and verdicts == []
