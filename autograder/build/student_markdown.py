"""Turn the MyST of the book into the Markdown that Jupyter and Colab render.

The chapter sources use MyST: citations (``{cite:p}`key```), admonitions (``:::{note}``)
and dropdowns. A notebook shows those as raw text, so the student notebooks get plain
equivalents: "(Vaswani et al., 2017)", block quotes, ``<details>`` for dropdowns, and for
a number glued from the book's run a pointer to the student's own output.
"""

import re
from functools import cache

from pybtex.backends.plaintext import Backend
from pybtex.database import parse_file
from pybtex.richtext import Text

from autograder.paths import REPO

_CITE = re.compile(r"\{cite:(p|t)\}`([^`]+)`")
_ADMONITION = re.compile(
    r"^:::\{(?P<kind>[a-z]+)\}(?P<title>[^\n]*)\n(?P<options>(?::[a-z-]+:[^\n]*\n)*)(?P<body>.*?)\n:::[ \t]*$",
    re.DOTALL | re.MULTILINE,
)
# ``{glue:text}`key:format``` quotes a number the book's run computed (course_utils.glue);
# a notebook has no such run behind its text, so it points at the student's own output.
_GLUE = re.compile(r"\{glue(?::[a-z]*)?\}`([A-Za-z0-9_.-]+)(?::[^`]*)?`")
_ROLE = re.compile(r"\{[a-z:-]+\}`([^`<]*?)(?:\s*<[^>]*>)?`")


# render_as("text") would look the backend up among every installed package's entry points
# at each call (35 ms); one plain-text backend serves every name
_PLAIN_TEXT = Backend()


class MarkdownError(ValueError):
    pass


@cache
def _bibliography():
    return parse_file(REPO / "references.bib").entries


@cache
def _author_year(key: str) -> tuple[str, str]:
    entry = _bibliography().get(key)
    if entry is None:
        raise MarkdownError(f"unknown citation key {key!r} (add it to references.bib)")
    # LaTeX to text: "Veli{\v{c}}kovi{\'c}" is "Veličković", not "Velivckovi'c"
    authors = [
        Text.from_latex(" ".join(p.last_names)).render(_PLAIN_TEXT)
        for p in entry.persons["author"]
    ]
    names = (
        authors[0]
        if len(authors) == 1
        else " and ".join(authors)
        if len(authors) == 2
        else f"{authors[0]} et al."
    )
    return names, entry.fields["year"]


def _citation(match: re.Match) -> str:
    pairs = [_author_year(key.strip()) for key in match.group(2).split(",")]
    if match.group(1) == "p":
        return "(" + "; ".join(f"{names}, {year}" for names, year in pairs) + ")"
    return ", ".join(f"{names} ({year})" for names, year in pairs)


def _admonition(match: re.Match) -> str:
    kind, title, body = (
        match.group("kind"),
        match.group("title").strip(),
        match.group("body").strip("\n"),
    )
    if ":class: dropdown" in match.group("options"):
        return f"<details><summary><b>{title or kind.capitalize()}</b> (click to open)</summary>\n\n{body}\n\n</details>"
    quoted = "\n".join(f"> {line}" if line else ">" for line in body.splitlines())
    return f"> **{title or kind.capitalize()}**\n>\n{quoted}"


def to_jupyter_markdown(text: str) -> str:
    text = _CITE.sub(_citation, text)
    text = _ADMONITION.sub(_admonition, text)
    text = _GLUE.sub(
        lambda m: f"[{m.group(1).replace('_', ' ')}: see the output above]", text
    )
    text = _ROLE.sub(lambda m: m.group(1), text)
    if re.search(r"^(:::|```)\{", text, re.MULTILINE):
        raise MarkdownError(
            f"a MyST directive has no plain-Markdown form for notebooks: {text[:200]!r}"
        )
    return text
