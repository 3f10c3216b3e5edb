"""nbgrader's check of each cell's metadata, with its schema checked once, not per cell.

nbgrader validates every cell's ``nbgrader`` metadata with ``jsonschema.validate``, which
first checks the schema itself against the JSON Schema meta-schema: about nine tenths of
the time ``nbgrader autograde`` spends in ``CheckCellMetadata`` (three passes over every
cell of every notebook), for the same small schema each time. :func:`install` gives
nbgrader's metadata module a ``validate`` that does the same work, in the same order and
with the same errors, and remembers the schemas it has already checked.
"""

from __future__ import annotations

import json

import jsonschema
from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for


class _SchemaCheckedOnce:
    """Stands for the ``jsonschema`` module where nbgrader's metadata module uses it."""

    def __init__(self) -> None:
        self._validators: dict[str, object] = {}

    def validate(self, instance, schema, cls=None, *args, **kwargs) -> None:
        """``jsonschema.validate``: a schema that was valid is not checked again."""
        key = json.dumps(
            [schema, getattr(cls, "__name__", None), args, kwargs],
            sort_keys=True,
            default=repr,
        )
        validator = self._validators.get(key)
        if validator is None:
            cls = cls or validator_for(schema)
            cls.check_schema(schema)
            validator = self._validators[key] = cls(schema, *args, **kwargs)
        error = best_match(validator.iter_errors(instance))
        if error is not None:
            raise error

    def __getattr__(self, name: str):
        return getattr(jsonschema, name)


def install() -> None:
    """In this process only (a recording worker)."""
    from nbgrader.nbgraderformat import common

    if not isinstance(common.jsonschema, _SchemaCheckedOnce):
        common.jsonschema = _SchemaCheckedOnce()
