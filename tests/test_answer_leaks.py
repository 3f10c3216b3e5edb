"""No student notebook gives away the answer to an exercise of its own or a later chapter.

The notebooks are public (Colab links, the book's pages built from the same cells), and a
class works through the chapters in order: a course cell of chapter 4 that defines chapter
4's ``split_heads`` in full, or one of chapter 3 that prints chapter 6's encoder layer,
hands the answer to whoever opens it before the deadline. So every cell of a release
notebook other than the exercise stubs (the course's code, the visible checks, the helpers,
Python in the Markdown, and Python held in string literals, which a cell could print) is
compared with the reference answer of every exercise of that chapter and the later ones,
statement by statement after normalising the code with ``ast``, and by name. A later
chapter may build on an earlier chapter's answer (chapter 9's encoder layer on chapter
6's), since that chapter's submissions are in by then; the instructor guide says so.
"""

import ast
import re

import nbformat
import pytest

from autograder import paths
from autograder.build.solution_cells import reference_definitions
from autograder.grading.judging.spec import graded_chapters, load_chapter_tests

# A statement shorter than this (normalised) says too little to give an answer away:
# "return out", "x = x + 1", "super().__init__()".
MIN_STATEMENT_CHARS = 30
# A cell gives an exercise away when it holds this share of the reference's statements.
REVEALING_SHARE = 0.5


def _leaf_statements(tree: ast.AST) -> set[str]:
    """The simple statements of ``tree`` (compound ones are entered, not kept),
    normalised by ``ast.unparse``, without docstrings or short ones."""
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or hasattr(node, "body"):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring or a bare string
        text = ast.unparse(node)
        if len(text) >= MIN_STATEMENT_CHARS:
            found.add(text)
    return found


def _parse(code: str) -> ast.AST | None:
    # notebook magics and shell escapes are not Python
    code = re.sub(r"^\s*[!%].*$", "", code, flags=re.MULTILINE)
    try:
        return ast.parse(code)
    except SyntaxError:
        return None


def _code_in(tree: ast.AST) -> list[ast.AST]:
    """``tree`` and the Python held in its string literals (code a cell could print)."""
    trees = [tree]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "\n" in node.value and (inner := _parse(node.value)) is not None:
                trees.append(inner)
    return trees


def reference_answers(first: str | None = None) -> dict[str, set[str]]:
    """``{"chapter: exercise": its reference's statements}`` for every graded exercise of
    chapter ``first`` and the later ones (all chapters by default; a class's methods
    together)."""
    answers = {}
    for chapter in graded_chapters():
        if first is not None and chapter < first:
            continue
        module = paths.REPO / "solutions" / f"{paths.module_name(chapter)}.py"
        definitions = reference_definitions(module)
        for name in load_chapter_tests(chapter).exercises:
            answers[f"{chapter}: {name}"] = _leaf_statements(definitions[name][0])
    return answers


def readable_code(chapter: str) -> list[tuple[str, ast.AST]]:
    """Every piece of Python a student reads in the chapter's release notebook, outside
    the exercise cells, with where it is."""
    nb = nbformat.read(paths.release_notebook(chapter), as_version=4)
    pieces = []
    for index, cell in enumerate(nb.cells):
        if cell.metadata.get("nbgrader", {}).get("solution"):
            continue  # an exercise cell: the student's own answer goes there
        sources = (
            [cell.source]
            if cell.cell_type == "code"
            else re.findall(
                r"```(?:python|ipython3)?\n(.*?)```", cell.source, re.DOTALL
            )
        )
        for source in sources:
            if (tree := _parse(source)) is not None:
                pieces += [(f"{chapter}, cell {index}", t) for t in _code_in(tree)]
    return pieces


def revealed(statements: set[str], answer: set[str]) -> bool:
    return bool(answer) and len(statements & answer) >= REVEALING_SHARE * len(answer)


def definitions(tree: ast.AST) -> dict[str, ast.AST]:
    """The functions and classes ``tree`` defines that do more than a stub (raise)."""
    return {
        node.name: node
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and _leaf_statements(node)
    }


@pytest.mark.parametrize("chapter", graded_chapters())
def test_no_cell_of_a_student_notebook_reveals_an_answer(chapter):
    answers = reference_answers(first=chapter)
    leaks = []
    for where, tree in readable_code(chapter):
        statements, defined = _leaf_statements(tree), definitions(tree)
        leaks += [
            f"{where} gives away {exercise} "
            f"({len(statements & answer)} of its {len(answer)} statements)"
            for exercise, answer in answers.items()
            if revealed(statements, answer)
        ]
        # written another way, an exercise's answer under the exercise's name
        leaks += [
            f"{where} defines {name}, the answer to {exercise}"
            for exercise in answers
            if (name := exercise.split(": ")[1]) in defined
        ]
    assert not leaks, "\n".join(leaks)


def test_the_leak_test_sees_a_reference_pasted_into_a_course_cell():
    """The test of the test: a course cell that defines an exercise's answer, or prints it
    from a string, is a leak; a stub is not."""
    answers = reference_answers()
    module = paths.REPO / "solutions" / "multi_head.py"
    source = ast.unparse(
        next(
            node
            for node in ast.parse(module.read_text()).body
            if getattr(node, "name", None) == "MultiHeadAttention"
        )
    )
    answer = answers["04_multi_head: MultiHeadAttention"]
    pasted = _leaf_statements(ast.parse(source))
    printed = set().union(
        *map(_leaf_statements, _code_in(ast.parse(f"print({source!r})")))
    )
    stub = _leaf_statements(
        ast.parse('def f(x):\n    """Doc."""\n    raise NotImplementedError()')
    )
    assert revealed(pasted, answer) and revealed(printed, answer)
    assert not revealed(stub, answer)
    assert all(answers.values()), "an exercise whose reference has no statement to find"
