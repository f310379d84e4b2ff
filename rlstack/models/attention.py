"""Attention for a few query positions per row on CPU: decoding steps and short continuations.

PyTorch's CPU kernel behind `scaled_dot_product_attention` (a flash-attention loop) pays a fixed
cost per block that dominates when each row brings only a few queries, and with a mask Hugging
Face repeats every key/value head for grouped-query attention (several queries). With 16 queries
or fewer per row, two matrix products over the grouped heads are faster, most of all over short
contexts; with more queries, the kernel is. Time of Hugging Face's `sdpa_attention_forward` over
`small_query_attention`'s on a 2-core CPU (float32, 4 heads over 2 key/value heads, head size 32, a
causal mask), two runs of `python bench/bench_cpu_paths.py` (bench/results/cpu_paths.json):

    rows x queries x keys   forward       forward + backward
    128 x  1 x   40         3.1x / 3.0x   1.9x / 2.2x
    128 x  1 x  512         1.5x / 1.0x   1.4x / 1.4x
      8 x  1 x 2048         1.1x / 1.1x   0.59x / 0.61x
     64 x 15 x   39         2.1x / 2.3x   2.6x / 2.5x
     16 x 16 x  256         1.6x / 1.4x   1.6x / 1.7x
      8 x 16 x 1024         1.3x / 1.3x   1.6x / 1.5x

A decoding step is the forward of one query per row; the update's response columns of short
responses are the forward and backward of up to 16 (one query with a gradient over long contexts,
slower here, does not occur in training). With 32 queries per row the kernel was as fast or faster
(0.9-0.95x over 64-1024 keys, measured with the raw kernels before this module existed).

`rlstack_sdpa` is Hugging Face's `sdpa` attention (same masks, same kernel) except that blocks of
at most `SMALL_QUERY` queries on CPU take the matrix-product path. Models load with it where
`attn_implementation=sdpa` is asked for (`rlstack.models.loading.load_causal_lm`); on a GPU
nothing changes. The two paths agree up to float rounding.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "rlstack_sdpa"
SMALL_QUERY = 16
"""Most queries per row that take the matrix-product path (see the table above)."""


def small_query_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, Q, D]
    key: torch.Tensor,  # [B, KV, L, D]
    value: torch.Tensor,  # [B, KV, L, D]
    attention_mask: torch.Tensor | None,  # [B or 1, 1, Q, L] bool (True: attend), or None
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Hugging Face's attention-function signature; returns `[B, Q, H, D]` as `sdpa_attention_forward`."""
    B, H, Q, D = query.shape
    KV = key.shape[1]
    usable = (
        query.device.type == "cpu"
        and Q <= SMALL_QUERY
        and dropout == 0.0
        and H % KV == 0
        and value.shape[-1] == D
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and (attention_mask is not None or Q == 1)  # no mask with several queries: the causal kernel
        and (attention_mask is None or attention_mask.shape[1] == 1)  # one mask for all heads
    )
    if not usable:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    g = H // KV  # query heads kv*g .. kv*g+g-1 read key/value head kv (as `repeat_kv` lays them out)
    grouped = query.reshape(B, KV, g, Q, D)
    if attention_mask is None or attention_mask.dtype == torch.bool:
        blocked = None if attention_mask is None else ~attention_mask[:, :, None]
        out = grouped_attention(grouped, key, value, scaling, blocked=blocked)
    else:
        out = grouped_attention(grouped, key, value, scaling, bias=attention_mask[:, :, None])
    return out.view(B, H, Q, D).transpose(1, 2).contiguous(), None


def grouped_attention(
    query: torch.Tensor,  # [B, KV, g, Q, D]: the g query heads that read each key/value head
    key: torch.Tensor,  # [B, KV, L, D]
    value: torch.Tensor,  # [B, KV, L, D]
    scaling: float | None = None,
    blocked: torch.Tensor | None = None,  # bool, broadcast to [B, KV, g, Q, L]: True where not attended
    bias: torch.Tensor | None = None,  # float, broadcast to [B, KV, g, Q, L]: added to the scores
) -> torch.Tensor:
    """Grouped-query attention as two matrix products, without repeating key/value heads: `[B, KV, g*Q, D]`.

    A blocked score takes the dtype's lowest value rather than -inf: a row that may attend to nothing (a
    padding query) gets finite weights, whose output nothing reads, instead of NaNs in the gradient."""
    B, KV, g, Q, D = query.shape
    L = key.shape[2]
    scale = scaling if scaling is not None else D**-0.5
    scores = (torch.matmul(query.reshape(B, KV, g * Q, D), key.transpose(-1, -2)) * scale).view(
        B, KV, g, Q, L
    )
    if blocked is not None:
        scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min)
    if bias is not None:
        scores = scores + bias
    weights = torch.softmax(scores.view(B, KV, g * Q, L), dim=-1, dtype=torch.float32).to(value.dtype)
    return torch.matmul(weights, value)


AttentionInterface.register(NAME, small_query_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)
