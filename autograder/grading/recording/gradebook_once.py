"""nbgrader's gradebook connected to once per recording worker, not a dozen times per
notebook.

nbgrader opens a new ``Gradebook`` at each step of each notebook (about twelve per
notebook in ``autograde``). Each open makes a new SQLAlchemy engine, so every query is
compiled again (SQLAlchemy keeps compiled statements per engine), and checks that every
table exists. :func:`install` makes every open in this process after the first reuse the
first one's engine for the same database, whose tables that first open checked or made;
each open still has a session of its own. A course is checked (and entered if new) at
its first open in the process, as nbgrader does: nbgrader never removes one, so the
dozen checks after it would only read the same row again.
Closing a gradebook ends its session; the shared engine stays for the next open (its
connections end with the process). Every change still commits as nbgrader commits it.
"""

from __future__ import annotations

from nbgrader import api

_ENGINES: dict[str, object] = {}  # database URL -> the engine its first open made
_CHECKED: set[tuple[str, str]] = set()  # (database URL, course id) checked already
_nbgrader_init = api.Gradebook.__init__
_nbgrader_close = api.Gradebook.close


def _open(self, db_url: str, course_id: str = "default_course", authenticator=None):
    engine = _ENGINES.get(db_url)
    if engine is None:  # nbgrader's own open: the engine, the tables, alembic's mark
        _nbgrader_init(self, db_url, course_id, authenticator)
        _ENGINES[db_url] = self.engine
        _CHECKED.add((db_url, course_id))
        return
    self.engine = engine
    self.db = api.scoped_session(
        api.sessionmaker(autoflush=True, bind=engine, future=True)
    )
    if (db_url, course_id) not in _CHECKED:
        self.check_course(course_id=course_id)
        _CHECKED.add((db_url, course_id))
    self.course_id = course_id
    self.authenticator = authenticator


def _close(self) -> None:
    if self.engine in _ENGINES.values():
        self.db.remove()
    else:
        _nbgrader_close(self)


def install() -> None:
    """In this process only (a recording worker)."""
    if api.Gradebook.__init__ is not _open:
        api.Gradebook.__init__ = _open
        api.Gradebook.close = _close
