"""Hand-placed submissions get the time the late penalty needs: ``autograde
--timestamps FILE`` writes nbgrader's ``timestamp.txt``, which nbgrader reads back as the
time given; bad input writes nothing. (That ``nbgrader autograde`` then records those
times and the late penalty: ``tests/test_class_autograde.py``, whose parallel class is
stamped this way.)"""

import datetime

import pytest
from nbgrader.api import Gradebook
from nbgrader.coursedir import CourseDirectory

from autograder.__main__ import main
from autograder.grading.nbgrader_bridge import COURSE_ID
from autograder.grading.recording import timestamps
from tests.notebooks import class_course

CH = "03_self_attention"


@pytest.fixture
def root(tmp_path):
    root = class_course(tmp_path / "course", CH, {})
    for student in ("alice", "bob", "carol"):
        (root / "submitted" / student / CH).mkdir(parents=True)
    return root


def _csv(path, *rows):
    path.write_text("student_id,timestamp\n" + "".join(f"{r}\n" for r in rows))
    return path


def test_the_times_given_are_the_times_nbgrader_reads(root, tmp_path):
    times = timestamps.read(
        _csv(tmp_path / "t.csv", "alice,2026-01-16 11:30:00 Europe/Berlin",
             "bob,2026-01-14 10:00:00", "carol,2026-07-01 09:00:00 +0200")
    )  # fmt: skip
    lines = timestamps.stamp(root, CH, times)
    assert lines == [
        "alice: submitted 2026-01-16 10:30:00 UTC",  # winter: Berlin is UTC+1
        "bob: submitted 2026-01-14 10:00:00 UTC",  # no zone: UTC, as nbgrader reads it
        "carol: submitted 2026-07-01 07:00:00 UTC",
    ]
    read = CourseDirectory().get_existing_timestamp
    folder = root / "submitted" / "alice" / CH
    assert (folder / "timestamp.txt").read_text() == "2026-01-16 10:30:00.000000 UTC\n"
    assert read(str(folder)) == datetime.datetime(2026, 1, 16, 10, 30)
    assert read(str(root / "submitted" / "carol" / CH)) == datetime.datetime(
        2026, 7, 1, 7, 0
    )
    # the same again keeps the file; a student graded before gets told to grade again
    (root / "autograded" / "bob" / CH).mkdir(parents=True)
    (root / "submitted" / "bob" / CH / "timestamp.txt").unlink()
    again = timestamps.stamp(root, CH, times)
    assert again[0] == "alice: submitted 2026-01-16 10:30:00 UTC (kept)"
    assert "bob: submitted 2026-01-14 10:00:00 UTC; already autograded without it: " \
        "grade again with --student bob --force" in again  # fmt: skip


@pytest.mark.parametrize(
    "rows, message",
    [
        (["alice,2026-01-16 10:00:00", "zed,2026-01-16 10:00:00"],
         "zed: no submission at"),
        (["alice,2026-01-16 10:00:00", "bob,the day after"],
         "not a time nbgrader reads (line 3: 'the day after')"),
        (["alice,2026-01-16 10:00:00", "carol,2026-01-17 10:00:00"],
         "carol: {} already says 2026-01-15 09:00:00 UTC (delete it to replace it)"),
    ],
)  # fmt: skip
def test_bad_times_write_nothing_and_grade_nothing(
    root, tmp_path, capsys, rows, message
):
    carol = root / "submitted" / "carol" / CH / "timestamp.txt"
    carol.write_text("2026-01-15 09:00:00.000000 UTC")  # as nbgrader collect wrote it
    status = main(
        ["autograde", CH, "--timestamps", str(_csv(tmp_path / "t.csv", *rows)),
         "--course-dir", str(root)]
    )  # fmt: skip
    assert status == 2
    assert message.format(carol) in capsys.readouterr().err
    assert not (root / "submitted" / "alice" / CH / "timestamp.txt").exists()
    assert carol.read_text() == "2026-01-15 09:00:00.000000 UTC"
    assert not (root / "gradebook.db").exists()  # nothing entered, nothing graded


def test_a_csv_without_the_columns_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("name,time\nalice,2026-01-16 10:00:00\n")
    with pytest.raises(
        timestamps.StampError, match="the columns student_id, timestamp"
    ):
        timestamps.read(tmp_path / "t.csv")


@pytest.mark.filterwarnings("ignore:Object of type <Submitted")
def test_submissions_without_a_time_are_named_when_a_due_date_makes_it_matter(root):
    everyone = ["alice", "bob", "carol"]
    assert timestamps.unstamped(root, CH, everyone) == ([], "")  # no gradebook yet
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE_ID) as gb:
        gb.add_assignment(CH)
    assert timestamps.unstamped(root, CH, everyone) == ([], "")  # no due date
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE_ID) as gb:
        gb.find_assignment(CH).duedate = datetime.datetime(2026, 1, 15, 12)
        gb.db.commit()
    (root / "submitted" / "bob" / CH / "timestamp.txt").write_text(
        "2026-01-14 10:00:00.000000 UTC"
    )
    missing, due = timestamps.unstamped(root, CH, everyone)
    assert missing == ["alice", "carol"] and due.startswith("2026-01-15 12:00:00")
