"""The gradebook-import CSV of each LMS, as its documentation describes it.

- **Canvas** (Grades, Import; Instructure's "How do I import grades in the Gradebook?",
  https://community.canvaslms.com/t5/Instructor-Guide/How-do-I-import-grades-in-the-Gradebook/ta-p/807,
  a university's copy of its rules,
  https://teaching.resources.osu.edu/toolsets/carmencanvas/guides/calculating-final-grades/import-csv-file-carmen-grades,
  and the importer itself, canvas-lms ``app/models/gradebook_importer.rb``): the columns
  Student, ID, SIS User ID, SIS Login ID and Section, then one column per assignment; a
  row whose first cell says "Points Possible" gives each new assignment its points. A
  column that names no existing assignment (``Name (id)``, or its exact title) creates
  one. A student is found by ID (Canvas's user id), else by SIS User ID, else by SIS
  Login ID, else by name. An empty cell is "no score": it removes a score Canvas holds.
- **Moodle** (Grade administration, Import, CSV file; https://docs.moodle.org/en/Grade_import,
  and the importer itself, moodle ``grade/import/csv/classes/load_data.php``): any
  columns; on the import page the instructor maps one column to a user field ("Identify
  user by": Map from a column, Map to username, email address, ID number or user id) and
  each grade column to a grade item (one that exists, or a new one). A row whose user it
  cannot find aborts the whole import; an empty cell is "no grade".
- **Blackboard Learn** (Grade Center, Work Offline, Upload; "Uploading External Grade
  Center Items",
  http://library.blackboard.com/ref/36ba3329-e441-488a-93ce-7a55543cc999/Content/Grade%20Center/Uploading%20External%20Grade%20Center%20Items.htm):
  one header row, one row per student; a student is identified by Username, a column by
  its Column ID, which the header of a column in Blackboard's own download carries
  (``Name [Total Pts: 10 Score] |12345``); a column without one becomes a new text
  column worth 0 points. In a comma-delimited file every field is quoted.

Scores are written as numbers with at most two decimals; the file is UTF-8.
"""

from __future__ import annotations

import csv
import io

from autograder.lms.gradebook import Course, ExportError, Student

LMSES = ("canvas", "moodle", "blackboard")

# the nbgrader field each LMS may identify a student by, and the column it goes in
MATCH = {
    "canvas": {"id": "SIS Login ID", "lms_user_id": "ID"},
    "moodle": {"id": "Username", "email": "Email address", "lms_user_id": "ID number"},
    "blackboard": {"id": "Username"},
}

MISSING = ("zero", "blank")


def _number(x: float) -> str:
    return f"{round(x, 2):g}"


def _cell(student: Student, assignment: str, missing: str) -> str:
    grade = student.grades[assignment]
    if grade.status == "graded":
        return _number(grade.score)
    if grade.status == "missing" and missing == "zero":
        return "0"
    return ""  # ungraded: a grader fault is never a grade; or missing, blank


def check_match(course: Course, lms: str, match: str) -> None:
    """Refuse when a roster student lacks the field the LMS is to find them by."""
    if match not in MATCH[lms]:
        raise ExportError(
            f"{lms} cannot identify students by {match}; it can by: "
            f"{', '.join(MATCH[lms])}"
        )
    # Canvas reads its ID column as a number (its user id): "535fa0..." would find
    # user 535, so an id that is not all digits is as good as none
    digits = lms == "canvas" and match == "lms_user_id"
    lacking = [
        s.id
        for s in course.students
        if not getattr(s, match) or (digits and not getattr(s, match).isdigit())
    ]
    if lacking:
        what = f"{match} (Canvas's user id: digits)" if digits else match
        raise ExportError(
            f"{len(lacking)} roster student(s) have no {what} in nbgrader's gradebook, "
            f"which {lms} needs to find them: {', '.join(lacking)}. Add it with "
            f"`nbgrader db student import roster.csv`, a CSV with the columns id and "
            f"{match} (it updates the students who exist, and only those columns; "
            "`nbgrader db student add` would clear the fields it is not given); then "
            "export again"
        )


def render(
    course: Course,
    lms: str,
    headers: dict[str, str],
    missing: str = "zero",
    match: str = "id",
) -> str:
    """The CSV text; ``headers``: each assignment's column name in the LMS (default:
    the assignment's id); ``match``: the field the LMS finds students by (Canvas's ID
    column is filled only when it is ``lms_user_id``, checked to be Canvas's)."""
    columns = [headers.get(a, a) for a in course.assignments]
    out = io.StringIO()
    if lms == "canvas":
        w = csv.writer(out)
        w.writerow(
            ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *columns]
        )
        w.writerow(
            ["Points Possible", "", "", "", "",
             *(_number(course.max_scores[a]) for a in course.assignments)]
        )  # fmt: skip
        for s in course.students:
            name = ", ".join(p for p in (s.last_name, s.first_name) if p) or s.id
            canvas_id = s.lms_user_id if match == "lms_user_id" else ""
            w.writerow(
                [name, canvas_id, "", s.id, "",
                 *(_cell(s, a, missing) for a in course.assignments)]
            )  # fmt: skip
    elif lms == "moodle":
        w = csv.writer(out)
        w.writerow(
            ["Username", "ID number", "Email address", "First name", "Last name",
             *columns]
        )  # fmt: skip
        for s in course.students:
            w.writerow(
                [s.id, s.lms_user_id, s.email, s.first_name, s.last_name,
                 *(_cell(s, a, missing) for a in course.assignments)]
            )  # fmt: skip
    elif lms == "blackboard":
        w = csv.writer(out, quoting=csv.QUOTE_ALL)
        w.writerow(["Last Name", "First Name", "Username", "Student ID", *columns])
        for s in course.students:
            w.writerow(
                [s.last_name, s.first_name, s.id, s.lms_user_id,
                 *(_cell(s, a, missing) for a in course.assignments)]
            )  # fmt: skip
    else:
        raise ExportError(f"unknown LMS {lms!r}; known: {', '.join(LMSES)}")
    return out.getvalue()


def notes(course: Course, missing: str) -> list[str]:
    """What the instructor should know about the file: late penalties taken off, where
    they differ from the gradebook's, and the cells left empty or set to 0."""
    lines = []
    for s in course.students:
        for a in course.assignments:
            g = s.grades[a]
            if g.status == "ungraded":
                lines.append(
                    f"EMPTY {s.id} {a}: collected but not in the gradebook (not "
                    "autograded yet, or the grader could not grade it): autograde it, "
                    "then export again"
                )
            elif g.status == "missing":
                lines.append(
                    f"MISSING {s.id} {a}: no submission, "
                    + ("0 in the file" if missing == "zero" else "left empty")
                )
            elif not g.autograded:
                lines.append(
                    f"NOT AUTOGRADED {s.id} {a}: the gradebook holds "
                    f"{_number(g.score)}, but nbgrader could not process the submission "
                    "(no autograded copy; `nbgrader export` counts it so too): look at "
                    "it before you import"
                )
            elif g.penalty:
                lines.append(
                    f"LATE {s.id} {a}: {_number(g.score)} (graded {_number(g.raw)}, "
                    f"late penalty {_number(g.penalty)})"
                )
            if g.status == "graded" and abs(g.penalty - g.recorded_penalty) > 1e-9:
                lines.append(
                    f"PENALTY CHANGED {s.id} {a}: the course's settings give "
                    f"{_number(g.penalty)}, the gradebook (and the student's feedback) "
                    f"holds {_number(g.recorded_penalty)}, from when it was autograded; "
                    f"the file has {_number(g.penalty)}. To bring the gradebook and the "
                    f"feedback in line: `python -m autograder autograde {a} --student "
                    f"{s.id} --force --feedback`"
                )
    for student, a in course.unrostered:
        lines.append(
            f"NOT ON THE ROSTER {student} {a}: a submission, but no such student in "
            "the gradebook; not in the file"
        )
    return lines
