"""Helpers every chapter uses: device choice, checks that explain themselves, attention plots.

The chapter notebooks import this module; the student notebooks get a copy of it inlined by
``python -m autograder build`` so that they run anywhere (Colab included) on their own.
It needs nothing but torch and matplotlib.
"""

import torch


def pick_device() -> torch.device:
    """CUDA when there is a GPU, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def difference(
    name: str, got, expected: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-5
) -> str | None:
    """None when tensor ``got`` equals ``expected`` within tolerance, else what differs."""
    if not isinstance(got, torch.Tensor):
        return f"{name}: expected a tensor of shape {tuple(expected.shape)}, got {type(got).__name__}"
    if got.shape != expected.shape:
        shape_got, shape_exp = tuple(got.shape), tuple(expected.shape)
        hint = ""
        if sorted(shape_got) == sorted(shape_exp):
            hint = " (the same sizes in another order: a transpose or a wrong reshape?)"
        elif got.dim() != expected.dim():
            hint = " (a missing or extra dimension: check broadcasting and keepdim)"
        return f"{name}: expected shape {shape_exp}, got {shape_got}{hint}"
    if expected.dtype == torch.bool or not expected.is_floating_point():
        if got.dtype != expected.dtype and (
            expected.dtype == torch.bool or got.is_floating_point()
        ):
            return f"{name}: expected dtype {expected.dtype}, got {got.dtype}"
        wrong = (got.cpu() != expected.cpu()).sum().item()
        return (
            None
            if wrong == 0
            else f"{name}: {wrong} of {expected.numel()} entries differ"
        )
    if not got.is_floating_point():
        return f"{name}: expected a floating-point tensor, got dtype {got.dtype}"
    e, g = expected.detach().cpu().double(), got.detach().cpu().double()
    nan = (torch.isnan(g) & ~torch.isnan(e)).sum().item()
    if nan:
        return f"{name}: {nan} entries are NaN where they should be finite (a fully masked row, or exp of a huge logit?)"
    inf = (torch.isinf(g) & ~torch.isinf(e)).sum().item()
    if inf:
        return f"{name}: {inf} entries are infinite where they should be finite (overflow?)"
    if torch.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
        return None
    err = (g - e).abs().nan_to_num(0.0)
    bad = (err > atol + rtol * e.abs()).sum().item()
    return (
        f"{name}: values differ (max abs error {err.max().item():.3g}, "
        f"{bad} of {e.numel()} entries outside rtol={rtol:g}, atol={atol:g})"
    )


def expect(condition: bool, message: str) -> None:
    """A check that says what is wrong when it fails."""
    if not condition:
        raise AssertionError(message)


def expect_shape(name: str, tensor, shape: tuple) -> None:
    expect(
        isinstance(tensor, torch.Tensor),
        f"{name}: expected a tensor, got {type(tensor).__name__}",
    )
    expect(
        tuple(tensor.shape) == tuple(shape),
        f"{name}: expected shape {tuple(shape)}, got {tuple(tensor.shape)}",
    )


def expect_close(
    name: str,
    got,
    expected: torch.Tensor,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    hint: str = "",
) -> None:
    problem = difference(name, got, expected, rtol, atol)
    expect(problem is None, f"{problem}. {hint}".strip())


def passed(what: str) -> None:
    print(f"\N{CHECK MARK} {what}")


def glue(name: str, value) -> None:
    """Hand ``value`` to the book's prose, which quotes it as ``{glue:text}`name```.

    In the book (the chapters import this module) it is myst-nb's ``glue``, so every
    number the text quotes is the number this run computed. A student notebook carries a
    copy of this module in a cell of its own (``__name__`` is ``__main__`` there), where
    the text says "[name: see the output above]": so it prints that line."""
    if __name__ != "course_utils":
        shown = f"{value:.4g}" if isinstance(value, float) else value
        print(f"{name.replace('_', ' ')}: {shown}")
        return
    from myst_nb import glue as myst_glue

    myst_glue(name, value, display=False)


def claim(statement: str, holds: bool) -> None:
    """A statement the prose makes about the run above (an accuracy reached, an ordering).

    Silent when it holds. When it does not: in the book build and the course's own tests
    (``COURSE_STRICT_CLAIMS=1``) an error, since the page would say something false; in a
    student notebook a note, since a different answer or machine may explain it."""
    import os

    if holds:
        return
    if os.environ.get("COURSE_STRICT_CLAIMS") == "1":
        raise AssertionError(
            f"The text claims: {statement}. This run does not bear it out."
        )
    print(
        f"Note: the text says {statement}, and your run above does not bear it out. "
        "If an exercise it uses is still unfinished or wrong, that is the likely reason."
    )


def plot_attention(weights, queries, keys, title="", ax=None, annotate=True):
    """Heatmap of an (n_q, n_k) weight matrix: one row per query, one column per key."""
    import matplotlib.pyplot as plt

    weights = weights.detach().cpu().float()
    if ax is None:
        _, ax = plt.subplots(figsize=(0.55 * len(keys) + 1.8, 0.5 * len(queries) + 1.2))
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(keys)), keys, rotation=45, ha="right")
    ax.set_yticks(range(len(queries)), queries)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title)
    if annotate:
        for i in range(weights.shape[0]):
            for j in range(weights.shape[1]):
                value = weights[i, j].item()
                ax.text(
                    j,
                    i,
                    f"{value:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if value > 0.6 else "white",
                )
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return ax


# Schematics: small drawing helpers for the diagrams of the chapters (matplotlib patches only).
PALETTE = {
    "query": "#e8892b",  # orange: queries, the thing that attends
    "key": "#4a7fb5",  # blue: keys
    "value": "#8cb369",  # green: values and outputs
    "neutral": "#c9d3de",  # grey: everything else
    "light": "#eef2f6",  # a background panel
    "ink": "#1f2a36",  # lines and text
}


def schematic_figure(ncols: int = 1, figsize: tuple = (9, 3.5)):
    """A figure for a schematic: white background (legible on a dark page), axes off.

    Returns (fig, axes); axes is one Axes when ncols == 1, else an array of them.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=figsize)
    fig.patch.set_facecolor("white")
    for ax in [axes] if ncols == 1 else axes:
        ax.set_facecolor("white")
        ax.set_aspect("equal")
        ax.axis("off")
    return fig, axes


def box(ax, x, y, w, h, color, text="", size=8, text_color=None):
    """A rounded box of width w and height h centred on (x, y), with optional text."""
    from matplotlib.patches import FancyBboxPatch

    ink = PALETTE["ink"]
    ax.add_patch(
        FancyBboxPatch(
            (x - w / 2, y - h / 2),
            w,
            h,
            boxstyle="round,pad=0.01,rounding_size=0.04",
            fc=color,
            ec=ink,
            lw=0.8,
        )
    )
    if text:
        ax.text(
            x, y, text, ha="center", va="center", fontsize=size, color=text_color or ink
        )


def arrow(ax, start, end, text="", color=None, lw=1.2, size=8, rad=0.0, offset=(0, 0)):
    """An arrow from start to end (optionally curved by rad), with a label at its middle."""
    from matplotlib.patches import FancyArrowPatch

    color = color or PALETTE["ink"]
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle="-|>",
            mutation_scale=10,
            lw=lw,
            color=color,
            connectionstyle=f"arc3,rad={rad}",
            shrinkA=0,
            shrinkB=0,
        )
    )
    if text:
        middle = (
            (start[0] + end[0]) / 2 + offset[0],
            (start[1] + end[1]) / 2 + offset[1],
        )
        ax.text(*middle, text, ha="center", va="center", fontsize=size, color=color)


def link(ax, start, end, weight, color=None):
    """A line whose width shows an attention weight in [0, 1]."""
    ax.plot(
        *zip(start, end, strict=True),
        color=color or PALETTE["query"],
        lw=0.5 + 5 * weight,
        alpha=0.8,
        solid_capstyle="round",
    )
