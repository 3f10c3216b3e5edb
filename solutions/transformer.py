"""Chapter 6, the Transformer: reference implementations.

Exercise 0 of the chapter asks for the student's own answers to earlier chapters
(``causal_mask`` from chapter 3, ``sinusoidal_encoding`` from chapter 5, ``attention``,
``split_heads``, ``merge_heads`` and ``MultiHeadAttention`` from chapter 4): the student
notebook holds no copy of them. Their references here are copies of those chapters'
references (the build fills the exercise's stubs from this file's text);
``tests/test_transformer.py`` checks that they compute the same.
"""

import math

import torch
from torch import nn

# --------------------------------------------- exercise 0: answers from chapters 3 to 5


def causal_mask(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(n, n) bool: query i may attend to key j exactly when j <= i (chapter 3)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def sinusoidal_encoding(max_len: int, d_model: int) -> torch.Tensor:
    """(max_len, d_model): PE[pos, 2i] = sin(pos w_i), PE[pos, 2i+1] = cos(pos w_i).

    Returns float32; an odd d_model raises ValueError."""
    if d_model % 2 != 0:
        raise ValueError(
            f"d_model must be even (a sine and a cosine per pair), got {d_model}"
        )
    # Angles in float64: in float32, pos * w_i near pos = 1000 is off by about 1e-4 rad.
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(
        0, d_model, 2, dtype=torch.float64
    )  # (d_model/2,): 0, 2, 4, ...
    omega = 10000.0 ** (-two_i / d_model)  # (d_model/2,): 1 down to about 1/10000
    angle = position * omega  # (max_len, d_model/2)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)  # even dimensions 2i
    pe[:, 1::2] = torch.cos(angle)  # odd dimensions 2i+1
    return pe.float()


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(d_k)) v over the last two dimensions; mask True = may attend."""
    d_k = q.size(-1)  # the width of one head's queries and keys
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., n_q, n_k)
    if mask is not None:
        # The most negative finite float, not -inf: a fully masked row then gives a
        # uniform softmax (no NaN) that the zeroing below turns into zeros.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (..., n_q, n_k), rows sum to 1
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights  # (..., n_q, d_v), (..., n_q, n_k)


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, n, d_model) -> (B, h, n, d_model / h); head i gets features [i d_head, (i+1) d_head)."""
    batch, n, d_model = x.shape
    if d_model % num_heads != 0:
        raise ValueError(f"d_model = {d_model} is not divisible by {num_heads} heads")
    d_head = d_model // num_heads
    # Cut each token's feature vector into h consecutive blocks, then move the head
    # dimension in front of the tokens so that every head is a batch of sequences.
    x = x.reshape(batch, n, num_heads, d_head)  # (B, n, h, d_head)
    return x.transpose(1, 2)  # (B, h, n, d_head)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, n, d_head) -> (B, n, h d_head): the inverse of split_heads."""
    batch, num_heads, n, d_head = x.shape
    # Tokens back in front of the heads, then concatenate the heads' features per token.
    # reshape, not view: after the transpose the memory is no longer contiguous.
    x = x.transpose(1, 2)  # (B, n, h, d_head)
    return x.reshape(batch, n, num_heads * d_head)  # (B, n, d_model)


class MultiHeadAttention(nn.Module):
    """Multi-head attention: h scaled dot-product attentions on slices of one projection."""

    def __init__(self, d_model: int, num_heads: int, bias: bool = True):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model = {d_model} is not divisible by num_heads = {num_heads}"
            )
        self.num_heads = num_heads
        # One full-width projection each; split_heads later cuts them into h heads.
        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, d_model, bias=bias)
        self.W_v = nn.Linear(d_model, d_model, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q = split_heads(self.W_q(query), self.num_heads)  # (B, h, n_q, d_head)
        k = split_heads(self.W_k(key), self.num_heads)  # (B, h, n_k, d_head)
        v = split_heads(self.W_v(value), self.num_heads)  # (B, h, n_k, d_head)
        if mask is not None and mask.dim() == 3:
            # (B, n_q, n_k) or (B, 1, n_k): insert the head dimension, so that every
            # head of sequence b uses mask[b] (without it, mask[b] would meet head b).
            mask = mask.unsqueeze(1)  # (B, 1, n_q or 1, n_k)
        out, weights = attention(q, k, v, mask)  # (B, h, n_q, d_head), (B, h, n_q, n_k)
        return self.W_o(
            merge_heads(out)
        ), weights  # (B, n_q, d_model), per-head weights

    def load_torch_weights(self, mha: nn.Module) -> None:
        d_model = self.W_q.in_features
        if mha.embed_dim != d_model or mha.num_heads != self.num_heads:
            raise ValueError(
                f"expected a layer with embed_dim {d_model} and {self.num_heads} heads, "
                f"got {mha.embed_dim} and {mha.num_heads}"
            )
        if mha.in_proj_weight is None or mha.bias_k is not None:
            raise ValueError(
                "only the standard layout is supported (no kdim, vdim, add_bias_kv)"
            )
        if (mha.in_proj_bias is None) != (self.W_q.bias is None):
            raise ValueError("one layer has biases and the other has not")
        # PyTorch stacks W_q, W_k, W_v (each in nn.Linear's (out, in) layout) in one
        # matrix, and their biases in one vector; load_state_dict copies them as they are.
        weights = mha.in_proj_weight.chunk(3)  # 3 x (d_model, d_model)
        biases = [None] * 3 if mha.in_proj_bias is None else mha.in_proj_bias.chunk(3)
        for linear, weight, b in zip(
            (self.W_q, self.W_k, self.W_v), weights, biases, strict=True
        ):
            state = {"weight": weight} if b is None else {"weight": weight, "bias": b}
            linear.load_state_dict(state)
        self.W_o.load_state_dict(mha.out_proj.state_dict())


# ------------------------------------------------------------------------------ exercises


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied to every position on its own."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.linear1(x))  # (..., d_ff)
        return self.linear2(self.dropout(hidden))  # (..., d_model)


class SublayerConnection(nn.Module):
    """A residual connection around any sublayer, with layer norm after it or before it."""

    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        if self.norm_first:
            # pre-norm: the residual path from x to the output carries no normalisation
            return x + self.dropout(sublayer(self.norm(x)))
        # post-norm (the paper): normalise the sum
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each inside a SublayerConnection."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
    ):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayers = nn.ModuleList(
            [SublayerConnection(d_model, dropout, norm_first) for _ in range(2)]
        )

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = self.sublayers[0](x, lambda y: self.self_attn(y, y, y, mask)[0])
        return self.sublayers[1](x, self.feed_forward)  # (B, n, d_model)

    def load_torch_weights(self, layer: nn.Module) -> None:
        # nn.TransformerEncoderLayer's names -> ours; chapter 4's layer loads the attention
        self.self_attn.load_torch_weights(layer.self_attn)
        self.feed_forward.linear1.load_state_dict(layer.linear1.state_dict())
        self.feed_forward.linear2.load_state_dict(layer.linear2.state_dict())
        self.sublayers[0].norm.load_state_dict(layer.norm1.state_dict())
        self.sublayers[1].norm.load_state_dict(layer.norm2.state_dict())


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder's output, feed-forward."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
    ):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayers = nn.ModuleList(
            [SublayerConnection(d_model, dropout, norm_first) for _ in range(3)]
        )

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self_mask = causal_mask(x.size(1), x.device)  # (n_tgt, n_tgt)
        if tgt_mask is not None:
            self_mask = self_mask & tgt_mask  # broadcasts to (B, n_tgt, n_tgt)
        x = self.sublayers[0](x, lambda y: self.self_attn(y, y, y, self_mask)[0])
        # queries from the decoder, keys and values from the encoder's output
        x = self.sublayers[1](
            x, lambda y: self.cross_attn(y, memory, memory, memory_mask)[0]
        )
        return self.sublayers[2](x, self.feed_forward)  # (B, n_tgt, d_model)


class Encoder(nn.Module):
    """num_layers encoder layers; pre-norm stacks end with one more layer norm."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        num_layers: int,
        dropout: float = 0.0,
        norm_first: bool = False,
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            [
                EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first)
                for _ in range(num_layers)
            ]
        )
        # post-norm layers already end in a norm; a pre-norm stack's output is a raw sum
        self.norm = nn.LayerNorm(d_model) if norm_first else None

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return x if self.norm is None else self.norm(x)  # (B, n, d_model)


class Decoder(nn.Module):
    """num_layers decoder layers; pre-norm stacks end with one more layer norm."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        num_layers: int,
        dropout: float = 0.0,
        norm_first: bool = False,
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            [
                DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first)
                for _ in range(num_layers)
            ]
        )
        self.norm = nn.LayerNorm(d_model) if norm_first else None

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, memory, tgt_mask, memory_mask)
        return x if self.norm is None else self.norm(x)  # (B, n_tgt, d_model)


class Transformer(nn.Module):
    """The encoder-decoder Transformer: embeddings and positions, two stacks, output projection."""

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        num_layers: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        max_len: int = 256,
    ):
        super().__init__()
        self.d_model = d_model
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        # std d_model^-1/2, so that the embeddings times sqrt(d_model) have unit scale,
        # like the positional encoding they are added to
        nn.init.normal_(self.src_embed.weight, std=d_model**-0.5)
        nn.init.normal_(self.tgt_embed.weight, std=d_model**-0.5)
        # not persistent: the encoding is computed, never learned or loaded
        self.register_buffer(
            "pe", sinusoidal_encoding(max_len, d_model), persistent=False
        )
        self.dropout = nn.Dropout(dropout)
        sizes = (d_model, num_heads, d_ff, num_layers, dropout, norm_first)
        self.encoder = Encoder(*sizes)
        self.decoder = Decoder(*sizes)
        self.out_proj = nn.Linear(d_model, tgt_vocab)

    def encode(
        self, src: torch.Tensor, src_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        n = src.size(1)
        x = self.src_embed(src) * math.sqrt(self.d_model) + self.pe[:n]  # (B, n, d)
        return self.encoder(self.dropout(x), src_mask)  # (B, n_src, d_model)

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        n = tgt.size(1)
        y = self.tgt_embed(tgt) * math.sqrt(self.d_model) + self.pe[:n]  # (B, n, d)
        y = self.decoder(self.dropout(y), memory, tgt_mask, src_mask)
        return self.out_proj(y)  # (B, n_tgt, tgt_vocab) logits

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        memory = self.encode(src, src_mask)
        return self.decode(tgt, memory, src_mask, tgt_mask)

    def greedy_decode(
        self,
        src: torch.Tensor,
        max_len: int,
        bos: int,
        src_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        memory = self.encode(src, src_mask)  # encode once, decode max_len times
        ys = torch.full((src.size(0), 1), bos, dtype=torch.long, device=src.device)
        for _ in range(max_len):
            logits = self.decode(ys, memory, src_mask)  # (B, t, tgt_vocab)
            next_token = logits[:, -1].argmax(dim=-1)  # (B,): the most probable
            ys = torch.cat([ys, next_token[:, None]], dim=1)  # (B, t + 1)
        return ys[:, 1:]  # (B, max_len), without the start token


# --------------------------------------------------------------- the training recipe


def label_smoothing_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    smoothing: float = 0.1,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Cross-entropy against the smoothed target (1 - eps) one_hot(y) + eps / V, averaged
    over the targets that are not ignore_index (PyTorch's label_smoothing convention)."""
    log_probs = torch.log_softmax(logits, dim=-1).flatten(0, -2)  # (N, V)
    target = target.flatten()  # (N,)
    keep = target != ignore_index  # (N,): the targets that count
    log_probs, target = log_probs[keep], target[keep]  # (N_kept, V), (N_kept,)
    nll = -log_probs.gather(1, target[:, None]).squeeze(1)  # -log p_y
    uniform = -log_probs.mean(dim=-1)  # -(1/V) sum_c log p_c: the uniform part
    return ((1 - smoothing) * nll + smoothing * uniform).mean()


def inverse_sqrt_schedule(step: int, d_model: int, warmup: int) -> float:
    """d_model^-0.5 min(step^-0.5, step warmup^-1.5) (Vaswani et al., eq. 3); step 0 is
    taken as step 1, so that the first update is not wasted."""
    step = max(step, 1)
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
