"""Put reference bodies into exercise stubs, between nbgrader's solution markers.

An exercise cell defines functions and classes whose stubbed bodies end in
``raise NotImplementedError``. For each such function or method, the statements the stub
gives before the ``raise`` must begin the reference's body too (``super().__init__()``, say);
the ``raise`` is replaced by the rest of the reference's body, fenced by
``### BEGIN SOLUTION`` / ``### END SOLUTION``. ``nbgrader generate_assignment`` later strips
the fenced code again, so the student sees the stub.
"""

import ast
import textwrap
from pathlib import Path

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


class SolutionError(ValueError):
    pass


Definition = tuple[
    ast.FunctionDef | ast.ClassDef, list[str]
]  # the node, its file's lines


def reference_definitions(module: Path) -> dict[str, Definition]:
    """The top-level functions and classes of a reference module, by name, each with the
    lines of the file that writes it. A name the module imports from another reference
    module (``from solutions.multi_head import attention``) is followed there: a chapter
    that builds on earlier chapters' answers holds no copy of them."""
    source = module.read_text()
    tree = ast.parse(source)
    lines = source.splitlines()
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            found[node.name] = (node, lines)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "solutions."
        ):
            other = module.with_name(node.module.removeprefix("solutions.") + ".py")
            imported = reference_definitions(other)
            for alias in node.names:
                found[alias.asname or alias.name] = imported[alias.name]
    return found


def _definitions(
    definitions: dict[str, Definition],
) -> dict[str, tuple[ast.FunctionDef, list[str]]]:
    """Functions and methods of classes, by qualified name."""
    found = {}
    for name, (node, lines) in definitions.items():
        if isinstance(node, ast.FunctionDef):
            found[name] = (node, lines)
        else:
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found[f"{name}.{item.name}"] = (item, lines)
    return found


def _statements(fn: ast.FunctionDef) -> list[ast.stmt]:
    """The body without its docstring."""
    body = fn.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
    ):
        if isinstance(body[0].value.value, str):
            return body[1:]
    return body


def _is_stub_raise(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.Raise) or stmt.exc is None:
        return False
    exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def exercise_names(source: str) -> list[str]:
    """Names of the top-level functions and classes an exercise cell defines."""
    return [
        n.name
        for n in ast.parse(source).body
        if isinstance(n, ast.FunctionDef | ast.ClassDef)
    ]


def fill_solutions(
    stub_source: str, reference: dict[str, Definition], where: str
) -> str:
    """The stub cell with every ``raise NotImplementedError`` body completed from the
    reference (:func:`reference_definitions`)."""
    reference_defs = _definitions(reference)
    stub_tree = ast.parse(stub_source)
    stub_defs = {
        n.name: (n, [])
        for n in stub_tree.body
        if isinstance(n, ast.FunctionDef | ast.ClassDef)
    }
    lines = stub_source.splitlines()
    replacements = []
    for name, (stub, _) in _definitions(stub_defs).items():
        given = _statements(stub)
        if not given or not _is_stub_raise(given[-1]):
            continue
        given, stub_raise = given[:-1], given[-1]
        if name not in reference_defs:
            raise SolutionError(
                f"{where}: `{name}` has a stub but no reference implementation"
            )
        reference, reference_lines = reference_defs[name]
        full = _statements(reference)
        prefix = full[: len(given)]
        if [ast.dump(s) for s in prefix] != [ast.dump(s) for s in given]:
            raise SolutionError(
                f"{where}: the code the stub `{name}` gives must begin its reference's body"
            )
        rest = full[len(given) :]
        if not rest:
            raise SolutionError(
                f"{where}: the reference `{name}` has nothing beyond what the stub gives"
            )
        # Start after the previous statement or the docstring, so that comments come along.
        if prefix:
            previous_end = prefix[-1].end_lineno
        elif full is not reference.body:
            previous_end = reference.body[0].end_lineno  # the docstring
        else:
            previous_end = rest[0].lineno - 1
        body = textwrap.dedent(
            "\n".join(reference_lines[previous_end : rest[-1].end_lineno])
        ).strip("\n")
        indent = " " * stub_raise.col_offset
        fenced = (
            [indent + BEGIN]
            + [indent + line if line.strip() else "" for line in body.splitlines()]
            + [indent + END]
        )
        replacements.append((stub_raise.lineno - 1, stub_raise.end_lineno, fenced))
    for start, end, fenced in sorted(replacements, reverse=True):
        lines[start:end] = fenced
    return "\n".join(lines)
