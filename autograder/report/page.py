"""The class report as one self-contained HTML page (no network needed: styles inline,
plots embedded) and a CSV of the same numbers beside it. Student ids and messages are
untrusted text: the template escapes everything (jinja2's autoescape)."""

from __future__ import annotations

import csv
import statistics
from datetime import UTC, datetime
from pathlib import Path

import jinja2

from autograder.report import figures
from autograder.report.data import Assignment, Course

TEMPLATE = Path(__file__).with_name("page.html.j2")


def _num(value: float) -> str:
    return f"{value:g}"


class Names:
    """Who a student is in the report: their id when the instructor asks for names,
    else "student N" (N by sorted id, the same in the page and the CSV)."""

    def __init__(self, ids: set[str], show: bool):
        self.show = show
        self.number = {s: i for i, s in enumerate(sorted(ids), 1)}

    def __call__(self, student: str) -> str:
        return student if self.show else f"student {self.number[student]}"

    def many(self, students: list[str]) -> str:
        return ", ".join(self(s) for s in students)


def _everyone(course: Course) -> set[str]:
    ids = set()
    for a in course.assignments:
        ids |= {s.id for s in a.students}
        ids |= {t["student"] for t in a.to_grade_again}
        ids |= {r["student"] for r in a.refusals}
        ids |= {r["student"] for r in a.for_review}
        ids |= set(a.roster)
        for f in a.mistakes + a.unmatched:
            ids |= set(f.students)
    return ids


def _spread(scores: list[float]) -> dict:
    """Median, quartiles and standard deviation, as the page prints them."""
    if not scores:
        return {"median": "none", "quartiles": "none", "sd": "none"}
    if len(scores) == 1:
        q1 = q3 = scores[0]
    else:
        q1, _, q3 = statistics.quantiles(scores, n=4, method="inclusive")
    return {
        "median": f"{statistics.median(scores):g}",
        "quartiles": f"{q1:g} and {q3:g}",
        "sd": f"{statistics.pstdev(scores):.2f}",
    }


def _assignment_view(a: Assignment) -> dict:
    totals = [s.score for s in a.students]
    ranked = []
    for name in a.hardest_first():
        scores = [s.by_exercise.get(name, 0.0) for s in a.students]
        top = a.max_points[name]
        ranked.append(
            {
                "name": name,
                "top": top,
                "lost": a.lost_by(name),
                "not_attempted": a.not_attempted.get(name, []),
                "no_result": a.no_result.get(name, []),
                "tests": [t for t in a.tests if t["exercise"] == name],
                "mean": f"{statistics.fmean(scores):.2f}" if scores else "none",
                "counts": figures.score_counts(scores, top),
                "plot": figures.histogram(scores, top, f"scores on {name}"),
                "mistakes": [f for f in a.mistakes if f.exercise == name],
                "unmatched": [f for f in a.unmatched if f.exercise == name],
            }
        )
    return {
        "name": a.name,
        "students": a.students,
        "max_score": a.max_score,
        "mean": f"{statistics.fmean(totals):.2f}" if totals else "none",
        **_spread(totals),
        "roster": a.roster,
        "submitted": a.submitted,
        "not_submitted": a.not_submitted,
        "export_mean": "none" if a.export_mean is None else f"{a.export_mean:.2f}",
        "refused_students": sorted({r["student"] for r in a.refusals}),
        "full": sum(t == a.max_score for t in totals),
        "zero": sum(t == 0 for t in totals),
        "total_plot": figures.histogram(
            totals, a.max_score, f"total scores of {a.name}"
        ),
        "ranked": ranked,
        "to_grade_again": a.to_grade_again,
        "refusals": a.refusals,
        "for_review": a.for_review,
        "hand_changed": a.hand_changed,
    }


def _heat(course: Course, names: Names) -> dict | None:
    # an exercise worth no points (feedback only) has no share to show
    columns = [
        (a, e) for a in course.assignments for e in a.exercises if a.max_points[e]
    ]
    students = sorted(
        {s.id for a in course.assignments for s in a.students}, key=names.number.get
    )
    if not students or not columns:
        return None
    scores = {
        (a.name, s.id): s.by_exercise for a in course.assignments for s in a.students
    }
    rows, shares = [], []
    for student in students:
        cells, share = [], []
        for a, e in columns:
            got = scores.get((a.name, student))
            top = a.max_points[e]
            cells.append("" if got is None else f"{got.get(e, 0.0):g}/{top:g}")
            share.append(None if got is None else got.get(e, 0.0) / top)
        rows.append({"student": student, "cells": cells})
        shares.append(share)
    labels = [f"{a.name[:2]} {e}" for a, e in columns]
    return {
        "columns": labels,
        "rows": rows,
        "plot": figures.heat_map([names(s) for s in students], labels, shares),
    }


def csv_rows(course: Course, names: Names) -> list[list]:
    """One row per assignment, student and exercise, and one for the total: the scores
    of the page's tables, with the mistakes named and the routes refused."""
    rows = [
        [
            "assignment",
            "student",
            "exercise",
            "score",
            "max_score",
            "mistakes",
            "refused",
            "set_apart",
        ]
    ]
    for a in course.assignments:
        for s in a.students:
            for e in a.exercises:
                mistakes = [
                    f.what for f in a.mistakes if f.exercise == e and s.id in f.students
                ]
                refused = [
                    r["route"]
                    for r in a.refusals
                    if r["exercise"] == e and r["student"] == s.id
                ]
                apart = [
                    why
                    for why, who in (
                        ("not attempted", a.not_attempted.get(e, [])),
                        ("no result", a.no_result.get(e, [])),
                    )
                    if s.id in who
                ]
                rows.append(
                    [a.name, names(s.id), e, _num(s.by_exercise.get(e, 0.0)),
                     _num(a.max_points[e]), "; ".join(mistakes), "; ".join(refused),
                     "; ".join(apart)]
                )  # fmt: skip
            rows.append(
                [
                    a.name,
                    names(s.id),
                    "(total)",
                    _num(s.score),
                    _num(a.max_score),
                    "",
                    "",
                    "",
                ]
            )
    return rows


def write(
    course: Course,
    out: Path,
    stem: str,
    gradebook: Path,
    show_names: bool,
    class_wide: bool,
) -> tuple[Path, Path]:
    """Write ``out/<stem>.html`` and ``out/<stem>.csv`` (``<stem>-named`` with the
    students' ids, never over the page that can be shared); return their paths. The
    class-wide form adds the heat map of students by exercises."""
    names = Names(_everyone(course), show_names)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{stem}-named" if show_names else stem
    html_path, csv_path = out / f"{stem}.html", out / f"{stem}.csv"
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["num"] = _num
    env.filters["who"] = names.many
    title = (
        "Class report: every assignment graded"
        if class_wide
        else f"Class report: {course.assignments[0].name}"
    )
    page = env.from_string(TEMPLATE.read_text()).render(
        title=title,
        gradebook=gradebook.name,  # no path of the grading machine on a shared page
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        names=show_names,
        csv_name=csv_path.name,
        assignments=[_assignment_view(a) for a in course.assignments],
        heat=_heat(course, names) if class_wide else None,
    )
    html_path.write_text(page)
    with open(csv_path, "w", newline="") as f:
        csv.writer(f).writerows(csv_rows(course, names))
    return html_path, csv_path
