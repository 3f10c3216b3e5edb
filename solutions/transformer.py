"""Chapter 6, the Transformer: reference implementations.

Exercise 0 of the chapter asks for the student's own answers to earlier chapters
(``causal_mask`` from chapter 3, ``sinusoidal_encoding`` from chapter 5, ``attention``,
``split_heads``, ``merge_heads`` and ``MultiHeadAttention`` from chapter 4): the student
notebook holds no copy of them. Their references are those chapters' own, imported below.
"""

import math
from collections.abc import Callable

import torch
from torch import nn

# Exercise 0's references are their own chapters' (the build fills its stubs from there).
from solutions.multi_head import (  # noqa: F401
    MultiHeadAttention,
    attention,
    merge_heads,
    split_heads,
)
from solutions.positional_encoding import sinusoidal_encoding
from solutions.self_attention import causal_mask

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

    def forward(
        self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
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
