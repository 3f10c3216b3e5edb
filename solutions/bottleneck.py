"""Chapter 1, the bottleneck: reference implementations."""

import torch
from torch import nn


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x) / sum(exp(x)) along ``dim``, computed without overflow."""
    # softmax(x) = softmax(x - a) for any a constant along dim. With a = the maximum of each
    # slice, the largest exponent is exp(0) = 1: nothing overflows, and the sum is >= 1.
    shifted = x - x.amax(dim=dim, keepdim=True)  # same shape as x, every entry <= 0
    exp = shifted.exp()
    return exp / exp.sum(dim=dim, keepdim=True)


def attention_pool(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dot-product attention of one query per batch element over n keys and values."""
    scores = (keys * query.unsqueeze(1)).sum(dim=-1)  # e_i = q . k_i: (B, n)
    weights = softmax(scores, dim=-1)  # (B, n): a distribution over the n positions
    context = (weights.unsqueeze(-1) * values).sum(dim=1)  # sum_i alpha_i v_i: (B, d_v)
    return context, weights


class Seq2SeqAttentionDecoderStep(nn.Module):
    """One step of an attention decoder: attend, update the GRU state, predict a token."""

    def __init__(self, vocab_size: int, emb_dim: int, hidden_dim: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_dim)
        self.gru = nn.GRUCell(emb_dim + hidden_dim, hidden_dim)
        self.out = nn.Linear(2 * hidden_dim, vocab_size)

    def forward(
        self,
        token: torch.Tensor,
        hidden: torch.Tensor,
        encoder_outputs: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # The previous state s_{t-1} asks which source positions matter now (Bahdanau);
        # the encoder states are both the keys and the values.
        query = hidden  # (B, H)
        context, weights = attention_pool(query, encoder_outputs, encoder_outputs)
        embedded = self.embedding(token)  # (B, E)
        hidden = self.gru(torch.cat([embedded, context], dim=-1), hidden)  # (B, H)
        logits = self.out(torch.cat([hidden, context], dim=-1))  # (B, V)
        return logits, hidden, weights
