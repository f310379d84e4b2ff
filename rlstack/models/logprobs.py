"""Per-token log-probabilities and entropies of a causal LM over a `[B, T]` batch.

Vision-language batches carry `[B, 3, T]` M-RoPE position ids and per-row images
(`pixel_values`, `image_grid_thw`: lists with one tensor per row, see `rlstack.models.vision`);
they take one plain forward pass, without prompt sharing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from rlstack.models.vision import as_model_positions, check_batch_image_tokens, multimodal_inputs


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[labels]. logits [B, T, V], labels [B, T] -> [B, T] (float32)."""
    logits = logits.float()
    return torch.gather(F.log_softmax(logits, dim=-1), -1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim. [B, T, V] -> [B, T]."""
    logits = logits.float()
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of `input_ids[b, t]` given `input_ids[b, <t]`, at `temperature`.

    Entropies carry a gradient only with `entropy_grad` (an entropy bonus in the loss).
    Returns `[B, T]` tensors, zero at and before the first column of `response_mask` that is not
    needed. See `response_logits` for how the forward pass is done.
    """
    logits, start = response_logits(
        model, input_ids, attention_mask, position_ids, response_mask, pixel_values, image_grid_thw
    )
    scaled = logits if temperature == 1.0 else logits / temperature
    return logprobs_from_response_logits(scaled, input_ids, start, with_entropy, entropy_grad)


def response_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # [B, T]
    attention_mask: torch.Tensor,  # [B, T]
    position_ids: torch.Tensor,  # [B, T], or [B, 3, T] (M-RoPE)
    response_mask: torch.Tensor,  # [B, T]
    pixel_values: list[torch.Tensor] | None = None,  # per row, [patches_b, patch_dim]
    image_grid_thw: list[torch.Tensor] | None = None,  # per row, [images_b, 3]
) -> tuple[torch.Tensor, int]:
    """Logits predicting the tokens at columns `start .. T-1` ([B, T-start, V]) and `start`, the first
    column with a sampled token; only these logits are materialised (`logits_to_keep`).

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
    images = {}
    if image_grid_thw is not None:
        check_batch_image_tokens(model, input_ids, image_grid_thw)
        images = multimodal_inputs(pixel_values, image_grid_thw, input_ids.device)
    if start < T and position_ids.dim() == 2 and not images:
        logits = _shared_prompt_logits(model, input_ids, attention_mask, position_ids, start)
    if logits is None:
        keep = T - start + 1  # logits at columns start-1 .. T-1 predict tokens start .. T
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=as_model_positions(position_ids),
            use_cache=False,
            logits_to_keep=keep,
            **images,
        )
        logits = out.logits[:, :-1, :]  # [B, T-start, V]
    return logits, start


def logprobs_from_response_logits(
    logits: torch.Tensor,  # [B, T-start, V], already divided by the temperature
    input_ids: torch.Tensor,  # [B, T]
    start: int,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`[B, T]` log-probs of `input_ids` (and entropies) from `response_logits`' output."""
    logp = to_full_width(logprobs_from_logits(logits, input_ids[:, start:]), input_ids.shape[1], start)
    if not with_entropy:
        return logp, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        ent = entropy_from_logits(logits)
    return logp, to_full_width(ent, input_ids.shape[1], start)


def to_full_width(values: torch.Tensor, width: int, start: int) -> torch.Tensor:
    """[B, width-start] -> [B, width], zeros before `start`."""
    full = values.new_zeros(values.shape[0], width)
    full[:, start:] = values
    return full


def _shared_prompt_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    start: int,
) -> torch.Tensor | None:
    """Logits at columns start-1 .. T-2 ([B, T-start, V]) computed with one prompt pass per run of
    rows with identical columns `:start`; None when no two neighbouring rows share them.

    A causal LM's keys/values at a column depend only on the columns up to it, so the prompt
    columns are run once per distinct prompt into a KV cache, which is expanded to every row
    of its run (`index_select`, so gradients of all rows flow back into the one prompt pass),
    and the response columns are run against it with their own position ids and the full
    `[B, T]` attention mask, exactly as a decoding step would. The logits of the last prompt
    column come from the prompt pass. With `n` samples per prompt this runs the prompt
    tokens once instead of `n` times in both the forward and the backward pass.
    """
    B, T = input_ids.shape
    training = model.training and torch.is_grad_enabled()
    if training and any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
        return None  # activation-checkpointed layers drop the cache in training
    prompt = (input_ids[:, :start], attention_mask[:, :start], position_ids[:, :start])
    starts = run_starts(*prompt)
    if bool(starts.all()):
        return None
    rows = starts.nonzero().squeeze(-1)  # first row of each run
    run_of_row = starts.long().cumsum(0) - 1  # [B] -> run index
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=prompt[0][rows],
        attention_mask=prompt[1][rows],
        position_ids=prompt[2][rows],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    if cache.get_seq_length() != start:
        return None  # the model did not fill the cache as expected: use the plain pass
    first = out.logits.index_select(0, run_of_row)  # [B, 1, V]: predicts column `start`
    if start == T - 1:
        return first
    cache.reorder_cache(run_of_row)  # index_select of every layer's keys/values: differentiable
    # Column T-1 predicts nothing, so the response pass stops before it.
    out = model(
        input_ids=input_ids[:, start : T - 1],
        attention_mask=attention_mask[:, : T - 1],
        position_ids=position_ids[:, start : T - 1],
        past_key_values=cache,
        use_cache=True,
    )
    return torch.cat([first, out.logits], dim=1)
