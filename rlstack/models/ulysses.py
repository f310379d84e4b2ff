"""Sequence parallelism for long contexts: DeepSpeed-Ulysses attention over a group of ranks.

Jacobs et al., "DeepSpeed Ulysses: System Optimizations for Enabling Training of Extreme Long Sequence
Transformer Models" (arXiv:2309.14509); EasyR1's `worker.actor.ulysses_size`, veRL's
`ulysses_sequence_parallel_size`. The ranks of a sequence-parallel group hold the same rows; the
packed sequence of a padding-free pass (`rlstack.models.logprobs.packed_response_logits`) is cut into
as many equal slices, one per rank, and every layer works on its rank's slice except attention, which
needs all of it: an all-to-all before attention gives each rank the whole sequence for its share of
the heads (scatter heads, gather the sequence), and the inverse one after it gives each rank its
slice of the sequence for all heads. Activations then take 1/size of the memory on every rank.

Where rlstack departs from the paper and veRL:
- positions (M-RoPE's three rows included) and the embeddings (image features merged in) are made
  on the whole sequence on every rank; the language model's input is cut to the rank's slice by a
  pre-hook (`shard_decoder_input`), so a vision-language model needs no patch of its own;
- the mask is the block-diagonal causal mask of the whole packed sequence, handed to SDPA; veRL
  hands FlashAttention the rows' lengths (`cu_seqlens`) instead, which rlstack does not do yet;
- a sequence that does not divide into `size` slices is padded at its end with a segment of its own
  that no real token attends to and whose logits nothing reads;
- each rank takes the log-probs of its slice's response tokens, and all ranks gather them
  (`gather_pieces`): every rank of the group then computes the same loss, and the gather's backward
  keeps only the rank's own piece, so the ranks' gradients add up to the one-process gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rlstack.models.attention import small_query_attention

NAME = "rlstack_ulysses"
"""The attention implementation of a sequence-parallel language model: rlstack's SDPA attention
(`rlstack.models.attention`), with Ulysses' all-to-all around it in a pass that carries a `SequenceShard`."""


@dataclass(frozen=True)
class SequenceShard:
    """A forward pass's packed sequence cut across a sequence-parallel group (a forward kwarg, which
    Hugging Face models pass down to their attention functions, activation recomputation included)."""

    group: dist.ProcessGroup
    rank: int
    """This rank's place in the group: it holds slice `rank` of the sequence."""
    size: int
    """Ranks in the group (slices of the sequence)."""
    mask: torch.Tensor
    """`[1, 1, N, N]` bool, True where attended: causal within each packed row of the whole (padded) sequence."""

    @property
    def length(self) -> int:
        """Tokens of one slice."""
        return self.mask.shape[-1] // self.size


@dataclass(frozen=True)
class ShardedPass:
    """The inputs of a sequence-parallel padding-free pass, and where each rank's logits belong."""

    input_ids: torch.Tensor
    """`[1, N]`: the packed rows, padded to a multiple of the group's size (the model's input; the language
    model keeps its slice)."""
    position_ids: torch.Tensor
    """`[1, N]`, or `[4, 1, N]` (text positions, then M-RoPE's three rows), padded the same way."""
    keep: torch.Tensor
    """`[K]`: the positions of this rank's slice whose logits are kept (indices within the slice)."""
    pieces: list[int]
    """How many kept logits each rank of the group has, by rank."""
    shard: SequenceShard


def shard_packed(
    group: dist.ProcessGroup,
    input_ids: torch.Tensor,  # [1, N]
    position_ids: torch.Tensor,  # [1, N], or [4, 1, N] (text positions first)
    keep: torch.Tensor,  # [K] ascending: packed positions whose logits are needed
) -> ShardedPass:
    """Pad a packed sequence to a multiple of the group's size and say which of this rank's positions keep
    their logits. The padding (the last token repeated, which is never an image token) has positions 0, 1,
    ...: a packed row of its own, after every real token, so no real token attends to it."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    N = input_ids.shape[-1]
    pad = -N % size
    if pad:
        input_ids = torch.cat([input_ids, input_ids[:, -1:].expand(1, pad)], dim=1)
        fresh = torch.arange(pad, device=position_ids.device, dtype=position_ids.dtype)
        position_ids = torch.cat([position_ids, fresh.expand(*position_ids.shape[:-1], pad)], dim=-1)
    text = position_ids[0] if position_ids.dim() == 3 else position_ids  # [1, N + pad]
    length = (N + pad) // size
    pieces = torch.bincount(keep // length, minlength=size).tolist()
    mine = keep[(keep >= rank * length) & (keep < (rank + 1) * length)] - rank * length
    shard = SequenceShard(group, rank, size, packed_causal_mask(text[0]))
    return ShardedPass(input_ids, position_ids, mine, pieces, shard)


def packed_causal_mask(positions: torch.Tensor) -> torch.Tensor:
    """`[1, 1, N, N]` bool: token i attends to token j <= i of its own packed row. A row starts wherever the
    positions do not go up by one (as Hugging Face finds packed rows)."""
    N = positions.shape[0]
    starts = torch.ones(N, dtype=torch.bool, device=positions.device)
    starts[1:] = positions[1:] != positions[:-1] + 1
    row = starts.cumsum(0)
    same_row = row[:, None] == row[None, :]
    causal = torch.ones(N, N, dtype=torch.bool, device=positions.device).tril()
    return (same_row & causal)[None, None]


def shard_decoder_input(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Forward pre-hook of the language model (`install`): in a pass with a `sequence_shard`, its input ids
    or embeddings and its position ids are cut to the rank's slice; any other pass is left as it is."""
    shard = kwargs.get("sequence_shard")
    if shard is None:
        return None
    lo, hi = shard.rank * shard.length, (shard.rank + 1) * shard.length
    if args:  # input ids given by position (a token-classification head calls its model so)
        args = (args[0][:, lo:hi], *args[1:])
    for name in ("input_ids", "inputs_embeds"):
        if kwargs.get(name) is not None:
            kwargs[name] = kwargs[name][:, lo:hi]
    kwargs["position_ids"] = kwargs["position_ids"][..., lo:hi]
    return args, kwargs


def heads(config) -> tuple[int, int]:
    """The language model's attention heads and key/value heads (a vision-language config's `text_config`)."""
    text = getattr(config, "text_config", None) or config
    return text.num_attention_heads, getattr(text, "num_key_value_heads", None) or text.num_attention_heads


def install(model: torch.nn.Module) -> None:
    """Cut the language model's input to each rank's slice in passes with a `sequence_shard` (once per model)."""
    decoder = model.get_decoder()
    if not getattr(decoder, "_rlstack_sequence_hook", False):
        decoder.register_forward_pre_hook(shard_decoder_input, with_kwargs=True)
        decoder._rlstack_sequence_hook = True


def ulysses_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, T/size, D] (the whole T without a shard)
    key: torch.Tensor,  # [B, KV, T/size, D]
    value: torch.Tensor,  # [B, KV, T/size, D]
    attention_mask: torch.Tensor | None,
    sequence_shard: SequenceShard | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Hugging Face's attention-function signature; returns `[B, T/size, H, D]`. Without a `sequence_shard`:
    rlstack's SDPA attention. With one: each rank attends over the whole sequence with its `H/size` query
    heads and `KV/size` key/value heads (query heads `[r*H/size, (r+1)*H/size)` read key/value heads
    `[r*KV/size, ...)`, as grouped-query attention lays them out), under the whole sequence's mask (the one
    Hugging Face made for the slice is not used)."""
    if sequence_shard is None:
        return small_query_attention(module, query, key, value, attention_mask, **kwargs)
    group = sequence_shard.group
    q, k, v = (all_to_all(t, group, scatter_dim=1, gather_dim=2) for t in (query, key, value))
    out, _ = sdpa_attention_forward(module, q, k, v, sequence_shard.mask, **kwargs)  # [B, T, H/size, D]
    return all_to_all(out, group, scatter_dim=1, gather_dim=2), None


def all_to_all(x: torch.Tensor, group: dist.ProcessGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """`x` cut into the group's size along `scatter_dim`, piece r sent to rank r, and the pieces received
    joined along `gather_dim` in rank order (differentiable: the backward is the inverse exchange)."""
    return _AllToAll.apply(x, group, scatter_dim, gather_dim)


def _exchange(x: torch.Tensor, group: dist.ProcessGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    size = dist.get_world_size(group)
    send = torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()  # [size, ...]: piece r goes to rank r
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, scatter_dim, gather_dim):
        ctx.exchange = (group, scatter_dim, gather_dim)
        return _exchange(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        group, scatter_dim, gather_dim = ctx.exchange
        return _exchange(grad, group, gather_dim, scatter_dim), None, None, None


def gather_pieces(x: torch.Tensor, group: dist.ProcessGroup, pieces: list[int]) -> torch.Tensor:
    """Every rank's `x` (`[pieces[r], ...]` on rank r) joined in rank order, on every rank of the group.

    Differentiable for the case it serves: every rank computes the same function of the result (the loss of
    the rows the group holds), so the backward gives each rank the gradient of its own piece only (summing
    the ranks' identical gradients would count each `size` times)."""
    return _GatherPieces.apply(x, group, pieces)


class _GatherPieces(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, pieces):
        rank = dist.get_rank(group)
        most = max(max(pieces), 1)
        padded = x.new_zeros(most, *x.shape[1:])
        padded[: x.shape[0]] = x
        received = [torch.empty_like(padded) for _ in pieces]
        dist.all_gather(received, padded, group=group)
        ctx.piece = (sum(pieces[:rank]), pieces[rank])
        return torch.cat([r[:n] for r, n in zip(received, pieces)])

    @staticmethod
    def backward(ctx, grad):
        start, n = ctx.piece
        return grad[start : start + n], None, None


AttentionInterface.register(NAME, ulysses_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)
