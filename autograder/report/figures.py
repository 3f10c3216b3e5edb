"""The class report's plots, as PNG images embedded in the page, each with a text
alternative that states what it shows and its numbers (the page's tables repeat them).
Colour never carries meaning alone: bars are labelled with their counts, and the heat
map's numbers are in the table beside it."""

from __future__ import annotations

import base64
import io
from collections import Counter
from dataclasses import dataclass

from matplotlib.figure import Figure

DPI = 96


@dataclass
class Plot:
    png: str  # base64, for a data: URL
    alt: str


def _png(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def score_counts(scores: list[float], top: float) -> list[tuple[float, int]]:
    """How many students got each score: every whole score from 0 to ``top`` (the ones
    nobody got too: 0) and any other score someone got."""
    counts = Counter(float(s) for s in scores)
    whole = range(int(top) + 1) if top <= 200 else (0, top)
    values = sorted(set(counts) | {float(v) for v in whole} | {float(top)})
    return [(v, counts.get(v, 0)) for v in values]


def histogram(scores: list[float], top: float, what: str) -> Plot:
    """Bars on a real axis of scores, so that a range nobody scored in shows as a gap."""
    counts = score_counts(scores, top)
    fig = Figure(figsize=(max(4.2, 0.22 * len(counts)), 2.4))
    ax = fig.add_subplot()
    values = [v for v, _ in counts]
    gaps = [b - a for a, b in zip(values, values[1:], strict=False)]
    width = 0.8 * min(gaps, default=1.0)
    bars = ax.bar(values, [n for _, n in counts], width=width, color="#1f5f8b")
    ax.bar_label(bars, labels=[str(n) if n else "" for _, n in counts], padding=1)
    ax.set_xlim(-width, top + width)
    if top <= 30:
        ax.set_xticks(range(int(top) + 1))
    ax.set_xlabel(f"score (out of {top:g})")
    ax.set_ylabel("students")
    ax.set_title(what, fontsize=10)
    ax.margins(y=0.2)
    ax.spines[["top", "right"]].set_visible(False)
    said = "; ".join(f"{n} scored {v:g}" for v, n in counts if n) or "no scores"
    alt = (
        f"Bar chart of {what} on a scale from 0 to {top:g}, for {len(scores)} "
        f"students: {said}; no one else."
    )
    return Plot(_png(fig), alt)


def heat_map(
    rows: list[str], columns: list[str], shares: list[list[float | None]]
) -> Plot:
    """Students (rows) by exercises (columns): the share of each exercise's points
    (None: no grade for that assignment, drawn white)."""
    import matplotlib
    import numpy as np

    values = np.ma.masked_invalid(np.array(shares, dtype=float).reshape(len(rows), -1))
    cmap = matplotlib.colormaps["cividis"].with_extremes(bad="white")
    fig = Figure(
        figsize=(min(1.0 + 0.45 * len(columns), 16), min(1.5 + 0.18 * len(rows), 12))
    )
    ax = fig.add_subplot()
    image = ax.imshow(
        values, aspect="auto", cmap=cmap, vmin=0, vmax=1, interpolation="nearest"
    )
    ax.set_xticks(range(len(columns)), columns, rotation=60, ha="right", fontsize=8)
    if len(rows) <= 60:
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
    else:
        ax.set_yticks([])
        ax.set_ylabel(f"{len(rows)} students")
    fig.colorbar(image, ax=ax, label="share of the exercise's points")
    alt = (
        f"Heat map of {len(rows)} students by {len(columns)} exercises: each cell's "
        "brightness is the share of the exercise's points the student earned, from dark "
        "(none) to light (all); white where the student has no grade for the "
        "assignment. The table of scores below gives every number."
    )
    return Plot(_png(fig), alt)
