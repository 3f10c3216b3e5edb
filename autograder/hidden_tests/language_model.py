"""Hidden tests for chapter 10, a decoder-only language model (25 points).

Module exercises are built with the test's arguments and loaded with randomised reference
weights (``Init``). ``sample`` and ``generate`` draw with a seeded generator that the
student's call and the reference's share, so their tokens are compared exactly; their
contract fixes the draw (``torch.multinomial`` on the filtered probabilities).
"""

import torch

from autograder.grading.judging.spec import (
    HiddenTest,
    Init,
    case,
    notebook_module,
    seeded_generator,
)
from autograder.hidden_tests._inputs import randn


def _weights(module: torch.nn.Module, g: torch.Generator) -> dict:
    """Random weights at unit scale for a model passed as an argument."""
    with torch.no_grad():
        for p in module.parameters():
            scale = 1 / p.shape[-1] ** 0.5 if p.dim() > 1 else 0.5
            p.copy_(torch.randn(p.shape, generator=g) * scale + (p.dim() == 1))
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# ------------------------------------------------------------------------------- cases


def _rmsnorm_cases(g):
    return [
        case(randn(g, 2, 5, 16), init=Init((16,)), label="(2, 5, 16)"),
        case(randn(g, 3, 8, scale=50.0), init=Init((8,)), label="large inputs"),
        case(
            randn(g, 4, 12, scale=1e-3),
            init=Init((12,)),
            label="tiny inputs, where eps matters",
        ),
        case(
            randn(g, 2, 6, 8) + 3.0,
            init=Init((8,), {"eps": 1e-2}),
            label="inputs with a large mean, eps = 1e-2",
        ),
    ]


def _rmsnorm_float16_cases(g):
    # float16 rows whose entries reach far past 256: their squares exceed float16's
    # largest number, 65504, unless the norm is computed in float32 as the docstring asks.
    # Rows of every scale in one case, so that each known mistake still shows its own slip.
    scales = torch.tensor([1.0, 30.0, 400.0, 2000.0])[:, None]
    mixed = randn(g, 4, 16) * scales
    return [
        case(mixed.half(), init=Init((16,)), label="float16 rows of scale 1 to 2000"),
        case(
            (randn(g, 2, 3, 8, scale=300.0) + 500.0).half(),
            init=Init((8,)),
            label="float16 inputs near 500, with a mean",
        ),
    ]


def _silu_cases(g):
    return [
        case(randn(g, 4, 7, scale=3.0), label="(4, 7)"),
        case(torch.linspace(-30, 30, 61), label="-30 ... 30"),
    ]


def _swiglu_cases(g):
    return [
        case(randn(g, 2, 5, 8), init=Init((8, 24)), label="d_model 8, d_ff 24"),
        case(randn(g, 3, 16), init=Init((16, 8)), label="d_ff < d_model"),
    ]


def _attention_cases(g):
    return [
        case(randn(g, 2, 7, 16), init=Init((16, 4)), label="4 heads, n = 7"),
        case(
            randn(g, 2, 6, 16),
            init=Init((16, 4), {"num_kv_heads": 2}),
            label="4 query heads share 2 key/value heads",
        ),
        case(
            randn(g, 1, 5, 24),
            init=Init((24, 3), {"num_kv_heads": 1}),
            label="multi-query: one key/value head",
        ),
        case(
            randn(g, 2, 6, 16),
            torch.arange(10, 16),
            init=Init((16, 2), {"rope_theta": 500.0}),
            label="positions 10 ... 15 given, rope_theta = 500",
        ),
        case(randn(g, 2, 1, 16), init=Init((16, 4)), label="one token"),
    ]


def _attention_cache_cases(g):
    def cached(B, t, g_heads, d_head):
        return (randn(g, B, g_heads, t, d_head), randn(g, B, g_heads, t, d_head))

    return [
        case(
            randn(g, 2, 1, 16),
            cache=cached(2, 5, 4, 4),
            init=Init((16, 4)),
            label="one new token after 5 cached",
        ),
        case(
            randn(g, 1, 3, 16),
            cache=cached(1, 4, 2, 4),
            init=Init((16, 4), {"num_kv_heads": 2}),
            label="3 new tokens after 4 cached, grouped heads",
        ),
        case(
            randn(g, 1, 2, 16),
            cache=cached(1, 6, 4, 4),
            init=Init((16, 4), {"rope_theta": 100.0}),
            label="2 new tokens after 6 cached, rope_theta = 100",
        ),
        case(
            randn(g, 2, 4, 16),
            init=Init((16, 2)),
            label="no cache yet: the returned cache holds the rotated keys",
        ),
    ]


def _block_cases(g):
    return [
        case(randn(g, 2, 6, 16), init=Init((16, 4, 32)), label="d_model 16, d_ff 32"),
        case(
            randn(g, 1, 5, 16),
            init=Init((16, 4, 24), {"num_kv_heads": 2}),
            label="grouped heads",
        ),
    ]


def _model_cases(g):
    return [
        case(
            torch.randint(0, 40, (2, 9), generator=g),
            init=Init((40, 16, 16, 2, 4, 32)),
            label="2 layers, vocabulary 40",
        ),
        case(
            torch.randint(0, 30, (1, 12), generator=g),
            init=Init((30, 16, 16, 1, 2, 24), {"tie_weights": True}),
            label="1 layer, tied weights",
        ),
        case(
            torch.randint(0, 30, (2, 5), generator=g),
            init=Init((30, 8, 16, 3, 4, 16), {"num_kv_heads": 1}),
            label="3 layers, one key/value head",
        ),
        case(
            torch.randint(0, 30, (2, 10), generator=g),
            init=Init((30, 16, 16, 2, 4, 32), {"rope_theta": 500.0}),
            label="rope_theta = 500 reaches every block's attention",
        ),
    ]


def _cross_entropy_cases(g):
    logits = randn(g, 2, 5, 11, scale=3.0)
    return [
        case(logits, torch.randint(0, 11, (2, 5), generator=g), label="(2, 5, 11)"),
        case(
            randn(g, 4, 7, scale=1e4),
            torch.randint(0, 7, (4,), generator=g),
            label="logits of size 1e4",
        ),
        case(
            randn(g, 3, 6) - 1e4,
            torch.randint(0, 6, (3,), generator=g),
            label="logits near -1e4",
        ),
    ]


def _sample_cases(g):
    logits = randn(g, 300, 6, scale=2.0)
    return [
        case(logits, temperature=0.0, label="temperature 0: greedy"),
        case(
            logits,
            temperature=0.5,
            generator=seeded_generator(int(torch.randint(1 << 30, (), generator=g))),
            label="temperature 0.5",
        ),
        case(
            logits,
            top_k=2,
            generator=seeded_generator(int(torch.randint(1 << 30, (), generator=g))),
            label="top_k = 2",
        ),
        case(logits[:50], top_k=1, label="top_k = 1: greedy"),
    ]


def _top_p_logits(g, rows):
    # every row a shuffled copy of probabilities whose running sums avoid round numbers
    probs = torch.tensor([0.42, 0.27, 0.16, 0.09, 0.06])
    order = torch.stack([torch.randperm(5, generator=g) for _ in range(rows)])
    return probs.log()[order]  # (rows, 5)


def _dyadic_logits(g, rows):
    # probabilities 1/2, 1/4, 1/8, 1/16, 1/16, shuffled: softmax returns them exactly in
    # float32 (each exp lies within 0.13 of a unit in the last place of its power of two),
    # so the running sums 0.5 and 0.75 are exact and top_p = 0.5 or 0.75 falls exactly on a
    # boundary, with no tie across it
    probs = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625], dtype=torch.float64)
    order = torch.stack([torch.randperm(5, generator=g) for _ in range(rows)])
    return probs.log().float()[order]  # (rows, 5)


def _sample_top_p_cases(g):
    def seed():
        return seeded_generator(int(torch.randint(1 << 30, (), generator=g)))

    return [
        case(
            _top_p_logits(g, 400),
            temperature=2.0,
            top_p=0.6,
            generator=seed(),
            label="temperature 2, then top_p = 0.6 (the flattened probabilities keep 3)",
        ),
        case(
            _top_p_logits(g, 400),
            temperature=0.5,
            top_p=0.8,
            generator=seed(),
            label="temperature 0.5, then top_p = 0.8 (the sharpened probabilities keep 2)",
        ),
        case(
            _dyadic_logits(g, 400),
            top_p=0.75,
            generator=seed(),
            label="top_p = 0.75, exactly what the top two tokens hold: the third goes",
        ),
        case(
            _dyadic_logits(g, 200),
            top_p=0.5,
            generator=seed(),
            label="top_p = 0.5, exactly what the top token holds: only it stays",
        ),
        case(_top_p_logits(g, 400), top_p=0.6, generator=seed(), label="top_p = 0.6"),
        case(_top_p_logits(g, 400), top_p=0.8, generator=seed(), label="top_p = 0.8"),
        case(
            _top_p_logits(g, 400),
            top_k=4,
            top_p=0.9,
            generator=seed(),
            label="top_k = 4, then top_p = 0.9",
        ),
        case(
            _top_p_logits(g, 400),
            top_k=2,
            top_p=0.9,
            generator=seed(),
            label="top_k = 2, then top_p = 0.9",
        ),
        case(
            _top_p_logits(g, 100),
            top_p=0.3,
            generator=seed(),
            label="top_p below the top token",
        ),
    ]


def _generate_cases(g):
    from solutions.language_model import TransformerLM

    def model(*args, **kwargs):
        reference = TransformerLM(*args, **kwargs)
        return notebook_module(
            "TransformerLM", *args, state=_weights(reference, g), **kwargs
        )

    seed = seeded_generator(int(torch.randint(1 << 30, (), generator=g)))
    return [
        case(
            model(30, 32, 16, 2, 4, 32),
            torch.randint(0, 30, (2, 5), generator=g),
            6,
            temperature=0.0,
            label="greedy, 6 new tokens after 5",
        ),
        case(
            model(30, 32, 16, 1, 4, 32, num_kv_heads=2),
            torch.randint(0, 30, (3, 4), generator=g),
            5,
            top_k=5,
            generator=seed,
            label="top_k = 5 with a generator, grouped heads",
        ),
        case(
            model(20, 16, 8, 1, 2, 16),
            torch.randint(0, 20, (1, 1), generator=g),
            1,
            temperature=0.0,
            label="one new token after one",
        ),
        case(
            model(30, 32, 16, 2, 4, 32),
            torch.randint(0, 30, (2, 3), generator=g),
            5,
            temperature=0.7,
            top_k=8,
            top_p=0.9,
            generator=seeded_generator(int(torch.randint(1 << 30, (), generator=g))),
            label="temperature 0.7, top_k = 8, top_p = 0.9: the logits are the model's, "
            "before the temperature and the filters",
        ),
    ]


def _mla_cases(g):
    return [
        case(randn(g, 2, 7, 16), init=Init((16, 4, 8, 4)), label="4 heads, n = 7"),
        case(
            randn(g, 2, 6, 24),
            init=Init((24, 3, 6, 8), {"q_rank": 12}),
            label="low-rank queries, rope_dim 8",
        ),
        case(
            randn(g, 1, 5, 16),
            torch.arange(20, 25),
            init=Init((16, 2, 4, 6), {"rope_theta": 300.0}),
            label="positions 20 ... 24 given, rope_theta = 300",
        ),
        case(
            randn(g, 2, 6, 16, scale=4.0) + 2.0,
            init=Init((16, 4, 8, 4), {"q_rank": 8}),
            label="large inputs with a mean: the latents' RMSNorm matters",
        ),
        case(randn(g, 2, 1, 16), init=Init((16, 4, 8, 4)), label="one token"),
    ]


def _mla_cache_cases(g):
    def cached(B, t, rank, d_rope):  # a latent (RMS-normalised) and a rotated key
        latent = randn(g, B, t, rank)
        latent = latent / latent.pow(2).mean(-1, keepdim=True).sqrt()
        return (latent, randn(g, B, t, d_rope))

    return [
        case(
            randn(g, 2, 1, 16),
            cache=cached(2, 5, 8, 4),
            init=Init((16, 4, 8, 4)),
            label="one new token after 5 cached",
        ),
        case(
            randn(g, 1, 3, 24),
            cache=cached(1, 4, 6, 8),
            init=Init((24, 3, 6, 8), {"q_rank": 12, "rope_theta": 100.0}),
            label="3 new tokens after 4 cached, low-rank queries, rope_theta = 100",
        ),
        case(
            randn(g, 2, 4, 16),
            init=Init((16, 2, 4, 4)),
            label="no cache yet: the returned cache holds the latents and the rotated "
            "shared keys, kv_rank + rope_dim numbers per token",
        ),
    ]


TESTS = [
    HiddenTest(
        id="lm_rmsnorm",
        exercise="RMSNorm",
        points=2,
        description="RMSNorm divides by sqrt(mean(x^2) + eps) and scales by weight",
        make_cases=_rmsnorm_cases,
        level="module",
    ),
    HiddenTest(
        id="lm_rmsnorm_float16",
        exercise="RMSNorm",
        points=1,
        description="RMSNorm of float16 inputs computes in float32: entries above 256 "
        "would overflow when squared in float16",
        make_cases=_rmsnorm_float16_cases,
        level="model",  # float16 outputs: one unit in the last place is ~1e-3 of them
    ),
    HiddenTest(
        id="lm_silu",
        exercise="silu",
        points=1,
        description="silu(x) = x * sigmoid(x)",
        make_cases=_silu_cases,
    ),
    HiddenTest(
        id="lm_swiglu",
        exercise="SwiGLU",
        points=1,
        description="SwiGLU computes w2(silu(w1 x) * w3 x)",
        make_cases=_swiglu_cases,
        level="module",
    ),
    HiddenTest(
        id="lm_attention",
        exercise="CausalSelfAttention",
        points=3,
        description="causal self-attention with rotary queries and keys and grouped "
        "key/value heads",
        make_cases=_attention_cases,
        level="module",
        outputs=("out", "cache"),
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="lm_attention_cache",
        exercise="CausalSelfAttention",
        points=2,
        description="with a cache, new tokens take the next positions and attend over "
        "the cached keys, which are not rotated again",
        make_cases=_attention_cache_cases,
        level="module",
        outputs=("out", "cache"),
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="lm_block",
        exercise="DecoderBlock",
        points=1,
        description="a pre-norm block: x + attn(ln1(x)), then + ffn(ln2(.))",
        make_cases=_block_cases,
        level="module",
        outputs=("out", "cache"),
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="lm_model",
        exercise="TransformerLM",
        points=2,
        description="TransformerLM: embedding, blocks, final RMSNorm, lm_head; "
        "rope_theta is the base of every block's rotary positions",
        make_cases=_model_cases,
        level="model",
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="lm_cross_entropy",
        exercise="cross_entropy",
        points=2,
        description="cross_entropy: the mean negative log-probability, stable at "
        "logits of 1e4",
        make_cases=_cross_entropy_cases,
        forbidden=("cross_entropy",),
    ),
    HiddenTest(
        id="lm_sample",
        exercise="sample",
        points=1,
        description="sample with temperature and top_k, drawn with torch.multinomial",
        make_cases=_sample_cases,
        level="exact",
    ),
    HiddenTest(
        id="lm_sample_top_p",
        exercise="sample",
        points=2,
        description="sample with top_p, after the temperature and top_k, keeps the "
        "smallest set of tokens holding at least p: the token that crosses p stays, a "
        "token whose higher-ranked tokens hold exactly p goes",
        make_cases=_sample_top_p_cases,
        level="exact",
    ),
    HiddenTest(
        id="lm_generate",
        exercise="generate",
        points=2,
        description="generate with a key-value cache: its logits are the model's own "
        "(before the temperature and the filters) and equal full recomputation at every "
        "step",
        make_cases=_generate_cases,
        level="model",
        outputs=("tokens", "logits"),
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="lm_mla",
        exercise="MultiHeadLatentAttention",
        points=3,
        description="multi-head latent attention: keys and values from a normalised "
        "low-rank latent, a decoupled rotary key shared by all heads, causal",
        make_cases=_mla_cases,
        level="module",
        outputs=("out", "cache"),
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="lm_mla_cache",
        exercise="MultiHeadLatentAttention",
        points=2,
        description="with a cache of latents and rotated shared keys, new tokens take "
        "the next positions and attend over every cached token",
        make_cases=_mla_cache_cases,
        level="module",
        outputs=("out", "cache"),
        forbidden=("sdpa",),
    ),
]
