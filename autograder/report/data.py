"""The class report's facts, read from the gradebook into plain rows.

Scores come from nbgrader's gradebook alone (a score per graded cell, that is per hidden
test, as nbgrader computes it: a hand-entered score wins over the autograder's); what the
grader knew beyond a score (the known mistake, the route a refusal refused, why a notebook
was not graded, which limit it hit) comes from the course's tables in the same file
(``autograder/grading/recording/verdict_record.py``). Nothing here is estimated: every figure of
the report is a count or a sum of these rows.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from autograder.grading.judging import judge
from autograder.grading.judging.spec import load_chapter_tests
from autograder.grading.recording import verdict_record
from autograder.grading.sealed import probe
from autograder.paths import chapter_page


@dataclass
class Student:
    id: str
    score: (
        float  # the assignment's total, as nbgrader sums it (no late penalty taken off)
    )
    by_exercise: dict[str, float]


@dataclass
class Finding:
    """What several students share on one exercise: a known mistake, or a failure that
    matched none (grouped by its message, numbers masked)."""

    exercise: str
    what: str  # the mistake's name, or the message's shape
    detail: str  # the mistake's hint, or one example of the message
    students: list[str]
    section: str = ""  # where the book teaches the point (a known mistake's link)


@dataclass
class Assignment:
    name: str
    exercises: list[str]
    max_points: dict[str, float]  # per exercise
    students: list[Student]  # those with a grade in the gradebook
    mistakes: list[Finding]
    unmatched: list[Finding]
    refusals: list[dict]  # {student, exercise, test, route}
    to_grade_again: list[dict]  # {student, outcome, limits, message}
    hand_changed: int = 0  # verdicts whose gradebook score was changed by hand since
    # submissions flagged for review ({student, flags}; ``delegation.flags``): no points
    for_review: list[dict] = field(default_factory=list)
    roster: list[str] = field(default_factory=list)  # every student in the gradebook
    submitted: list[str] = field(default_factory=list)  # those with a submission
    # per exercise, the students who did not attempt it (its stub untouched) and those
    # whose tests got no result (a time limit, a crash): kept out of the mistakes
    not_attempted: dict[str, list[str]] = field(default_factory=dict)
    no_result: dict[str, list[str]] = field(default_factory=dict)
    # each hidden test: {test, exercise, points, passed (students with its full points)}
    tests: list[dict] = field(default_factory=list)
    # the mean nbgrader export's CSV gives: every roster student, late penalties taken
    # off, no submission counting 0
    export_mean: float | None = None

    @property
    def not_submitted(self) -> list[str]:
        return sorted(set(self.roster) - set(self.submitted))

    @property
    def max_score(self) -> float:
        return sum(self.max_points.values())

    def lost_by(self, exercise: str) -> int:
        """How many students lost points on ``exercise``."""
        top = self.max_points[exercise]
        return sum(s.by_exercise.get(exercise, 0.0) < top for s in self.students)

    def hardest_first(self) -> list[str]:
        """Exercises by how many students lost points on them, then by points lost."""

        def lost(exercise):
            top = self.max_points[exercise]
            return sum(top - s.by_exercise.get(exercise, 0.0) for s in self.students)

        return sorted(self.exercises, key=lambda e: (-self.lost_by(e), -lost(e)))


@dataclass
class Course:
    assignments: list[Assignment] = field(default_factory=list)


def _gradebook_rows(db: Path, assignment: str):
    """``(students, grades)``: every submission of the assignment in the gradebook, and
    ``(student, test, score, max_score, auto_score, manual_score)`` of its graded cells."""
    from nbgrader.api import (
        Assignment as NbAssignment,
    )
    from nbgrader.api import (
        Grade,
        Gradebook,
        GradeCell,
        SubmittedAssignment,
        SubmittedNotebook,
    )

    from autograder.grading.nbgrader_bridge import COURSE_ID

    with Gradebook(f"sqlite:///{db}", COURSE_ID) as gb:
        submitted = (
            gb.db.query(SubmittedAssignment.student_id)
            .join(NbAssignment, SubmittedAssignment.assignment_id == NbAssignment.id)
            .filter(NbAssignment.name == assignment)
            .all()
        )
        grades = (
            gb.db.query(
                SubmittedAssignment.student_id,
                GradeCell.name,
                Grade.score,
                GradeCell.max_score,
                Grade.auto_score,
                Grade.manual_score,
            )
            .join(SubmittedNotebook, Grade.notebook_id == SubmittedNotebook.id)
            .join(
                SubmittedAssignment,
                SubmittedNotebook.assignment_id == SubmittedAssignment.id,
            )
            .join(NbAssignment, SubmittedAssignment.assignment_id == NbAssignment.id)
            .join(GradeCell, Grade.cell_id == GradeCell.id)
            .filter(NbAssignment.name == assignment)
            .all()
        )
    return [s for (s,) in submitted], [tuple(g) for g in grades]


def _roster_and_export(db: Path, assignment: str) -> tuple[list[str], float | None]:
    """Every student in the gradebook, and the mean of the scores ``nbgrader export``
    writes for them (its rule: no submission is 0, the late penalty is taken off)."""
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.grading.nbgrader_bridge import COURSE_ID

    with Gradebook(f"sqlite:///{db}", COURSE_ID) as gb:
        roster = sorted(s.id for s in gb.students)
        scores = []
        for student in roster:
            try:
                sub = gb.find_submission(assignment, student)
            except MissingEntry:
                scores.append(0.0)
                continue
            scores.append(max(0.0, sub.score - sub.late_submission_penalty))
    return roster, (sum(scores) / len(scores) if scores else None)


def assignments_in(db: Path) -> list[str]:
    """The assignments that have submissions in the gradebook, in course order."""
    from nbgrader.api import Gradebook

    from autograder.grading.judging.spec import graded_chapters
    from autograder.grading.nbgrader_bridge import COURSE_ID

    with Gradebook(f"sqlite:///{db}", COURSE_ID) as gb:
        used = {a.name for a in gb.assignments if a.num_submissions}
    return [c for c in graded_chapters() if c in used]


NOT_ATTEMPTED = (
    probe.NOT_IMPLEMENTED
)  # the probe's message for a stub that still raises
NO_RESULT = judge.NO_RESULT_MARK  # grade.py's and the judge's: a time limit, a crash


def _set_aside(message: str) -> str | None:
    """Why a failure says nothing about how the student understood the exercise: a stub
    never filled in, or a test that got no result. None for a real failure."""
    if NOT_ATTEMPTED in message:
        return "not_attempted"
    if message.startswith(NO_RESULT):
        return "no_result"
    return None


_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")
# judge._compare_outputs' "`exercise` case i of n (label): problem."
_CASE = re.compile(r"`[^`]+` case \d+ of \d+(?: \(.*?\))?: (?P<problem>.*)", re.S)


def message_shape(message: str) -> str:
    """What a failure's message says went wrong, without the case it went wrong on and
    with its numbers masked, so that the same failure on other cases or by other amounts
    groups together."""
    case = _CASE.fullmatch(message)
    return _NUMBER.sub("#", case["problem"] if case else message)


def _scores(submitted, grades, exercise_of, max_points):
    """Each graded student's score per exercise, the points per exercise (as the
    gradebook holds them, where it holds any), and each graded cell's score."""
    by_student: dict[str, dict[str, float]] = {s: {} for s in submitted}
    scored: dict[str, bool] = dict.fromkeys(submitted, False)
    cell_score, cell_max = {}, {}
    for student, test, score, top, auto, manual in grades:
        exercise = exercise_of.get(test, test)  # a cell the tests do not know: itself
        cell_max[test] = float(top or 0)
        by = by_student[student]
        by[exercise] = by.get(exercise, 0.0) + float(score)
        scored[student] |= auto is not None or manual is not None
        cell_score[student, test] = float(score)
    if cell_max:
        max_points = defaultdict(float)
        for test, top in cell_max.items():
            max_points[exercise_of.get(test, test)] += top
    # a submission nbgrader entered but graded nothing of (it could not read it) has
    # no grade: it is listed to grade again, not counted as a zero
    students = [
        Student(s, sum(by.values()), by)
        for s, by in sorted(by_student.items())
        if scored[s]
    ]
    return students, dict(max_points), cell_score


def _findings(groups: dict[tuple, set], detail) -> list[Finding]:
    return sorted(
        (
            Finding(e, what, detail(e, what), sorted(ss))
            for (e, what), ss in groups.items()
        ),
        key=lambda f: (-len(f.students), f.exercise, f.what),
    )


def _with_hint(finding: Finding, known: dict) -> Finding:
    """A known mistake's finding with the hint the feedback gave and the address of the
    section of the book that teaches the point."""
    m = known.get((finding.exercise, finding.what))
    if m is None:  # a mistake since renamed or removed
        return finding
    link = chapter_page(*m.section.split("#")) if m.section else ""
    return replace(finding, detail=m.hint, section=link)


def read_assignment(db: Path, name: str) -> Assignment:
    tests = load_chapter_tests(name)
    exercise_of = {t.id: t.exercise for t in tests.tests}
    points: dict[str, float] = defaultdict(float)
    for t in tests.tests:
        points[t.exercise] += t.points
    submitted, grades = _gradebook_rows(db, name)
    students, max_points, cell_score = _scores(submitted, grades, exercise_of, points)
    attempts, verdicts = verdict_record.read(db, name)
    graded = {s.id for s in students}
    mistakes: dict[tuple, set] = defaultdict(set)
    unmatched: dict[tuple, set] = defaultdict(set)
    example: dict[tuple, str] = {}
    refusals, hand_changed = [], 0
    set_aside: dict[str, dict[str, set]] = {
        "not_attempted": defaultdict(set),
        "no_result": defaultdict(set),
    }
    for v in verdicts:
        if v["student"] not in graded:
            continue
        exercise = exercise_of.get(v["test"], v["test"])
        recorded = cell_score.get((v["student"], v["test"]))
        hand_changed += recorded is not None and recorded != v["score"]
        why = None if v["passed"] else _set_aside(v["message"] or "")
        if why is not None:  # no mistake to learn from: counted apart
            set_aside[why][exercise].add(v["student"])
        elif v["refused"]:
            refusals.append(
                {"student": v["student"], "exercise": exercise, "test": v["test"],
                 "route": v["refused"]}
            )  # fmt: skip
        elif v["mistake"]:
            mistakes[exercise, v["mistake"]].add(v["student"])
        elif not v["passed"]:
            key = (exercise, message_shape(v["message"]))
            unmatched[key].add(v["student"])
            example.setdefault(key, v["message"])
    to_grade_again = [
        {"student": a["student"], "outcome": a["outcome"], "limits": a["limits"] or "",
         "message": a["message"] or ""}
        for a in sorted(attempts.values(), key=lambda a: a["student"])
        if a["outcome"] != verdict_record.GRADED or a["limits"]
    ]  # fmt: skip
    known = {(m.exercise, m.name): m for m in tests.mistakes}
    order = {e: i for i, e in enumerate(tests.exercises)}
    roster, export_mean = _roster_and_export(db, name)
    per_test = [
        {"test": t.id, "exercise": t.exercise, "points": t.points,
         "passed": sum(cell_score.get((s.id, t.id), 0.0) >= t.points for s in students)}
        for t in tests.tests
    ]  # fmt: skip
    return Assignment(
        name=name,
        exercises=sorted(
            max_points, key=lambda e: (e not in order, order.get(e, 0), e)
        ),
        max_points=max_points,
        students=students,
        mistakes=[_with_hint(f, known) for f in _findings(mistakes, lambda *_: "")],
        unmatched=_findings(unmatched, lambda e, shape: example[e, shape]),
        refusals=sorted(
            refusals, key=lambda r: (r["exercise"], r["student"], r["test"])
        ),
        to_grade_again=to_grade_again,
        hand_changed=hand_changed,
        for_review=_for_review(db, name, graded),
        roster=roster,
        submitted=sorted(submitted),
        not_attempted={e: sorted(s) for e, s in set_aside["not_attempted"].items()},
        no_result={e: sorted(s) for e, s in set_aside["no_result"].items()},
        tests=per_test,
        export_mean=export_mean,
    )


def _for_review(db: Path, name: str, graded: set[str]) -> list[dict]:
    """The students whose code was flagged for the instructor's review (the gradebook's
    provenance table; a gradebook from before flags has none)."""
    import json

    from autograder.grading.recording import provenance

    found = []
    for student, row in sorted(provenance.recorded(db, name).items()):
        try:
            flags = json.loads(row.get("flags") or "[]")
        except ValueError:
            flags = []
        if student in graded and flags:
            found.append({"student": student, "flags": [str(f) for f in flags][:20]})
    return found


def read_course(db: Path, names: list[str]) -> Course:
    return Course([read_assignment(db, n) for n in names])
