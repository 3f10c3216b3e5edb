"""Hidden tests for chapter 9, attention beyond sequences (20 points).

The references are checked against F.unfold, a loop over a graph's edges, nn.MultiheadAttention
with copied weights and the papers' formulas in tests/test_beyond_sequences.py.
"""

# ruff: noqa: N803, N806  (W, a, ... are the papers' names)

import torch

from autograder.grading.judging.spec import HiddenTest, Init, case
from autograder.hidden_tests._inputs import randn


def _graph(g, n, p=0.3, symmetric=True, isolated=False):
    """A random (n, n) bool adjacency without self-loops (graph_attention adds them)."""
    adjacency = torch.rand(n, n, generator=g) < p
    if symmetric:
        adjacency = adjacency | adjacency.T
    adjacency.fill_diagonal_(False)
    if isolated:
        adjacency[0, :] = False
        adjacency[:, 0] = False
    return adjacency


def _weights(g, L, B, h, n):
    """Attention weights (L, B, h, n, n), rows on the simplex, some of them peaked."""
    return torch.softmax(randn(g, L, B, h, n, n, scale=2.0), dim=-1)


def _keep(g, B, n):
    """(B, n) bool, True = may attend, at least one True per row."""
    keep = torch.rand(B, n, generator=g) < 0.6
    keep[:, 0] = True
    return keep


# ------------------------------------------------------------------------------- cases


def _patchify_cases(g):
    return [
        case(randn(g, 2, 3, 8, 12), 4, label="(2, 3, 8, 12), patch 4: a 2 x 3 grid"),
        case(randn(g, 3, 1, 8, 8), 2, label="(3, 1, 8, 8), patch 2"),
        case(randn(g, 1, 2, 6, 9), 3, label="(1, 2, 6, 9), patch 3"),
        case(randn(g, 2, 3, 4, 4), 4, label="one patch per image"),
        case(randn(g, 2, 2, 3, 2), 1, label="patch 1: every pixel a token"),
    ]


def _patch_embedding_cases(g):
    return [
        case(randn(g, 3, 1, 8, 8), init=Init((8, 2, 1, 16)), label="8 x 8, patch 2"),
        case(
            randn(g, 2, 3, 6, 6), init=Init((6, 3, 3, 10)), label="3 channels, patch 3"
        ),
        case(randn(g, 1, 2, 4, 4), init=Init((4, 4, 2, 8)), label="one patch"),
    ]


def _vit_cases(g):
    return [
        case(
            randn(g, 4, 1, 8, 8),
            init=Init((8, 2, 1, 10, 16, 2, 2, 32)),
            label="8 x 8 digits-like, 2 layers",
        ),
        case(
            randn(g, 2, 3, 6, 6),
            init=Init((6, 3, 3, 5, 12, 3, 1, 24)),
            label="3 channels, 1 layer, 3 heads",
        ),
    ]


def _gat_cases(g):
    return [
        case(
            randn(g, 7, 5),
            _graph(g, 7),
            randn(g, 5, 4),
            randn(g, 8),
            label="7 nodes, undirected",
        ),
        case(
            randn(g, 9, 3),
            _graph(g, 9, symmetric=False),
            randn(g, 3, 6),
            randn(g, 12),
            label="directed edges",
        ),
        case(
            randn(g, 2, 6, 4),
            _graph(g, 6, isolated=True),
            randn(g, 4, 4),
            randn(g, 8),
            label="a batch of feature sets, an isolated node",
        ),
        case(
            randn(g, 8, 4),
            _graph(g, 8, p=0.5),
            randn(g, 4, 3),
            randn(g, 6, scale=2.0),
            negative_slope=0.05,
            label="negative_slope = 0.05",
        ),
    ]


def _gat_layer_cases(g):
    return [
        case(
            randn(g, 7, 5),
            _graph(g, 7),
            init=Init((5, 3, 4)),
            label="4 heads of 3 features, concatenated",
        ),
        case(
            randn(g, 6, 4),
            _graph(g, 6, symmetric=False),
            init=Init((4, 2, 3), {"concat": False}),
            label="3 heads averaged",
        ),
        case(
            randn(g, 5, 3),
            _graph(g, 5),
            init=Init((3, 4, 1)),
            label="one head",
        ),
    ]


def _memory_cases(g):
    return [
        case(
            randn(g, 2, 3, 8),
            randn(g, 2, 10, 8),
            randn(g, 2, 10, 5),
            label="3 queries, 10 slots",
        ),
        case(
            randn(g, 4, 6),
            randn(g, 7, 6),
            randn(g, 7, 6),
            temperature=0.25,
            label="temperature 0.25",
        ),
        case(
            randn(g, 2, 5, 4),
            randn(g, 2, 12, 4),
            randn(g, 2, 12, 3),
            temperature=4.0,
            label="temperature 4",
        ),
    ]


def _memory_top_k_cases(g):
    return [
        case(
            randn(g, 2, 3, 8),
            randn(g, 2, 10, 8),
            randn(g, 2, 10, 5),
            top_k=3,
            label="top 3 of 10 slots",
        ),
        case(
            randn(g, 4, 6),
            randn(g, 7, 6),
            randn(g, 7, 6),
            temperature=0.5,
            top_k=1,
            label="top 1: a hard lookup",
        ),
        case(
            randn(g, 2, 3, 4),
            randn(g, 2, 5, 4),
            randn(g, 2, 5, 2),
            top_k=5,
            label="top_k = every slot",
        ),
    ]


def _cross_cases(g):
    def weights(d_q, d_c, d_model):
        return (
            randn(g, d_q, d_model, scale=d_q**-0.5),
            randn(g, d_c, d_model, scale=d_c**-0.5),
            randn(g, d_c, d_model, scale=d_c**-0.5),
            randn(g, d_model, d_q, scale=d_model**-0.5),
        )

    return [
        case(
            randn(g, 2, 5, 8),
            randn(g, 2, 9, 6),
            *weights(8, 6, 8),
            2,
            label="text (width 8) over patches (width 6), 2 heads",
        ),
        case(
            randn(g, 3, 4, 6),
            randn(g, 3, 7, 10),
            *weights(6, 10, 12),
            3,
            label="d_model = 12 differs from both widths, 3 heads",
        ),
        case(
            randn(g, 2, 1, 8),
            randn(g, 2, 6, 8),
            *weights(8, 8, 8),
            4,
            label="one query",
        ),
        case(
            randn(g, 2, 4, 8),
            randn(g, 2, 6, 5),
            *weights(8, 5, 8),
            2,
            mask=_keep(g, 2, 6)[:, None, :],
            label="a (B, 1, n_c) mask over the context",
        ),
    ]


def _latent_cases(g):
    return [
        case(
            randn(g, 3, 20, 8), init=Init((4, 8, 2)), label="4 latents over 20 inputs"
        ),
        case(randn(g, 2, 5, 12), init=Init((1, 12, 3)), label="one latent, 3 heads"),
        case(
            randn(g, 2, 9, 8),
            mask=_keep(g, 2, 9),
            init=Init((3, 8, 2)),
            label="a (B, n) padding mask",
        ),
    ]


def _rollout_cases(g):
    return [
        case(_weights(g, 1, 2, 3, 5), label="one layer"),
        case(_weights(g, 3, 2, 4, 6), label="3 layers"),
        case(_weights(g, 4, 1, 2, 5), label="4 layers, 2 heads"),
        case(_weights(g, 3, 2, 3, 5), residual=False, label="3 layers, residual=False"),
    ]


TESTS = [
    HiddenTest(
        id="bs_patchify",
        exercise="patchify",
        points=2,
        description="patchify: (B, C, H, W) -> (B, N, p*p*C), patches in row-major order",
        make_cases=_patchify_cases,
        level="exact",
    ),
    HiddenTest(
        id="bs_patch_embedding",
        exercise="PatchEmbedding",
        points=2,
        description="PatchEmbedding: a class token with its position, then the patch tokens with 2-D positions",
        make_cases=_patch_embedding_cases,
        level="module",
    ),
    HiddenTest(
        id="bs_vit",
        exercise="VisionTransformer",
        points=2,
        description="VisionTransformer: class-token logits after the encoder layers and a final LayerNorm",
        make_cases=_vit_cases,
        level="model",
    ),
    HiddenTest(
        id="bs_graph_attention",
        exercise="graph_attention",
        points=3,
        description="graph_attention: GAT's LeakyReLU(a^T [W h_i || W h_j]), softmax over each node's neighbours and itself",
        make_cases=_gat_cases,
        outputs=("h_out", "weights"),
    ),
    HiddenTest(
        id="bs_gat_layer",
        exercise="GATLayer",
        points=2,
        description="GATLayer: K heads of graph attention, concatenated or averaged",
        make_cases=_gat_layer_cases,
        level="module",
        outputs=("out", "weights"),
    ),
    HiddenTest(
        id="bs_memory",
        exercise="memory_lookup",
        points=2,
        description="memory_lookup: softmax(q . k / temperature) over the memory slots",
        make_cases=_memory_cases,
        outputs=("out", "weights"),
    ),
    HiddenTest(
        id="bs_memory_top_k",
        exercise="memory_lookup",
        points=1,
        description="memory_lookup with top_k: the softmax over the k best slots only",
        make_cases=_memory_top_k_cases,
        outputs=("out", "weights"),
    ),
    HiddenTest(
        id="bs_cross_attention",
        exercise="cross_attention",
        points=2,
        description="cross_attention: queries from one input, keys and values from another, several heads",
        make_cases=_cross_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=("sdpa", "mha"),
    ),
    HiddenTest(
        id="bs_latent_attention",
        exercise="LatentAttention",
        points=2,
        description="LatentAttention: learned latent queries cross-attend to the input",
        make_cases=_latent_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=("sdpa", "mha"),
    ),
    HiddenTest(
        id="bs_rollout",
        exercise="attention_rollout",
        points=2,
        description="attention_rollout: heads averaged, identity added, rows renormalised, layers multiplied",
        make_cases=_rollout_cases,
    ),
]
