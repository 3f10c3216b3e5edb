"""The references agree with PyTorch and with the properties the chapters teach."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from solutions import self_attention as sa


def _random_mask(*shape, p=0.5):
    mask = torch.rand(*shape) < p
    mask[..., 0] = True  # no fully masked rows: SDPA and ours then must agree exactly
    return mask


@pytest.mark.parametrize(
    "batch, n_q, n_k, d_k, d_v",
    [
        ((), 4, 4, 8, 8),
        ((3,), 5, 7, 8, 3),
        ((2, 4), 6, 6, 16, 16),
        ((2, 3, 2), 1, 9, 4, 5),
    ],
)
def test_sdpa_matches_torch_without_and_with_masks(batch, n_q, n_k, d_k, d_v):
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(*batch, n_q, d_k),
        torch.randn(*batch, n_k, d_k),
        torch.randn(*batch, n_k, d_v),
    )
    out, weights = sa.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert weights.shape == (*batch, n_q, n_k)
    for mask_shape in [
        (n_q, n_k),
        (*batch, n_q, n_k),
        (*batch[:1], *[1] * (len(batch) - 1), 1, n_k),
    ]:
        mask = _random_mask(*mask_shape)
        out, weights = sa.scaled_dot_product_attention(q, k, v, mask)
        torch.testing.assert_close(
            out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        )
        assert bool((weights.masked_select(~mask.expand_as(weights)) == 0).all())


def test_sdpa_weights_are_a_distribution_over_keys():
    q, k, v = torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.randn(2, 7, 4)
    _, weights = sa.scaled_dot_product_attention(q, k, v, _random_mask(2, 5, 7))
    assert bool((weights >= 0).all())
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5))


def test_fully_masked_rows_give_zeros_and_finite_gradients():
    q, k, v = (torch.randn(2, 4, 8, requires_grad=True) for _ in range(3))
    mask = _random_mask(2, 4, 4)
    mask[1, 2] = False
    out, weights = sa.scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(out[1, 2], torch.zeros(8)) and torch.equal(
        weights[1, 2], torch.zeros(4)
    )
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_large_logits_stay_finite():
    q, k, v = (
        torch.randn(2, 5, 16) * 100,
        torch.randn(2, 5, 16) * 100,
        torch.randn(2, 5, 16),
    )
    out, weights = sa.scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))


def test_causal_mask_matches_torch_is_causal():
    for n in (1, 2, 7):
        mask = sa.causal_mask(n)
        assert mask.dtype == torch.bool and mask.shape == (n, n)
        assert all(
            bool(mask[i, j]) == (j <= i)
            for i, j in itertools.product(range(n), repeat=2)
        )
    q, k, v = torch.randn(3, 6, 8), torch.randn(3, 6, 8), torch.randn(3, 6, 8)
    out, _ = sa.scaled_dot_product_attention(q, k, v, sa.causal_mask(6))
    torch.testing.assert_close(
        out, F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


def test_padding_mask_marks_real_tokens():
    mask = sa.padding_mask(torch.tensor([0, 2, 4]), 4)
    assert mask.dtype == torch.bool and mask.shape == (3, 1, 4)
    assert mask[:, 0].tolist() == [[False] * 4, [True, True, False, False], [True] * 4]


def _layer(seed=0):
    torch.manual_seed(seed)
    return sa.SelfAttention(d_model=12, d_k=8, d_v=5)


def test_self_attention_is_sdpa_of_three_projections():
    layer, x = _layer(), torch.randn(2, 6, 12)
    out, weights = layer(x)
    q, k, v = x @ layer.W_q.weight.T, x @ layer.W_k.weight.T, x @ layer.W_v.weight.T
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert weights.shape == (2, 6, 6)
    assert sum(p.numel() for p in layer.parameters()) == 12 * (8 + 8 + 5)


def test_self_attention_is_permutation_equivariant():
    layer, x = _layer(), torch.randn(2, 6, 12)
    perm = torch.randperm(6)
    out, weights = layer(x)
    out_p, weights_p = layer(x[:, perm])
    torch.testing.assert_close(out_p, out[:, perm])
    torch.testing.assert_close(weights_p, weights[:, perm][:, :, perm])


def test_self_attention_with_causal_mask_is_causal():
    layer, x = _layer(), torch.randn(2, 6, 12)
    for t in range(6):
        changed = x.clone()
        changed[:, t] = torch.randn(2, 12)
        before, _ = layer(x, sa.causal_mask(6))
        after, _ = layer(changed, sa.causal_mask(6))
        torch.testing.assert_close(
            after[:, :t], before[:, :t]
        )  # earlier positions unaffected
        assert not torch.allclose(
            after[:, t], before[:, t]
        )  # the changed position is affected
