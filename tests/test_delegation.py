"""Delegation to PyTorch is recognised both ways: reading the code, and watching it run."""

import torch.nn.functional as F

from autograder.delegation import FEATURES, static_uses
from autograder.spec import load_chapter_tests
from solutions import self_attention as sa
from tests.answers import verdicts

OWN = """
import math, torch
def scaled_dot_product_attention(q, k, v, mask=None):
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    return weights @ v, weights
class SelfAttention(torch.nn.Module):
    def forward(self, x, mask=None):
        return scaled_dot_product_attention(x, x, x, mask)
"""


def _sdpa(source):
    return static_uses([source], "scaled_dot_product_attention", ("sdpa",))


def test_the_students_own_function_of_the_same_name_is_not_delegation():
    assert _sdpa(OWN) == []
    assert static_uses([OWN], "SelfAttention", ("sdpa",)) == []


def test_a_scratch_cell_comparing_with_pytorch_is_not_delegation():
    scratch = "import torch.nn.functional as F\nprint(F.scaled_dot_product_attention(q, k, v))"
    assert _sdpa(OWN) == _sdpa(OWN + scratch) == []


def test_direct_aliased_indirect_and_string_uses_are_found():
    direct = "import torch.nn.functional as F\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    return F.scaled_dot_product_attention(q, k, v), None"
    aliased = "from torch.nn.functional import scaled_dot_product_attention as fast\ndef helper(q, k, v):\n    return fast(q, k, v)\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    return helper(q, k, v), None"
    by_string = "import torch.nn.functional as F\nfn = getattr(F, 'scaled_dot_product_attention')\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    return fn(q, k, v), None"
    flash = "from torch.nn.attention import sdpa_kernel, SDPBackend\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):\n        return q, q"
    for source in (direct, aliased, by_string, flash):
        assert _sdpa(source) == ["sdpa"], source
    # through a method of the student's module
    module = OWN.replace(
        "return scaled_dot_product_attention(x, x, x, mask)",
        "return torch.nn.functional.scaled_dot_product_attention(x, x, x)",
    )
    assert static_uses([module], "SelfAttention", ("sdpa",)) == ["sdpa"]
    mha = "import torch\nclass MultiHeadAttention(torch.nn.Module):\n    def __init__(self, d, h):\n        super().__init__()\n        self.inner = torch.nn.MultiheadAttention(d, h, batch_first=True)"
    assert static_uses([mha], "MultiHeadAttention", ("mha",)) == ["mha"]


def test_type_hints_and_isinstance_checks_are_not_delegation():
    hinted = (
        "import torch\nfrom torch import nn\n"
        "class MultiHeadAttention(nn.Module):\n"
        "    def load_torch_weights(self, mha: nn.MultiheadAttention) -> None:\n"
        "        assert isinstance(mha, nn.MultiheadAttention)\n"
        "        layer: nn.MultiheadAttention = mha\n"
        "        self.w = mha.in_proj_weight\n"
    )
    assert static_uses([hinted], "MultiHeadAttention", ("mha",)) == []


def test_unparseable_cells_are_skipped_not_fatal():
    assert _sdpa("def broken(:\n") == []


def _delegating(q, k, v, mask=None):
    fn = getattr(
        F, "scaled_dot_" + "product_attention"
    )  # invisible to reading the code
    out = fn(q, k, v, attn_mask=mask)
    return out, sa.scaled_dot_product_attention(q, k, v, mask)[1]


def test_delegation_seen_while_running_fails_with_a_message():
    tests = load_chapter_tests("03_self_attention")
    results = verdicts(tests, {**vars(sa), "scaled_dot_product_attention": _delegating})
    for test_id in ("sdpa_basic", "sdpa_masked", "sdpa_edge_cases"):
        assert not results[test_id].passed
        assert FEATURES["sdpa"].description in results[test_id].message
    assert results["causal_mask_values"].passed  # other exercises are unaffected


def test_the_reference_is_not_flagged():
    tests = load_chapter_tests("03_self_attention")
    assert all(v.passed for v in verdicts(tests, vars(sa)).values())
