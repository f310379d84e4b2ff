"""Per-token log-probabilities and entropies of a causal LM over a `[B, T]` batch.

Vision-language batches carry `[B, 3, T]` M-RoPE position ids and per-row images
(`pixel_values`, `image_grid_thw`: lists with one tensor per row, see `rlstack.models.vision`);
they take one plain forward pass, without prompt sharing.

Two layouts give the same log-probs: padded (`response_logits`, the reference: every row of the
batch at full width, prompts shared between neighbouring rows) and padding-free
(`packed_response_logits`: rows laid end to end without their padding).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from rlstack.models import ulysses
from rlstack.models.prefix import SharedPrefix
from rlstack.models.vision import as_model_positions, check_batch_image_tokens, multimodal_inputs
from rlstack.models.vocab import token_logprobs


def first_scored_column(response_mask: torch.Tensor) -> int:
    """First column where any row has a sampled token; the model needs logits from the column before it."""
    cols = response_mask.any(dim=0).nonzero()
    return int(cols[0]) if len(cols) else response_mask.shape[1]


def run_starts(*columns: torch.Tensor) -> torch.Tensor:
    """[B] bool: True where a row differs from the previous row in any of `columns` ([B, ...] tensors).

    Row 0 always starts a run; `run_starts(...).cumsum(0) - 1` maps each row to its run.
    """
    B = columns[0].shape[0]
    starts = torch.ones(B, dtype=torch.bool, device=columns[0].device)
    if B > 1:
        same = torch.ones(B - 1, dtype=torch.bool, device=starts.device)
        for c in columns:
            same &= (c[1:] == c[:-1]).reshape(B - 1, -1).all(-1)
        starts[1:] = ~same
    return starts


def forward_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # [B, T]
    attention_mask: torch.Tensor,  # [B, T]
    position_ids: torch.Tensor,  # [B, T], or [B, 3, T] (M-RoPE)
    response_mask: torch.Tensor,  # [B, T]
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    pixel_values: list[torch.Tensor] | None = None,  # per row, [patches_b, patch_dim]
    image_grid_thw: list[torch.Tensor] | None = None,  # per row, [images_b, 3]
    padding_free: bool = False,
    sequence_group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of `input_ids[b, t]` given `input_ids[b, <t]`, at `temperature`.

    Entropies carry a gradient only with `entropy_grad` (an entropy bonus in the loss).
    Returns `[B, T]` tensors. Padded (default): zero at and before the first column of
    `response_mask` that is not needed, see `response_logits`. `padding_free`: zero wherever
    `response_mask` is 0, see `packed_response_logits` (which `sequence_group` splits across its ranks).
    """
    inputs = (model, input_ids, attention_mask, position_ids, response_mask, pixel_values, image_grid_thw)
    if padding_free:
        scored = packed_response_logits(*inputs, sequence_group=sequence_group)
    else:
        scored = response_logits(*inputs)
    return scored.scaled(temperature).logprobs(with_entropy, entropy_grad)


@dataclass
class ResponseLogits:
    """Logits of the tokens a batch scores, and where they belong in its `[B, T]` layout."""

    logits: torch.Tensor
    """`[B, T-start, V]` (padded: every column from the first scored one) or `[N, V]` (padding-free:
    one row per response token)."""
    labels: torch.Tensor
    """The token each logit predicts: `logits.shape[:-1]`."""
    start: int | None
    """Padded layout: the first column the logits predict. None for the padding-free layout."""
    index: tuple[torch.Tensor, torch.Tensor] | None
    """Padding-free layout: the (row, column) of the token each logit predicts."""
    shape: tuple[int, int]
    """`(B, T)` of the batch."""
    pieces: tuple[dist.ProcessGroup, list[int]] | None = None
    """Sequence parallelism: the group whose ranks hold the logits (each those of its slice of the packed
    sequence), and how many each holds; per-logit values are gathered from all of them."""

    temperature: float = 1.0
    """The sampling temperature the logits are divided by (in `logprobs`, and by `tempered`)."""

    def scaled(self, temperature: float) -> ResponseLogits:
        """These logits at a sampling temperature: `logprobs` and `tempered` divide by it, `logits` stays raw."""
        return replace(self, temperature=self.temperature * temperature)

    def tempered(self) -> torch.Tensor:
        """The logits divided by the temperature."""
        return self.logits if self.temperature == 1.0 else self.logits / self.temperature

    def to_full(self, values: torch.Tensor) -> torch.Tensor:
        """Per-logit values (`labels`' shape) -> `[B, T]`, zeros where nothing is scored. With sequence
        parallelism, every rank's values of the group (`pieces`) on every rank."""
        if self.pieces is not None:
            values = ulysses.gather_pieces(values, *self.pieces)
        if self.index is None:
            return to_full_width(values, self.shape[1], self.start)
        full = values.new_zeros(self.shape)
        return full.index_put(self.index, values)

    def logprobs(
        self, with_entropy: bool = False, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`[B, T]` log-probs of the labels (and entropies, with a gradient only with `entropy_grad`), through
        the vocabulary a block of positions at a time (`rlstack.models.vocab.token_logprobs`)."""
        logp, ent = token_logprobs(self.logits, self.labels, self.temperature, with_entropy, entropy_grad)
        return self.to_full(logp), (self.to_full(ent) if with_entropy else None)


def response_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # [B, T]
    attention_mask: torch.Tensor,  # [B, T]
    position_ids: torch.Tensor,  # [B, T], or [B, 3, T] (M-RoPE)
    response_mask: torch.Tensor,  # [B, T]
    pixel_values: list[torch.Tensor] | None = None,  # per row, [patches_b, patch_dim]
    image_grid_thw: list[torch.Tensor] | None = None,  # per row, [images_b, 3]
) -> ResponseLogits:
    """Logits predicting the tokens at columns `start .. T-1` (`[B, T-start, V]`), `start` being the
    first column with a sampled token; only these logits are materialised (`logits_to_keep`).

    Consecutive rows with the same prompt (every column before the first response column, as
    `n` samples of one prompt are laid out) share one forward pass of it: see
    `_shared_prompt_logits`. The result, and its gradients, are those of one plain forward pass
    over the whole batch, up to float rounding. Batches with M-RoPE positions (vision-language
    models) take the plain pass, with the rows' images; every row's image tokens are checked
    against its images first.
    """
    T = input_ids.shape[1]
    start = max(first_scored_column(response_mask), 1)
    logits = None
    images = _images(model, input_ids, pixel_values, image_grid_thw)
    share = 1 < start < T and position_ids.dim() == 2 and not images  # a prompt of 2 columns or more
    several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if several:
        # FSDP2 runs collectives in every forward pass: all ranks must make as many passes, so they share
        # prompts together (each in two passes, with or without neighbours to share with) or not at all.
        share = _on_every_rank(share and start < T - 1, input_ids.device)
    if share:
        logits = _shared_prompt_logits(model, input_ids, attention_mask, position_ids, start, always=several)
    if logits is None:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=as_model_positions(position_ids),
            use_cache=False,
            # the logits at columns start-1 .. T-2 predict tokens start .. T-1: [B, T-start, V], contiguous
            logits_to_keep=torch.arange(start - 1, T - 1, device=input_ids.device),
            **images,
        )
        logits = out.logits
    return ResponseLogits(logits, input_ids[:, start:], start, None, tuple(input_ids.shape))


def packed_response_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # [B, T]
    attention_mask: torch.Tensor,  # [B, T]
    position_ids: torch.Tensor,  # [B, T], or [B, 3, T] (M-RoPE)
    response_mask: torch.Tensor,  # [B, T]
    pixel_values: list[torch.Tensor] | None = None,  # per row, [patches_b, patch_dim]
    image_grid_thw: list[torch.Tensor] | None = None,  # per row, [images_b, 3]
    sequence_group: dist.ProcessGroup | None = None,
) -> ResponseLogits:
    """Logits of the response tokens (`[N, V]`, one per token with `response_mask`) from one forward
    pass over the rows packed into a single sequence, padding removed (veRL's `use_remove_padding`).

    The attended tokens of every row are laid end to end (`[1, sum of lengths]`) with each row's own
    position ids, and neither attention mask nor cache: the model then attends within each row only
    (Hugging Face finds the rows where the position ids restart: a block-diagonal causal mask for SDPA and eager
    attention, variable-length kernels for FlashAttention). M-RoPE models get their three position
    rows with the text positions in front (`[4, 1, N]`, the layout Qwen-VL models read packed rows
    from); the images are the rows' images in row order, as in the padded pass. Only the logits of
    the positions before a response token are computed (`logits_to_keep` as indices).

    `sequence_group` (sequence parallelism, `rlstack.models.ulysses`; every rank of the group has the same
    rows): each rank runs its slice of the packed sequence through the language model and holds the logits
    of the response tokens in it (`[N_rank, V]`); `to_full` gathers per-logit values from the group.
    """
    B, T = input_ids.shape
    attended = attention_mask.bool()
    scored = response_mask.bool() & attended
    images = _images(model, input_ids, pixel_values, image_grid_thw)
    offsets = attended.long().flatten().cumsum(0).view(B, T) - 1  # packed index of each attended token
    text_positions = attention_mask.long().cumsum(-1) - 1
    if bool((scored & (text_positions == 0)).any()):
        raise ValueError("a row's first attended token is marked as a response token: nothing predicts it")
    packed_ids = input_ids[attended][None]
    if position_ids.dim() == 3:  # [B, 3, T] -> [4, 1, N]: text positions, then M-RoPE's three rows
        rope = position_ids.permute(1, 0, 2)[:, attended]
        packed_positions = torch.cat([text_positions[attended][None], rope])[:, None, :]
    else:
        packed_positions = position_ids[attended][None]
    index = scored.nonzero(as_tuple=True)
    keep = offsets[index] - 1  # the logits at the token before each response token predict it
    labels = input_ids[index]
    pieces, split = None, {}
    if sequence_group is not None and dist.get_world_size(sequence_group) > 1:
        ulysses.install(model)
        sp = ulysses.shard_packed(sequence_group, packed_ids, packed_positions, keep)
        packed_ids, packed_positions, keep = sp.input_ids, sp.position_ids, sp.keep
        start = sum(sp.pieces[: sp.shard.rank])
        labels = labels[start : start + len(keep)]
        pieces, split = (sequence_group, sp.pieces), {"sequence_shard": sp.shard}
    out = model(
        input_ids=packed_ids,
        attention_mask=None,
        position_ids=packed_positions,
        use_cache=False,
        logits_to_keep=keep,
        **images,
        **split,
    )
    return ResponseLogits(out.logits[0], labels, None, index, (B, T), pieces)


def _images(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    pixel_values: list[torch.Tensor] | None,
    image_grid_thw: list[torch.Tensor] | None,
) -> dict[str, torch.Tensor]:
    """The rows' images as forward kwargs, after checking every row's image tokens against them."""
    if image_grid_thw is None:
        return {}
    check_batch_image_tokens(model, input_ids, image_grid_thw)
    return multimodal_inputs(pixel_values, image_grid_thw, input_ids.device)


def to_full_width(values: torch.Tensor, width: int, start: int) -> torch.Tensor:
    """[B, width-start] -> [B, width], zeros before `start`."""
    full = values.new_zeros(values.shape[0], width)
    full[:, start:] = values
    return full


def _on_every_rank(flag: bool, device: torch.device) -> bool:
    """Whether `flag` holds on every rank of the process group (a collective: every rank calls it)."""
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _shared_prompt_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    start: int,
    always: bool = False,
) -> torch.Tensor | None:
    """Logits at columns start-1 .. T-2 ([B, T-start, V], contiguous) computed with one prompt pass per
    run of rows with identical columns `:start`; None when no two neighbouring rows share them, nor the
    prompts a prefix.

    A causal LM's keys/values at a column depend only on the columns up to it, so the prompt
    columns but the last are run once per distinct prompt into a KV cache, which is expanded to every
    row of its run (`index_select`, so gradients of all rows flow back into the one prompt pass),
    and the columns from the prompts' last one are run against it with their own position ids and the
    full attention mask, exactly as decoding steps would: all the logits come from that one pass, in
    one tensor. With `n` samples per prompt this runs the prompt tokens once instead of `n` times in both
    the forward and the backward pass.

    Where the distinct prompts themselves start with the same tokens (a system prompt, a worked example:
    `SharedPrefix`, at least `SHARED_PREFIX_MIN` of them), those run once for the whole batch, in a pass of
    their own before the prompts' other tokens, in sampling's cache layout (the prefix first, each prompt's
    rest right-aligned after it): the same logits and gradients up to float rounding. Only where every
    layer attends to the whole sequence (a sliding window counts cache columns, gap included; a linear
    attention or state-space layer would read the gap), not with several ranks (`always`: they make the same
    passes) and not under FSDP2 (its backward needs the logits of every pass in the loss: there the prompt
    pass also runs the prompts' last column, and its logits are joined to the others').

    `always`: the two passes even where no rows share a prompt (every rank of a sharded model makes the
    same passes).
    """
    B, T = input_ids.shape
    training = model.training and torch.is_grad_enabled()
    if training and any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
        return None  # activation-checkpointed layers drop the cache in training
    prompt = (input_ids[:, :start], attention_mask[:, :start], position_ids[:, :start])
    starts = run_starts(*prompt)
    rows = starts.nonzero().squeeze(-1)  # first row of each run
    run_of_row = starts.long().cumsum(0) - 1  # [B] -> run index
    cache = DynamicCache(config=model.config)
    ids, mask, pos = (c[rows] for c in prompt)
    # FSDP2 gathers a layer's parameters for its backward when gradients reach the layer's output, and the last
    # layer of a pass whose logits are dropped hands its keys and values to the cache only: under it no prefix
    # pass, and the prompt pass runs to the prompts' end and gives the first logits (the others joined to them).
    sharded = _fsdp(model)
    found = None if always or sharded else _shared_prefix(ids, mask, pos, cache, T)
    if bool(starts.all()) and found is None and not always:
        return None
    begin = 0
    if found is not None:
        shared, distinct = found
        ids, mask, pos = shared.layout(distinct, input_ids.device, width=start)
        mask = mask.to(attention_mask.dtype)
        shared.prefill(model, cache, ids, mask, pos, len(rows))
        begin = shared.length
    last = start if sharded else start - 1  # where the response pass starts
    first = None
    if last > begin:
        out = model(
            input_ids=ids[:, begin:last],
            attention_mask=mask[:, :last],
            position_ids=pos[:, begin:last],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        first = out.logits.index_select(0, run_of_row) if sharded else None  # [B, 1, V]: predicts `start`
    if cache.get_seq_length() != last:
        return None  # the model did not fill the cache as expected: use the plain pass
    if last == T - 1:
        return first
    cache.reorder_cache(run_of_row)  # index_select of every layer's keys/values: differentiable
    # Up to column T-2: column T-1 predicts nothing.
    out = model(
        input_ids=input_ids[:, last : T - 1],
        attention_mask=torch.cat(
            [mask[:, :last].index_select(0, run_of_row), attention_mask[:, last : T - 1]], dim=1
        ),
        position_ids=position_ids[:, last : T - 1],
        past_key_values=cache,
        use_cache=True,
    )
    return out.logits if first is None else torch.cat([first, out.logits], dim=1)


def _fsdp(model: torch.nn.Module) -> bool:
    """Whether FSDP2 shards any of `model`'s modules."""
    return any(isinstance(m, FSDPModule) for m in model.modules())


def _shared_prefix(
    ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache, width: int
) -> tuple[SharedPrefix, list[list[int]]] | None:
    """The prefix the distinct prompts `ids` ([R, start], left-padded by `mask`, at text `positions`) share,
    where running it once gives the same result: each prompt one run of attended columns ending at column
    `start - 1` with positions counting from 0, and every cache layer one of full attention (or of a sliding
    window no shorter than `width` columns): a masked gap is left padding to attention only; with the
    prompts' attended tokens."""
    if len(ids) < 2:
        return None
    if not all(
        type(layer) is DynamicLayer
        or (type(layer) is DynamicSlidingWindowLayer and layer.sliding_window >= width)
        for layer in cache.layers
    ):
        return None  # a window that slides, or a layer of another kind (linear attention, a state space)
    attended = mask.bool()
    left_padded = bool((attended[:, 1:] >= attended[:, :-1]).all() & attended[:, -1].all())
    counted = attended.long().cumsum(-1) - 1
    if not left_padded or not bool(((positions == counted) | ~attended).all()):
        return None
    distinct = [row[m].tolist() for row, m in zip(ids, attended)]
    shared = SharedPrefix.of(distinct)
    return None if shared is None else (shared, distinct)
