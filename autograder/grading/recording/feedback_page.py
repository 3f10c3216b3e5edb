"""What the course changes in nbgrader's feedback page: small, scriptless, easy to scan.

nbgrader's feedback template (``feedback/index.html.j2``) inlines Bootstrap (117 KB) and
loads MathJax from a CDN, so offline the chapter's math shows as raw ``$...$``; the course
once inlined MathJax instead, 2.3 MB and a script in every page. The course's template
(``templates/course_feedback``) extends nbgrader's with

* :data:`PAGE_CSS`, a stylesheet of its own in place of Bootstrap: outputs wrap inside
  the page at spaces, and only a token too long for a line (a long path, a number) is
  broken, never a word that fits;
* no script: the math is MathML, written when the page is written (``tex_math.py``);
* each hidden test named in the table of contents (:func:`test_title`), not "Test cell".

And after rendering, :func:`scannable` makes each "Read again: <address>" of a verdict a
link to that section of the book, and keeps the explanation of a refused PyTorch call to
its first test (the later ones point back to it).
"""

from __future__ import annotations

import functools
import html
import re

from autograder import paths
from autograder.grading.sealed import guard

PAGE_CSS = """
body { margin: 0; color: #1b1b1b; background: #fff; font: 15px/1.5 system-ui, sans-serif; }
main.container { max-width: 1100px; margin: 0 auto; padding: 1em; }
a { color: #0b57b0; }
code, pre { font: 13px/1.45 ui-monospace, "DejaVu Sans Mono", monospace; }
h1.page-score { font-size: 1.4em; margin: 0 0 0.5em; }
.panel { border: 1px solid #b9c3cf; border-radius: 4px; margin: 0.6em 0; }
.panel-heading { background: #eef2f7; padding: 0.4em 0.7em; overflow: hidden; }
.panel-primary > .panel-heading { background: #dde7f3; }
.panel-body, .panel-footer { padding: 0.4em 0.7em; }
.pull-right { float: right; }
.prompt { display: none; }
.cell { margin: 0.4em 0; }
.input_area pre, .highlight pre { background: #f6f8fa; padding: 0.5em; margin: 0; }
.late-penalty { color: #a4241c; }
table { border-collapse: collapse; }
td, th { border: 1px solid #b9c3cf; padding: 0.2em 0.5em; }
math[display="block"] { margin: 0.6em 0; max-width: 100%; }
code.tex-display { display: block; margin: 0.6em 0; }
/* Every output and code block wraps inside the page, so the named mistake is read
   without scrolling sideways: at spaces, and mid-token only for a token longer than a
   line (break-word, not anywhere, which would break words that fit). */
pre { white-space: pre-wrap; overflow-wrap: break-word; }
div.output_subarea { min-width: 0; }
"""

# A refused call's explanation stays at its first test; later ones point back to it
_SEE_FIRST = (
    "is switched off while this exercise's hidden tests run (the first test above that "
    "says so explains what to do)."
)
_HIDDEN_TEST = re.compile(r"#\s*Hidden test `([^`]+)` \(([^)]*)\):\s*(.+)")


def test_title(cell) -> str:
    """The table of contents' entry for a graded cell, as escaped HTML: a hidden test's
    name and what it checks (from its cell's first line), or the kind of cell."""
    grading = cell.metadata.nbgrader
    if not grading.get("solution"):
        first = (cell.source or "").strip().splitlines()[:1]
        found = _HIDDEN_TEST.match(first[0]) if first else None
        if found:
            name, description = found.group(1), found.group(3).rstrip(".")
            return f"<code>{html.escape(name)}</code>: {html.escape(description)}"
        return f"Test <code>{html.escape(grading.grade_id)}</code>"
    kind = "Written answer" if cell.cell_type == "markdown" else "Code answer"
    return f"{kind} <code>{html.escape(grading.grade_id)}</code>"


@functools.cache
def _read_again() -> re.Pattern:
    """ "Read again: <address>" where the address is a page of the course's own book."""
    book = re.escape(html.escape(paths.book_address()))
    return re.compile(rf"Read again: ({book}[A-Za-z0-9_./#%-]*[A-Za-z0-9_/#-])")


def linked(page: str) -> str:
    """``page`` with each "Read again" address of the book a link to its section."""
    return _read_again().sub(
        lambda m: f'Read again: <a href="{m.group(1)}">{m.group(1)}</a>', page
    )


def _once(text: str, keep_first: bool) -> str:
    head, found, rest = text.partition(guard.MESSAGE_TAIL)
    if not found:
        return text
    first = guard.MESSAGE_TAIL if keep_first else _SEE_FIRST
    return head + first + rest.replace(guard.MESSAGE_TAIL, _SEE_FIRST)


def refusal_once(nb) -> None:
    """Keeps the explanation of a refused PyTorch call in ``nb``'s outputs to the first
    output that holds it; later refusals name the function and point back to it. (An
    error's ``evalue`` and ``traceback`` are one output: both keep it, or neither.)"""
    seen = False
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            texts = [
                output.get("evalue"),
                output.get("text"),
                *output.get("traceback", []),
            ]
            if not any(isinstance(t, str) and guard.MESSAGE_TAIL in t for t in texts):
                continue
            if "evalue" in output:
                output["evalue"] = _once(output["evalue"], not seen)
            if "traceback" in output:
                output["traceback"] = [_once(t, not seen) for t in output["traceback"]]
            if isinstance(output.get("text"), str):
                output["text"] = _once(output["text"], not seen)
            seen = True
