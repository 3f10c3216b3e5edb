"""Attack cells shared by the attack tests and the nbgrader test: each must earn nothing."""

from autograder import paths
from tests.notebooks import release_notebook, with_extra_cell

CHAPTER = "03_self_attention"
REPO = str(paths.REPO)


def stub_with_cell(source: str):
    """The untouched notebook plus ``source`` after the last exercise (so that a stolen
    answer is not overwritten by a later stub)."""
    return with_extra_cell(release_notebook(CHAPTER), source, "exercise_SelfAttention")


PATCH_COMPARISONS = """
import math, numpy, numpy.testing, torch, torch.testing
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
torch.Tensor.__eq__ = lambda self, other: torch.ones((), dtype=torch.bool)
numpy.allclose = lambda *a, **k: True
numpy.testing.assert_allclose = lambda *a, **k: None
math.isclose = lambda *a, **k: True
"""

# Gets the reference answers if any route to them exists; else leaves the stubs.
STEAL = f"""
import glob, json, sys
stolen = {{}}
try:
    sys.path.insert(0, "{REPO}")
    from solutions.self_attention import (
        scaled_dot_product_attention, causal_mask, padding_mask, SelfAttention)
    stolen["import"] = True
except Exception as exc:
    print("no import:", exc)
for path in ["{REPO}/autograder/course/source/{CHAPTER}/{CHAPTER}.ipynb",
             *[p for top in ("/tmp", "/submission", "/root", "/home", "/work")
               for p in glob.glob(top + "/**/source/{CHAPTER}/*.ipynb", recursive=True)]]:
    try:
        nb = json.load(open(path))
    except Exception as exc:
        print("no instructor notebook:", exc)
        continue
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "BEGIN SOLUTION" in "".join(cell["source"]):
            exec("".join(cell["source"]))
    stolen["notebook"] = True
    break
"""
