"""nbgrader's metadata check with its schema checked once (``schema_once.py``) refuses
exactly what nbgrader's own refuses, with the same message."""

import jsonschema
import nbformat
import pytest
from nbgrader.nbgraderformat import MetadataValidator, common

from autograder.grading.recording import schema_once


def _cell(**meta):
    cell = nbformat.v4.new_code_cell("x = 1")
    cell.metadata.nbgrader = {"schema_version": 3, "grade_id": "a", **meta}
    return cell


CELLS = [
    _cell(grade=True, solution=False, locked=False, points=1),
    _cell(grade=True, solution=False, locked=False, points="one"),
    _cell(grade="yes", solution=False, locked=False),
    _cell(grade=False, solution=True, locked=False, task=3),
]


def _verdicts():
    out = []
    for cell in CELLS:
        try:
            MetadataValidator().validate_cell(cell)
            out.append(None)
        except jsonschema.ValidationError as error:
            out.append(error.message)
    return out


def test_the_same_cells_pass_and_fail_with_the_same_messages(monkeypatch):
    monkeypatch.setattr(common, "jsonschema", jsonschema)
    nbgraders = _verdicts()
    assert nbgraders[0] is None and all(nbgraders[1:3])
    schema_once.install()
    assert isinstance(common.jsonschema, schema_once._SchemaCheckedOnce)
    assert _verdicts() == nbgraders
    assert _verdicts() == nbgraders  # the second time, from the remembered schema


def test_an_invalid_schema_is_still_refused():
    with pytest.raises(jsonschema.SchemaError):
        schema_once._SchemaCheckedOnce().validate({}, {"type": 12})
