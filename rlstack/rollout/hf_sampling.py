"""Batched sampling with a Hugging Face module (`sample`, which `HFEngine` in `rollout/hf.py` calls):
prefill once per distinct prompt, then one decoding step per token; the token draws (seeded per row,
or from a generator) and the stop strings (`StopStrings`).

Decoding takes one step per generated token after the first (the prefill gives the first): for
Llama, Mistral, Qwen2, Qwen3 and the Qwen-VL families, the lean step of
`rlstack.models.decoding` over the module's parameters and the prefill's KV buffers; for any other
model, a call of its `forward`.
A row that has ended keeps attending normally (its tokens are padding, masked out of the result), as
transformers' `generate` does: masking ended rows in the attention mask sends every call onto a
slower attention path. With the lean step, once half the rows being decoded or more have ended, the
ended ones leave the decoding batch (the others' KV buffers are copied, the old ones freed), so that
the longest answers of a call do not decode with every row that finished before them.

Log-probs are under the temperature-scaled distribution before top-k / top-p truncation, which is
the distribution the policy scores (`logits / temperature`): at temperature 1 with no truncation
they equal a separate forward pass.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.generation.logits_process import LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper

from rlstack.errors import TrainingDiverged
from rlstack.models.decoding import lean_decoder
from rlstack.models.logprobs import run_starts
from rlstack.models.prefix import SharedPrefix
from rlstack.models.vision import (
    as_model_positions,
    check_batch_image_tokens,
    mrope_position_ids,
    multimodal_inputs,
    vision_token_ids,
)
from rlstack.rollout.hf_cache import _preallocated, _PreallocatedLayer

ENDED_SHARE_TO_LEAVE = 0.5
"""Share of the decoding batch's rows that have ended at which they leave it (lean step only; above 1:
never, every row decodes to the end of the call)."""


@dataclass
class KeptKV:
    """The keys and values a row's tokens left in the KV cache of a `sample` call (`keep`), for a later
    call whose prompt continues those tokens (a multi-turn trajectory's next turn): that call copies them
    into its cache and prefills only the tokens after them.

    `keys[l]` / `values[l]`: layer l's `[KV heads, len(token_ids), head dim]`. A `KeptKV` is used once:
    the call that reads it empties it layer by layer as it copies (the memory goes back at once).
    """

    token_ids: tuple[int, ...]
    """The tokens it holds: the row's prompt and its response but the last token (whose keys and
    values a call computes only when another step follows it, which the last step of a call does not)."""
    keys: list[torch.Tensor | None] = field(repr=False)
    values: list[torch.Tensor | None] = field(repr=False)

    def continued_by(self, prompt: Sequence[int]) -> bool:
        """`prompt` starts with its tokens and has at least one more, and it has not been used yet."""
        n = len(self.token_ids)
        return (
            n < len(prompt)
            and bool(self.keys)
            and self.keys[0] is not None
            and tuple(prompt[:n]) == self.token_ids
        )


@dataclass(frozen=True)
class _Continued:
    """The KV cache's layout when rows continue kept caches (`KeptKV`): columns `0 .. C-1` hold each row's
    kept keys and values right-aligned (C: the longest kept), then its new tokens right-aligned in the
    columns after (up to the longest run of new tokens), masked columns between. Positions come from the
    mask, so each row's tokens keep the positions they had when its kept part was computed."""

    kept: list[KeptKV | None]
    width: int
    """C: columns of kept keys and values."""

    @staticmethod
    def of(prompts: list[list[int]], kept: Sequence[KeptKV | None]) -> _Continued | None:
        """The layout, or None when no row continues a kept cache."""
        usable, seen = [], set()
        for p, k in zip(prompts, kept):  # a kept cache handed to two rows serves the first
            fits = k is not None and id(k) not in seen and k.continued_by(p)
            usable.append(k if fits else None)
            seen |= {id(k)} if fits else set()
        width = max((len(k.token_ids) for k in usable if k is not None), default=0)
        return _Continued(usable, width) if width else None

    def reused(self, row: int) -> int:
        k = self.kept[row]
        return 0 if k is None else len(k.token_ids)

    def columns(self, prompts: list[list[int]]) -> int:
        """Columns of the layout: C and the longest run of new tokens."""
        return self.width + max(len(p) - self.reused(i) for i, p in enumerate(prompts))

    def layout(
        self, prompts: list[list[int]], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token ids, mask and positions [B, columns] (the kept columns' ids are the kept tokens)."""
        C, width = self.width, self.columns(prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            c = self.reused(i)
            ids[i, C - c : C] = torch.tensor(p[:c], dtype=torch.long)
            mask[i, C - c : C] = 1
            ids[i, width - (len(p) - c) :] = torch.tensor(p[c:], dtype=torch.long)
            mask[i, width - (len(p) - c) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    def fill(self, cache: DynamicCache) -> None:
        """Write the kept keys and values into `cache`'s first C columns (zeros where a row has fewer: masked,
        but never uninitialised memory, whose NaNs a mask would not hide), layer by layer, emptying each
        `KeptKV` as it goes."""
        C, B = self.width, len(self.kept)
        first = next(k for k in self.kept if k is not None)
        for layer_index, layer in enumerate(cache.layers):
            k0, v0 = first.keys[layer_index], first.values[layer_index]
            keys = k0.new_zeros((B, k0.shape[0], C, k0.shape[-1]))
            values = v0.new_zeros((B, v0.shape[0], C, v0.shape[-1]))
            for i, k in enumerate(self.kept):
                if k is not None:
                    c = len(k.token_ids)
                    keys[i, :, C - c :] = k.keys[layer_index]
                    values[i, :, C - c :] = k.values[layer_index]
                    k.keys[layer_index] = k.values[layer_index] = None
            layer.update(keys, values)


def _cloned_out_of_inference_mode(fn):
    """Clone a function's tensor results, so that tensors made under `torch.inference_mode`
    can be used as inputs of a later backward pass (the update's). Other results (`kept`) pass as they are."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in fn(*args, **kwargs).items()}

    return wrapper


class StopStrings:
    """Ends a row once the text of its response (special tokens left out, as in `response_text`)
    contains one of `strings` (e.g. `</code>`, `</tool_call>`).

    A string is looked for in the decoded text of the row's last tokens: enough of them to give
    as many characters as the longest string has, so a check costs about the same at every step.
    The token that completes the string is kept whole (the response is not cut inside it), as
    vLLM's `stop` keeps the sampled token ids.
    """

    def __init__(self, tokenizer, strings: Sequence[str]):
        if not strings or any(not s for s in strings):
            raise ValueError(f"stop strings must be non-empty, got {list(strings)!r}")
        self.tokenizer = tokenizer
        self.strings = tuple(strings)
        self.window = max(len(s) for s in self.strings)

    def hit(self, tokens: list[torch.Tensor], active: torch.Tensor) -> torch.Tensor:
        """[B] bool: rows in `active` whose response so far (`tokens`: one [B] tensor per step) has a stop string."""
        hits = torch.zeros_like(active)
        rows = active.nonzero().flatten().tolist()
        n = self.window
        while rows:
            tail = torch.stack(tokens[-n:], dim=1)[rows].tolist()
            short = []
            for b, ids in zip(rows, tail):
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                if any(s in text for s in self.strings):
                    hits[b] = True
                elif len(text) < self.window and n < len(tokens):
                    short.append(b)  # special tokens in the tail: look further back
            rows, n = short, 2 * n
        return hits


@_cloned_out_of_inference_mode
@torch.inference_mode()  # no autograd bookkeeping at all while decoding
def sample(
    model: torch.nn.Module,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_token_id: int | Sequence[int],
    pad_token_id: int,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | None = None,
    pixel_values: list[torch.Tensor] | None = None,
    image_grid_thw: list[torch.Tensor] | None = None,
    stop: StopStrings | None = None,
    between_steps: Callable[[], None] | None = None,
    share_prefix: bool = True,
    kept: Sequence[KeptKV | None] | None = None,
    keep: Sequence[bool] | None = None,
) -> dict[str, torch.Tensor | list[KeptKV | None]]:
    """Sample one response per prompt. `temperature == 0` decodes greedily.

    Each token is drawn by inverting the row's cumulative distribution at a uniform random number:
    from `generator`, or with `seeds` ([B] int64, one per prompt) a number that depends only on the
    row's seed and the token's index (`_uniform`): a row then samples the same tokens whatever rows
    share the batch.

    A vision-language model's prompts come with their images: `pixel_values` and `image_grid_thw`,
    one tensor per prompt (empty for a prompt without images), as `encode_prompt` makes them.
    A row ends at EOS, or at a stop string with `stop`; an ended row gets padding, masked out.
    `between_steps` is called before every decoding step's forward pass (where in-flight weight
    updates land): its k-th call comes before the forward that gives token k.

    `share_prefix`: the tokens every prompt starts with (a system prompt, a worked example, a chat's
    earlier turns), when there are at least `rlstack.models.prefix.SHARED_PREFIX_MIN` of them, are prefilled once for the
    whole batch (`SharedPrefix`) instead of once per prompt (text-only models whose attention has no
    sliding window shorter than the call's sequences).

    `kept` (one per prompt, or None): the KV cache an earlier call kept for a prompt that continues it
    (`KeptKV`): its tokens are not prefilled again. `keep` (one bool per prompt): keep each such row's
    KV cache in `kept` of the result. Both apply where the cache is the lean one (text-only models whose
    attention has no sliding window shorter than the call's sequences); elsewhere every prompt is prefilled
    whole and nothing is kept.

    Returns `[B, P + R]` tensors (prompts left-padded to P, responses right-padded to the
    longest response R): input_ids, attention_mask, response_mask, rollout_logprobs; `truncated` [B]
    (neither EOS nor a stop string within `max_new_tokens`); `prefilled` (the prompt tokens the prefill
    computed, shared ones once) and `reused` (those read from `kept`), 0-d; with `keep`, `kept` ([B]
    `KeptKV`, None where not kept).
    """
    device = next(model.parameters()).device
    eos = torch.tensor(
        [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id),
        dtype=torch.long,
        device=device,
    )
    B, P = len(prompts), max(len(p) for p in prompts)
    prompt_ids = torch.full((B, P), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    for i, p in enumerate(prompts):
        prompt_ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        prompt_mask[i, P - len(p) :] = 1
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    multimodal = image_grid_thw is not None
    if multimodal:
        prompt_pos = mrope_position_ids(model, prompt_ids, prompt_mask, image_grid_thw)  # [B, 3, P]
        next_pos = prompt_pos.amax(dim=(1, 2)) + 1  # text after the prompt continues from its largest id
    else:
        prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]
        next_pos = prompt_pos[:, -1] + 1

    # A vision model must not write image / vision markers itself: the tokens would claim image
    # features that do not exist. They are never sampled (their log-probs still come from the model).
    banned = _vision_token_ids(model, device) if multimodal else None
    warpers = LogitsProcessorList()
    if top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p))

    # Rows come in runs of identical prompts (HFEngine repeats each prompt n times): prefill each
    # distinct prompt once, then copy its KV cache and next-token logits to every row of its run.
    # A row's cache and logits depend only on its own tokens (and images), so this samples what
    # prefilling every row would (the generator draws per row, as before).
    starts = run_starts(prompt_ids, prompt_mask)
    if multimodal:
        check_batch_image_tokens(model, prompt_ids, image_grid_thw)
        starts |= ~_same_images_as_previous(pixel_values, image_grid_thw, device)
    rows = starts.nonzero().squeeze(-1)
    picked = rows.tolist()
    images = (
        multimodal_inputs([pixel_values[r] for r in picked], [image_grid_thw[r] for r in picked], device)
        if multimodal
        else {}
    )
    continued = None if multimodal or kept is None else _Continued.of(prompts, kept)
    W = P if continued is None else continued.columns(prompts)  # the cache's columns before the response
    cache = _preallocated(DynamicCache(config=model.config), W + max_new_tokens)
    lean = all(isinstance(layer, _PreallocatedLayer) for layer in cache.layers)
    # The KV cache's layout: the prompts' own (left-padded, P columns); with a shared prefix its columns
    # first, then each prompt's rest right-aligned (the gap between them masked); with kept caches, their
    # columns first, then each row's new tokens right-aligned (`_Continued`). Only where no layer's window
    # slides (`lean`): a sliding window counts cache columns, gaps included, not positions.
    if not lean and continued is not None:  # a sliding window: every prompt is prefilled whole
        continued, W = None, P
        cache = _preallocated(DynamicCache(config=model.config), W + max_new_tokens)
        lean = all(isinstance(layer, _PreallocatedLayer) for layer in cache.layers)
    if continued is not None:  # rows continue different kept tokens: no two are prefilled as one
        starts = torch.ones(B, dtype=torch.bool, device=device)
        rows, picked = torch.arange(B, device=device), list(range(B))
    share = share_prefix and lean and not multimodal and continued is None
    shared = SharedPrefix.of([prompts[r] for r in picked]) if share else None
    if continued is not None:
        kv_ids, kv_mask, kv_pos = continued.layout(prompts, device)
    elif shared is not None:
        kv_ids, kv_mask, kv_pos = shared.layout(prompts, device)
    else:
        kv_ids, kv_mask, kv_pos = prompt_ids, prompt_mask, prompt_pos
    decoder = lean_decoder(model, W + max_new_tokens) if lean else None
    begin = 0
    reused = 0
    if continued is not None:
        continued.fill(cache)
        begin = continued.width
        reused = sum(continued.reused(i) for i in range(B))
    elif shared is not None:
        shared.prefill(model, cache, kv_ids, kv_mask, kv_pos, len(picked))
        begin = shared.length
    out = model(
        input_ids=kv_ids[rows, begin:],
        attention_mask=kv_mask[rows],
        position_ids=as_model_positions(kv_pos[rows, begin:]),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
        **images,
    )
    next_logits = out.logits[:, -1, :]
    prefilled = int(kv_mask[rows, begin:].sum()) + (shared.length if shared is not None else 0)
    if len(rows) < B:
        run_of_row = starts.long().cumsum(0) - 1
        cache.reorder_cache(run_of_row)
        next_logits = next_logits[run_of_row]
    tokens, logps = [], []
    done = torch.zeros(B, dtype=torch.bool, device=device)
    lengths = torch.zeros(B, dtype=torch.long, device=device)
    attn = kv_mask
    keep_rows = keep is not None and lean and not multimodal
    kept_out: list[KeptKV | None] = [None] * B
    live: torch.Tensor | None = None
    """Rows (of the B) still in the decoding batch, in its order; None: all of them (ended rows leave it
    once they are half of it or more)."""
    if lean:  # the KV buffers the prefill filled, and the prompt padding no row attends
        keys = [layer.key_buffer for layer in cache.layers]
        values = [layer.value_buffer for layer in cache.layers]
        blocked = torch.zeros(B, W + max_new_tokens, dtype=torch.bool, device=device)
        blocked[:, :W] = kv_mask == 0
    for step in range(max_new_tokens):
        logits = next_logits.float()  # [rows in the decoding batch, V]
        # A NaN or an infinity in a row makes the row's sum non-finite; so do finite logits past float32's range
        # when summed (near 1e33: a model that diverged)
        if not bool(logits.sum(-1).isfinite().all()):
            raise TrainingDiverged(
                "the policy produced non-finite logits while sampling; its weights have diverged"
            )
        if temperature > 0:
            scaled = logits / temperature if temperature != 1.0 else logits
            logp_all = torch.log_softmax(scaled, dim=-1)
            if warpers or banned is not None:
                warped = warpers(None, scaled)
                if banned is not None:
                    warped = warped.index_fill(1, banned, float("-inf"))  # not in place: it may be the logits
                probs = torch.softmax(warped, dim=-1)
            else:
                probs = logp_all.exp()  # the same distribution, without a second softmax
            # One uniform number per row, inverting the row's cumulative distribution: exact sampling,
            # and on CPU 4-8x faster than `torch.multinomial`, whose exponential draws over the whole
            # vocabulary cost 48 ms per step for 16 rows of a 152k vocabulary (12-13 ms this way;
            # bench/bench_cpu_paths.py).
            # (B numbers drawn from the generator whatever rows decode: the same stream for every row)
            u = _uniform(seeds.to(device), step) if seeds is not None else _draw(B, generator, device)
            tok = _inverse_cdf(probs, u if live is None else u[live])
        else:
            logp_all = torch.log_softmax(logits, dim=-1)
            choice = logits if banned is None else logits.index_fill(1, banned, float("-inf"))
            tok = choice.argmax(-1)
        logp = logp_all.gather(-1, tok[:, None]).squeeze(-1)
        if live is not None:  # back to all B rows; the rows that left have ended (padding)
            tok = torch.full((B,), pad_token_id, dtype=tok.dtype, device=device).index_copy(0, live, tok)
            logp = torch.zeros(B, dtype=logp.dtype, device=device).index_copy(0, live, logp)
        tok = torch.where(done, torch.full_like(tok, pad_token_id), tok)
        tokens.append(tok)
        logps.append(logp)
        newly_valid = ~done
        lengths += newly_valid.long()
        ended = torch.isin(tok, eos)
        if stop is not None:
            ended |= stop.hit(tokens, newly_valid & ~ended)
        done = done | ended
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        pos = next_pos + step  # [B]: the same id in all three M-RoPE dims
        if between_steps is not None:
            between_steps()
        if decoder is not None:
            ended_in_batch = done if live is None else done[live]
            # fewer than all: a call whose rows all ended stopped above
            ended_count = int(ended_in_batch.sum())
            if ended_count and ended_count >= ENDED_SHARE_TO_LEAVE * len(ended_in_batch):
                members = torch.arange(B, device=device) if live is None else live
                for j in ended_in_batch.nonzero().flatten().tolist():
                    i = int(members[j])
                    if keep_rows and keep[i]:
                        kept_out[i] = _kept_row(keys, values, j, prompts[i], tokens, i, lengths, kv_mask, W)
                stay = (~ended_in_batch).nonzero().flatten()
                keys = [k.index_select(0, stay) for k in keys]
                values = [v.index_select(0, stay) for v in values]
                blocked, live = blocked.index_select(0, stay), members[stay]
                for layer, k, v in zip(cache.layers, keys, values):  # the full buffers go back now
                    layer.key_buffer, layer.value_buffer = k, v
                    layer.keys, layer.values = k[:, :, : layer.length], v[:, :, : layer.length]
            rows_now = slice(None) if live is None else live
            next_logits = decoder.step(tok[rows_now], pos[rows_now], keys, values, W + step, blocked)
            continue
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=-1)
        out = model(
            input_ids=tok[:, None],
            attention_mask=attn,
            position_ids=pos[None, :, None].expand(3, B, 1) if multimodal else pos[:, None],
            past_key_values=cache,
            use_cache=True,
        )
        next_logits = out.logits[:, -1, :]

    resp = torch.stack(tokens, dim=1)  # [B, R]
    resp_logp = torch.stack(logps, dim=1)
    # A row's response is its tokens up to and including the one that ended it.
    valid = torch.arange(resp.shape[1], device=device)[None, :] < lengths[:, None]
    resp_mask = valid.long()

    zeros = torch.zeros_like(prompt_ids)
    if keep_rows:
        if decoder is None:  # the model's own forward wrote the cache's buffers (reordered by the prefill)
            keys = [layer.key_buffer for layer in cache.layers]
            values = [layer.value_buffer for layer in cache.layers]
        members = list(range(B)) if live is None else live.tolist()
        for j, i in enumerate(members):
            if keep[i]:
                kept_out[i] = _kept_row(keys, values, j, prompts[i], tokens, i, lengths, kv_mask, W)
    return ({"kept": kept_out} if keep is not None else {}) | {
        "input_ids": torch.cat([prompt_ids, torch.where(valid, resp, pad_token_id)], dim=1),
        "attention_mask": torch.cat([prompt_mask, resp_mask], dim=1),
        "response_mask": torch.cat([zeros, resp_mask], dim=1),
        "rollout_logprobs": torch.cat([zeros.float(), resp_logp * resp_mask], dim=1),
        "truncated": ~done,
        "prefilled": torch.tensor(prefilled),
        "reused": torch.tensor(reused),
    }


def _kept_row(
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    j: int,
    prompt: list[int],
    tokens: list[torch.Tensor],
    row: int,
    lengths: torch.Tensor,
    kv_mask: torch.Tensor,
    width: int,
) -> KeptKV:
    """Row `row`'s keys and values (at index `j` of the decoding batch's buffers), compacted: its prompt's
    columns of the layout, then its response's but the last token's (decoding computes a token's keys and
    values in the step after it is drawn)."""
    n = int(lengths[row]) - 1
    columns = torch.cat(
        [kv_mask[row].nonzero().flatten(), torch.arange(width, width + n, device=kv_mask.device)]
    )
    return KeptKV(
        tuple(prompt) + tuple(int(t[row]) for t in tokens[:n]),
        [k[j].index_select(1, columns) for k in keys],
        [v[j].index_select(1, columns) for v in values],
    )


def _srl(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 values."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN, _M1, _M2 = (_signed(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _uniform(seeds: torch.Tensor, index: int) -> torch.Tensor:
    """[B] float64 in [0, 1): splitmix64 of (row seed, token index), in int64 arithmetic (which wraps)."""
    z = seeds + torch.full_like(seeds, index + 1) * _GOLDEN
    z = (z ^ _srl(z, 30)) * _M1
    z = (z ^ _srl(z, 27)) * _M2
    z = z ^ _srl(z, 31)
    return _srl(z, 11).double() * 2.0**-53


def _draw(B: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """[B] float64 uniform numbers in [0, 1) from `generator` (a CPU generator), on `device`."""
    return torch.rand(B, generator=generator, dtype=torch.float64).to(device)


CDF_BLOCK = 1024
"""Tokens per block of `_inverse_cdf`: a vocabulary of more is searched block by block."""


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[B] token ids drawn from `probs` [B, V] with one uniform number per row: the first token whose
    cumulative probability exceeds u times the row's total (a token of probability 0 is never drawn).

    A vocabulary of more than `CDF_BLOCK` tokens is searched in two levels: the blocks' sums (in float32)
    and their cumulative sum find the block, whose own cumulative sum (float64) finds the token. A full
    float64 cumulative sum of every row (25 MB a step for 64 rows of a 49k vocabulary, a new allocation each
    step) took 5-10 ms of a 190 ms decoding step on a 2-core CPU, this about 1 ms. The blocks' sums round to
    float32: a draw moves only where its uniform number falls within about 1e-6 of a token's boundary."""
    B, V = probs.shape
    if V <= CDF_BLOCK:
        cdf = probs.double().cumsum(-1)
        return _first_above(cdf, u * cdf[:, -1], probs)
    whole = V // CDF_BLOCK * CDF_BLOCK
    sums = probs[:, :whole].reshape(B, -1, CDF_BLOCK).sum(-1)
    if whole < V:
        sums = torch.cat([sums, probs[:, whole:].sum(-1, keepdim=True)], dim=1)
    ends = sums.double().cumsum(-1)  # [B, blocks]: the cumulative probability at each block's end
    target = u * ends[:, -1]
    block = _first_above(ends, target, sums)
    before = torch.where(block > 0, ends.gather(1, (block - 1).clamp(min=0)[:, None]).squeeze(1), 0.0)
    index = block[:, None] * CDF_BLOCK + torch.arange(CDF_BLOCK, device=probs.device)
    chosen = probs.gather(1, index.clamp(max=V - 1)).masked_fill_(index >= V, 0.0)  # [B, CDF_BLOCK]
    return block * CDF_BLOCK + _first_above(chosen.double().cumsum(-1) + before[:, None], target, chosen)


def _first_above(cdf: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[B]: the first column of `cdf` [B, n] (the cumulative sum of `weights` [B, n]) above `target` [B]; where
    rounding leaves none above it, the last column of nonzero weight (never one of weight 0)."""
    found = torch.searchsorted(cdf, target[:, None], right=True).squeeze(-1)
    last = ((weights > 0) * torch.arange(1, weights.shape[-1] + 1, device=weights.device)).argmax(-1)
    return torch.minimum(found, last)


def _vision_token_ids(model: torch.nn.Module, device: torch.device) -> torch.Tensor | None:
    """Ids of the image / video / vision start and end tokens of a Qwen-VL config."""
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = vision_token_ids(lambda key: getattr(model.config, key, None), vocab)
    return torch.tensor(ids, dtype=torch.long, device=device) if ids else None


def _same_images_as_previous(
    pixel_values: list[torch.Tensor], image_grid_thw: list[torch.Tensor], device: torch.device
) -> torch.Tensor:
    """[B] bool: row b has the same images as row b-1 (False for row 0)."""
    same = [False] + [
        (pixel_values[b] is pixel_values[b - 1] and image_grid_thw[b] is image_grid_thw[b - 1])
        or (
            torch.equal(image_grid_thw[b], image_grid_thw[b - 1])
            and torch.equal(pixel_values[b], pixel_values[b - 1])
        )
        for b in range(1, len(image_grid_thw))
    ]
    return torch.tensor(same, device=device)
