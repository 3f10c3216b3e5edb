"""PyTorch features an exercise may not delegate to, and how each is recognised.

A hidden test names the features its exercise reimplements (``HiddenTest.forbidden``).
A submission that calls one of them from its own code earns no points for that test, and
the feedback says why. Two independent checks, so that hiding a call from one does not
hide it from the other:

- ``names``: identifiers looked for in the student's own code (exercise cells and any
  cell the student added), parsed in the grader, which never runs it;
- ``ops``: substrings of the ATen operator names PyTorch dispatches to, recorded in the
  sandbox while the student's function runs on the hidden inputs.
"""

from typing import NamedTuple


class Feature(NamedTuple):
    description: str  # how the feedback names it
    names: tuple[str, ...]  # Python identifiers (attribute or imported names)
    ops: tuple[str, ...]  # substrings of aten operator names


FEATURES: dict[str, Feature] = {
    "sdpa": Feature(
        "PyTorch's fused attention (F.scaled_dot_product_attention, flash attention)",
        names=(
            "scaled_dot_product_attention",
            "_scaled_dot_product_attention_math",
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_flash_attention_for_cpu",
            "_fused_sdp_choice",
            "sdpa_kernel",
            "flex_attention",
        ),
        ops=(
            "scaled_dot_product",
            "_flash_attention",
            "_efficient_attention",
            "flex_attention",
        ),
    ),
    "mha": Feature(
        "PyTorch's nn.MultiheadAttention",
        names=(
            "MultiheadAttention",
            "multi_head_attention_forward",
            "_native_multi_head_attention",
        ),
        ops=("_native_multi_head_attention",),
    ),
    "transformer_layer": Feature(
        "PyTorch's nn.Transformer layers",
        names=(
            "TransformerEncoderLayer",
            "TransformerDecoderLayer",
            "TransformerEncoder",
            "TransformerDecoder",
            "Transformer",
            "_transformer_encoder_layer_fwd",
        ),
        ops=("_transformer_encoder_layer_fwd", "_transformer_decoder_only_layer_fwd"),
    ),
    "softmax": Feature(
        "PyTorch's softmax (torch.softmax, F.softmax, Tensor.softmax)",
        names=("softmax", "log_softmax", "Softmax", "LogSoftmax"),
        ops=("_softmax", "softmax"),
    ),
}
