"""TeX to MathML when a feedback page is written, so the page needs no script for its math.

Browsers render MathML Core, and screen readers read it, so a page that carries its
formulas as MathML shows them offline with nothing to run. ``latex2mathml`` (MIT, pure
Python, pinned in requirements.txt) does the conversion. Its output is not trusted: TeX
is the student's too (their Markdown cells), and ``latex2mathml`` passes some of it
through as it is (``\\href`` and ``\\style`` become attributes, ``\\text{<script>}``
becomes markup). So its output is parsed as XML and written again from an allowlist of
MathML elements and attributes (no links, styles, classes or ids, nothing that loads or
runs), with the characters as text, not entities; the page's sanitiser
(``safe_feedback.py``) checks the result once more.

What cannot be converted (TeX ``latex2mathml`` does not know, a formula too long or
nested too deep, a page over its budget) shows as its TeX text, never breaking the page.
The bounds keep a hostile notebook's cost small: at most :data:`MAX_TEX` characters and
:data:`MAX_DEPTH` levels of braces per formula, :data:`PAGE_BUDGET` characters of TeX
converted per page, and :data:`MAX_GROWTH` times its TeX's length of MathML per formula.
"""

from __future__ import annotations

import html
import xml.etree.ElementTree as ET

from latex2mathml.converter import convert

MAX_TEX = 2_000  # characters of one formula (the course's longest: about 300)
MAX_DEPTH = 40  # nested braces, \left ... \right and environments in one formula
PAGE_BUDGET = 60_000  # characters of TeX converted per page (chapter 3: about 5,000)
MAX_GROWTH = 40  # MathML characters per TeX character, at most (typical: 5 to 12)

# MathML Core's elements (and menclose, which latex2mathml writes for \boxed)
ELEMENTS = frozenset(
    {"math", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "mfrac", "msqrt"}
    | {"mroot", "msub", "msup", "msubsup", "munder", "mover", "munderover"}
    | {"mmultiscripts", "mprescripts", "none", "mtable", "mtr", "mtd", "mstyle"}
    | {"mpadded", "mphantom", "menclose", "merror", "semantics"}
)
# Presentation attributes only: none of them links, styles, names or runs anything
ATTRIBUTES = frozenset(
    {"display", "displaystyle", "scriptlevel", "mathvariant", "stretchy", "fence"}
    | {"separator", "form", "lspace", "rspace", "largeop", "movablelimits", "accent"}
    | {"accentunder", "symmetric", "minsize", "maxsize", "linethickness", "width"}
    | {"height", "depth", "columnalign", "rowalign", "columnspacing", "rowspacing"}
    | {"columnlines", "rowlines", "frame", "notation"}
)
MATHML_NS = "http://www.w3.org/1998/Math/MathML"


class Unrenderable(ValueError):
    """TeX that is shown as text instead."""


def _depth(tex: str) -> int:
    depth = deepest = 0
    for token in tex.replace("\\{", "").replace("\\}", "").split("\\"):
        for ch in token:
            depth += (ch == "{") - (ch == "}")
            deepest = max(deepest, depth)
    nests = tex.count("\\left") + tex.count("\\begin")
    return max(deepest, nests)


def _name(tag: str) -> str:
    return tag.split("}", 1)[1] if tag.startswith("{") else tag


def _write(element: ET.Element, out: list[str]) -> None:
    """``element`` as MathML from the allowlists; an mrow of one child is the child."""
    name = _name(element.tag)
    if name not in ELEMENTS:
        raise Unrenderable(f"<{name}>")
    children = list(element)
    if name == "mrow" and len(children) == 1 and not (element.text or "").strip():
        if not (children[0].tail or "").strip():
            _write(children[0], out)
            return
    attributes = "".join(
        f' {key}="{html.escape(value)}"'
        for key, value in sorted(element.attrib.items())
        if key in ATTRIBUTES
    )
    if name == "math":
        attributes = f' xmlns="{MATHML_NS}"' + attributes
    out.append(f"<{name}{attributes}>{html.escape(element.text or '', quote=False)}")
    for child in children:
        _write(child, out)
        out.append(html.escape(child.tail or "", quote=False))
    out.append(f"</{name}>")


def mathml(tex: str, display: bool = False) -> str:
    """``tex`` as one ``<math>`` element from the allowlists; :class:`Unrenderable` when
    it cannot be (the caller shows the TeX)."""
    if len(tex) > MAX_TEX or _depth(tex) > MAX_DEPTH:
        raise Unrenderable("too long or nested too deep")
    try:
        converted = convert(tex, display="block" if display else "inline")
    except Exception as exc:  # noqa: BLE001 (any TeX it cannot read is shown as text)
        raise Unrenderable(type(exc).__name__) from None
    if "<!" in converted or "<?" in converted:  # no declarations or entities to expand
        raise Unrenderable("markup in the TeX")
    if len(converted) > MAX_GROWTH * len(tex) + 200:
        raise Unrenderable("too large")
    try:
        root = ET.fromstring(converted)
    except ET.ParseError:  # e.g. \text{<b>}: markup latex2mathml passed through
        raise Unrenderable("not well-formed") from None
    out: list[str] = []
    try:
        _write(root, out)
    except RecursionError:  # MathML nested deeper than Python recurses
        raise Unrenderable("nested too deep") from None
    return "".join(out)


def tex_text(tex: str, display: bool = False) -> str:
    """``tex`` shown as what it is, with its delimiters, as escaped text."""
    mark = "$$" if display else "$"
    kind = "tex-display" if display else "tex-inline"
    return f'<code class="{kind}">{html.escape(mark + tex + mark, quote=False)}</code>'


class PageMath:
    """Converts one page's formulas within :data:`PAGE_BUDGET` characters of TeX."""

    def __init__(self) -> None:
        self.converted = 0  # characters of TeX converted so far
        self.as_text = 0  # formulas shown as TeX

    def render(self, tex: str, display: bool = False) -> str:
        self.converted += len(tex)
        try:
            if self.converted > PAGE_BUDGET:
                raise Unrenderable("the page's budget is spent")
            return mathml(tex, display)
        except Exception:  # noqa: BLE001 (Unrenderable, or any surprise: never the page)
            self.as_text += 1
            return tex_text(tex, display)
