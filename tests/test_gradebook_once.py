"""nbgrader's gradebook with one engine per database in a recording worker
(``gradebook_once.py``): each open after the first reuses it, and what each writes is
in the database as nbgrader's own gradebook would have left it. That a whole class
records the same grades with it is ``tests/test_class_autograde.py``'s check against
serial nbgrader."""

import sqlite3

from nbgrader import api

from autograder.grading.recording import gradebook_once


def _installed(monkeypatch):
    """Installed for this test only."""
    monkeypatch.setattr(api.Gradebook, "__init__", api.Gradebook.__init__)
    monkeypatch.setattr(api.Gradebook, "close", api.Gradebook.close)
    monkeypatch.setattr(gradebook_once, "_ENGINES", {})
    monkeypatch.setattr(gradebook_once, "_CHECKED", set())
    gradebook_once.install()


def test_opens_share_an_engine_and_write_what_nbgrader_would(tmp_path, monkeypatch):
    _installed(monkeypatch)
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with api.Gradebook(url, "course") as first:  # a new database: nbgrader's open
        first.add_assignment("a1")
        first.add_student("s1")
    with api.Gradebook(url, "course") as second:
        assert second.engine is first.engine
        assert [s.id for s in second.students] == ["s1"]
        second.add_student("s2")
    with api.Gradebook(url, "other-course") as third:  # its course checked, as before
        assert third.course_id == "other-course"
    checks = []
    monkeypatch.setattr(api.Gradebook, "check_course", lambda s, **k: checks.append(k))
    with api.Gradebook(url, "course"), api.Gradebook(url, "third-course"):
        pass
    assert checks == [{"course_id": "third-course"}]  # each course once a process
    other = f"sqlite:///{tmp_path / 'other.db'}"
    with api.Gradebook(other, "course") as elsewhere:
        assert elsewhere.engine is not first.engine
    with sqlite3.connect(tmp_path / "gradebook.db") as db:
        assert [r[0] for r in db.execute("SELECT id FROM student ORDER BY id")] == [
            "s1",
            "s2",
        ]
        assert db.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)
        courses = {r[0] for r in db.execute("SELECT id FROM course")}
        assert courses == {"course", "other-course"}  # the third's check was stubbed


def test_without_it_each_open_has_its_own_engine(tmp_path):
    """nbgrader's own behaviour, which the worker's patch changes (if nbgrader ever
    shares engines itself, the patch can go)."""
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with (
        api.Gradebook(url, "course") as first,
        api.Gradebook(url, "course") as second,
    ):
        assert first.engine is not second.engine
