"""Exercise cells that hand back earlier chapters' stubs, derived from those chapters.

Chapter 6's exercise 0 asks for the student's own answers to chapters 3 to 5, so its cell
shows those chapters' stubs (signatures and docstrings). They are written once, in their
own chapters: the cell names them in its metadata, as ``CHAPTER/NAME`` in the order shown,

    ---
    stubs_from: [03_self_attention/causal_mask, 04_multi_head/attention, ...]
    tags: [exercise, skip-execution]
    ---

and ``python -m autograder build`` rewrites its body from them (``refresh``), before the
notebooks are made from the chapter; ``build --check`` reports a body that is stale.

A later chapter that *uses* earlier chapters' answers without asking for them again
(chapter 10 calls chapter 5's ``apply_rope`` and chapter 8's ``kv_cache_step``) gets a
given, read-only cell instead, derived the same way from the references themselves, as
``MODULE/NAME`` in ``solutions/MODULE.py``:

    ---
    given_from: [positional_encoding/apply_rope, efficient_attention/kv_cache_step]
    tags: [given]
    ---

Those chapters' submissions are in by then (``tests/test_answer_leaks.py``), and the code
has one source: the reference module, which the later chapter's own reference imports.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import jupytext
import yaml

from autograder import paths

KEY = "stubs_from"
GIVEN_KEY = "given_from"
# a code cell of a MyST notebook: its header (with the YAML block) and its body
_CELL = re.compile(
    r"(?P<head>^```\{code-cell\}[^\n]*\n---\n(?P<yaml>.*?)\n---\n)(?P<body>.*?)(?=^```$)",
    re.MULTILINE | re.DOTALL,
)


@cache
def _stubs(chapter: str) -> dict[str, str]:
    """Each top-level definition in the chapter's exercise cells, as its source text."""
    found = {}
    for cell in jupytext.read(paths.chapter_source(chapter)).cells:
        if "exercise" in cell.metadata.get("tags", []):
            lines = cell.source.splitlines()
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.FunctionDef | ast.ClassDef):
                    found[node.name] = "\n".join(
                        lines[node.lineno - 1 : node.end_lineno]
                    )
    return found


def derived(names: list[str]) -> str:
    """The body of a cell that shows the stubs ``CHAPTER/NAME``, in that order."""
    parts = []
    for entry in names:
        chapter, name = entry.split("/")
        if name not in _stubs(chapter):
            raise KeyError(f"{KEY}: {chapter} has no exercise stub {name!r}")
        parts.append(_stubs(chapter)[name])
    return "\n\n\n".join(parts)


def given(names: list[str]) -> str:
    """The body of a cell that gives the references ``MODULE/NAME``, in that order."""
    parts = []
    for entry in names:
        module, name = entry.split("/")
        source = (paths.REPO / "solutions" / f"{module}.py").read_text()
        lines = source.splitlines()
        found = [
            n
            for n in ast.parse(source).body
            if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name
        ]
        if not found:
            raise KeyError(f"{GIVEN_KEY}: solutions/{module}.py has no {name!r}")
        node = found[0]
        parts.append("\n".join(lines[node.lineno - 1 : node.end_lineno]))
    header = (
        "# Given (read-only): code this chapter builds on, copied by\n"
        "# `python -m autograder build` from the course's reference implementations."
    )
    return header + "\n" + "\n\n\n".join(parts)


def _fresh_text(path: Path) -> str:
    """The chapter's text with every ``stubs_from`` cell's body derived afresh."""
    text = path.read_text()

    def fill(match: re.Match) -> str:
        meta = yaml.safe_load(match["yaml"]) or {}
        if meta.get(KEY) is not None:
            return match["head"] + "\n" + derived(meta[KEY]) + "\n"
        if meta.get(GIVEN_KEY) is not None:
            return match["head"] + "\n" + given(meta[GIVEN_KEY]) + "\n"
        return match[0]

    return _CELL.sub(fill, text)


def refresh(chapter: str) -> bool:
    """Rewrite the chapter's derived stub cells; True when anything changed."""
    path = paths.chapter_source(chapter)
    fresh = _fresh_text(path)
    if fresh == path.read_text():
        return False
    path.write_text(fresh)
    return True


def stale(chapter: str) -> bool:
    path = paths.chapter_source(chapter)
    return _fresh_text(path) != path.read_text()
