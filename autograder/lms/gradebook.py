"""Each roster student's grade of each assignment, from nbgrader's gradebook, read with
nbgrader's own ``Gradebook`` API.

nbgrader stores a submission's raw score and, beside it, the late penalty that its
``AssignLatePenalties`` step computed when the submission was autograded (``nbgrader
export`` subtracts one from the other). That penalty is the one of the due date and the
settings of that moment. Here the penalty is computed again, exactly as that step
computes it, from the course's settings now (``c.LateSubmissionPlugin.penalty_method``
in the course root's ``nbgrader_config.py``, or its ``AssignLatePenalties.plugin_class``),
the submission's timestamp and its due date with any extension; where it differs from
the recorded one (a due date moved, a setting changed, a score changed by hand after a
"zero" penalty), the export applies the settings and says so, naming both numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class ExportError(Exception):
    """A reason to write nothing, in the instructor's words."""


@dataclass
class Grade:
    """One student's grade of one assignment. ``status``: ``graded`` (in the
    gradebook), ``missing`` (no submission) or ``ungraded`` (a submission collected
    but not in the gradebook: not autograded yet, or the grader could not grade it)."""

    status: str
    raw: float = 0.0  # as nbgrader sums it, before the late penalty
    penalty: float = 0.0  # what the course's settings take off now
    recorded_penalty: float = 0.0  # what the gradebook holds
    seconds_late: float = 0.0
    autograded: bool = True  # nbgrader wrote its autograded copy

    @property
    def score(self) -> float:
        return max(0.0, self.raw - self.penalty)


@dataclass
class Student:
    id: str
    first_name: str
    last_name: str
    email: str
    lms_user_id: str
    grades: dict[str, Grade] = field(default_factory=dict)


@dataclass
class Course:
    assignments: list[str]
    max_scores: dict[str, float]
    students: list[Student]
    unrostered: list[tuple[str, str]]  # (student folder, assignment): not exported


def late_step(root: Path):
    """nbgrader's ``AssignLatePenalties`` step, configured by the course's settings."""
    from nbgrader.preprocessors import AssignLatePenalties

    from autograder.grading.nbgrader_bridge import course_config

    config = course_config(root)
    step = AssignLatePenalties(config=config)
    step.init_plugin()
    return step


def _penalty(step, student: str, notebook, seconds_late: float) -> float:
    """What ``AssignLatePenalties.preprocess`` records for one notebook: nothing when
    on time; else the plugin's penalty, kept between 0 and the notebook's score."""
    if seconds_late <= 0:
        return 0.0
    penalty = step.plugin_inst.late_submission_penalty(
        student, notebook.score, seconds_late
    )
    if penalty is None:
        return 0.0
    return float(min(max(penalty, 0.0), notebook.score))


def read(root: Path, assignment: str | None = None) -> Course:
    """Every roster student's grade of ``assignment`` (None: every assignment in the
    gradebook), with the late penalty the course's settings give."""
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.grading.nbgrader_bridge import COURSE_ID

    db = root / "gradebook.db"
    if not db.is_file():
        raise ExportError(f"no gradebook at {db}: autograde an assignment first")
    step = late_step(root)
    with Gradebook(f"sqlite:///{db}", COURSE_ID) as gb:
        known = sorted(a.name for a in gb.assignments)
        if assignment is not None and assignment not in known:
            raise ExportError(
                f"no assignment {assignment!r} in {db}; it holds: "
                f"{', '.join(known) or 'none'}"
            )
        chosen = [assignment] if assignment else known
        if not chosen:
            raise ExportError(f"nothing graded yet in {db}")
        max_scores = {a: float(gb.find_assignment(a).max_score) for a in chosen}
        students = []
        for s in sorted(gb.students, key=lambda s: s.id):
            student = Student(
                s.id, s.first_name or "", s.last_name or "", s.email or "",
                s.lms_user_id or "",
            )  # fmt: skip
            for a in chosen:
                try:
                    sub = gb.find_submission(a, s.id)
                except MissingEntry:
                    collected = (root / "submitted" / s.id / a).is_dir()
                    student.grades[a] = Grade("ungraded" if collected else "missing")
                    continue
                late = float(sub.total_seconds_late)
                student.grades[a] = Grade(
                    "graded",
                    raw=float(sub.score),
                    penalty=sum(_penalty(step, s.id, nb, late) for nb in sub.notebooks),
                    recorded_penalty=float(sub.late_submission_penalty or 0.0),
                    seconds_late=late,
                    autograded=(root / "autograded" / s.id / a).is_dir(),
                )
            students.append(student)
        rostered = {s.id for s in students}
    unrostered = sorted(
        (folder.parent.name, a)
        for a in chosen
        for folder in (root / "submitted").glob(f"*/{a}")
        if folder.parent.name not in rostered
    )
    return Course(chosen, max_scores, students, unrostered)
