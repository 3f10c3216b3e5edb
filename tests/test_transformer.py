"""Chapter 6: the references agree with PyTorch's Transformer layers, and the hidden tests
tell right from wrong answers written outside the mistake catalogue."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder.build import stub_copies
from solutions import multi_head, positional_encoding, self_attention
from solutions import transformer as tr

# answers call the reference by its bare name, as a student's notebook would
from solutions.transformer import label_smoothing_loss
from tests.answers import (
    SEEDS,
    assert_right_answer_passes,
    assert_wrong_answer_fails,
    right_answers,
    wrong_answers,
)
from tests.notebooks import answers, release_notebook

CHAPTER = "06_transformer"


# Exercise 0: the earlier chapters' exercises that chapter 6 builds on.
def _randomise(*modules, std=0.3):
    """Random weights everywhere, layer norms included (their 1 and 0 hide mistakes)."""
    with torch.no_grad():
        for module in modules:
            for p in module.parameters():
                p.normal_(0, std)


def _keep(lengths, n):
    """(B, n) bool, True on real tokens."""
    return torch.tensor(lengths)[:, None] > torch.arange(n)


def _copy_decoder_layer(ours, theirs):
    ours.self_attn.load_torch_weights(theirs.self_attn)
    ours.cross_attn.load_torch_weights(theirs.multihead_attn)
    ours.feed_forward.linear1.load_state_dict(theirs.linear1.state_dict())
    ours.feed_forward.linear2.load_state_dict(theirs.linear2.state_dict())
    for connection, norm in zip(
        ours.sublayers, (theirs.norm1, theirs.norm2, theirs.norm3), strict=True
    ):
        connection.norm.load_state_dict(norm.state_dict())


# ------------------------------------------------------ the references against PyTorch


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_encoder_layer_equals_torch_encoder_layer(norm_first, grad):
    """Both PyTorch paths (the fused inference path under no_grad, the plain one with
    autograd) and every mask shape: none, (n, n), (B, n, n) and padding (B, 1, n)."""
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(
        16, 4, dim_feedforward=40, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    _randomise(theirs)
    theirs.eval()
    ours = tr.EncoderLayer(16, 4, 40, norm_first=norm_first).eval()
    ours.load_torch_weights(theirs)
    x = torch.randn(3, 6, 16)
    causal = tr.causal_mask(6)
    full = torch.rand(3, 6, 6) < 0.5
    full[..., 0] = True
    keep = _keep([6, 4, 2], 6)
    with torch.set_grad_enabled(grad):
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(
            ours(x, causal), theirs(x, src_mask=~causal), rtol=1e-4, atol=1e-5
        )
        torch.testing.assert_close(
            ours(x, full),
            theirs(x, src_mask=(~full).repeat_interleave(4, dim=0)),
            rtol=1e-4,
            atol=1e-5,
        )
        got = ours(x, keep[:, None, :])
        expected = theirs(x, src_key_padding_mask=~keep)
        torch.testing.assert_close(got[keep], expected[keep], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_torch_decoder_layer(norm_first):
    torch.manual_seed(1)
    theirs = nn.TransformerDecoderLayer(
        16, 2, dim_feedforward=24, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    _randomise(theirs)
    theirs.eval()
    ours = tr.DecoderLayer(16, 2, 24, norm_first=norm_first).eval()
    _copy_decoder_layer(ours, theirs)
    x, memory = torch.randn(3, 5, 16), torch.randn(3, 7, 16)
    tgt_keep, src_keep = _keep([5, 3, 4], 5), _keep([7, 2, 6], 7)
    got = ours(x, memory, tgt_keep[:, None, :], src_keep[:, None, :])
    expected = theirs(
        x,
        memory,
        tgt_mask=~tr.causal_mask(5),
        tgt_key_padding_mask=~tgt_keep,
        memory_key_padding_mask=~src_keep,
    )
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_stacks_equal_torch_stacks(norm_first):
    torch.manual_seed(2)
    kwargs = dict(
        dim_feedforward=32, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    theirs_enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 4, **kwargs),
        3,
        norm=nn.LayerNorm(16) if norm_first else None,
        enable_nested_tensor=False,
    )
    theirs_dec = nn.TransformerDecoder(
        nn.TransformerDecoderLayer(16, 4, **kwargs),
        3,
        norm=nn.LayerNorm(16) if norm_first else None,
    )
    _randomise(theirs_enc, theirs_dec)
    encoder = tr.Encoder(16, 4, 32, 3, norm_first=norm_first)
    decoder = tr.Decoder(16, 4, 32, 3, norm_first=norm_first)
    for i in range(3):
        encoder.layers[i].load_torch_weights(theirs_enc.layers[i])
        _copy_decoder_layer(decoder.layers[i], theirs_dec.layers[i])
    if norm_first:
        encoder.norm.load_state_dict(theirs_enc.norm.state_dict())
        decoder.norm.load_state_dict(theirs_dec.norm.state_dict())
    else:
        assert encoder.norm is None and decoder.norm is None
    src, tgt = torch.randn(2, 6, 16), torch.randn(2, 4, 16)
    src_keep = _keep([6, 3], 6)
    memory = encoder(src, src_keep[:, None, :])
    torch.testing.assert_close(
        memory[src_keep],
        theirs_enc(src, src_key_padding_mask=~src_keep)[src_keep],
        rtol=1e-4,
        atol=1e-5,
    )
    torch.testing.assert_close(
        decoder(tgt, memory, memory_mask=src_keep[:, None, :]),
        theirs_dec(
            tgt,
            memory,
            tgt_mask=~tr.causal_mask(4),
            memory_key_padding_mask=~src_keep,
        ),
        rtol=1e-4,
        atol=1e-5,
    )


def test_feed_forward_and_sublayer_connection_follow_the_formulas():
    torch.manual_seed(3)
    ffn = tr.PositionwiseFeedForward(8, 32)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    ffn.double()
    w1, b1 = ffn.linear1.weight.T, ffn.linear1.bias
    w2, b2 = ffn.linear2.weight.T, ffn.linear2.bias
    torch.testing.assert_close(ffn(x), torch.clamp(x @ w1 + b1, min=0) @ w2 + b2)
    for norm_first in (False, True):
        connection = tr.SublayerConnection(8, norm_first=norm_first).double()
        _randomise(connection)
        gamma, beta = connection.norm.weight, connection.norm.bias

        def layer_norm(t, gamma=gamma, beta=beta):
            mu = t.mean(-1, keepdim=True)
            var = ((t - mu) ** 2).mean(-1, keepdim=True)  # biased, as in Ba et al.
            return gamma * (t - mu) / torch.sqrt(var + 1e-5) + beta

        expected = x + ffn(layer_norm(x)) if norm_first else layer_norm(x + ffn(x))
        torch.testing.assert_close(connection(x, ffn), expected)


def test_the_layers_run_on_chapter_4s_attention():
    """Exercise 0's references are the earlier chapters' own (no copies), and the layers
    hold chapter 4's class, not PyTorch's."""
    assert tr.MultiHeadAttention is multi_head.MultiHeadAttention
    assert tr.attention is multi_head.attention
    assert tr.causal_mask is self_attention.causal_mask
    assert tr.sinusoidal_encoding is positional_encoding.sinusoidal_encoding
    layer = tr.DecoderLayer(16, 4, 32)
    for attn in (
        layer.self_attn,
        layer.cross_attn,
        tr.EncoderLayer(16, 4, 32).self_attn,
    ):
        assert type(attn) is tr.MultiHeadAttention
    model = tr.Transformer(5, 6, 16, 4, 32, 2)
    assert not any(isinstance(m, nn.MultiheadAttention) for m in model.modules())


@pytest.mark.parametrize("shape", [(7,), (3, 4)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.35])
def test_label_smoothing_loss_equals_torch_cross_entropy(shape, smoothing):
    torch.manual_seed(8)
    logits = torch.randn(*shape, 9) * 4
    target = torch.randint(9, shape)
    for ignore_index in (-100, 2):
        target.view(-1)[[0, -1]] = ignore_index if ignore_index >= 0 else 5
        expected = F.cross_entropy(
            logits.flatten(0, -2),
            target.flatten(),
            label_smoothing=smoothing,
            ignore_index=ignore_index,
        )
        got = tr.label_smoothing_loss(logits, target, smoothing, ignore_index)
        assert got.shape == ()
        torch.testing.assert_close(got, expected)


def test_label_smoothing_loss_follows_the_smoothed_target():
    """The cross-entropy against q = (1 - eps) one_hot + eps / V, in float64 by hand."""
    logits = torch.tensor([[0.7, 0.1, 0.1, 0.1]], dtype=torch.float64).log()
    got = tr.label_smoothing_loss(logits, torch.tensor([0]), 0.1, -100)
    q = torch.tensor([0.9 + 0.025, 0.025, 0.025, 0.025], dtype=torch.float64)
    expected = -(
        q * torch.tensor([0.7, 0.1, 0.1, 0.1], dtype=torch.float64).log()
    ).sum()
    torch.testing.assert_close(got, expected)
    assert abs(got.item() - 0.50262) < 1e-5  # the chapter's worked numbers


def test_inverse_sqrt_schedule_is_equation_3():
    rates = [tr.inverse_sqrt_schedule(s, 512, 4000) for s in range(0, 20_001)]
    assert all(isinstance(r, float) for r in rates[:3])
    assert rates[0] == rates[1]  # step 0 is taken as step 1
    peak = max(range(len(rates)), key=rates.__getitem__)
    assert peak == 4000
    assert math.isclose(rates[4000], (512 * 4000) ** -0.5, rel_tol=1e-12)
    assert math.isclose(rates[100], 512**-0.5 * 100 * 4000**-1.5, rel_tol=1e-12)
    assert math.isclose(rates[16_000], rates[4000] / 2, rel_tol=1e-12)  # 1/sqrt(step)
    assert math.isclose(
        tr.inverse_sqrt_schedule(100_000, 512, 4000), 1.3975e-4, rel_tol=1e-3
    )


def test_transformer_is_causal_ignores_padding_and_decodes_greedily():
    torch.manual_seed(5)
    model = tr.Transformer(11, 13, 16, 4, 32, 2, norm_first=True).eval()
    src, tgt = torch.randint(11, (2, 7)), torch.randint(13, (2, 6))
    keep = _keep([7, 4], 7)[:, None, :]
    with torch.no_grad():
        logits = model(src, tgt, src_mask=keep)
        assert logits.shape == (2, 6, 13)
        later = tgt.clone()
        later[:, 3:] = torch.randint(13, (2, 3))
        torch.testing.assert_close(
            model(src, later, src_mask=keep)[:, :3], logits[:, :3]
        )
        padded = src.clone()
        padded[1, 4:] = torch.randint(11, (3,))
        torch.testing.assert_close(model(padded, tgt, src_mask=keep), logits)
        generated = model.greedy_decode(src, 5, 12, src_mask=keep)
        assert generated.shape == (2, 5) and generated.dtype == torch.long
        fed_back = torch.cat([torch.full((2, 1), 12), generated[:, :-1]], dim=1)
        assert torch.equal(model(src, fed_back, src_mask=keep).argmax(-1), generated)


def test_transformer_embeds_scales_and_adds_positions():
    torch.manual_seed(6)
    model = tr.Transformer(5, 6, 8, 2, 16, 1).eval()
    assert "pe" not in model.state_dict()
    src = torch.randint(5, (2, 4))
    pe = torch.tensor(
        [
            [math.sin(p / 10000 ** (2 * (i // 2) / 8)) if i % 2 == 0 else
             math.cos(p / 10000 ** (2 * (i // 2) / 8)) for i in range(8)]
            for p in range(4)
        ]
    )  # fmt: skip
    torch.testing.assert_close(tr.sinusoidal_encoding(4, 8), pe)
    with torch.no_grad():
        torch.testing.assert_close(
            model.encode(src), model.encoder(model.src_embed(src) * math.sqrt(8) + pe)
        )


def test_exercise_0_is_the_earlier_chapters_exercises_with_their_references():
    """Exercise 0's stubs are derived from the chapters they come from (``stub_copies``:
    a changed stub there makes this chapter stale), and chapter 6's references compute
    what those chapters' references do."""
    assert not stub_copies.stale(CHAPTER)
    original = stub_copies._stubs
    changed = dict(original("03_self_attention"))
    changed["causal_mask"] = changed["causal_mask"].replace("left-to-right", "causal")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            stub_copies,
            "_stubs",
            lambda ch: changed if ch == "03_self_attention" else original(ch),
        )
        assert stub_copies.stale(CHAPTER)
    for n in (1, 5):
        assert torch.equal(tr.causal_mask(n), self_attention.causal_mask(n))
    for shape in ((9, 6), (200, 512)):
        assert torch.equal(
            tr.sinusoidal_encoding(*shape),
            positional_encoding.sinusoidal_encoding(*shape),
        )
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
    mask = torch.rand(5, 6) > 0.3
    for a, b in zip(
        tr.attention(q, k, v, mask), multi_head.attention(q, k, v, mask), strict=True
    ):
        assert torch.equal(a, b)
    x = torch.randn(2, 5, 12)
    assert torch.equal(tr.split_heads(x, 3), multi_head.split_heads(x, 3))
    assert torch.equal(
        tr.merge_heads(tr.split_heads(x, 3)),
        multi_head.merge_heads(tr.split_heads(x, 3)),
    )


def test_the_student_notebook_gives_no_answer_of_an_earlier_chapter():
    """No line of a chapter 3, 4 or 5 reference answer (beyond their stubs) appears in
    chapter 6's student notebook."""
    released = "\n".join(
        c.source for c in release_notebook(CHAPTER).cells if c.cell_type == "code"
    )
    stub_lines = {
        line.strip()
        for source in stub_copies._stubs(CHAPTER).values()
        for line in source.splitlines()
    }
    for chapter in ("03_self_attention", "04_multi_head", "05_positional_encoding"):
        for answer in answers(chapter).values():
            for line in answer.splitlines():
                line = line.strip()
                if (
                    len(line) > 12
                    and line not in stub_lines
                    and not line.startswith("#")
                ):
                    assert line not in released, (chapter, line)


# --------------------------------- wrong answers written outside the mistake catalogue


class _FFNNoOutputBias(tr.PositionwiseFeedForward):
    def forward(self, x):
        return torch.relu(self.linear1(x)) @ self.linear2.weight.T


class _FFNLeakyReLU(tr.PositionwiseFeedForward):
    def forward(self, x):
        return self.linear2(F.leaky_relu(self.linear1(x), 0.1))


class _FFNReturnsHidden(tr.PositionwiseFeedForward):
    def forward(self, x):
        return torch.relu(self.linear1(x))


class _SublayerUnbiasedStd(tr.SublayerConnection):
    """Layer norm by hand with x.std(), which is the unbiased estimate: wrong by sqrt(d/(d-1))."""

    def forward(self, x, sublayer):
        def norm(t):
            mu, std = t.mean(-1, keepdim=True), t.std(-1, keepdim=True)
            return self.norm.weight * (t - mu) / (std + 1e-5) + self.norm.bias

        return x + sublayer(norm(x)) if self.norm_first else norm(x + sublayer(x))


class _SublayerNoAffine(tr.SublayerConnection):
    def forward(self, x, sublayer):
        def norm(t):
            return F.layer_norm(t, t.shape[-1:])

        return x + sublayer(norm(x)) if self.norm_first else norm(x + sublayer(x))


class _SublayerNormOverSequence(tr.SublayerConnection):
    def forward(self, x, sublayer):
        def norm(t):
            mu, var = t.mean(-2, keepdim=True), t.var(-2, keepdim=True, unbiased=False)
            return self.norm.weight * (t - mu) / torch.sqrt(var + 1e-5) + self.norm.bias

        return x + sublayer(norm(x)) if self.norm_first else norm(x + sublayer(x))


class _EncoderLayerOneResidual(tr.EncoderLayer):
    """One residual connection around the whole layer instead of one per sublayer."""

    def forward(self, x, mask=None):
        first, second = self.sublayers
        if first.norm_first:
            y = first.norm(x)
            return x + self.feed_forward(second.norm(self.self_attn(y, y, y, mask)[0]))
        y = first.norm(self.self_attn(x, x, x, mask)[0])
        return second.norm(x + self.feed_forward(y))


class _EncoderLayerWeightsWithoutBiases(tr.EncoderLayer):
    def load_torch_weights(self, layer):
        with torch.no_grad():
            w_q, w_k, w_v = layer.self_attn.in_proj_weight.chunk(3)
            self.self_attn.W_q.weight.copy_(w_q)
            self.self_attn.W_k.weight.copy_(w_k)
            self.self_attn.W_v.weight.copy_(w_v)
            self.self_attn.W_o.weight.copy_(layer.self_attn.out_proj.weight)
            self.feed_forward.linear1.weight.copy_(layer.linear1.weight)
            self.feed_forward.linear2.weight.copy_(layer.linear2.weight)
            self.sublayers[0].norm.weight.copy_(layer.norm1.weight)
            self.sublayers[1].norm.weight.copy_(layer.norm2.weight)


class _EncoderLayerForgetsOutProj(tr.EncoderLayer):
    def load_torch_weights(self, layer):
        with torch.no_grad():
            weights = layer.self_attn.in_proj_weight.chunk(3)
            biases = layer.self_attn.in_proj_bias.chunk(3)
            projections = (self.self_attn.W_q, self.self_attn.W_k, self.self_attn.W_v)
            for linear, w, b in zip(projections, weights, biases, strict=True):
                linear.weight.copy_(w)
                linear.bias.copy_(b)
            self.feed_forward.load_state_dict(
                {
                    "linear1.weight": layer.linear1.weight,
                    "linear1.bias": layer.linear1.bias,
                    "linear2.weight": layer.linear2.weight,
                    "linear2.bias": layer.linear2.bias,
                }
            )
            self.sublayers[0].norm.load_state_dict(layer.norm1.state_dict())
            self.sublayers[1].norm.load_state_dict(layer.norm2.state_dict())


class _DecoderLayerNormsMemory(tr.DecoderLayer):
    """Pre-norm that also normalises the memory with the cross-attention sublayer's norm."""

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        connection = self.sublayers[1]
        if connection.norm_first:
            memory = connection.norm(memory)
        return super().forward(x, memory, tgt_mask, memory_mask)


class _DecoderLayerCausalCrossAttention(tr.DecoderLayer):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        m, n = x.size(1), memory.size(1)
        causal = torch.ones(m, n, dtype=torch.bool).tril()
        memory_mask = causal if memory_mask is None else causal & memory_mask
        return super().forward(x, memory, tgt_mask, memory_mask)


class _DecoderLayerOneAttention(tr.DecoderLayer):
    """Uses self_attn for the cross-attention too."""

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        self_mask = tr.causal_mask(x.size(1))
        if tgt_mask is not None:
            self_mask = self_mask & tgt_mask
        x = self.sublayers[0](x, lambda y: self.self_attn(y, y, y, self_mask)[0])
        x = self.sublayers[1](
            x, lambda y: self.self_attn(y, memory, memory, memory_mask)[0]
        )
        return self.sublayers[2](x, self.feed_forward)


class _EncoderStackResidual(tr.Encoder):
    """Adds the stack's input to its output."""

    def forward(self, x, mask=None):
        return x + super().forward(x, mask)


class _EncoderNormsEveryLayer(tr.Encoder):
    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer(x, mask)
            if self.norm is not None:
                x = self.norm(x)
        return x


class _DecoderPreviousLayerAsMemory(tr.Decoder):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        previous = memory
        for layer in self.layers:
            x, previous = layer(x, previous, tgt_mask, memory_mask), x
            memory_mask = None  # the "memory" is now a target sequence
        return x if self.norm is None else self.norm(x)


class _TransformerScalesPositions(tr.Transformer):
    """(embedding + positions) * sqrt(d_model): the positions get scaled too."""

    def encode(self, src, src_mask=None):
        x = (self.src_embed(src) + self.pe[: src.size(1)]) * math.sqrt(self.d_model)
        return self.encoder(x, src_mask)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        y = (self.tgt_embed(tgt) + self.pe[: tgt.size(1)]) * math.sqrt(self.d_model)
        return self.out_proj(self.decoder(y, memory, tgt_mask, src_mask))


class _TransformerPositionsFromOne(tr.Transformer):
    def encode(self, src, src_mask=None):
        n = src.size(1)
        x = self.src_embed(src) * math.sqrt(self.d_model) + self.pe[1 : n + 1]
        return self.encoder(x, src_mask)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        m = tgt.size(1)
        y = self.tgt_embed(tgt) * math.sqrt(self.d_model) + self.pe[1 : m + 1]
        return self.out_proj(self.decoder(y, memory, tgt_mask, src_mask))


class _GreedyFloat(tr.Transformer):
    def greedy_decode(self, src, max_len, bos, src_mask=None):
        return super().greedy_decode(src, max_len, bos, src_mask).float()


class _GreedyOneShort(tr.Transformer):
    def greedy_decode(self, src, max_len, bos, src_mask=None):
        return super().greedy_decode(src, max_len - 1, bos, src_mask)


class _GreedyTeacherForcedOnBos(tr.Transformer):
    """One forward pass on a target of start tokens: no token is ever fed back."""

    def greedy_decode(self, src, max_len, bos, src_mask=None):
        start = torch.full((src.size(0), max_len), bos, dtype=torch.long)
        return self(src, start, src_mask).argmax(-1)


def _smoothing_without_log_softmax(logits, target, smoothing=0.1, ignore_index=-100):
    """The log of the softmax, not log_softmax: -inf (then nan) on large logits."""
    log_probs = torch.log(torch.softmax(logits.flatten(0, -2), dim=-1))
    target = target.flatten()
    keep = target != ignore_index
    log_probs, target = log_probs[keep], target[keep]
    nll = -log_probs[torch.arange(len(target)), target]
    return ((1 - smoothing) * nll - smoothing * log_probs.mean(-1)).mean()


def _smoothing_target_weight_only(logits, target, smoothing=0.1, ignore_index=-100):
    """Scales the plain loss by (1 - eps) and forgets the uniform part."""
    plain = label_smoothing_loss(logits, target, 0.0, ignore_index)
    return (1 - smoothing) * plain


def _smoothing_ignores_nothing(logits, target, smoothing=0.1, ignore_index=-100):
    """Treats ignore_index as an ordinary class (valid here: padding label 0 or 3)."""
    return label_smoothing_loss(logits, target.clamp_min(0), smoothing, -100)


def _smoothing_mean_over_sequences(logits, target, smoothing=0.1, ignore_index=-100):
    """Averages each sequence first, then the sequences: wrong weights with padding."""
    if logits.dim() == 2:
        logits, target = logits[None], target[None]
    per_sequence = [
        label_smoothing_loss(lg, t, smoothing, ignore_index).nan_to_num()
        for lg, t in zip(logits, target, strict=True)
    ]
    return torch.stack(per_sequence).mean()


def _schedule_linear_then_flat(step, d_model, warmup):
    """Warm-up, then a constant rate: no decay."""
    step = max(step, 1)
    return d_model**-0.5 * min(step, warmup) * warmup**-1.5


def _schedule_zero_based(step, d_model, warmup):
    """Counts from step + 1 everywhere: one step ahead."""
    step = step + 1
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def _schedule_sqrt_of_d_model(step, d_model, warmup):
    step = max(step, 1)
    return d_model**0.5 * min(step**-0.5, step * warmup**-1.5)


INDEPENDENT_WRONG_ANSWERS = {
    "PositionwiseFeedForward": {
        _FFNNoOutputBias: ["ffn_values"],
        _FFNLeakyReLU: ["ffn_values"],
        _FFNReturnsHidden: ["ffn_values"],
    },
    "SublayerConnection": {
        _SublayerUnbiasedStd: ["sublayer_connection"],
        _SublayerNoAffine: ["sublayer_connection"],
        _SublayerNormOverSequence: ["sublayer_connection"],
    },
    "EncoderLayer": {
        _EncoderLayerOneResidual: [
            "encoder_layer_values",
            "encoder_layer_torch_weights",
        ],
        _EncoderLayerWeightsWithoutBiases: ["encoder_layer_torch_weights"],
        _EncoderLayerForgetsOutProj: ["encoder_layer_torch_weights"],
    },
    "DecoderLayer": {
        _DecoderLayerNormsMemory: ["decoder_layer_values", "decoder_layer_causal"],
        _DecoderLayerCausalCrossAttention: ["decoder_layer_values"],
        _DecoderLayerOneAttention: ["decoder_layer_values", "decoder_layer_causal"],
    },
    "Encoder": {
        _EncoderStackResidual: ["encoder_stack"],
        _EncoderNormsEveryLayer: ["encoder_stack"],
    },
    "Decoder": {_DecoderPreviousLayerAsMemory: ["decoder_stack"]},
    "Transformer": {
        _TransformerScalesPositions: [
            "transformer_forward",
            "transformer_greedy_decode",
        ],
        _TransformerPositionsFromOne: ["transformer_forward"],
        _GreedyFloat: ["transformer_greedy_decode"],
        _GreedyOneShort: ["transformer_greedy_decode"],
        _GreedyTeacherForcedOnBos: ["transformer_greedy_decode"],
    },
    "label_smoothing_loss": {
        _smoothing_without_log_softmax: ["label_smoothing_values"],
        _smoothing_target_weight_only: [
            "label_smoothing_values",
            "label_smoothing_ignore_index",
        ],
        _smoothing_ignores_nothing: ["label_smoothing_ignore_index"],
        _smoothing_mean_over_sequences: ["label_smoothing_ignore_index"],
    },
    "inverse_sqrt_schedule": {
        _schedule_linear_then_flat: ["inverse_sqrt_schedule_values"],
        _schedule_zero_based: ["inverse_sqrt_schedule_values"],
        _schedule_sqrt_of_d_model: ["inverse_sqrt_schedule_values"],
    },
}


@pytest.mark.parametrize(
    "exercise, wrong, test_ids", wrong_answers(INDEPENDENT_WRONG_ANSWERS)
)
def test_independent_wrong_answers_fail(exercise, wrong, test_ids):
    assert_wrong_answer_fails(CHAPTER, tr, exercise, wrong, test_ids)


# ------------------------------------- correct answers written in another style must pass


class _OwnMHA(nn.Module):
    """Attention by hand with chapter 4's parameter names, in einsum: no PyTorch layer."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (
            nn.Linear(d_model, d_model) for _ in range(4)
        )

    def forward(self, query, key, value, mask=None):
        h = self.num_heads
        q, k, v = (
            torch.einsum("bnd,ed->bne", t, w.weight) + w.bias
            for t, w in ((query, self.W_q), (key, self.W_k), (value, self.W_v))
        )
        q, k, v = (t.unflatten(-1, (h, -1)) for t in (q, k, v))  # (B, n, h, d_head)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.size(-1))
        if mask is not None:
            scores = scores.masked_fill(
                ~mask[:, None] if mask.dim() == 3 else ~mask, -1e30
            )
        weights = scores.softmax(-1)
        out = torch.einsum("bhqk,bkhd->bqhd", weights, v).flatten(2)
        return self.W_o(out), weights

    def load_from(self, mha):
        with torch.no_grad():
            for linear, w, b in zip(
                (self.W_q, self.W_k, self.W_v),
                mha.in_proj_weight.chunk(3),
                mha.in_proj_bias.chunk(3),
                strict=True,
            ):
                linear.weight.copy_(w)
                linear.bias.copy_(b)
            self.W_o.weight.copy_(mha.out_proj.weight)
            self.W_o.bias.copy_(mha.out_proj.bias)


def _layer_norm(t, norm):
    return F.layer_norm(t, t.shape[-1:], norm.weight, norm.bias, norm.eps)


class _FFNFunctional(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        hidden = F.linear(x, self.linear1.weight, self.linear1.bias).clamp_min(0.0)
        return F.linear(hidden, self.linear2.weight, self.linear2.bias)


class _SublayerByHand(nn.Module):
    def __init__(self, d_model, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.norm_first = norm_first

    def forward(self, x, sublayer):
        g, b = self.norm.weight.double(), self.norm.bias.double()

        def norm(t):  # in float64, variance by hand
            t = t.double()
            centred = t - t.mean(-1, keepdim=True)
            return (
                g * centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5)
                + b
            )

        if self.norm_first:
            return (x.double() + sublayer(norm(x).float()).double()).float()
        return norm(x + sublayer(x)).float()


class _EncoderLayerInline(nn.Module):
    """Residuals and norms written inline, own attention; weights copied by name."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = _OwnMHA(d_model, num_heads)
        self.feed_forward = _FFNFunctional(d_model, d_ff)
        self.sublayers = nn.ModuleList(
            [_SublayerByHand(d_model, norm_first=norm_first) for _ in range(2)]
        )
        self.norm_first = norm_first

    def forward(self, x, mask=None):
        n1, n2 = (s.norm for s in self.sublayers)
        if self.norm_first:
            y = _layer_norm(x, n1)
            x = x + self.self_attn(y, y, y, mask)[0]
            return x + self.feed_forward(_layer_norm(x, n2))
        x = _layer_norm(x + self.self_attn(x, x, x, mask)[0], n1)
        return _layer_norm(x + self.feed_forward(x), n2)

    def load_torch_weights(self, layer):
        mapping = {
            "feed_forward.linear1.": "linear1.",
            "feed_forward.linear2.": "linear2.",
            "sublayers.0.norm.": "norm1.",
            "sublayers.1.norm.": "norm2.",
        }
        theirs = layer.state_dict()
        state = {}
        for name in self.state_dict():
            for ours, torch_name in mapping.items():
                if name.startswith(ours):
                    state[name] = theirs[torch_name + name[len(ours) :]]
        self.load_state_dict(state, strict=False)
        self.self_attn.load_from(layer.self_attn)


class _DecoderLayerInline(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = _OwnMHA(d_model, num_heads)
        self.cross_attn = _OwnMHA(d_model, num_heads)
        self.feed_forward = _FFNFunctional(d_model, d_ff)
        self.sublayers = nn.ModuleList(
            [_SublayerByHand(d_model, norm_first=norm_first) for _ in range(3)]
        )

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        m = x.size(1)
        causal = torch.arange(m)[:, None] >= torch.arange(m)[None, :]
        self_mask = causal if tgt_mask is None else torch.logical_and(causal, tgt_mask)
        blocks = [
            lambda y: self.self_attn(y, y, y, self_mask)[0],
            lambda y: self.cross_attn(y, memory, memory, memory_mask)[0],
            self.feed_forward,
        ]
        for connection, block in zip(self.sublayers, blocks, strict=True):
            x = connection(x, block)
        return x


class _EncoderWithReduce(nn.Module):
    def __init__(
        self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            _EncoderLayerInline(d_model, num_heads, d_ff, norm_first=norm_first)
            for _ in range(num_layers)
        )
        if norm_first:
            self.norm = nn.LayerNorm(d_model)

    def forward(self, x, mask=None):
        import functools

        x = functools.reduce(lambda h, layer: layer(h, mask), self.layers, x)
        return self.norm(x) if hasattr(self, "norm") else x


class _DecoderIndexed(nn.Module):
    def __init__(
        self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            _DecoderLayerInline(d_model, num_heads, d_ff, norm_first=norm_first)
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        for i in range(len(self.layers)):
            x = self.layers[i](x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask)
        return self.norm(x)


class _TransformerOwnStyle(nn.Module):
    """Positions computed on the fly (no buffer), F.embedding, greedy decoding into a
    preallocated tensor."""

    def __init__(self, src_vocab, tgt_vocab, d_model, num_heads, d_ff, num_layers,
                 dropout=0.0, norm_first=False, max_len=256):  # fmt: skip
        super().__init__()
        self.d_model = d_model
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.encoder = _EncoderWithReduce(
            d_model, num_heads, d_ff, num_layers, 0.0, norm_first
        )
        self.decoder = _DecoderIndexed(
            d_model, num_heads, d_ff, num_layers, 0.0, norm_first
        )
        self.out_proj = nn.Linear(d_model, tgt_vocab)

    def _embed(self, tokens, table):
        n, d = tokens.size(1), self.d_model
        position = torch.arange(n, dtype=torch.float64)[:, None]
        frequency = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2) / d)
        pe = torch.stack(
            [torch.sin(position * frequency), torch.cos(position * frequency)], dim=-1
        ).flatten(1)[:, :d]
        return F.embedding(tokens, table.weight) * d**0.5 + pe.float()

    def encode(self, src, src_mask=None):
        return self.encoder(self._embed(src, self.src_embed), src_mask)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        y = self.decoder(self._embed(tgt, self.tgt_embed), memory, tgt_mask, src_mask)
        return self.out_proj(y)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask)

    def greedy_decode(self, src, max_len, bos, src_mask=None):
        memory = self.encode(src, src_mask)
        tokens = torch.empty(src.size(0), max_len + 1, dtype=torch.long)
        tokens[:, 0] = bos
        for t in range(max_len):
            logits = self.decode(tokens[:, : t + 1], memory, src_mask)
            tokens[:, t + 1] = logits[:, t].argmax(-1)
        return tokens[:, 1:]


def _smoothing_one_hot(logits, target, smoothing=0.1, ignore_index=-100):
    """The smoothed target built as a tensor, in float64, masked sum over a count."""
    vocab = logits.size(-1)
    log_probs = F.log_softmax(logits.double(), dim=-1).reshape(-1, vocab)
    target = target.reshape(-1)
    keep = target.ne(ignore_index)
    q = F.one_hot(target.where(keep, 0), vocab).double() * (1 - smoothing)
    q = q + smoothing / vocab
    per_token = -(q * log_probs).sum(-1)
    return (per_token * keep).sum().div(keep.sum()).float()


def _schedule_by_cases(step, d_model, warmup):
    """Two branches instead of a min, with math.sqrt."""
    step = step or 1
    if step < warmup:
        return step / (math.sqrt(d_model) * warmup * math.sqrt(warmup))
    return 1.0 / math.sqrt(d_model * step)


INDEPENDENT_CORRECT_ANSWERS = {
    "PositionwiseFeedForward": [_FFNFunctional],
    "SublayerConnection": [_SublayerByHand],
    "EncoderLayer": [_EncoderLayerInline],
    "DecoderLayer": [_DecoderLayerInline],
    "Encoder": [_EncoderWithReduce],
    "Decoder": [_DecoderIndexed],
    "Transformer": [_TransformerOwnStyle],
    "label_smoothing_loss": [_smoothing_one_hot],
    "inverse_sqrt_schedule": [_schedule_by_cases],
}


@pytest.mark.parametrize("exercise, right", right_answers(INDEPENDENT_CORRECT_ANSWERS))
@pytest.mark.parametrize("seed", SEEDS)
def test_independent_correct_answers_pass(exercise, right, seed):
    assert_right_answer_passes(CHAPTER, tr, exercise, right, seed)


def test_label_smoothing_by_pytorchs_loss_gets_a_remark_not_a_zero():
    """F.cross_entropy(label_smoothing=...) is the exercise done by PyTorch: reading the
    code takes no point (it may be dead code or a comparison), it adds a remark."""
    from autograder.grading.judging.delegation import FEATURES
    from autograder.grading.judging.spec import load_chapter_tests
    from tests.answers import verdicts

    def delegating(logits, target, smoothing=0.1, ignore_index=-100):
        return F.cross_entropy(
            logits.flatten(0, -2), target.flatten(),
            label_smoothing=smoothing, ignore_index=ignore_index,
        )  # fmt: skip

    tests = load_chapter_tests(CHAPTER)
    smoothing = [t for t in tests.tests if t.exercise == "label_smoothing_loss"]
    results = verdicts(
        tests, {**vars(tr), "label_smoothing_loss": delegating}, 0, smoothing
    )
    for test in smoothing:
        assert results[test.id].passed
        assert "took no point" in results[test.id].remark
        assert FEATURES["cross_entropy"].description in results[test.id].remark
        assert "Remark" not in results[test.id].message
    assert all(verdicts(tests, vars(tr), 0, smoothing)[t.id].passed for t in smoothing)
