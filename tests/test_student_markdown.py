"""The book's MyST, as the student notebooks show it (``autograder/build/student_markdown.py``)."""

from autograder.build.student_markdown import to_jupyter_markdown


def test_citations_spell_authors_as_the_bibliography_does():
    text = to_jupyter_markdown("{cite:p}`velickovic2018graph`")
    assert text == "(Veličković et al., 2018)"


def test_a_glued_number_points_at_the_students_own_output():
    """The book quotes the number its own run computed; a notebook has no such run
    behind its text, so it names the value and points at the output above."""
    text = to_jupyter_markdown(
        "reaches {glue:text}`sort_exact_match:.1%` exact match ({glue:}`steps`)"
    )
    assert text == (
        "reaches [sort exact match: see the output above] exact match "
        "([steps: see the output above])"
    )
