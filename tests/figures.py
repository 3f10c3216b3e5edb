"""What a figure's text alternative must be, for the book's pages and the student notebooks."""

import re

MIN_WORDS = 8  # "a sentence at least": what it shows and what to notice
# one or two sentences: a screen reader reads the alternative in one breath; the long
# description is the figure's caption, in the page where everyone can read it
MAX_WORDS = 45


def alt_text_problems(alts: list[tuple[str, str | None]]) -> list[str]:
    """Problems with the text alternatives ``[(where, alt or None), ...]`` of one page or
    notebook: missing, a file name or path, too short to say anything, too long to hear in
    one breath, or the same as another figure's."""
    problems, seen = [], {}
    for where, alt in alts:
        text = (alt or "").strip()
        if not text:
            problems.append(f"{where}: no text alternative")
        elif re.search(r"[\w-]+\.(png|svg|jpe?g|gif)\b|^[\w./-]+$", text):
            problems.append(f"{where}: the text alternative is a file name: {text!r}")
        elif len(text.split()) < MIN_WORDS:
            problems.append(f"{where}: the text alternative says too little: {text!r}")
        elif len(text.split()) > MAX_WORDS:
            problems.append(
                f"{where}: the text alternative runs to {len(text.split())} words: keep it "
                f"to one or two sentences and put the long description in the caption"
            )
        elif text in seen:
            problems.append(f"{where}: the same text alternative as {seen[text]}")
        seen.setdefault(text, where)
    return problems
