"""Hidden tests for chapter 4, multi-head attention (12 points)."""

import torch

from autograder.grading.judging.spec import HiddenTest, Init, case, torch_layer
from autograder.hidden_tests._inputs import randn, random_mask


def _causal(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


def _padding(lengths, n):
    return (torch.arange(n) < torch.tensor(lengths)[:, None]).unsqueeze(1)  # (B, 1, n)


# ------------------------------------------------------------------------------ attention


def _attention_cases(g):
    fully_masked = random_mask(g, 2, 1, 5, 5)
    fully_masked[1, 0, 3] = False  # query 3 of sequence 1 may attend to nothing
    return [
        case(
            randn(g, 2, 3, 5, 8),
            randn(g, 2, 3, 5, 8),
            randn(g, 2, 3, 5, 8),
            label="heads as a batch dimension (B, h, n, d_head)",
        ),
        case(
            randn(g, 2, 4, 3, 6),
            randn(g, 2, 4, 7, 6),
            randn(g, 2, 4, 7, 5),
            mask=_padding([7, 4], 7).unsqueeze(1),
            label="cross-attention with a padding mask (B, 1, 1, n_k)",
        ),
        case(
            randn(g, 1, 2, 6, 4),
            randn(g, 1, 2, 6, 4),
            randn(g, 1, 2, 6, 4),
            mask=_causal(6),
            label="causal mask (n, n) broadcast over batch and heads",
        ),
        case(
            randn(g, 2, 2, 5, 8, scale=4.0),
            randn(g, 2, 2, 5, 8, scale=4.0),
            randn(g, 2, 2, 5, 8),
            mask=fully_masked,
            label="a fully masked query row must give zeros",
        ),
    ]


# ---------------------------------------------------------------- split_heads, merge_heads


def _split_cases(g):
    return [
        case(randn(g, 2, 5, 12), 3, label="(2, 5, 12) into 3 heads"),
        case(randn(g, 3, 4, 8), 4, label="(3, 4, 8) into 4 heads (n = h)"),
        case(randn(g, 1, 1, 6), 6, label="one token, heads of width 1"),
        case(randn(g, 2, 3, 8), 1, label="a single head"),
    ]


def _split_error_cases(g):
    return [
        case(randn(g, 2, 5, 10), 3, raises="ValueError",
             label="10 features into 3 heads: ValueError"),
        case(randn(g, 1, 4, 6), 4, raises="ValueError",
             label="6 features into 4 heads: ValueError"),
    ]  # fmt: skip


def _merge_cases(g):
    return [
        case(randn(g, 2, 3, 5, 4), label="(2, 3, 5, 4): 3 heads of width 4"),
        case(randn(g, 3, 4, 4, 2), label="(3, 4, 4, 2): n = h"),
        case(randn(g, 1, 6, 1, 1), label="one token, heads of width 1"),
        case(randn(g, 2, 1, 3, 8), label="a single head"),
    ]


# ----------------------------------------------------------------------- MultiHeadAttention


def _self_attention_cases(g):
    x = randn(g, 2, 6, 16)
    return [
        case(x, x, x, init=Init((16, 4)), label="self-attention, no mask"),
        case(x, x, x, mask=_causal(6), init=Init((16, 4)), label="causal mask (n, n)"),
        case(
            *(3 * [randn(g, 3, 5, 12)]),
            mask=random_mask(g, 3, 5, 5),
            init=Init((12, 3)),
            label="a (B, n, n) mask with B = h = 3",
        ),
        case(*(3 * [randn(g, 2, 1, 8)]), init=Init((8, 2)), label="one token"),
    ]


def _cross_attention_cases(g):
    memory = randn(g, 2, 7, 16)
    return [
        case(
            randn(g, 2, 3, 16),
            randn(g, 2, 7, 16),
            randn(g, 2, 7, 16),
            init=Init((16, 4)),
            label="n_q = 3, n_k = 7, key and value different",
        ),
        case(
            randn(g, 2, 3, 16),
            memory,
            memory,
            mask=_padding([7, 4], 7),
            init=Init((16, 4)),
            label="padding mask (B, 1, n_k)",
        ),
        case(
            randn(g, 2, 4, 8),
            randn(g, 2, 6, 8),
            randn(g, 2, 6, 8),
            mask=random_mask(g, 2, 4, 6),
            init=Init((8, 2)),
            label="a (B, n_q, n_k) mask with B = h = 2",
        ),
    ]


def _no_bias_cases(g):
    init = Init((12, 3), {"bias": False})
    x = randn(g, 2, 5, 12)
    return [
        case(x, x, x, init=init, label="bias=False, self-attention"),
        case(
            randn(g, 2, 4, 12),
            x,
            x,
            mask=random_mask(g, 4, 5),
            init=init,
            label="bias=False, cross-attention with a (n_q, n_k) mask",
        ),
    ]


def _torch_state(g, d_model, bias):
    """Random weights for nn.MultiheadAttention (whose own init sets the biases to zero)."""
    state = {
        "in_proj_weight": randn(g, 3 * d_model, d_model, scale=d_model**-0.5),
        "out_proj.weight": randn(g, d_model, d_model, scale=d_model**-0.5),
    }
    if bias:
        state["in_proj_bias"] = randn(g, 3 * d_model, scale=0.5)
        state["out_proj.bias"] = randn(g, d_model, scale=0.5)
    return state


def _from_torch(g, d_model, num_heads, bias=True):
    """Build our layer without weights, then copy a PyTorch layer's with load_torch_weights."""
    layer = torch_layer(
        "MultiheadAttention",
        d_model,
        num_heads,
        bias=bias,
        batch_first=True,
        state=_torch_state(g, d_model, bias),
    )
    return {
        "init": Init((d_model, num_heads), {"bias": bias}, load_state=False),
        "setup": [("load_torch_weights", (layer,))],
    }


def _torch_weights_cases(g):
    x = randn(g, 2, 6, 16)
    memory = randn(g, 3, 7, 8)
    return [
        case(x, x, x, label="self-attention", **_from_torch(g, 16, 4)),
        case(
            x,
            x,
            x,
            mask=_causal(6),
            label="self-attention, causal mask",
            **_from_torch(g, 16, 4),
        ),
        case(
            randn(g, 3, 2, 8),
            memory,
            memory,
            mask=_padding([7, 5, 1], 7),
            label="cross-attention, padding mask",
            **_from_torch(g, 8, 2),
        ),
        case(
            *(3 * [randn(g, 2, 5, 12)]),
            label="bias=False",
            **_from_torch(g, 12, 3, bias=False),
        ),
    ]


_NO_DELEGATION = ("mha", "sdpa")

TESTS = [
    HiddenTest(
        id="mh_attention_heads",
        exercise="attention",
        points=2,
        description="softmax(q k^T / sqrt(d_k)) v over (B, h, n, d_head) tensors, masks broadcast over heads, empty rows give zeros",
        make_cases=_attention_cases,
        outputs=("out", "weights"),
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="split_heads_values",
        exercise="split_heads",
        points=1,
        description="(B, n, d_model) -> (B, h, n, d_head), head i holding features i d_head to (i+1) d_head - 1",
        make_cases=_split_cases,
        level="exact",
    ),
    HiddenTest(
        id="split_heads_errors",
        exercise="split_heads",
        points=1,
        description="a ValueError, as the docstring says, when d_model is not divisible by h",
        make_cases=_split_error_cases,
    ),
    HiddenTest(
        id="merge_heads_values",
        exercise="merge_heads",
        points=1,
        description="(B, h, n, d_head) -> (B, n, h d_head), the exact inverse of split_heads",
        make_cases=_merge_cases,
        level="exact",
    ),
    HiddenTest(
        id="mha_self_attention",
        exercise="MultiHeadAttention",
        points=2,
        description="multi-head self-attention with W_q, W_k, W_v, W_o, with and without masks, per-head weights",
        make_cases=_self_attention_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=_NO_DELEGATION,
    ),
    HiddenTest(
        id="mha_cross_attention",
        exercise="MultiHeadAttention",
        points=2,
        description="multi-head cross-attention (n_q != n_k) with padding and per-query masks",
        make_cases=_cross_attention_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=_NO_DELEGATION,
    ),
    HiddenTest(
        id="mha_no_bias",
        exercise="MultiHeadAttention",
        points=1,
        description="MultiHeadAttention(d_model, num_heads, bias=False) has and uses no biases",
        make_cases=_no_bias_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=_NO_DELEGATION,
    ),
    HiddenTest(
        id="mha_torch_weights",
        exercise="MultiHeadAttention",
        points=3,
        description="after load_torch_weights, outputs and per-head weights equal nn.MultiheadAttention's with the same weights",
        make_cases=_torch_weights_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=_NO_DELEGATION,
    ),
]
