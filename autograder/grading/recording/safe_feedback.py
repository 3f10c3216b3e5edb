"""Feedback pages that show what the student wrote but run none of it.

``nbgrader generate_feedback`` renders the autograded notebook, whose markdown cells,
raw cells and outputs the student may have written. nbconvert's own option
(``HTMLExporter.sanitize_html``) sanitises outputs and drops JavaScript and widgets, but
nbgrader's feedback template renders markdown cells itself, without it. So
:class:`FeedbackExporter` also passes all rendered markdown through bleach (the
sanitiser nbconvert uses) with an allowlist that keeps what markdown makes (headings,
lists, tables, code, math as text for MathJax, images as data URIs) and drops scripts,
event handlers, styles, frames and anything that loads from elsewhere. Raw cells, which
nbconvert would copy into the page as they are, are left out.

The page also wraps its outputs and typesets math offline (``feedback_page.py``).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import bleach
from jinja2 import pass_context
from nbconvert.exporters import HTMLExporter
from nbgrader.preprocessors import ClearHiddenTests
from traitlets import List, default

from autograder.grading.recording.feedback_page import with_course_head

TAGS = frozenset(
    {"p", "br", "hr", "div", "span", "blockquote", "pre", "code", "kbd", "samp"}
    | {"h1", "h2", "h3", "h4", "h5", "h6", "a", "img", "em", "strong", "b", "i", "u"}
    | {"s", "del", "ins", "sub", "sup", "small", "mark", "abbr", "cite", "q"}
    | {"ul", "ol", "li", "dl", "dt", "dd", "details", "summary"}
    | {"table", "thead", "tbody", "tfoot", "tr", "th", "td", "caption"}
)
HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")


def _allowed_attribute(tag: str, name: str, value: str) -> bool:
    """Links may point anywhere a click may go; images only to data they hold inline,
    so that the page loads nothing from elsewhere."""
    if name in ("class", "title") or (name == "id" and tag in HEADINGS):
        return True
    if tag == "a" and name == "href":
        return urlsplit(value).scheme.lower() in ("", "http", "https", "mailto")
    if tag == "img":
        return name in ("alt", "width", "height") or (
            name == "src" and value.lower().startswith("data:image/")
        )
    if tag in ("td", "th"):
        return name in ("colspan", "rowspan", "align")
    return tag in ("ol", "li") and name in ("start", "value")


def safe_html(html: str) -> str:
    """``html`` with only the allowed tags and attributes; others are removed."""
    return bleach.clean(
        html,
        tags=TAGS,
        attributes=_allowed_attribute,
        protocols={"http", "https", "mailto", "data"},
        strip=True,
        strip_comments=True,
    )


class FeedbackExporter(HTMLExporter):
    """nbgrader's feedback page (its template and settings), with everything the
    student could have written sanitised."""

    @default("sanitize_html")
    def _sanitize_by_default(self):  # outputs: nbconvert's own sanitising, no scripts
        return True

    @default("exclude_raw")
    def _no_raw_cells(self):  # copied into the page unsanitised by the templates
        return True

    @pass_context
    def markdown2html(self, context, source):
        return safe_html(super().markdown2html(context, source))

    def from_notebook_node(self, nb, resources=None, **kw):
        html, resources = super().from_notebook_node(nb, resources, **kw)
        cdn_mathjax = self.environment.get_template("mathjax.html.j2").module.mathjax()
        return with_course_head(html, str(cdn_mathjax)), resources


class FeedbackClearHiddenTests(ClearHiddenTests):
    """nbgrader's ``ClearHiddenTests``, quiet in the feedback step. The exporter configures
    ``display_data_priority`` for every nbconvert class, and nbgrader's base preprocessor
    redeclares it as no option, so traitlets warned "Config option
    `display_data_priority` not recognized" for every page, which reads like an error.
    The same trait as an option (as nbgrader's own ``GetGrades`` declares it) takes the
    setting in silence; this step shows no outputs by it."""

    display_data_priority = List(
        ClearHiddenTests.display_data_priority.default_value, config=True
    )
