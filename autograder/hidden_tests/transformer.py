"""Hidden tests for chapter 6, the Transformer (23 points)."""

import math

import torch
from torch import nn

from autograder.grading.spec import HiddenTest, Init, Mistake, case, torch_layer
from solutions import transformer as ref


def _randn(g, *shape, scale=1.0):
    return torch.randn(*shape, generator=g) * scale


def _random_mask(g, *shape):
    """A bool mask (True = may attend) with at least one True per query row."""
    mask = torch.rand(*shape, generator=g) < 0.6
    mask[..., torch.randint(shape[-1], (), generator=g)] = True
    return mask


def _padding(lengths, n):
    """(B, 1, n) bool, True on the first lengths[b] keys (chapter 3's padding_mask)."""
    return (torch.arange(n) < torch.tensor(lengths)[:, None]).unsqueeze(1)


def _random_state(module, g):
    """A PyTorch layer's state drawn from g, layer norms included (not their 1 and 0)."""
    with torch.no_grad():
        for p in module.parameters():
            scale = 1 / math.sqrt(p.shape[-1]) if p.dim() > 1 else 0.5
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _linear(g, d):
    """A random nn.Linear(d, d) as plain data: the sublayer a SublayerConnection wraps."""
    return torch_layer("Linear", d, d, state=_random_state(nn.Linear(d, d), g))


def _pair(g, batch, n, d):
    """Target sequences in pairs that agree everywhere but at the last position."""
    x = _randn(g, batch, n, d)
    changed = x.clone()
    changed[:, -1] = _randn(g, batch, d)
    return torch.cat([x, changed])  # (2 * batch, n, d)


# ------------------------------------------------------------------------------- cases


def _ffn_cases(g):
    return [
        case(_randn(g, 2, 5, 8), init=Init((8, 32)), label="(2, 5, 8), d_ff = 32"),
        case(_randn(g, 3, 1, 6), init=Init((6, 4)), label="length 1, d_ff < d_model"),
        case(_randn(g, 7, 16), init=Init((16, 64)), label="no batch dimension"),
    ]


def _sublayer_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((8,), {"norm_first": norm_first})
        cases += [
            case(_randn(g, 2, 5, 8), _linear(g, 8), init=init, label=name),
            case(_randn(g, 1, 3, 8, scale=5.0), _linear(g, 8), init=init,
                 label=f"{name}, large inputs"),
        ]  # fmt: skip
    return cases


def _encoder_layer_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((16, 4, 32), {"norm_first": norm_first})
        cases += [
            case(_randn(g, 2, 5, 16), init=init, label=f"{name}, no mask"),
            case(_randn(g, 3, 6, 16), mask=_padding([6, 4, 1], 6), init=init,
                 label=f"{name}, padding mask (B, 1, n)"),
            case(_randn(g, 2, 5, 16), mask=_random_mask(g, 2, 5, 5), init=init,
                 label=f"{name}, mask (B, n, n)"),
        ]  # fmt: skip
    return cases


def _torch_encoder_layer(g, d, h, d_ff, norm_first):
    layer = nn.TransformerEncoderLayer(
        d, h, dim_feedforward=d_ff, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    return torch_layer(
        "TransformerEncoderLayer", d, h, dim_feedforward=d_ff, dropout=0.0,
        batch_first=True, norm_first=norm_first, state=_random_state(layer, g),
    )  # fmt: skip


def _encoder_layer_torch_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((16, 2, 24), {"norm_first": norm_first}, load_state=False)
        layer = _torch_encoder_layer(g, 16, 2, 24, norm_first)
        cases += [
            case(_randn(g, 2, 5, 16), init=init, setup=[("load_torch_weights", (layer,))],
                 label=f"{name}, no mask"),
            case(_randn(g, 3, 4, 16), mask=_padding([4, 2, 3], 4), init=init,
                 setup=[("load_torch_weights", (layer,))], label=f"{name}, padding mask"),
        ]  # fmt: skip
    return cases


def _decoder_layer_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((16, 4, 32), {"norm_first": norm_first})
        cases += [
            case(_randn(g, 2, 5, 16), _randn(g, 2, 7, 16), init=init,
                 label=f"{name}, 5 targets, 7 sources, no masks"),
            case(_randn(g, 3, 4, 16), _randn(g, 3, 6, 16),
                 memory_mask=_padding([6, 3, 1], 6), init=init,
                 label=f"{name}, source padding mask"),
            case(_randn(g, 3, 5, 16), _randn(g, 3, 3, 16),
                 tgt_mask=_padding([5, 2, 4], 5), init=init,
                 label=f"{name}, target padding mask"),
        ]  # fmt: skip
    return cases


def _decoder_layer_causal_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((16, 2, 32), {"norm_first": norm_first})
        memory = _randn(g, 2, 6, 16)
        cases.append(
            case(_pair(g, 1, 6, 16), memory, init=init,
                 label=f"{name}, two targets that differ only in the last token"),
        )  # fmt: skip
    return cases


def _encoder_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((16, 4, 32, 3), {"norm_first": norm_first})
        cases += [
            case(_randn(g, 2, 5, 16), init=init, label=f"{name}, 3 layers"),
            case(_randn(g, 3, 6, 16), mask=_padding([6, 2, 5], 6), init=init,
                 label=f"{name}, 3 layers, padding mask"),
        ]  # fmt: skip
    return cases


def _decoder_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((16, 4, 32, 3), {"norm_first": norm_first})
        cases += [
            case(_pair(g, 1, 5, 16), _randn(g, 2, 4, 16), init=init,
                 label=f"{name}, two targets that differ only in the last token"),
            case(_randn(g, 3, 5, 16), _randn(g, 3, 6, 16),
                 tgt_mask=_padding([5, 3, 4], 5), memory_mask=_padding([6, 6, 2], 6),
                 init=init, label=f"{name}, target and source padding masks"),
        ]  # fmt: skip
    return cases


def _tokens(g, vocab, *shape):
    return torch.randint(vocab, shape, generator=g)


def _transformer_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((11, 13, 16, 4, 32, 2), {"norm_first": norm_first})
        cases += [
            case(_tokens(g, 11, 2, 7), _tokens(g, 13, 2, 5), init=init,
                 label=f"{name}, 7 source and 5 target tokens"),
            case(_tokens(g, 11, 3, 6), _tokens(g, 13, 3, 6),
                 src_mask=_padding([6, 3, 4], 6), init=init,
                 label=f"{name}, source padding mask"),
        ]  # fmt: skip
    return cases


def _greedy_cases(g):
    # Models with random weights often predict one token whatever the decoder reads; small
    # one-layer pre-norm models vary the most, so most cases use them, each with its own
    # weights, so that a decoder that never feeds its tokens back is caught.
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((9, 9, 16, 2, 32, 2), {"norm_first": norm_first})
        cases += [
            case(_tokens(g, 9, 3, 6), 6, 8, init=init, method="greedy_decode",
                 label=f"{name}, 6 tokens from 6"),
            case(_tokens(g, 9, 2, 4), 7, 0, src_mask=_padding([4, 2], 4), init=init,
                 method="greedy_decode", label=f"{name}, source padding mask"),
        ]  # fmt: skip
    small = Init((13, 13, 8, 2, 16, 1), {"norm_first": True})
    for i in range(3):
        cases.append(
            case(_tokens(g, 13, 4, 6), 6, 0, init=small, method="greedy_decode",
                 label=f"pre-norm, one layer, d_model = 8, model {i + 1}"),
        )  # fmt: skip
    return cases


# The layers are built on the student's own chapter-4 attention: no PyTorch layer, no fused
# attention behind them.
_OWN_LAYERS = ("transformer_layer", "mha", "sdpa")


def _smoothing_cases(g):
    return [
        case(_randn(g, 6, 5, scale=3.0), _tokens(g, 5, 6), 0.1, -100,
             label="(N, V) = (6, 5), smoothing 0.1"),
        case(_randn(g, 8, 11), _tokens(g, 11, 8), 0.0, -100,
             label="smoothing 0: the plain cross-entropy"),
        case(_randn(g, 5, 7), _tokens(g, 7, 5), 0.3, -100, label="smoothing 0.3"),
        case(_randn(g, 4, 6, scale=40.0), _tokens(g, 6, 4), 0.1, -100,
             label="large logits (log_softmax, not the log of the softmax)"),
        case(_randn(g, 2, 3, 9), _tokens(g, 9, 2, 3), 0.2, -100,
             label="(B, n, V) = (2, 3, 9) logits"),
    ]  # fmt: skip


def _smoothing_ignore_cases(g):
    cases = []
    for smoothing, ignore in ((0.1, 0), (0.25, 3)):
        target = _tokens(g, 8, 3, 5)
        target[0, 3:] = ignore
        target[2, 1:] = ignore
        target[1, 0] = (ignore + 1) % 8  # at least one target that counts
        cases.append(
            case(_randn(g, 3, 5, 8, scale=2.0), target, smoothing, ignore,
                 label=f"(B, n, V) = (3, 5, 8), padding label {ignore} ignored"),
        )  # fmt: skip
    target = _tokens(g, 6, 7)
    target[[1, 4]] = -100
    cases.append(
        case(_randn(g, 7, 6), target, 0.1, -100, label="(N, V), targets -100 ignored")
    )
    return cases


def _schedule_cases(g):
    return [
        case(
            step,
            d_model,
            warmup,
            label=f"step {step}, d_model {d_model}, warmup {warmup}",
        )
        for step, d_model, warmup in (
            (1, 512, 4000),
            (100, 512, 4000),
            (4000, 512, 4000),
            (25_000, 512, 4000),
            (3, 16, 10),
            (10, 16, 10),
            (40, 64, 10),
            (0, 64, 10),
        )
    ]


TESTS = [
    HiddenTest(
        id="ffn_values",
        exercise="PositionwiseFeedForward",
        points=1,
        description="linear2(relu(linear1(x))) on every position, for any leading dimensions",
        make_cases=_ffn_cases,
        level="module",
    ),
    HiddenTest(
        id="sublayer_connection",
        exercise="SublayerConnection",
        points=2,
        description="post-norm LayerNorm(x + sublayer(x)) and pre-norm x + sublayer(LayerNorm(x))",
        make_cases=_sublayer_cases,
        level="module",
    ),
    HiddenTest(
        id="encoder_layer_values",
        exercise="EncoderLayer",
        points=2,
        description="self-attention and feed-forward sublayers, post-norm and pre-norm, with masks (True = may attend)",
        make_cases=_encoder_layer_cases,
        level="module",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="encoder_layer_torch_weights",
        exercise="EncoderLayer",
        points=2,
        description="after load_torch_weights, the layer computes what nn.TransformerEncoderLayer does, in both norm placements",
        make_cases=_encoder_layer_torch_cases,
        level="module",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="decoder_layer_values",
        exercise="DecoderLayer",
        points=2,
        description="causal self-attention, cross-attention to the memory and feed-forward, with masks",
        make_cases=_decoder_layer_cases,
        level="module",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="decoder_layer_causal",
        exercise="DecoderLayer",
        points=1,
        description="changing a future target token leaves the earlier outputs unchanged",
        make_cases=_decoder_layer_causal_cases,
        level="module",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="encoder_stack",
        exercise="Encoder",
        points=2,
        description="num_layers encoder layers in order, with a final layer norm in pre-norm stacks",
        make_cases=_encoder_cases,
        level="model",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="decoder_stack",
        exercise="Decoder",
        points=2,
        description="num_layers causal decoder layers attending to the memory, with a final layer norm in pre-norm stacks",
        make_cases=_decoder_cases,
        level="model",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="transformer_forward",
        exercise="Transformer",
        points=2,
        description="scaled embeddings plus positions, encoder, decoder and output projection give the logits",
        make_cases=_transformer_cases,
        level="model",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="transformer_greedy_decode",
        exercise="Transformer",
        points=2,
        description="greedy_decode appends the most probable next token max_len times, from the start token",
        make_cases=_greedy_cases,
        level="exact",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="label_smoothing_values",
        exercise="label_smoothing_loss",
        points=2,
        description="(1 - eps) (-log p_y) + eps * mean over all V tokens of -log p_c, averaged, for (N, V) and (B, n, V) logits",
        make_cases=_smoothing_cases,
        level="op",
        forbidden=("cross_entropy",),
    ),
    HiddenTest(
        id="label_smoothing_ignore_index",
        exercise="label_smoothing_loss",
        points=1,
        description="targets equal to ignore_index count neither in the sum nor in the mean",
        make_cases=_smoothing_ignore_cases,
        level="op",
        forbidden=("cross_entropy",),
    ),
    HiddenTest(
        id="inverse_sqrt_schedule_values",
        exercise="inverse_sqrt_schedule",
        points=2,
        description="d_model^-0.5 min(step^-0.5, step warmup^-1.5), with step 0 taken as step 1",
        make_cases=_schedule_cases,
        level="op",
    ),
]


# ---------------------------------------------------------------- plausible wrong answers


def _smoothed(
    *, spread="all", ignored_in_mean=False, on_probabilities=False, uniform="mean"
):
    """A label_smoothing_loss with one deliberate slip."""

    def wrong(logits, target, smoothing=0.1, ignore_index=-100):
        log_probs = torch.log_softmax(logits, dim=-1).flatten(0, -2)
        target = target.flatten()
        keep = target != ignore_index
        safe = target.masked_fill(~keep, 0)
        vocab = log_probs.size(-1)
        nll = -log_probs.gather(1, safe[:, None]).squeeze(1)
        if (
            on_probabilities
        ):  # smooth p, then take the log: -log((1 - eps) p_y + eps / V)
            p_y = log_probs.exp().gather(1, safe[:, None]).squeeze(1)
            loss = -torch.log((1 - smoothing) * p_y + smoothing / vocab)
        elif spread == "others":  # eps / (V - 1) on the wrong tokens only
            others = (-log_probs.sum(-1) - nll) / (vocab - 1)
            loss = (1 - smoothing) * nll + smoothing * others
        else:
            total = -log_probs.sum(-1)
            part = total if uniform == "sum" else total / vocab
            loss = (1 - smoothing) * nll + smoothing * part
        loss = loss * keep
        return loss.sum() / (target.numel() if ignored_in_mean else keep.sum())

    return wrong


def _schedule(*, warmup_power=-1.5, guard=True, scale=True, pick=min):
    """An inverse_sqrt_schedule with one deliberate slip."""

    def wrong(step, d_model, warmup):
        if guard:
            step = max(step, 1)
        decay = (
            step**-0.5 if step > 0 else math.inf
        )  # unguarded: the rate of step 0 is 0
        rate = pick(decay, step * warmup**warmup_power)
        return d_model**-0.5 * rate if scale else float(rate)

    return wrong


class _FFNNoReLU(ref.PositionwiseFeedForward):
    def forward(self, x):
        return self.linear2(self.linear1(x))


class _FFNGelu(ref.PositionwiseFeedForward):
    def forward(self, x):
        return self.linear2(torch.nn.functional.gelu(self.linear1(x)))


class _FFNReLUAtTheEnd(ref.PositionwiseFeedForward):
    def forward(self, x):
        return torch.relu(self.linear2(torch.relu(self.linear1(x))))


class _FFNWithResidual(ref.PositionwiseFeedForward):
    def forward(self, x):
        return x + self.linear2(torch.relu(self.linear1(x)))


class _SublayerNoResidual(ref.SublayerConnection):
    def forward(self, x, sublayer):
        if self.norm_first:
            return self.dropout(sublayer(self.norm(x)))
        return self.norm(self.dropout(sublayer(x)))


class _SublayerSwapped(ref.SublayerConnection):
    def forward(self, x, sublayer):
        if not self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class _SublayerAlwaysPost(ref.SublayerConnection):
    def forward(self, x, sublayer):
        return self.norm(x + self.dropout(sublayer(x)))


class _SublayerPreResidualNormed(ref.SublayerConnection):
    def forward(self, x, sublayer):
        if self.norm_first:
            normed = self.norm(x)
            return normed + self.dropout(sublayer(normed))
        return self.norm(x + self.dropout(sublayer(x)))


class _SublayerPostNormsBranch(ref.SublayerConnection):
    def forward(self, x, sublayer):
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return x + self.norm(self.dropout(sublayer(x)))


def _attend(attn, query, key_value, mask):
    return attn(query, key_value, key_value, mask)[0]


class _EncoderLayerNoResidual(ref.EncoderLayer):
    def forward(self, x, mask=None):
        first, second = self.sublayers
        if first.norm_first:
            x = _attend(self.self_attn, first.norm(x), first.norm(x), mask)
            return self.feed_forward(second.norm(x))
        x = first.norm(_attend(self.self_attn, x, x, mask))
        return second.norm(self.feed_forward(x))


class _EncoderLayerSwappedNorm(ref.EncoderLayer):
    def forward(self, x, mask=None):
        first, second = self.sublayers
        if not first.norm_first:
            y = first.norm(x)
            x = x + _attend(self.self_attn, y, y, mask)
            return x + self.feed_forward(second.norm(x))
        x = first.norm(x + _attend(self.self_attn, x, x, mask))
        return second.norm(x + self.feed_forward(x))


class _EncoderLayerInvertedMask(ref.EncoderLayer):
    def forward(self, x, mask=None):
        return super().forward(x, None if mask is None else ~mask)


class _EncoderLayerIgnoresMask(ref.EncoderLayer):
    def forward(self, x, mask=None):
        return super().forward(x, None)


class _EncoderLayerFFNFirst(ref.EncoderLayer):
    def forward(self, x, mask=None):
        x = self.sublayers[0](x, self.feed_forward)
        return self.sublayers[1](x, lambda y: _attend(self.self_attn, y, y, mask))


class _EncoderLayerNormsSwapped(ref.EncoderLayer):
    """Right forward; load_torch_weights puts norm2 where norm1 belongs and back."""

    def load_torch_weights(self, layer):
        super().load_torch_weights(layer)
        self.sublayers[0].norm.load_state_dict(layer.norm2.state_dict())
        self.sublayers[1].norm.load_state_dict(layer.norm1.state_dict())


def _decoder_layer(
    *,
    causal=True,
    use_tgt_mask=True,
    use_memory_mask=True,
    cross_from_decoder=False,
    residual=True,
    swap_norm=False,
    cross_first=False,
):
    """A DecoderLayer with one deliberate slip."""

    class Wrong(ref.DecoderLayer):
        def forward(self, x, memory, tgt_mask=None, memory_mask=None):
            n = x.size(1)
            self_mask = (
                ref.causal_mask(n) if causal else torch.ones(n, n, dtype=torch.bool)
            )
            if use_tgt_mask and tgt_mask is not None:
                self_mask = self_mask & tgt_mask
            if not use_memory_mask:
                memory_mask = None

            def self_block(y):
                return _attend(self.self_attn, y, y, self_mask)

            def cross_block(y):
                if (
                    cross_from_decoder
                ):  # keys and values from the decoder, not the memory
                    return _attend(self.cross_attn, y, y, self_mask)
                return _attend(self.cross_attn, y, memory, memory_mask)

            blocks = [self_block, cross_block, self.feed_forward]
            if cross_first:
                blocks[0], blocks[1] = blocks[1], blocks[0]
            for connection, block in zip(self.sublayers, blocks, strict=True):
                pre = connection.norm_first != swap_norm
                if not residual:
                    x = block(connection.norm(x)) if pre else connection.norm(block(x))
                elif pre:
                    x = x + block(connection.norm(x))
                else:
                    x = connection.norm(x + block(x))
            return x

    return Wrong


def _encoder(*, final_norm="pre", use_mask=True, reverse=False, first_only=False):
    class Wrong(ref.Encoder):
        def forward(self, x, mask=None):
            layers = list(self.layers)
            if reverse:
                layers = layers[::-1]
            if first_only:
                layers = [layers[0]] * len(layers)
            for layer in layers:
                x = layer(x, mask if use_mask else None)
            if final_norm == "always":
                return nn.functional.layer_norm(x, x.shape[-1:])
            if final_norm == "pre" and self.norm is not None:
                return self.norm(x)
            return x

    return Wrong


def _decoder(
    *, final_norm="pre", use_tgt_mask=True, use_memory_mask=True, reverse=False
):
    class Wrong(ref.Decoder):
        def forward(self, x, memory, tgt_mask=None, memory_mask=None):
            layers = list(self.layers)[::-1] if reverse else self.layers
            for layer in layers:
                x = layer(
                    x,
                    memory,
                    tgt_mask if use_tgt_mask else None,
                    memory_mask if use_memory_mask else None,
                )
            if final_norm == "always":
                return nn.functional.layer_norm(x, x.shape[-1:])
            if final_norm == "pre" and self.norm is not None:
                return self.norm(x)
            return x

    return Wrong


def _transformer(
    *,
    scale=True,
    positions="both",
    tgt_table="tgt",
    memory_mask=True,
    probabilities=False,
):
    """A Transformer whose forward pass has one deliberate slip."""

    class Wrong(ref.Transformer):
        def _embed(self, tokens, table, side):
            x = table(tokens) * (math.sqrt(self.d_model) if scale else 1.0)
            if positions == "both" or positions == side:
                x = x + self.pe[: tokens.size(1)]
            return x

        def encode(self, src, src_mask=None):
            return self.encoder(self._embed(src, self.src_embed, "src"), src_mask)

        def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
            table = self.tgt_embed if tgt_table == "tgt" else self.src_embed
            y = self._embed(tgt, table, "tgt")
            y = self.decoder(y, memory, tgt_mask, src_mask if memory_mask else None)
            logits = self.out_proj(y)
            return logits.softmax(-1) if probabilities else logits

    return Wrong


def _greedy(*, keep_start=False, feed_back=True):
    """A Transformer whose greedy_decode has one deliberate slip."""

    class Wrong(ref.Transformer):
        def greedy_decode(self, src, max_len, bos, src_mask=None):
            memory = self.encode(src, src_mask)
            ys = torch.full((src.size(0), 1), bos, dtype=torch.long)
            out = ys
            for _ in range(max_len):
                logits = self.decode(ys, memory, src_mask)
                token = logits[:, -1].argmax(-1)[:, None]
                out = torch.cat([out, token], dim=1)
                if feed_back:
                    ys = out
            return out if keep_start else out[:, 1:]

    return Wrong


MISTAKES = [
    Mistake(
        "PositionwiseFeedForward",
        "no ReLU",
        "your feed-forward network looks linear: apply the ReLU between linear1 and linear2.",
        _FFNNoReLU,
    ),
    Mistake(
        "PositionwiseFeedForward",
        "GELU",
        "your activation looks like GELU: the paper's network uses ReLU, max(0, x W_1 + b_1).",
        _FFNGelu,
    ),
    Mistake(
        "PositionwiseFeedForward",
        "ReLU on the output",
        "your output is never negative: is there a ReLU after linear2? Only the hidden layer has one.",
        _FFNReLUAtTheEnd,
    ),
    Mistake(
        "PositionwiseFeedForward",
        "residual inside",
        "your output looks like x + FFN(x): the residual connection belongs to SublayerConnection, not to the network.",
        _FFNWithResidual,
    ),
    Mistake(
        "SublayerConnection",
        "no residual",
        "your output has no residual path: did you add x back (x + sublayer(...))?",
        _SublayerNoResidual,
    ),
    Mistake(
        "SublayerConnection",
        "placements swapped",
        "your post-norm and pre-norm look swapped: norm_first=False normalises the sum, LayerNorm(x + sublayer(x)); norm_first=True normalises the sublayer's input.",
        _SublayerSwapped,
    ),
    Mistake(
        "SublayerConnection",
        "norm_first ignored",
        "your pre-norm output equals the post-norm one: does forward look at norm_first?",
        _SublayerAlwaysPost,
    ),
    Mistake(
        "SublayerConnection",
        "pre-norm residual from the normalised input",
        "your pre-norm residual adds LayerNorm(x), not x: the residual path must carry x unchanged, x + sublayer(LayerNorm(x)).",
        _SublayerPreResidualNormed,
    ),
    Mistake(
        "SublayerConnection",
        "post-norm normalises the branch",
        "your post-norm normalises only the sublayer's output: normalise the sum, LayerNorm(x + sublayer(x)).",
        _SublayerPostNormsBranch,
    ),
    Mistake(
        "EncoderLayer",
        "no residual",
        "your layer has no residual connections: is each sublayer wrapped in a SublayerConnection that adds x back?",
        _EncoderLayerNoResidual,
    ),
    Mistake(
        "EncoderLayer",
        "norm placement swapped",
        "your layer normalises in the other place: norm_first=False is post-norm (the paper), norm_first=True is pre-norm.",
        _EncoderLayerSwappedNorm,
    ),
    Mistake(
        "EncoderLayer",
        "inverted mask",
        "your mask looks inverted: our masks say True = may attend, as chapter 4's MultiHeadAttention expects; pass the mask on unchanged.",
        _EncoderLayerInvertedMask,
    ),
    Mistake(
        "EncoderLayer",
        "mask ignored",
        "your layer ignores the mask: pass it on to the self-attention.",
        _EncoderLayerIgnoresMask,
    ),
    Mistake(
        "EncoderLayer",
        "feed-forward first",
        "your sublayers look in the wrong order: self-attention comes first, then the feed-forward network.",
        _EncoderLayerFFNFirst,
    ),
    Mistake(
        "EncoderLayer",
        "norms swapped in load_torch_weights",
        "after load_torch_weights the layer norms look swapped: PyTorch's norm1 belongs to the attention sublayer, norm2 to the feed-forward one.",
        _EncoderLayerNormsSwapped,
    ),
    Mistake(
        "DecoderLayer",
        "no causal mask",
        "your decoder's self-attention sees future tokens: combine causal_mask(n) with tgt_mask.",
        _decoder_layer(causal=False),
    ),
    Mistake(
        "DecoderLayer",
        "cross-attention to the decoder",
        "your cross-attention takes its keys and values from the decoder: they come from the encoder's output, memory.",
        _decoder_layer(cross_from_decoder=True),
    ),
    Mistake(
        "DecoderLayer",
        "target mask ignored",
        "your layer ignores tgt_mask: combine it with the causal mask (causal & tgt_mask).",
        _decoder_layer(use_tgt_mask=False),
    ),
    Mistake(
        "DecoderLayer",
        "memory mask ignored",
        "your cross-attention ignores memory_mask: padded source tokens must not be attended to.",
        _decoder_layer(use_memory_mask=False),
    ),
    Mistake(
        "DecoderLayer",
        "no residual",
        "your layer has no residual connections: wrap each of the three sublayers in a SublayerConnection.",
        _decoder_layer(residual=False),
    ),
    Mistake(
        "DecoderLayer",
        "norm placement swapped",
        "your layer normalises in the other place: norm_first=False is post-norm (the paper), norm_first=True is pre-norm.",
        _decoder_layer(swap_norm=True),
    ),
    Mistake(
        "DecoderLayer",
        "cross-attention first",
        "your sublayers look in the wrong order: masked self-attention, then cross-attention, then feed-forward.",
        _decoder_layer(cross_first=True),
    ),
    Mistake(
        "Encoder",
        "no final norm in pre-norm",
        "your pre-norm stack has no final layer norm: its output is a raw residual sum; apply self.norm at the end.",
        _encoder(final_norm="never"),
    ),
    Mistake(
        "Encoder",
        "final norm in post-norm",
        "your post-norm stack normalises its output once more: only a pre-norm stack needs the final norm.",
        _encoder(final_norm="always"),
    ),
    Mistake(
        "Encoder",
        "mask not passed on",
        "your encoder ignores the mask: pass it to every layer.",
        _encoder(use_mask=False),
    ),
    Mistake(
        "Encoder",
        "layers in reverse",
        "your layers run in reverse order: apply self.layers[0] first.",
        _encoder(reverse=True),
    ),
    Mistake(
        "Encoder",
        "first layer repeated",
        "your stack applies the same layer again and again: each of the num_layers layers has its own weights.",
        _encoder(first_only=True),
    ),
    Mistake(
        "Decoder",
        "no final norm in pre-norm",
        "your pre-norm stack has no final layer norm: its output is a raw residual sum; apply self.norm at the end.",
        _decoder(final_norm="never"),
    ),
    Mistake(
        "Decoder",
        "final norm in post-norm",
        "your post-norm stack normalises its output once more: only a pre-norm stack needs the final norm.",
        _decoder(final_norm="always"),
    ),
    Mistake(
        "Decoder",
        "target mask not passed on",
        "your decoder ignores tgt_mask: pass it to every layer.",
        _decoder(use_tgt_mask=False),
    ),
    Mistake(
        "Decoder",
        "memory mask not passed on",
        "your decoder ignores memory_mask: pass it to every layer's cross-attention.",
        _decoder(use_memory_mask=False),
    ),
    Mistake(
        "Decoder",
        "layers in reverse",
        "your layers run in reverse order: apply self.layers[0] first.",
        _decoder(reverse=True),
    ),
    Mistake(
        "Transformer",
        "unscaled embeddings",
        "your embeddings look unscaled: multiply them by sqrt(d_model) before adding the positional encoding.",
        _transformer(scale=False),
    ),
    Mistake(
        "Transformer",
        "no positional encoding",
        "your model ignores positions: add self.pe[:n] to the scaled embeddings of source and target.",
        _transformer(positions="none"),
    ),
    Mistake(
        "Transformer",
        "positions only in the source",
        "your target has no positional encoding: add self.pe[:n] in decode too.",
        _transformer(positions="src"),
    ),
    Mistake(
        "Transformer",
        "source embedding for the target",
        "your decoder embeds the target with src_embed: target tokens have their own table, tgt_embed.",
        _transformer(tgt_table="src"),
    ),
    Mistake(
        "Transformer",
        "source mask not used by the decoder",
        "your decoder's cross-attention ignores src_mask: padded source tokens must be hidden there too.",
        _transformer(memory_mask=False),
    ),
    Mistake(
        "Transformer",
        "probabilities",
        "your model returns probabilities: return the logits (the output projection); the loss applies the softmax.",
        _transformer(probabilities=True),
    ),
    Mistake(
        "Transformer",
        "start token returned",
        "greedy_decode returns the start token too: return the max_len generated tokens only.",
        _greedy(keep_start=True),
    ),
    Mistake(
        "Transformer",
        "predictions not fed back",
        "greedy_decode repeats its first prediction: append each new token to the decoder's input, and take the next token from the last position, logits[:, -1].",
        _greedy(feed_back=False),
    ),
    Mistake(
        "label_smoothing_loss",
        "smoothing over V - 1 tokens",
        "your loss spreads the smoothing over the V - 1 wrong tokens: PyTorch (and Szegedy et al.) spread eps over all V tokens, the correct one included: (1 - eps) (-log p_y) + eps * mean_c (-log p_c).",
        _smoothed(spread="others"),
    ),
    Mistake(
        "label_smoothing_loss",
        "ignored targets in the mean",
        "your loss divides by every position, ignored ones included: average over the targets that are not ignore_index only.",
        _smoothed(ignored_in_mean=True),
    ),
    Mistake(
        "label_smoothing_loss",
        "smoothing the probabilities",
        "your loss looks like -log((1 - eps) p_y + eps / V): smooth the target distribution, not the model's probabilities, and take the cross-entropy -sum_c q_c log p_c.",
        _smoothed(on_probabilities=True),
    ),
    Mistake(
        "label_smoothing_loss",
        "sum instead of mean over the vocabulary",
        "your smoothing term is eps times the sum of -log p_c over the vocabulary: the uniform target puts eps / V on each token, so it is eps times the mean.",
        _smoothed(uniform="sum"),
    ),
    Mistake(
        "inverse_sqrt_schedule",
        "warmup to the power -0.5",
        "your warm-up looks too steep: the linear term is step * warmup^-1.5, so that both terms meet at step = warmup.",
        _schedule(warmup_power=-0.5),
    ),
    Mistake(
        "inverse_sqrt_schedule",
        "step 0 not guarded",
        "your rate at step 0 is 0 (or fails): take step 0 as step 1, so that the first update is not wasted.",
        _schedule(guard=False),
    ),
    Mistake(
        "inverse_sqrt_schedule",
        "no d_model^-0.5",
        "your rate is missing the factor d_model^-0.5.",
        _schedule(scale=False),
    ),
    Mistake(
        "inverse_sqrt_schedule",
        "max instead of min",
        "your rate keeps growing after the warm-up: take the min of step^-0.5 and step * warmup^-1.5, not the max.",
        _schedule(pick=max),
    ),
]
