"""Whether a submission is graded now or kept until the due date, and which graded
attempt the gradebook holds. The grader must not become an oracle: a student has
``attempts`` graded attempts, at least ``cooldown_minutes`` apart (by the times they
reached the exchange, ``inbound.waiting``, not the times the student's nbgrader wrote
in their names); anything beyond is kept and graded once the due date has
passed. After the due date nothing is held back (a late submission is graded, and
nbgrader's late penalty applies as for any other)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from autograder.on_submit.settings import Policy

TIME = "%Y-%m-%d %H:%M:%S.%f"  # a submission's time in the journal (read: any ISO form)


def parse(text: str) -> datetime:
    """A journal's time (seconds, or microseconds too)."""
    return datetime.fromisoformat(text)


@dataclass(frozen=True)
class Decision:
    grade: bool
    number: int | None  # the graded attempt's number (1, 2, ...), None when held
    why_held: str = ""  # for the held page


def _graded(history: list[dict]) -> list[dict]:
    """The attempts given a number so far (graded, or being graded)."""
    return [e for e in history if e.get("attempt")]


def decide(
    history: list[dict], when: datetime, policy: Policy, due: datetime | None,
    now: datetime,
) -> Decision:  # fmt: skip
    """``history``: the student's earlier submissions of the assignment (the journal's
    lines, oldest first); ``when``: this one's time."""
    graded = _graded(history)
    number = len(graded) + 1
    if due is not None and now >= due:
        return Decision(True, number)
    after_due = f"after the due date ({due:%Y-%m-%d %H:%M} UTC)" if due else (
        "after the due date"
    )  # fmt: skip
    if policy.attempts and len(graded) >= policy.attempts:
        why = (
            f"you have used your {policy.attempts} graded attempt(s); it will be graded "
            f"{after_due}"
        )
        return Decision(False, None, why)
    if policy.cooldown_minutes and graded:
        last = parse(graded[-1]["timestamp"])
        ready = last + timedelta(minutes=policy.cooldown_minutes)
        if when < ready:
            why = (
                f"it came within {policy.cooldown_minutes:g} minutes of your last "
                f"graded attempt; it will be graded {after_due}. Your next graded "
                f"attempt can come from {ready:%Y-%m-%d %H:%M:%S} UTC"
            )
            return Decision(False, None, why)
    return Decision(True, number)


def left(policy: Policy, used: int) -> str:
    """What a page says of the attempts left after ``used`` graded attempts."""
    if not policy.attempts:
        return "no limit on graded attempts"
    remaining = max(0, policy.attempts - used)
    word = "attempt" if remaining == 1 else "attempts"
    return f"{remaining} graded {word} left of {policy.attempts}"


def chosen(history: list[dict], keep: str) -> tuple[dict, str] | None:
    """The graded attempt the gradebook holds, and why: ``last``, the latest graded;
    ``best``, the highest score (the latest among equals)."""
    graded = [e for e in history if e.get("state") == "graded"]
    if not graded:
        return None
    if keep == "last":
        pick = graded[-1]
        return pick, f"keep=last: the latest of {len(graded)} graded attempt(s)"
    pick = max(reversed(graded), key=lambda e: e["score"])
    return pick, (
        f"keep=best: the highest score ({pick['score']:g} of {pick['max_score']:g}) "
        f"of {len(graded)} graded attempt(s)"
    )
