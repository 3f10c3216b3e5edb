"""The instructor's switch, per assignment, in the course's ``nbgrader_config.py``::

    c.GradeOnSubmit.assignments = {
        "03_self_attention": {"attempts": 3, "cooldown_minutes": 0, "keep": "best"},
    }

``attempts``: graded attempts per student (0: no limit); ``cooldown_minutes``: the least
time between two graded attempts; ``keep``: which graded attempt the gradebook holds,
``"last"`` or ``"best"``; ``due`` (``YYYY-MM-DD HH:MM:SS`` UTC): when attempts kept back
are graded (default: the assignment's due date in nbgrader's gradebook). An entry that
can hold an attempt back (``attempts`` or ``cooldown_minutes`` above 0) needs a due date,
one or the other: without one, a held attempt would never be graded, so such an entry is
refused when the settings are read, with a message that says what to add.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from traitlets import Dict
from traitlets.config import Configurable

KEEP = ("last", "best")
KEYS = {"attempts", "cooldown_minutes", "keep", "due"}


class GradeOnSubmit(Configurable):
    assignments = Dict(
        help="assignment id -> {attempts, cooldown_minutes, keep, due}: graded on submit"
    ).tag(config=True)


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Policy:
    attempts: int  # 0: no limit
    cooldown_minutes: float
    keep: str
    due: datetime | None  # UTC, naive as nbgrader keeps it


def _due(text, assignment: str) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(str(text)).replace(tzinfo=None)
    except ValueError:
        raise SettingsError(
            f"GradeOnSubmit.assignments[{assignment!r}]['due'] = {text!r}: write it as "
            "'YYYY-MM-DD HH:MM:SS' (UTC)"
        ) from None


def policy(assignment: str, entry) -> Policy:
    """One assignment's entry, checked: a clear message for anything else."""
    where = f"GradeOnSubmit.assignments[{assignment!r}]"
    if not isinstance(entry, dict):
        raise SettingsError(f"{where} must be a dict, e.g. {{'attempts': 3}}")
    unknown = set(entry) - KEYS
    if unknown:
        raise SettingsError(
            f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(KEYS)}"
        )
    attempts = entry.get("attempts", 0)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 0:
        raise SettingsError(
            f"{where}['attempts'] must be a whole number >= 0 (0: no limit)"
        )
    cooldown = entry.get("cooldown_minutes", 0)
    if (
        not isinstance(cooldown, int | float)
        or isinstance(cooldown, bool)
        or cooldown < 0
    ):
        raise SettingsError(f"{where}['cooldown_minutes'] must be a number >= 0")
    keep = entry.get("keep", "last")
    if keep not in KEEP:
        raise SettingsError(f"{where}['keep'] must be one of {KEEP}, not {keep!r}")
    return Policy(attempts, float(cooldown), keep, _due(entry.get("due"), assignment))


def load(root: Path) -> dict[str, Policy]:
    """The assignments graded on submit, from ``root/nbgrader_config.py``; an assignment
    the course does not grade is refused by name."""
    from autograder.grading.judging.spec import graded_chapters
    from autograder.grading.nbgrader_bridge import course_config

    config = course_config(root)
    raw = GradeOnSubmit(config=config).assignments
    known = graded_chapters()
    found = {}
    for assignment, entry in raw.items():
        if assignment not in known:
            raise SettingsError(
                f"GradeOnSubmit.assignments: {assignment!r} is no assignment of this "
                f"course (known: {', '.join(known)})"
            )
        found[assignment] = policy(assignment, entry)
    for assignment, rule in found.items():
        if (rule.attempts or rule.cooldown_minutes) and (
            due_date(root, assignment, rule) is None
        ):
            raise SettingsError(no_due_date(assignment, rule))
    return found


def no_due_date(assignment: str, rule: Policy) -> str:
    """Why an entry that can hold attempts back is refused without a due date, and
    what to add."""
    holds = (
        f"'attempts': {rule.attempts}" if rule.attempts
        else f"'cooldown_minutes': {rule.cooldown_minutes:g}"
    )  # fmt: skip
    return (
        f"GradeOnSubmit.assignments[{assignment!r}] holds attempts back ({holds}) until "
        f"the due date, but {assignment} has none, so a held attempt would never be "
        f"graded: add a 'due' to its entry, e.g. 'due': '2026-02-01 23:59:00' (UTC), "
        f"or give the assignment a due date in the gradebook (in the course root: "
        f"nbgrader db assignment add {assignment} --duedate '2026-02-01 23:59:00')"
    )


def check_owner(root: Path) -> bool:
    """Whether a submission must be owned by the login it names: yes, unless the course
    turns nbgrader's own check off (``c.CollectApp.check_owner = False``, for an
    exchange where owners cannot be told apart), as the course's collect does."""
    from autograder.grading.nbgrader_bridge import course_config

    config = course_config(root)
    return bool(config.get("CollectApp", {}).get("check_owner", True))


def due_date(root: Path, assignment: str, policy: Policy) -> datetime | None:
    """The setting's ``due``, else the gradebook's due date (UTC, naive), else None."""
    if policy.due is not None:
        return policy.due
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.grading.nbgrader_bridge import COURSE_ID

    db = root / "gradebook.db"
    if not db.is_file():
        return None
    with Gradebook(f"sqlite:///{db}", COURSE_ID) as gb:
        try:
            return gb.find_assignment(assignment).duedate
        except MissingEntry:
            return None


def now() -> datetime:
    """UTC, naive, as nbgrader's timestamps are compared."""
    return datetime.now(UTC).replace(tzinfo=None)
