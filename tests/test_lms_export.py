"""``python -m autograder export --lms ...``: a small gradebook filled through nbgrader's
own API (late penalties recorded by nbgrader's own ``AssignLatePenalties`` step), and
each LMS's grade-import CSV checked exactly: header, rows, penalties, missing work."""

import csv
import datetime
import io
import subprocess

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.preprocessors import AssignLatePenalties
from traitlets.config import Config

from autograder import paths
from autograder.__main__ import main
from autograder.grading.nbgrader_bridge import COURSE_ID
from tests.notebooks import class_course

CH3, CH4 = "03_self_attention", "04_multi_head"
DUE = datetime.datetime(2026, 1, 15, 12, 0, 0)  # UTC, as nbgrader stores it
ON_TIME, LATE = DUE - datetime.timedelta(hours=2), DUE + datetime.timedelta(days=1)
STUDENTS = {
    "alice": dict(first_name="Alice", last_name="Liddell", email="alice@uni.example",
                  lms_user_id="1001"),
    "bob": dict(first_name="Bob", last_name="Ng, Jr.", lms_user_id="1002"),
    "carol": {},  # no names: her id stands for her name in Canvas's Student column
    "dave": dict(first_name="Dave", last_name="Ore"),
    "erin": dict(first_name="Erin", last_name="Vale"),
    "frank": dict(first_name="Frank", last_name="Moss"),
}  # fmt: skip
# (assignment, student): (score of each cell, submitted at, penalty method then)
SUBMITTED = {
    (CH3, "alice"): ((6, 4), ON_TIME, "zero"),
    (CH3, "bob"): ((6, 0.5), ON_TIME, "zero"),
    (CH3, "erin"): ((6, 4), LATE, "zero"),  # late: the course gives late work 0
    # late, recorded when the course said "none": the settings now say "zero"
    (CH3, "frank"): ((6, 4), LATE, "none"),
    (CH4, "alice"): ((3.5,), None, "zero"),
}
CELLS = {CH3: (6, 4), CH4: (5,)}
pytestmark = pytest.mark.filterwarnings(
    "ignore:Object of type <Submitted"  # nbgrader's own, as the course config filters
)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course root with the course's config; carol's CH3 was collected but never
    autograded (a folder in submitted/, nothing in the gradebook); dave submitted
    nothing."""
    root = class_course(tmp_path_factory.mktemp("lms") / "course", CH3, {})
    (root / "submitted" / "carol" / CH3).mkdir(parents=True)
    url = f"sqlite:///{root / 'gradebook.db'}"
    with Gradebook(url, COURSE_ID) as gb:
        for student, fields in STUDENTS.items():
            gb.add_student(student, **fields)
        for assignment, cells in CELLS.items():
            gb.add_assignment(assignment, duedate=DUE if assignment == CH3 else None)
            gb.add_notebook(assignment, assignment)
            for i, points in enumerate(cells):
                gb.add_grade_cell(f"test_{i}", assignment, assignment,
                                  max_score=points, cell_type="code")  # fmt: skip
        for (assignment, student), (scores, at, _) in SUBMITTED.items():
            gb.add_submission(assignment, student, timestamp=at)
            if student != "bob":  # bob's notebook nbgrader could not process
                (root / "autograded" / student / assignment).mkdir(parents=True)
            for i, score in enumerate(scores):
                gb.find_grade(
                    f"test_{i}", assignment, assignment, student
                ).auto_score = score
            gb.db.commit()
    for (assignment, student), (_, _, method) in SUBMITTED.items():
        # what nbgrader's autograde does after the scores: its late-penalty step
        step = AssignLatePenalties(
            config=Config({"LateSubmissionPlugin": {"penalty_method": method}})
        )
        step.preprocess(
            nbformat.v4.new_notebook(),
            {"nbgrader": {"notebook": assignment, "assignment": assignment,
                          "student": student, "db_url": url}},
        )  # fmt: skip
    return root


def _export(root, capsys, *args):
    status = main(["export", *args, "--course-dir", str(root)])
    out = capsys.readouterr()
    return status, out.out, out.err


def _rows(path):
    return list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))


def test_nbgrader_recorded_the_late_penalties_the_export_starts_from(course):
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", COURSE_ID) as gb:
        erin, frank = (gb.find_submission(CH3, s) for s in ("erin", "frank"))
        assert (erin.score, erin.late_submission_penalty) == (10, 10)
        assert (frank.score, frank.late_submission_penalty) == (10, 0)


CANVAS = [
    ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", CH3, CH4],
    ["Points Possible", "", "", "", "", "10", "5"],
    # Canvas's ID column only with --match lms_user_id: Canvas reads it as its user id
    ["Liddell, Alice", "", "", "alice", "", "10", "3.5"],
    ["Ng, Jr., Bob", "", "", "bob", "", "6.5", "0"],
    ["carol", "", "", "carol", "", "", "0"],  # collected, not graded: empty
    ["Ore, Dave", "", "", "dave", "", "0", "0"],  # nothing submitted: 0
    ["Vale, Erin", "", "", "erin", "", "0", "0"],  # late: 0
    ["Moss, Frank", "", "", "frank", "", "0", "0"],  # late, as the settings say now
]
MOODLE = [
    ["Username", "ID number", "Email address", "First name", "Last name", CH3, CH4],
    ["alice", "1001", "alice@uni.example", "Alice", "Liddell", "10", "3.5"],
    ["bob", "1002", "", "Bob", "Ng, Jr.", "6.5", "0"],
    ["carol", "", "", "", "", "", "0"],
    ["dave", "", "", "Dave", "Ore", "0", "0"],
    ["erin", "", "", "Erin", "Vale", "0", "0"],
    ["frank", "", "", "Frank", "Moss", "0", "0"],
]
BLACKBOARD = [
    ["Last Name", "First Name", "Username", "Student ID", CH3, CH4],
    ["Liddell", "Alice", "alice", "1001", "10", "3.5"],
    ["Ng, Jr.", "Bob", "bob", "1002", "6.5", "0"],
    ["", "", "carol", "", "", "0"],
    ["Ore", "Dave", "dave", "", "0", "0"],
    ["Vale", "Erin", "erin", "", "0", "0"],
    ["Moss", "Frank", "frank", "", "0", "0"],
]


@pytest.mark.parametrize(
    "lms, expected",
    [("canvas", CANVAS), ("moodle", MOODLE), ("blackboard", BLACKBOARD)],
)
def test_each_lms_gets_its_documented_csv_for_the_course(course, capsys, lms, expected):
    status, out, err = _export(course, capsys, "--lms", lms)
    assert status == 0, err
    path = course / "exports" / f"{lms}-course.csv"
    assert f"wrote {path}: 6 student(s), 2 assignment(s)" in out
    assert _rows(path) == expected
    text = path.read_text(encoding="utf-8")
    if lms == "blackboard":  # comma-delimited: every field quoted, as Blackboard asks
        assert text.splitlines()[1] == '"Liddell","Alice","alice","1001","10","3.5"'
    # what the instructor is told, once per case
    assert f"LATE erin {CH3}: 0 (graded 10, late penalty 10)" in out
    assert f"PENALTY CHANGED frank {CH3}: the course's settings give 10" in out
    assert "holds 0" in out and f"autograde {CH3} --student frank --force" in out
    assert f"EMPTY carol {CH3}: collected but not in the gradebook" in out
    assert f"MISSING dave {CH3}: no submission, 0 in the file" in out
    assert f"NOT AUTOGRADED bob {CH3}: the gradebook holds 6.5" in out
    assert f"MISSING alice {CH4}" not in out and "NOT AUTOGRADED alice" not in out


def test_one_assignment_an_lms_column_and_missing_work_left_empty(course, capsys):
    out_file = course / "one.csv"
    status, out, err = _export(
        course, capsys, "--lms", "canvas", "--assignment", CH3, "--missing", "blank",
        "--column", f"{CH3}=Self-attention (4242)", "--out", str(out_file),
    )  # fmt: skip
    assert status == 0, err
    assert _rows(out_file) == [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
         "Self-attention (4242)"],
        ["Points Possible", "", "", "", "", "10"],
        ["Liddell, Alice", "", "", "alice", "", "10"],
        ["Ng, Jr., Bob", "", "", "bob", "", "6.5"],
        ["carol", "", "", "carol", "", ""],
        ["Ore, Dave", "", "", "dave", "", ""],
        ["Vale, Erin", "", "", "erin", "", "0"],
        ["Moss, Frank", "", "", "frank", "", "0"],
    ]  # fmt: skip
    assert f"MISSING dave {CH3}: no submission, left empty" in out


def test_an_existing_file_is_replaced_only_with_force(course, capsys):
    path = course / "exports" / "moodle-04_multi_head.csv"
    path.parent.mkdir(exist_ok=True)
    path.write_text("the instructor's own file\n")
    status, _, err = _export(course, capsys, "--lms", "moodle", "--assignment", CH4)
    assert status == 2 and "exists: nothing written (--force replaces it)" in err
    assert path.read_text() == "the instructor's own file\n"
    status, _, err = _export(
        course, capsys, "--lms", "moodle", "--assignment", CH4, "--force"
    )
    assert status == 0, err
    assert _rows(path)[1] == ["alice", "1001", "alice@uni.example", "Alice",
                              "Liddell", "3.5"]  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lms", "moodle", "--match", "email"],
         "5 roster student(s) have no email in nbgrader's gradebook, which moodle "
         "needs to find them: bob, carol, dave, erin, frank. Add it with `nbgrader db "
         "student import roster.csv`, a CSV with the columns id and email"),
        (["--lms", "canvas", "--match", "lms_user_id"],
         "4 roster student(s) have no lms_user_id (Canvas's user id: digits)"),
        (["--lms", "blackboard", "--match", "email"],
         "blackboard cannot identify students by email; it can by: id"),
        (["--lms", "canvas", "--assignment", "05_transformer"],
         "no assignment '05_transformer' in"),
        (["--lms", "canvas", "--column", "05_transformer=X"],
         "--column names assignment(s) not exported: 05_transformer"),
    ],
)  # fmt: skip
def test_what_the_lms_needs_and_nbgrader_lacks_is_refused_clearly(
    course, capsys, tmp_path, args, message
):
    out_file = tmp_path / "grades.csv"
    status, _, err = _export(course, capsys, *args, "--out", str(out_file))
    assert status == 2
    assert message in err and "nothing written" in err
    assert not out_file.exists()


def test_the_default_exports_are_ignored_by_git():
    for lms in ("canvas", "moodle", "blackboard"):
        path = paths.COURSE_ROOT / "exports" / f"{lms}-course.csv"
        check = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=paths.REPO)
        assert check.returncode == 0, f"{path} is not ignored by git"
