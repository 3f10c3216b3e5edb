"""Known mistakes of transformer: plausible wrong answers that every hidden test of
their exercise must fail, each with the hint the feedback gives when a student's outputs
match it."""

import math

import torch
from torch import nn

from autograder.grading.judging.spec import Mistake
from autograder.hidden_tests.transformer import EXERCISE_0
from autograder.known_mistakes import multi_head as _ch4
from autograder.known_mistakes import positional_encoding as _ch5
from autograder.known_mistakes import self_attention as _ch3
from solutions import transformer as ref


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


def _final_norm(stack, x, final_norm):
    """The stack's last norm as the slip has it: ``"pre"`` the right one (the stack's own,
    if any), ``"always"`` a plain layer norm even where there is none, else none."""
    if final_norm == "always":
        return nn.functional.layer_norm(x, x.shape[-1:])
    if final_norm == "pre" and stack.norm is not None:
        return stack.norm(x)
    return x


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
            return _final_norm(self, x, final_norm)

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
            return _final_norm(self, x, final_norm)

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

# Exercise 0 asks for the student's own answers from chapters 3 to 5: their chapters'
# catalogued mistakes name what went wrong here too.
MISTAKES += [
    mistake
    for module in (_ch3, _ch4, _ch5)
    for mistake in module.MISTAKES
    if mistake.exercise in EXERCISE_0
]
