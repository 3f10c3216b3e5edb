"""What the course adds to nbgrader's feedback page: verdicts that wrap, math offline.

nbgrader's feedback template (``feedback/index.html.j2``) renders each failed hidden
test's verdict as one long unwrapped line in a ``<pre>``, so "Likely mistake: ..." runs
off the side of the page; and its ``mathjax()`` macro loads MathJax 2.7.7 from a CDN, so
offline the chapter's math shows as raw ``$...$``. :func:`course_head` replaces that
macro's output with

* CSS that wraps every output inside the page's width, and
* MathJax 3 (``tex-svg-full.js`` from the ``django-static-mathjax`` package pinned in
  requirements.txt, the MathJax the book serves, with every TeX package the book has),
  inlined into the page with MathJax's ``ui/safe`` extension.

Inlined, not copied beside the page: nbgrader's ``release_feedback`` and
``fetch_feedback`` carry only the ``.html`` file to the student, so a script beside it
would never arrive. The SVG output needs no font files (its glyphs are in the script),
which is what lets one file typeset math with no network; it costs about 2.3 MB a page.

The math MathJax typesets is the student's too (their Markdown cells). Student content
never carries a script into the page (``safe_feedback.py`` strips them), but TeX can ask
for links, styles and classes (``\\href{javascript:...}``, ``\\style``, ``\\mmlToken``):
``ui/safe`` filters those as MathJax's documentation advises for untrusted math, and the
TeX packages that load code from elsewhere (``require``, ``autoload``) are left out.
"""

from __future__ import annotations

import functools
from importlib import resources

# Inside the ``mathjax`` package: the TeX-to-SVG bundle, then the extension that makes
# untrusted math safe (it hooks itself into MathJax's start-up when it runs).
MATHJAX_SCRIPTS = (
    "static/mathjax/es5/tex-svg-full.js",
    "static/mathjax/es5/ui/safe.js",
)

VERDICT_CSS = """
/* A failed test's verdict is one long line: wrap it (and every other output) inside the
   page, so the named mistake is read without scrolling sideways. */
div.output_area pre {
  white-space: pre-wrap;
  overflow-wrap: anywhere;
}
div.output_subarea {
  min-width: 0;
}
"""

# MathJax 3's settings for what nbconvert's Markdown leaves as text (as the notebook and
# nbconvert's own MathJax 2 configuration read it).
MATHJAX_CONFIG = """
window.MathJax = {
  tex: {
    inlineMath: [["$", "$"], ["\\\\(", "\\\\)"]],
    displayMath: [["$$", "$$"], ["\\\\[", "\\\\]"]],
    processEscapes: true,
    processEnvironments: true,
    tags: "ams",
    packages: {"[-]": ["require", "autoload"]},
  },
  loader: {load: []},
  svg: {fontCache: "global"},
};
"""


class MathJaxMissing(RuntimeError):
    pass


@functools.cache
def mathjax_script() -> str:
    """MathJax 3's TeX-to-SVG bundle and its safe extension, as text to inline in one
    ``<script>``."""
    try:
        package = resources.files("mathjax")
        script = ";\n".join(
            (package / name).read_text("utf-8") for name in MATHJAX_SCRIPTS
        )
    except (ModuleNotFoundError, FileNotFoundError):
        raise MathJaxMissing(
            "feedback pages inline MathJax from the django-static-mathjax package: "
            "`python -m pip install -r requirements.txt`"
        ) from None
    if "</script" in script.lower():  # would end the inline script early
        raise MathJaxMissing(f"{MATHJAX_SCRIPTS} cannot be inlined: they hold </script")
    return script


def course_head() -> str:
    """The CSS and the inline MathJax that take the place of the template's CDN MathJax."""
    return (
        f'<style id="course-feedback-style">{VERDICT_CSS}</style>\n'
        f'<script id="course-mathjax-config">{MATHJAX_CONFIG}</script>\n'
        f'<script id="course-mathjax">{mathjax_script()}</script>\n'
    )


def with_course_head(html: str, cdn_mathjax: str) -> str:
    """``html`` (a rendered feedback page) with the template's MathJax block replaced by
    :func:`course_head`. ``cdn_mathjax`` is what the template's ``mathjax()`` macro
    writes; the block in the page is found by its first and last lines (the page's
    indentation differs)."""
    lines = [line.strip() for line in cdn_mathjax.strip().splitlines()]
    first, last = lines[0], lines[-1]
    if html.count(first) != 1 or html.count(last) != 1:
        raise RuntimeError(
            f"the feedback page does not hold its template's MathJax block once "
            f"({first!r} ... {last!r}): nbgrader's or nbconvert's template changed; "
            "see autograder/grading/recording/feedback_page.py"
        )
    start, end = html.index(first), html.index(last) + len(last)
    return html[:start] + course_head() + html[end:]
