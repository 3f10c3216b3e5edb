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

Math is converted to MathML here, as the page is written (``tex_math.py``), so the page
carries no script at all; the MathML passes the same sanitiser, with an allowlist of MathML
elements and presentation attributes. The course's template and stylesheet, and what makes
the page easy to scan, are in ``feedback_page.py``.
"""

from __future__ import annotations

import copy
import html
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import bleach
import nbgrader
from jinja2 import pass_context
from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter
from nbgrader.preprocessors import ClearHiddenTests
from traitlets import List, default
from traitlets.config import Config

from autograder.grading.recording import feedback_page, tex_math

TEMPLATES = Path(__file__).parent / "templates"
NBGRADER_TEMPLATES = (
    Path(nbgrader.__file__).parent / "server_extensions" / "formgrader" / "templates"
)

TAGS = frozenset(
    {"p", "br", "hr", "div", "span", "blockquote", "pre", "code", "kbd", "samp"}
    | {"h1", "h2", "h3", "h4", "h5", "h6", "a", "img", "em", "strong", "b", "i", "u"}
    | {"s", "del", "ins", "sub", "sup", "small", "mark", "abbr", "cite", "q"}
    | {"ul", "ol", "li", "dl", "dt", "dd", "details", "summary"}
    | {"table", "thead", "tbody", "tfoot", "tr", "th", "td", "caption"}
    | tex_math.ELEMENTS
)
# an output's image, which nbconvert writes with no alt: the text nbconvert gives it
NO_ALT = re.compile(r"<img(?![^>]*\balt=)")
NO_DESCRIPTION = "No description has been provided for this image"
# a heading as nbconvert anchors it: the opening tag, its content, then the anchor link
ANCHORED = re.compile(r'^(<h[1-6][^>]*>).*?(<a class="anchor-link")', re.S)
HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")


def _allowed_attribute(tag: str, name: str, value: str) -> bool:
    """Links may point anywhere a click may go; images only to data they hold inline,
    so that the page loads nothing from elsewhere."""
    if tag in tex_math.ELEMENTS:  # MathML: presentation only (tex_math.py)
        return name in tex_math.ATTRIBUTES
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


class _MathRenderer(IPythonRenderer):
    """nbconvert's Markdown renderer, with each formula MathML (or its TeX as text)."""

    def __init__(self, math: tex_math.PageMath, **kwargs):
        super().__init__(**kwargs)
        self.math = math

    def heading(self, text: str, level: int, **attrs) -> str:
        """nbconvert's heading with its anchor, which keeps only the text of what it
        holds: the anchor is made from the heading's words, then its math put back."""
        if "<math" not in text:
            return super().heading(text, level, **attrs)
        anchored = super().heading(re.sub(r"<[^>]*>", "", text), level, **attrs)
        return ANCHORED.sub(lambda m: m.group(1) + text + m.group(2), anchored, 1)

    def block_math(self, body: str) -> str:
        return self.math.render(body, display=True)

    def inline_math(self, body: str) -> str:
        return self.math.render(body)

    def latex_environment(self, name: str, body: str) -> str:
        return self.math.render(f"\\begin{{{name}}}{body}\\end{{{name}}}", True)


@dataclass(frozen=True)
class _Rendered:
    """A markdown cell's sanitised HTML, and what its formulas took of a page's budget."""

    html: str
    converted: int
    as_text: int


# markdown rendered in this process (a recording worker makes many pages): at most
# _KEEP cells of at most _KEEP_CHARS characters, the oldest forgotten first
_RENDERED: dict[tuple, _Rendered] = {}
_KEEP, _KEEP_CHARS = 4096, 50_000


_HIGHLIGHTED: dict[tuple, str] = {}  # answers highlighted in this process, likewise


def _keep_bounded(kept: dict, key: tuple, value) -> None:
    if len(key[0]) > _KEEP_CHARS:
        return
    if len(kept) >= _KEEP:
        del kept[next(iter(kept))]
    kept[key] = value


class FeedbackExporter(HTMLExporter):
    """nbgrader's feedback page in the course's template (``feedback_page.py``), with
    everything the student could have written sanitised and the math as MathML."""

    def __init__(self, config=None, **kwargs):
        # over nbgrader's HTMLExporter settings (its "feedback" template): this class's
        # own section is the more specific, and template paths are set at construction
        config = copy.deepcopy(config) if config is not None else Config()
        config.FeedbackExporter.template_name = "course_feedback"
        config.FeedbackExporter.extra_template_basedirs = [
            str(TEMPLATES),
            str(NBGRADER_TEMPLATES),
        ]
        # where the course's template finds the one it extends, feedback/index.html.j2
        config.FeedbackExporter.extra_template_paths = [str(NBGRADER_TEMPLATES)]
        super().__init__(config=config, **kwargs)
        self.page_math = tex_math.PageMath()
        self._highlight = Highlight2HTML(pygments_lexer="ipython3", parent=self)

    def highlight_answers(self, source, language=None, metadata=None):
        """The student's answers highlighted; the chapter's own code as plain text, which
        is what keeps a page small (highlighting makes each token an element). An answer
        many hand in alike (an untouched stub) is highlighted once per process."""
        metadata = metadata or {}
        if not metadata.get("nbgrader", {}).get("solution"):
            escaped = html.escape(source, quote=False)
            return f'<div class="highlight"><pre>{escaped}</pre></div>'
        # all the highlighting reads: the source, its language, a magic's language
        key = (source, language, metadata.get("magics_language"))
        highlighted = _HIGHLIGHTED.get(key)
        if highlighted is None:
            highlighted = self._highlight(source, language, metadata)
            _keep_bounded(_HIGHLIGHTED, key, highlighted)
        return highlighted

    def default_filters(self):
        yield from super().default_filters()
        yield ("test_title", feedback_page.test_title)

    @default("sanitize_html")
    def _sanitize_by_default(self):  # outputs: nbconvert's own sanitising, no scripts
        return True

    @default("exclude_raw")
    def _no_raw_cells(self):  # copied into the page unsanitised by the templates
        return True

    @pass_context
    def markdown2html(self, context, source):
        """nbconvert's ``markdown2html`` with the math as MathML, then sanitised.

        Most of a page's cost, and the same for every student: the chapter's text. So a
        cell whose rendering cannot depend on anything but its source (no attachments,
        no image read from disk, no formula past the page's budget) is rendered once per
        process and reused, its formulas still counted against each page's budget."""
        cell = context.get("cell", {})
        key = None
        if not cell.get("attachments") and not self.embed_images:
            key = (source, self.anchor_link_text, self.exclude_anchor_links)
        math = self.page_math
        if key is not None and (kept := _RENDERED.get(key)) is not None:
            if math.converted + kept.converted <= tex_math.PAGE_BUDGET:
                math.converted += kept.converted
                math.as_text += kept.as_text
                return kept.html
        before = (math.converted, math.as_text)
        page = self._render_markdown(context, cell, source)
        if key is not None and math.converted <= tex_math.PAGE_BUDGET:
            _keep_bounded(
                _RENDERED,
                key,
                _Rendered(page, math.converted - before[0], math.as_text - before[1]),
            )
        return page

    def _render_markdown(self, context, cell, source) -> str:
        renderer = _MathRenderer(
            self.page_math,
            escape=False,
            attachments=cell.get("attachments", {}),
            embed_images=self.embed_images,
            path=context.get("resources", {}).get("metadata", {}).get("path", ""),
            anchor_link_text=self.anchor_link_text,
            exclude_anchor_links=self.exclude_anchor_links,
            **self.lexer_options,
        )
        return safe_html(MarkdownWithMath(renderer=renderer).render(source))

    def from_notebook_node(self, nb, resources=None, **kw):
        nb = copy.deepcopy(nb)
        feedback_page.refusal_once(nb)
        self.page_math = tex_math.PageMath()  # each page its own budget
        resources = self._init_resources(
            dict(resources or {}, course_css=feedback_page.PAGE_CSS)
        )
        # HTMLExporter.from_notebook_node's work, less its BeautifulSoup pass over the
        # whole page (most of a page's cost), which only adds image descriptions (done
        # below) and marks JupyterLab's cells focusable (the classic template has none)
        self.register_filter("highlight_code", self.highlight_answers)
        self.register_filter(
            "filter_data_type",
            WidgetsDataTypeFilter(
                notebook_metadata=self._nb_metadata, parent=self, resources=resources
            ),
        )
        html, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        html = NO_ALT.sub(f'<img alt="{NO_DESCRIPTION}"', html)
        return feedback_page.linked(html), resources


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
