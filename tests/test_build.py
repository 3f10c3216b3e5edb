"""The derived notebooks: fresh, complete, and free of solutions and hidden tests where students look."""

import ast
import importlib
import inspect
import os
import shutil
import subprocess
import sys

import jupytext
import pytest
import torch

from autograder import paths
from autograder.build.solution_cells import exercise_names
from autograder.grading.judging.spec import load_chapter_tests
from tests.notebooks import CHAPTERS, answers, release_notebook, source_notebook

NOTEBOOK_PRELUDE = (
    "import math\nfrom collections.abc import Callable\nimport torch\n"
    "import torch.nn.functional as F\nfrom torch import nn\n"
)


# a chapter of Triton kernels (11) imports Triton first, in the interpreter without a GPU,
# as its notebook does
TRITON_PRELUDE = (
    "import os\nif not torch.cuda.is_available():\n"
    "    os.environ.setdefault('TRITON_INTERPRET', '1')\n"
    "import triton\nimport triton.language as tl\n"
)


def _kernels(source: str) -> set[str]:
    """The Triton kernels (``@triton.jit``) an exercise cell defines: they are not called
    but launched (the hidden tests' launchers, ``probe.LAUNCHERS``, and the notebook's own
    wrappers do it)."""
    return {
        n.name
        for n in ast.parse(source).body
        if isinstance(n, ast.FunctionDef)
        and any(ast.unparse(d) == "triton.jit" for d in n.decorator_list)
    }


def _exercise_cells(chapter):
    md = jupytext.read(paths.chapter_source(chapter))
    return [c.source for c in md.cells if "exercise" in c.metadata.get("tags", [])]


def _stubs(chapter) -> dict:
    namespace = {}
    exec(NOTEBOOK_PRELUDE, namespace)
    if any("triton" in source for source in _exercise_cells(chapter)):
        exec(TRITON_PRELUDE, namespace)
    md = jupytext.read(paths.chapter_source(chapter))
    for (
        cell
    ) in md.cells:  # what the stubs call that the chapter gives (chapter 11's _check)
        if "given_from" in cell.metadata:
            exec(cell.source, namespace)
    for source in _exercise_cells(chapter):
        exec(source, namespace)
    return namespace


def _signatures(obj) -> dict[str, inspect.Signature]:
    if inspect.isclass(obj):
        return {
            name: inspect.signature(member)
            for name, member in vars(obj).items()
            if inspect.isfunction(member)
        }
    return {"": inspect.signature(obj)}


def test_committed_notebooks_are_fresh_from_an_environment_never_activated():
    # What an IDE, cron or a service runs: this interpreter by its full path, with none of
    # its environment's tools (nbgrader's alembic, say) on PATH.
    bare = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    bare["PATH"] = "/usr/bin:/bin"
    run = subprocess.run(
        [sys.executable, "-m", "autograder", "build", "--check"],
        cwd=paths.REPO, env=bare, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.returncode == 0, (
        f"{run.stdout}\nrun `python -m autograder build` and commit the notebooks"
    )


def test_a_build_that_fails_leaves_every_derived_file_as_it_was(tmp_path, monkeypatch):
    import autograder.build as build_module

    chapter = CHAPTERS[0]
    shutil.copytree(paths.COURSE_ROOT / "release", tmp_path / "release")
    shutil.copytree(paths.COURSE_ROOT / "source", tmp_path / "source")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.ipynb")}

    def failing(
        chapter, root
    ):  # nbgrader --force empties the release folder, then fails
        shutil.rmtree(paths.release_notebook(chapter, root).parent, ignore_errors=True)
        raise build_module.BuildError("nbgrader generate_assignment failed")

    monkeypatch.setattr(build_module, "generate_release", failing)
    with pytest.raises(build_module.BuildError):
        build_module.build(tmp_path, [chapter])
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.ipynb")} == before


def test_each_stub_signature_equals_its_reference(chapter):
    stubs, reference = _stubs(chapter), load_chapter_tests(chapter).reference()
    names = [n for source in _exercise_cells(chapter) for n in exercise_names(source)]
    assert names
    for name in names:
        # a kernel's signature is its Python function's (``.fn`` of a Triton kernel)
        stub, ref = (
            getattr(x, "fn", x) for x in (stubs[name], getattr(reference, name))
        )
        assert _signatures(stub) == _signatures(ref), name


def test_every_exercise_has_hidden_tests_and_every_test_an_exercise(chapter):
    names = {n for source in _exercise_cells(chapter) for n in exercise_names(source)}
    assert names == set(load_chapter_tests(chapter).exercises)


def test_each_stub_raises_not_implemented(chapter):
    stubs = _stubs(chapter)
    for source in _exercise_cells(chapter):
        # a kernel runs only when launched (``test_kernels`` launches the released stubs)
        for name in set(exercise_names(source)) - _kernels(source):
            with pytest.raises(NotImplementedError):
                obj = stubs[name]
                if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
                    # an autograd Function is called through apply: its forward's
                    # parameters, less ctx
                    params = list(inspect.signature(obj.forward).parameters.values())
                    params, obj = params[1:], obj.apply
                else:
                    params = list(inspect.signature(obj).parameters.values())
                params = [p for p in params if p.default is p.empty]
                obj(*[1] * len(params))


def _code(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def test_student_notebook_has_no_solution_code_and_no_hidden_tests(chapter):
    released = _code(release_notebook(chapter))
    markers = (
        "BEGIN SOLUTION",
        "END SOLUTION",
        "BEGIN HIDDEN TESTS",
        "run_hidden_test",
    )
    imports = (
        "from autograder",
        "import autograder",
        "from solutions",
        "import solutions",
    )
    for marker in markers + imports:
        assert marker not in released
    stub_lines = {
        line.strip()
        for source in _exercise_cells(chapter)
        for line in source.splitlines()
    }
    for answer in answers(chapter).values():
        for line in answer.splitlines():
            line = line.strip()
            if len(line) > 12 and line not in stub_lines and not line.startswith("#"):
                assert line not in released, (
                    f"solution line leaked into the student notebook: {line}"
                )


def test_source_notebook_has_solutions_hidden_tests_and_points(chapter):
    nb = source_notebook(chapter)
    tests = load_chapter_tests(chapter)
    graded = {
        c.metadata.nbgrader.grade_id: c
        for c in nb.cells
        if c.get("metadata", {}).get("nbgrader", {}).get("grade")
    }
    assert set(graded) == {t.id for t in tests.tests}
    for t in tests.tests:
        assert graded[t.id].metadata.nbgrader.points == t.points
        assert "### BEGIN HIDDEN TESTS" in graded[t.id].source
    assert "### BEGIN SOLUTION" in _code(nb)


def test_student_notebook_stands_alone(chapter):
    """No import of the course's own modules: the notebook runs on Colab by itself."""
    code = _code(release_notebook(chapter))
    assert "from course_utils" not in code and "def pick_device" in code


@pytest.mark.parametrize("chapter_id", paths.chapter_ids())
def test_every_chapter_is_in_the_table_of_contents(chapter_id):
    toc = (paths.REPO / "_toc.yml").read_text()
    assert f"chapters/{chapter_id}/{chapter_id}" in toc
    page = paths.chapter_source(chapter_id).read_text()
    assert "## Learning goals" in page


def test_complete_chapters_have_every_part(chapter):
    page = paths.chapter_source(chapter).read_text()
    for heading in (
        "## Learning goals",
        "## Check your understanding",
        "## Further reading",
    ):
        assert heading in page
    assert page.count("plt.show()") >= 2, "a chapter computes at least two figures"
    assert "{cite:" in page


def test_all_chapters_are_listed():
    assert paths.chapter_ids() == [
        "01_bottleneck",
        "02_score_functions",
        "03_self_attention",
        "04_multi_head",
        "05_positional_encoding",
        "06_transformer",
        "07_relative_position",
        "08_efficient_attention",
        "09_beyond_sequences",
        "10_language_model",
        "11_kernels",
    ]
    assert set(CHAPTERS) <= set(paths.chapter_ids())


def test_student_notebook_markdown_has_no_myst_left(chapter):
    """Jupyter and Colab do not render MyST: citations, admonitions and roles are converted."""
    for cell in release_notebook(chapter).cells:
        if cell.cell_type == "markdown":
            for myst in ("{cite:", ":::", "```{", "{ref}", "{doc}"):
                assert myst not in cell.source, cell.source[:200]


def _without_docs_and_hints(node: ast.AST) -> str:
    """A definition's code: docstrings and type hints left out (the chapter's copy may
    explain more to the student than the module's)."""
    for n in ast.walk(node):
        if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                n.body = n.body[1:] or [ast.Pass()]
        if isinstance(n, ast.FunctionDef):
            n.returns = None
            for a in [*n.args.posonlyargs, *n.args.args, *n.args.kwonlyargs]:
                a.annotation = None
    return ast.dump(node)


def test_code_a_chapter_gives_is_the_code_its_reference_runs(chapter):
    """A class or function given to students in a chapter (not an exercise) that the
    reference module also defines must be the same code: the reference is graded
    against what the student's notebook really runs."""
    module = vars(importlib.import_module(f"solutions.{paths.module_name(chapter)}"))
    md = jupytext.read(paths.chapter_source(chapter))
    for cell in md.cells:
        if cell.cell_type != "code" or "exercise" in cell.metadata.get("tags", []):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # IPython magics: not a definition
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in module:
                ref = ast.parse(inspect.getsource(module[node.name])).body[0]
                assert _without_docs_and_hints(ref) == _without_docs_and_hints(node), (
                    f"{chapter}: {node.name} given in the chapter differs from "
                    f"solutions.{paths.module_name(chapter)}.{node.name}"
                )
