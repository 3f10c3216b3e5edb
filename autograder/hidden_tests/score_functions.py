"""Hidden tests for chapter 2, the score-function zoo (16 points).

Weight matrices have sizes that differ from each other (d_q != d_k != d_a, n != n_max) so
that a transposed or swapped matrix fails loudly; every test also has one case where all
sizes agree, where such a slip runs and its output can be recognised and named.
"""

import math

import torch

from autograder.grading.judging.spec import HiddenTest, case, notebook_function
from autograder.hidden_tests._inputs import randn, random_mask


def _weight(g, rows, cols):
    """A weight matrix at the usual initialisation scale 1/sqrt(fan-in)."""
    return randn(g, rows, cols, scale=1 / math.sqrt(cols))


# ------------------------------------------------------------------------------- cases


def _dot_cases(g):
    return [
        case(randn(g, 3, 8), randn(g, 3, 5, 8), label="B = 3, n = 5, d = 8"),
        case(randn(g, 4, 6), randn(g, 4, 4, 6), label="as many keys as batch rows"),
        case(randn(g, 2, 16), randn(g, 2, 1, 16), label="a single key"),
    ]


def _scaled_dot_cases(g):
    return [
        case(randn(g, 3, 8), randn(g, 3, 5, 8), label="B = 3, n = 5, d = 8"),
        case(randn(g, 2, 64), randn(g, 2, 6, 64), label="d = 64"),
        case(randn(g, 4, 5), randn(g, 4, 4, 5), label="as many keys as batch rows"),
    ]


def _general_cases(g):
    return [
        case(
            randn(g, 3, 5),
            randn(g, 3, 4, 7),
            _weight(g, 5, 7),
            label="d_q = 5, d_k = 7",
        ),
        case(
            randn(g, 2, 6),
            randn(g, 2, 5, 6),
            _weight(g, 6, 6),
            label="square W (d_q = d_k = 6)",
        ),
        case(
            randn(g, 1, 9),
            randn(g, 1, 1, 4),
            _weight(g, 9, 4),
            label="B = 1, a single key, d_q = 9, d_k = 4",
        ),
    ]


def _additive_params(g, d_q, d_k, d_a):
    return _weight(g, d_a, d_q), _weight(g, d_a, d_k), randn(g, d_a)


def _additive_cases(g):
    return [
        case(
            randn(g, 2, 5),
            randn(g, 2, 6, 7),
            *_additive_params(g, 5, 7, 3),
            label="d_q = 5, d_k = 7, d_a = 3",
        ),
        case(
            randn(g, 3, 4),
            randn(g, 3, 5, 4),
            *_additive_params(g, 4, 4, 4),
            label="all sizes equal (d_q = d_k = d_a = 4)",
        ),
        case(
            randn(g, 2, 6, scale=4.0),
            randn(g, 2, 5, 3, scale=4.0),
            *_additive_params(g, 6, 3, 8),
            label="large inputs (tanh saturates), d_q = 6, d_k = 3, d_a = 8",
        ),
        case(
            randn(g, 4, 3),
            randn(g, 4, 1, 2),
            *_additive_params(g, 3, 2, 5),
            label="a single key",
        ),
    ]


def _location_cases(g):
    return [
        case(randn(g, 3, 6), _weight(g, 10, 6), 7, label="d_q = 6, n_max = 10, n = 7"),
        case(randn(g, 2, 5), _weight(g, 5, 5), 3, label="square W_a (n_max = d_q = 5)"),
        case(randn(g, 4, 8), _weight(g, 9, 8), 9, label="n = n_max = 9"),
        case(randn(g, 1, 4), _weight(g, 6, 4), 1, label="B = 1, n = 1"),
    ]


def _location_error_cases(g):
    # the docstring's contract: no score for positions W_a has no row for, nor for n < 1
    return [
        case(randn(g, 2, 6), _weight(g, 10, 6), 11, raises="ValueError",
             label="n = 11 > n_max = 10: ValueError"),
        case(randn(g, 2, 6), _weight(g, 10, 6), 0, raises="ValueError",
             label="n = 0: ValueError"),
        case(randn(g, 2, 6), _weight(g, 10, 6), -1, raises="ValueError",
             label="n = -1: ValueError"),
    ]  # fmt: skip


def _masked_softmax_values_cases(g):
    return [
        case(randn(g, 4, 7), random_mask(g, 4, 7), label="(B, n) scores and mask"),
        case(randn(g, 3, 6), None, label="mask=None"),
        case(
            randn(g, 2, 3, 5),
            random_mask(g, 2, 1, 5),
            label="(B, h, n) scores, mask broadcast over h",
        ),
        case(
            randn(g, 3, 5), torch.ones(3, 5, dtype=torch.bool), label="nothing masked"
        ),
    ]


def _masked_softmax_edge_cases(g):
    fully = random_mask(g, 4, 6)
    fully[1] = False
    fully[3] = False
    single = torch.zeros(3, 5, dtype=torch.bool)
    single[torch.arange(3), torch.tensor([0, 4, 2])] = True
    return [
        case(randn(g, 4, 6), fully, label="fully masked rows must give zeros"),
        case(randn(g, 3, 5), single, label="one allowed key per row gets weight 1"),
        case(
            randn(g, 3, 8, scale=1000.0),
            random_mask(g, 3, 8),
            label="huge logits stay finite",
        ),
        case(
            randn(g, 2, 4, scale=1000.0),
            torch.tensor([[True, False, True, True], [False] * 4]),
            label="huge logits and a fully masked row",
        ),
    ]


def _attend_basic_cases(g):
    return [
        case(
            randn(g, 3, 8),
            randn(g, 3, 5, 8),
            randn(g, 3, 5, 4),
            label="d_k = 8, d_v = 4",
        ),
        case(
            randn(g, 2, 6),
            randn(g, 2, 7, 6),
            randn(g, 2, 7, 6),
            label="d_v = d_k",
        ),
        case(
            randn(g, 4, 16, scale=3.0),
            randn(g, 4, 4, 16),
            randn(g, 4, 4, 3),
            label="peaked weights, as many keys as batch rows",
        ),
        case(randn(g, 2, 5), randn(g, 2, 1, 5), randn(g, 2, 1, 3), label="one key"),
    ]


def _attend_masked_cases(g):
    fully = random_mask(g, 3, 6)
    fully[2] = False
    return [
        case(
            randn(g, 3, 8),
            randn(g, 3, 6, 8),
            randn(g, 3, 6, 5),
            mask=random_mask(g, 3, 6),
            label="random mask",
        ),
        case(
            randn(g, 3, 8),
            randn(g, 3, 6, 8),
            randn(g, 3, 6, 8),
            mask=fully,
            label="a fully masked row gives zero weights and a zero context",
        ),
        case(
            randn(g, 2, 4),
            randn(g, 2, 5, 4),
            randn(g, 2, 5, 2),
            None,
            torch.tensor([[True, True, True, False, False], [True] * 5]),
            label="padding mask, score_fn=None given positionally",
        ),
    ]


def _attend_score_fn_cases(g):
    """attend with the notebook's own score functions passed in: dot (unscaled, and with
    d = 64 far from the scaled default) and general with its W bound."""
    return [
        case(
            randn(g, 3, 64),
            randn(g, 3, 5, 64),
            randn(g, 3, 5, 4),
            notebook_function("dot_score"),
            label="score_fn=dot_score, d = 64",
        ),
        case(
            randn(g, 2, 6),
            randn(g, 2, 7, 4),
            randn(g, 2, 7, 3),
            score_fn=notebook_function("general_score", W=randn(g, 6, 4)),
            mask=random_mask(g, 2, 7),
            label="score_fn=partial(general_score, W=W) with d_q != d_k, and a mask",
        ),
    ]


# ------------------------------------------------------------------------------- tests

TESTS = [
    HiddenTest(
        id="sf_dot_score",
        exercise="dot_score",
        points=1,
        description="scores (B, n) equal q^T k_j for every key of every batch row",
        make_cases=_dot_cases,
    ),
    HiddenTest(
        id="sf_scaled_dot_score",
        exercise="scaled_dot_score",
        points=1,
        description="scores (B, n) equal q^T k_j / sqrt(d)",
        make_cases=_scaled_dot_cases,
    ),
    HiddenTest(
        id="sf_general_score",
        exercise="general_score",
        points=2,
        description="scores equal q^T W k_j with W of shape (d_q, d_k), also when d_q != d_k",
        make_cases=_general_cases,
    ),
    HiddenTest(
        id="sf_additive_score",
        exercise="additive_score",
        points=2,
        description="scores equal v^T tanh(W_q q + W_k k_j) with W_q (d_a, d_q), W_k (d_a, d_k), v (d_a,)",
        make_cases=_additive_cases,
    ),
    HiddenTest(
        id="sf_location_score",
        exercise="location_score",
        points=2,
        description="scores (B, n) equal W_a q restricted to the first n rows of W_a (n_max, d_q)",
        make_cases=_location_cases,
    ),
    HiddenTest(
        id="sf_location_score_errors",
        exercise="location_score",
        points=1,
        description="a ValueError, as the docstring says, for n > n_max and for n < 1",
        make_cases=_location_error_cases,
    ),
    HiddenTest(
        id="sf_masked_softmax_values",
        exercise="masked_softmax",
        points=2,
        description="a softmax over the last dimension with masked entries at 0, broadcast masks and mask=None",
        make_cases=_masked_softmax_values_cases,
        # torch.softmax is allowed here: chapter 1 graded the stable softmax itself; this
        # exercise is about the mask and the empty row, not about exponentials.
        forbidden=(),
    ),
    HiddenTest(
        id="sf_masked_softmax_edge_cases",
        exercise="masked_softmax",
        points=2,
        description="fully masked rows give zeros (not NaN), huge logits stay finite",
        make_cases=_masked_softmax_edge_cases,
        forbidden=(),
    ),
    HiddenTest(
        id="sf_attend_basic",
        exercise="attend",
        points=2,
        description="context (B, d_v) and weights (B, n) of scaled dot-product attention when score_fn is None",
        make_cases=_attend_basic_cases,
        outputs=("context", "weights"),
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="sf_attend_score_fn",
        exercise="attend",
        points=2,
        description="attend scores with the score_fn it is given (your dot_score; your general_score with W bound)",
        make_cases=_attend_score_fn_cases,
        outputs=("context", "weights"),
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="sf_attend_masked",
        exercise="attend",
        points=2,
        description="masked keys get weight 0 and do not reach the context; a fully masked row gives zeros",
        make_cases=_attend_masked_cases,
        outputs=("context", "weights"),
        forbidden=("sdpa",),
    ),
]
