"""How close a student's output must be to the reference: the one place tolerances are set.

A test declares its level. Single operations are held to float32 round-off; a module that
composes several operations (projections, then attention) accumulates more; a whole model
(stacked layers, layer norms) more again. ``torch.allclose`` semantics:
``|got - expected| <= atol + rtol * |expected|`` element-wise, computed in float64.
"""

from typing import NamedTuple


class Tolerance(NamedTuple):
    rtol: float
    atol: float


LEVELS: dict[str, Tolerance] = {
    "exact": Tolerance(rtol=0.0, atol=0.0),  # masks, indices, integer outputs
    "op": Tolerance(rtol=1e-5, atol=1e-5),  # one operation: a softmax, one attention
    "module": Tolerance(rtol=1e-4, atol=1e-5),  # a layer built from several operations
    "model": Tolerance(rtol=1e-3, atol=1e-4),  # stacks of layers, whole models
}
