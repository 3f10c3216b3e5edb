"""The feedback page as it is written, without a grading run (issues 43 and 44): math as
MathML with no script, hostile TeX kept harmless and bounded, test names in the table of
contents, "Read again" a link, a refusal explained once. The pages of real grading runs
are checked in Chromium in tests/test_class_autograde.py and tests/test_grader_bounds.py."""

import re
import time

import nbformat
import pytest

from autograder import paths
from autograder.grading.recording import feedback_page, tex_math
from autograder.grading.recording.safe_feedback import FeedbackExporter
from autograder.grading.sealed import guard
from tests.notebooks import source_notebook

CHAPTER = "03_self_attention"

# TeX that asks for links, styles, classes, ids, code or markup, or that would cost time
# or size: none of it may reach the page as anything but harmless MathML or text.
HOSTILE_TEX = {
    "href": r"\href{javascript:window.pwned=1}{a link}",
    "href_http": r"\href{http://evil.example/}{x}",
    "style": r"\style{background:url(http://evil.example/t.png)}{b}",
    "class": r"\class{panel}{c} \cssId{top}{d}",
    "token": r"\mmlToken{mi}[href=javascript:alert(1)]{a}",
    "require": r"\require{html} \unicode{x41}",
    "script_in_text": r"\text{<script>window.pwned=1</script>}",
    "close_math": r"x</math><script>window.pwned=1</script><math>",
    "entity": r"\text{<!DOCTYPE a [<!ENTITY e 'x'>]>&e;}",
    "handler": r"\text{<img src=x onerror=alert(1)>}",
    "color": r"\color{#fff}{white on white}",
}
UNSAFE = re.compile(
    r"<script|javascript:|\bhref=|\bstyle=|\bon\w+=|\bclass=|\bid=|<!|evil\.example",
    re.I,
)


def _tags(markup: str) -> str:
    """``markup``'s tags with their attributes, without text (where TeX shown as text
    may say anything, escaped), less the course's own wrapper of TeX shown as text."""
    markup = re.sub(r'^<code class="tex-(inline|display)">', "<code>", markup)
    return " ".join(re.findall(r"<[^>]*>", markup))


def test_formulas_become_mathml():
    math = tex_math.mathml(
        r"\operatorname{softmax}\left(\frac{QK^\top}{\sqrt{d_k}}\right)V"
    )
    assert math.startswith('<math xmlns="http://www.w3.org/1998/Math/MathML"')
    assert (
        "<mfrac>" in math and "<msqrt>" in math and "⊤" in math
    )  # characters, not &#x
    assert 'display="block"' in tex_math.mathml("x", display=True)
    assert "<mrow><mi>x</mi></mrow>" not in tex_math.mathml("{x}")  # one child: no mrow


@pytest.mark.parametrize("name", sorted(HOSTILE_TEX))
def test_hostile_tex_is_harmless(name):
    page = tex_math.PageMath()
    for display in (False, True):
        shown = page.render(HOSTILE_TEX[name], display)
        assert not UNSAFE.search(_tags(shown)), shown
        assert "<script" not in shown.lower() and "</math><" not in shown
        if "<math" not in shown:  # shown as its TeX, escaped
            assert (
                shown.startswith("<code")
                and "&lt;" in shown
                or "<" not in HOSTILE_TEX[name]
            )


def test_huge_or_deep_tex_is_text_and_cheap():
    cases = {
        "long": r"\frac{a}{b} + " * 400,
        "deep": "{" * 5000 + "x" + "}" * 5000,
        "lefts": r"\left(" * 300 + "x" + r"\right)" * 300,
        "sqrt": r"\sqrt{" * 45 + "x" + "}" * 45,
        "unbalanced": "{" * 100_000,
        "accents": r"\hat" * 499 + "x",  # 499 levels of MathML within MAX_TEX
    }
    page = tex_math.PageMath()
    start = time.perf_counter()
    for tex in cases.values():
        shown = page.render(tex)
        assert shown.startswith('<code class="tex-inline">'), shown[:80]
        assert len(shown) < 1.1 * len(tex) + 100  # the TeX, escaped: no blow-up
    assert time.perf_counter() - start < 1.0
    assert page.as_text == len(cases)


def test_a_page_converts_within_its_budget():
    page = tex_math.PageMath()
    formula = r"\frac{q_i k_j^\top}{\sqrt{d_k}}"
    shown = [
        page.render(formula) for _ in range(tex_math.PAGE_BUDGET // len(formula) + 50)
    ]
    assert shown[0].startswith("<math") and shown[-1].startswith("<code")
    assert page.as_text >= 50  # what is over the budget reads as TeX, the rest is math


def test_the_course_math_converts():
    """Every formula of chapter 3 is MathML on its page, none left as TeX; across the
    book, at most a handful fall back (TeX latex2mathml does not know)."""
    found, failed = 0, []
    for chapter in sorted(paths.CHAPTERS.iterdir()):
        for md in chapter.glob("*.md"):
            for m in re.finditer(
                r"\$\$(.+?)\$\$|(?<![\\$])\$(.+?)(?<![\\$])\$", md.read_text(), re.S
            ):
                found += 1
                try:
                    tex_math.mathml(m.group(1) or m.group(2), bool(m.group(1)))
                except tex_math.Unrenderable:
                    failed.append((chapter.name, (m.group(1) or m.group(2))[:60]))
    assert found > 1000 and len(failed) <= 5, failed
    assert not [f for f in failed if f[0] == CHAPTER]


def _scored(nb):
    """``nb`` with the scores nbgrader's GetGrades puts in a graded cell's metadata."""
    for cell in nb.cells:
        grading = cell.metadata.get("nbgrader", {})
        if grading.get("grade"):
            grading["score"] = 0.0
    return nb


def _page(nb) -> str:
    resources = {
        "nbgrader": {
            "notebook": CHAPTER,
            "score": 0,
            "max_score": 10,
            "late_penalty": 0,
        }
    }
    html, _ = FeedbackExporter().from_notebook_node(nb, resources)
    return html


@pytest.fixture(scope="module")
def chapter_page():
    """Chapter 3's source notebook as a feedback page: hidden tests named, math and all."""
    return _page(_scored(source_notebook(CHAPTER)))


def test_the_page_is_small_scriptless_and_shows_math(chapter_page):
    assert len(chapter_page.encode()) < 200_000, len(chapter_page.encode())
    assert "<script" not in chapter_page.lower()
    assert "Bootstrap" not in chapter_page  # the course's own small stylesheet instead
    assert chapter_page.count("<math") > 100
    assert 'class="tex-' not in chapter_page  # every formula of chapter 3 is MathML
    assert '<html lang="en">' in chapter_page


def test_the_contents_name_each_hidden_test(chapter_page):
    toc = chapter_page[chapter_page.index('id="toc"') : chapter_page.index("</nav>")]
    assert "Test cell" not in toc
    for test in (
        "sdpa_basic",
        "sdpa_masked",
        "causal_mask_values",
        "self_attention_module",
    ):
        assert f'<a href="#{test}"><code>{test}</code>: ' in toc, toc


def test_outputs_wrap_at_spaces_not_mid_word(chapter_page):
    css = feedback_page.PAGE_CSS
    assert "overflow-wrap: break-word" in css and "anywhere" not in css.replace(
        "not anywhere", ""
    )
    assert "word-break" not in css


def _with_outputs(outputs):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1", outputs=[o]) for o in outputs]
    return nb


def test_read_again_is_a_link_to_the_section():
    address = paths.chapter_page(CHAPTER, "scaled-dot-product-attention")
    elsewhere = "https://evil.example/chapters/x.html"
    nb = _with_outputs(
        [
            nbformat.v4.new_output(
                "error",
                ename="HiddenTestFailed",
                evalue=f"values differ. Read again: {address}",
                traceback=[f"HiddenTestFailed: values differ. Read again: {address}"],
            ),
            nbformat.v4.new_output("stream", text=f"Read again: {elsewhere}\n"),
        ]
    )
    page = _page(nb)
    assert f'Read again: <a href="{address}">{address}</a>' in page
    assert f'href="{elsewhere}"' not in page  # only the course's own book is linked


def test_a_refusal_is_explained_once():
    refusal = guard.refusal("scaled_dot_product_attention")
    outputs = [
        nbformat.v4.new_output(
            "error",
            ename="HiddenTestFailed",
            evalue=refusal,
            traceback=[f"HiddenTestFailed: {refusal}"],
        )  # fmt: skip
        for _ in range(3)
    ]
    nb = _with_outputs(outputs)
    page = _page(nb)
    tail = guard.MESSAGE_TAIL.replace("'", "&#x27;")
    assert page.count("write the attention yourself") == 1, page.count(tail)
    assert page.count("PyTorch") == 3  # each refused test still names what was refused
    assert page.count("the first test above that says so") == 2
    assert nb.cells[2].outputs[0].evalue == refusal  # the notebook itself is unchanged


def test_math_in_a_heading_stays_math():
    """nbconvert anchors a heading from its text alone: the math is put back."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## Without the $n \\times n$ matrix\n")]
    page = _page(nb)
    heading = re.search(r"<h2 [^>]*>.*?</h2>", page, re.S).group(0)
    assert "<math" in heading and "<mo>×</mo>" in heading, heading
    assert 'class="anchor-link"' in heading


def test_a_page_made_again_from_rendered_markdown_is_the_same(chapter_page):
    """Markdown is rendered once per process and reused (most of a page's cost), and so
    is an answer many hand in alike: the next student's page of the same chapter is byte
    for byte the page made afresh."""
    from autograder.grading.recording import safe_feedback

    assert safe_feedback._RENDERED and safe_feedback._HIGHLIGHTED  # the first page's
    assert _page(_scored(source_notebook(CHAPTER))) == chapter_page


def test_reused_markdown_still_counts_against_the_budget(monkeypatch):
    """A student who repeats one formula-heavy cell gets, from the cell past the page's
    budget on, the same TeX as text a page made afresh shows: reuse is no way around it."""
    from autograder.grading.recording import safe_feedback

    formula = r"$\frac{q_i k_j^\top}{\sqrt{d_k}}$ " * 200
    nb = nbformat.v4.new_notebook()
    copies = tex_math.PAGE_BUDGET // (len(formula) - 600) + 3
    nb.cells = [nbformat.v4.new_markdown_cell(formula) for _ in range(copies)]
    safe_feedback._RENDERED.clear()
    reused = [_page(nb), _page(nb)]  # the cell rendered once, then reused
    assert len(safe_feedback._RENDERED) == 1
    monkeypatch.setattr(safe_feedback, "_keep_bounded", lambda kept, key, value: None)
    safe_feedback._RENDERED.clear()
    fresh = _page(nb)  # every cell rendered
    assert reused == [fresh, fresh]
    assert fresh.count('class="tex-') > 0 and fresh.count("<math") > 200
