"""The page a student fetches for a submission: where ``nbgrader fetch_feedback`` (and
the Assignments tab) looks for it, ``<exchange>/<course>/feedback/<hash>.html`` with the
hash of the submission's secret and the notebook's name, as ``release_feedback`` writes
it. A graded attempt gets the course's own feedback page (``generate_feedback``'s) with
a line on top: the attempt's number and how many are left; one kept back gets a short
page saying so, and when it will be graded."""

from __future__ import annotations

import html
import os
from pathlib import Path

from nbgrader.utils import notebook_hash

from autograder.grading.recording import feedback_folder
from autograder.on_submit.inbound import Submission

STYLE = (
    "body{font:15px/1.5 system-ui,sans-serif;color:#1b1b1b;background:#fff;margin:0}"
    "main{max-width:1100px;margin:0 auto;padding:1em}"
    ".on-submit{border:1px solid #b9c3cf;background:#eef2f7;padding:.5em .8em}"
)


def feedback_path(exchange: Path, course_id: str, submission: Submission) -> Path:
    secret = (submission.folder / "submission_secret.txt").read_text()
    name = notebook_hash(secret=secret, notebook_id=submission.assignment)
    return Path(exchange) / course_id / "feedback" / f"{name}.html"


def banner(text: str) -> str:
    return f'<p class="on-submit" role="status">{html.escape(text)}</p>'


def with_banner(page: str, text: str) -> str:
    """The course's feedback page with ``text`` at the top of its main content."""
    for anchor in ('<main class="container">', "<body>"):
        if anchor in page:
            return page.replace(anchor, anchor + "\n" + banner(text), 1)
    return banner(text) + page


def held_page(submission: Submission, text: str, title: str = "") -> str:
    title = title or f"{submission.assignment}: attempt kept, not graded yet"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
        f"<body><main><h1>{html.escape(title)}</h1>{banner(text)}</main></body></html>\n"
    )


def write(path: Path, text: str) -> None:
    """All at once (written beside, renamed over): a fetch never sees half a page;
    readable by the student who fetches it, as ``release_feedback`` leaves pages, in a
    folder only its owner can list, as ``release_feedback`` makes it."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, feedback_folder.mode())
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
