"""Batched sampling with Hugging Face transformers models (the embedded default engine).

The engine shares the actor's model object (colocated, so weights never need syncing), keeps a
KV cache across decode steps, and samples with a seeded `torch.Generator` whose state is saved
in checkpoints. Temperature, top-k and top-p use transformers' logits warpers. Neighbouring rows
with the same prompt (the `n` samples of a prompt) are prefilled once and share its KV cache.

`rollout_logprobs` are log-probabilities under the temperature-scaled distribution before top-k
/ top-p truncation, which is the distribution the actor scores (`logits / temperature`): at
temperature 1 with no truncation they equal a separate forward pass.
"""

from __future__ import annotations

import functools

import torch
from transformers import DynamicCache
from transformers.generation.logits_process import LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper

from rlstack.batch import Batch
from rlstack.errors import TrainingDiverged
from rlstack.models.logprobs import run_starts


def _cloned_out_of_inference_mode(fn):
    """Clone a function's tensor results, so that tensors made under `torch.inference_mode`
    can be used as inputs of a later backward pass (the update's)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return {k: v.clone() for k, v in fn(*args, **kwargs).items()}

    return wrapper


@_cloned_out_of_inference_mode
@torch.inference_mode()  # no autograd bookkeeping at all while decoding
def sample(
    model: torch.nn.Module,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """Sample one response per prompt. `temperature == 0` decodes greedily.

    Returns `[B, P + R]` tensors (prompts left-padded to P, responses right-padded to the
    longest response R): input_ids, attention_mask, position_ids, response_mask,
    rollout_logprobs; and `truncated` [B] (no EOS within `max_new_tokens`).
    """
    device = next(model.parameters()).device
    B, P = len(prompts), max(len(p) for p in prompts)
    prompt_ids = torch.full((B, P), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    for i, p in enumerate(prompts):
        prompt_ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        prompt_mask[i, P - len(p) :] = 1
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)

    warpers = LogitsProcessorList()
    if top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p))

    # Rows come in runs of identical prompts (HFEngine repeats each prompt n times): prefill each
    # distinct prompt once, then copy its KV cache and next-token logits to every row of its run.
    # A row's cache and logits depend only on its own tokens, so this samples what prefilling
    # every row would (the generator draws per row, as before).
    starts = run_starts(prompt_ids, prompt_mask)
    rows = starts.nonzero().squeeze(-1)
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=prompt_ids[rows],
        attention_mask=prompt_mask[rows],
        position_ids=prompt_pos[rows],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    next_logits = out.logits[:, -1, :]
    if len(rows) < B:
        run_of_row = starts.long().cumsum(0) - 1
        cache.reorder_cache(run_of_row)
        next_logits = next_logits[run_of_row]
    tokens, logps = [], []
    done = torch.zeros(B, dtype=torch.bool, device=device)
    attn = prompt_mask
    pos = prompt_pos[:, -1:]
    for _ in range(max_new_tokens):
        logits = next_logits.float()  # [B, V]
        if not bool(torch.isfinite(logits).all()):
            raise TrainingDiverged(
                "the policy produced non-finite logits while sampling; its weights have diverged"
            )
        if temperature > 0:
            scaled = logits / temperature
            logp_all = torch.log_softmax(scaled, dim=-1)
            probs = torch.softmax(warpers(None, scaled), dim=-1)
            tok = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(device)
        else:
            logp_all = torch.log_softmax(logits, dim=-1)
            tok = logits.argmax(-1)
        tok = torch.where(done, torch.full_like(tok, pad_token_id), tok)
        tokens.append(tok)
        logps.append(logp_all.gather(-1, tok[:, None]).squeeze(-1))
        newly_valid = ~done
        done = done | (tok == eos_token_id)
        if bool(done.all()):
            break
        attn = torch.cat([attn, newly_valid[:, None].long()], dim=-1)
        pos = pos + 1
        out = model(
            input_ids=tok[:, None],
            attention_mask=attn,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
        )
        next_logits = out.logits[:, -1, :]

    resp = torch.stack(tokens, dim=1)  # [B, R]
    resp_logp = torch.stack(logps, dim=1)
    # A token is part of the response if no EOS came before it.
    eos_seen = (resp == eos_token_id).long().cumsum(-1)
    valid = (eos_seen - (resp == eos_token_id).long()) == 0  # up to and including the first EOS
    resp_mask = valid.long()
    truncated = ~(resp == eos_token_id).any(-1)

    input_ids = torch.cat([prompt_ids, torch.where(valid, resp, pad_token_id)], dim=1)
    attention_mask = torch.cat([prompt_mask, resp_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    zeros = torch.zeros_like(prompt_ids)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": torch.cat([zeros, resp_mask], dim=1),
        "rollout_logprobs": torch.cat([zeros.float(), resp_logp * resp_mask], dim=1),
        "truncated": truncated,
    }


class HFEngine:
    """Generates `n` responses per prompt row of a Batch with the given model."""

    def __init__(self, model: torch.nn.Module, tokenizer, max_response_length: int, seed: int):
        self.model = model
        self.tokenizer = tokenizer
        self.max_response_length = max_response_length
        self.generator = torch.Generator().manual_seed(seed)

    def generate(
        self,
        prompts: Batch,
        n: int,
        temperature: float,
        top_p: float,
        top_k: int,
        chunk_size: int | None = None,
    ) -> Batch:
        """Rows of `prompts` (with `prompt_ids`) repeated `n` times, each with a sampled response."""
        batch = prompts.repeat_interleave(n)
        was_training = self.model.training
        self.model.eval()
        parts = []
        for piece in batch.split(chunk_size or len(batch)):
            cols = sample(
                self.model,
                piece["prompt_ids"],
                max_new_tokens=self.max_response_length,
                eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                generator=self.generator,
            )
            parts.append(piece.update(cols))
        self.model.train(was_training)
        out = Batch.concat(parts, pad_values={"input_ids": self.tokenizer.pad_token_id})
        out["response_text"] = self.decode_responses(out)
        out["end_reason"] = ["over_length" if t else "done" for t in out["truncated"].tolist()]
        out.meta["temperature"] = temperature if temperature > 0 else 1.0
        return out

    def decode_responses(self, batch: Batch) -> list[str]:
        ids, mask = batch["input_ids"], batch["response_mask"].bool()
        return self.tokenizer.batch_decode(
            [row[m].tolist() for row, m in zip(ids, mask)], skip_special_tokens=True
        )

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
