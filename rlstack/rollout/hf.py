"""The embedded default engine: batched sampling with the policy's own Hugging Face module.

`HFEngine` samples from the module it is given (the policy's, colocated: no weights to sync), keeps
a KV cache across decode steps, and draws with a seeded `torch.Generator` whose state is saved in
checkpoints. Temperature, top-k and top-p use transformers' logits warpers. Neighbouring requests
with the same prompt (the `n` samples of a prompt; for a vision-language model, the same images
too) are prefilled once and share its KV cache; the tokens every prompt of a call starts with (a
system prompt, a worked example; `worker.rollout.enable_prefix_caching`) are prefilled once for the
whole call. Between calls it keeps what a multi-turn trajectory asks for (`Request.keep`): each such
completion's keys and values (prompt and response but its last token, in `Completion.cache`, compacted
to the row's own tokens), which the trajectory's next turn hands back (`Request.cache`) so that only its
new tokens are prefilled: the completion's last token and the tool's reply. A kept cache is used once and
only under the weights that made it (none is kept from a call during which weights landed); text-only
models with the lean cache (see `hf_sampling.sample`). `prefilled_tokens` and `reused_tokens` count
the prompt tokens computed and those read from kept caches. Vision-language prompts get M-RoPE positions from
the model's `get_rope_index`; each decoded token takes the prompt's largest position + 1 + its
index, in all three dimensions, which is what `get_rope_index` gives the response tokens of the
finished sequence. A completion ends at EOS or, optionally, at a stop string (`StopStrings`).

An engine with its own copy of the model takes in-flight weight updates: `update_weights` called from
another thread while `generate` runs stages a copy of the weights and returns; they land before the
call's next decoding step (`EngineCapabilities.in_flight_updates`).

The sampling itself is `rollout/hf_sampling.py` (`sample`, `StopStrings`), its KV cache
`rollout/hf_cache.py`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from rlstack.batch import Batch
from rlstack.models.logprobs import forward_logprobs
from rlstack.models.vision import position_ids
from rlstack.rollout.engine import (
    Completion,
    EngineCapabilities,
    Request,
    RequestTooLong,
    SamplingSettings,
    end_token_ids,
)
from rlstack.rollout.hf_sampling import KeptKV, StopStrings, sample


def context_length(config) -> int | None:
    """A text model's `max_position_embeddings` when its RoPE is unscaled; None when the config does not
    say, or when RoPE scaling extends the context past it."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    nested = [v for v in rope.values() if isinstance(v, dict)]  # per layer type (full / sliding)
    if any(r.get("rope_type", r.get("type", "default")) != "default" for r in [rope, *nested]):
        return None
    limit = getattr(text, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and limit > 0 else None


def _request_seeds(requests: Sequence[Request]) -> torch.Tensor | None:
    seeds = [r.seed for r in requests]
    if all(s is None for s in seeds):
        return None
    if any(s is None for s in seeds):
        raise ValueError("either every request of a generate call has a seed, or none has")
    return torch.tensor(seeds, dtype=torch.long)


@dataclass(frozen=True)
class _TurnCache:
    """`Completion.cache` of the HF engine: a completion's kept KV cache, the engine that made it and the
    version of the weights it was computed with."""

    engine: object
    """The engine's own token (`HFEngine._token`): a cache is read by the engine that made it only."""
    version: int
    kv: KeptKV


class HFEngine:
    """The `Engine` over a Hugging Face causal LM (the policy's own module; see module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        seed: int,
        multimodal: bool,
        shares_policy_weights: bool = True,
        share_prefix: bool = True,
        keep_turns: bool | None = None,
    ):
        """`model`: the policy's own module (`shares_policy_weights`), or a copy of its own whose weights
        `update_weights` loads (the policy is sharded over ranks and cannot generate rank by rank).
        `share_prefix`: prefill the tokens every prompt of a call starts with once (`sample`). `keep_turns`
        (default: `share_prefix`, both `worker.rollout.enable_prefix_caching`): keep the KV caches that
        requests ask for (`Request.keep`) for their next turn."""
        self.model = model
        self.share_prefix = share_prefix
        self.keep_turns = share_prefix if keep_turns is None else keep_turns
        self.tokenizer = tokenizer
        self.generator = torch.Generator().manual_seed(seed)
        self.multimodal = multimodal
        self.eos_token_ids = end_token_ids(
            tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        )
        self.context = None if multimodal else context_length(model.config)
        """Positions the model was built for (None: unknown, or extended by RoPE scaling, or M-RoPE, whose
        position ids do not count tokens): no request may go past them."""
        self.capabilities = EngineCapabilities(
            name="hf",
            shares_policy_weights=shares_policy_weights,
            sleep=False,
            multimodal=multimodal,
            prefix_caching=True,
            in_flight_updates=not shares_policy_weights,
            out_of_memory_fix=(
                "the HF engine samples every trajectory of a call at once, with a KV cache of rows x (prompt + "
                "response) positions in every layer: lower {sizes} or data.max_response_length, or generate with "
                "vLLM (worker.rollout.name=vllm), which pages its cache"
            ),
        )
        self.weight_version = 0
        self._lock = threading.Lock()
        """Guards `_generating`, `_staged` and the loading of weights (in-flight updates)."""
        self._generating = False
        self._staged: tuple[list[tuple[str, torch.Tensor]], int] | None = None
        """Weights that arrived during a `generate` call, and their version, waiting for its next step."""
        self._landed: list[tuple[int, int]] = []
        """(index of the first token they sampled, version) of the weights that landed during the call."""
        self._steps = 0
        """Decoding steps of the call so far."""
        self._token = object()
        """Names this engine in the caches it keeps (`_TurnCache.engine`)."""
        self.prefilled_tokens = 0
        """Prompt tokens the prefills computed (a shared prefix once), over the engine's calls."""
        self.reused_tokens = 0
        """Prompt tokens read from kept KV caches (`Request.cache`) instead, over the engine's calls."""

    def generate(self, requests: Sequence[Request], sampling: SamplingSettings) -> list[Completion]:
        # A vision-language model's requests all carry their (possibly empty) processed images: its
        # positions are M-RoPE ids, with or without images.
        max_tokens = sampling.max_tokens
        if self.context is not None:
            for i, r in enumerate(requests):
                if len(r.prompt_ids) >= self.context:
                    raise RequestTooLong(
                        i,
                        f"request {i} has {len(r.prompt_ids)} prompt tokens, but the model was built for at most "
                        f"{self.context} positions (max_position_embeddings in its config); shorten the prompt "
                        "(data.max_prompt_length) or use a model with a longer context",
                    )
            # past the last position the model knows, completions end as cut short ("length")
            max_tokens = min(max_tokens, self.context - max(len(r.prompt_ids) for r in requests))
        was_training = self.model.training
        self.model.eval()
        with self._lock:
            self._generating = True
            self._land_staged()
            first = self.weight_version
            self._landed, self._steps = [], 0
        try:
            out = sample(
                self.model,
                [r.prompt_ids for r in requests],
                max_new_tokens=max_tokens,
                eos_token_id=[] if sampling.ignore_eos else sorted(self.eos_token_ids),
                pad_token_id=self.tokenizer.pad_token_id,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                generator=self.generator,
                seeds=_request_seeds(requests),
                pixel_values=[r.pixel_values for r in requests] if self.multimodal else None,
                image_grid_thw=[r.image_grid_thw for r in requests] if self.multimodal else None,
                stop=StopStrings(self.tokenizer, sampling.stop) if sampling.stop else None,
                between_steps=self._between_steps,
                share_prefix=self.share_prefix,
                kept=[self._kept(r.cache, first) for r in requests],
                keep=[r.keep and self.keep_turns for r in requests],
            )
        except BaseException:
            # Staged weights wait for the next call: an error while landing them would hide this one.
            with self._lock:
                self._generating = False
            raise
        else:
            with self._lock:
                self._generating = False
                self._land_staged()  # weights that came after the last decoding step
        finally:
            self.model.train(was_training)
        self.prefilled_tokens += int(out["prefilled"])
        self.reused_tokens += int(out["reused"])
        # Keys and values computed under one version only: none is kept where weights landed mid-call.
        caches = [
            None if kv is None or self._landed else _TurnCache(self._token, first, kv) for kv in out["kept"]
        ]
        P = max(len(r.prompt_ids) for r in requests)
        tokens = out["input_ids"][:, P:].tolist()
        logprobs = out["rollout_logprobs"][:, P:].tolist()
        lengths = out["response_mask"][:, P:].sum(-1).tolist()
        truncated = out["truncated"].tolist()

        def version(n: int) -> int:  # of the weights that sampled a completion's last token (index n - 1)
            return max((v for start, v in self._landed if start <= n - 1), default=first)

        return [
            Completion(t[:n], lp[:n], "length" if cut else "stop", version(n), cache)
            for t, lp, n, cut, cache in zip(tokens, logprobs, lengths, truncated, caches)
        ]

    def _kept(self, cache: object | None, version: int) -> KeptKV | None:
        """The kept KV cache of `Request.cache` where this engine made it under the weights of `version`."""
        if isinstance(cache, _TurnCache) and cache.engine is self._token and cache.version == version:
            return cache.kv
        return None

    @torch.no_grad()
    def probe_logprobs(self, request: Request, token_ids: list[int]) -> list[float]:
        ids = torch.tensor([request.prompt_ids + token_ids], device=self.model.device)
        mask = torch.ones_like(ids)
        response = torch.zeros_like(ids)
        response[0, len(request.prompt_ids) :] = 1
        grids = [request.image_grid_thw] if self.multimodal else None
        was_training = self.model.training
        self.model.eval()
        try:
            logp, _ = forward_logprobs(
                self.model,
                ids,
                mask,
                position_ids(self.model, ids, mask, grids),
                response,
                pixel_values=[request.pixel_values] if self.multimodal else None,
                image_grid_thw=grids,
            )
        finally:
            self.model.train(was_training)
        return logp[0, len(request.prompt_ids) :].tolist()

    def rollout(self, prompts: Batch, rows_per_prompt: int, run: Callable[[Batch], Batch]) -> Batch:
        """`run(prompts)`: this engine lives on one rank."""
        return run(prompts)

    def update_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]] | None, version: int, private: bool = False
    ) -> None:
        """Load the policy's weights (its own copy), or record the version (sharing the policy's module).
        Called while `generate` runs in another thread, the weights are staged and land before that
        call's next decoding step: a copy of them, unless they are `private` (the engine's to keep, such
        as tensors received from another process), since the sender's tensors change as it trains on."""
        if self.capabilities.shares_policy_weights:
            if weights is not None:
                raise ValueError(
                    "this HF engine samples from the policy's own module; it takes no weights (pass None)"
                )
            self.weight_version = version
            return
        if weights is None:
            raise ValueError("this HF engine holds its own copy of the model: pass the policy's weights")
        with self._lock:
            if not self._generating:  # streamed in one tensor at a time
                self._load(weights, version)
                return
        # A newer update replaces one that has not landed yet.
        own = self.model.state_dict()
        staged = [(_own_name(own, name), t if private else t.detach().clone()) for name, t in weights]
        with self._lock:
            if self._generating:
                self._staged = (staged, version)
            else:
                self._load(staged, version)

    def _between_steps(self) -> None:
        """Before the forward pass that gives token `_steps` of the call: staged weights land here."""
        self._steps += 1
        if self._staged is not None:
            with self._lock:
                self._land_staged()
                self._landed.append((self._steps, self.weight_version))

    def _land_staged(self) -> None:
        """Load the staged weights (the caller holds `_lock`)."""
        if self._staged is not None:
            (weights, version), self._staged = self._staged, None
            self._load(weights, version)

    @torch.inference_mode(False)
    @torch.no_grad()
    def _load(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        own = self.model.state_dict()
        for name, tensor in weights:
            own[_own_name(own, name)].copy_(tensor)
        self.weight_version = version

    def sleep(self) -> None:
        """Nothing to free: the engine's only memory is the policy's module and a per-call KV cache."""

    def wake_up(self) -> None:
        """See `sleep`."""

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "weight_version": self.weight_version}

    def load_state_dict(self, state: dict) -> None:
        if "generator" in state:  # else a vLLM engine's state: a resume that changed the engine
            self.generator.set_state(state["generator"])
        self.weight_version = state["weight_version"]


def _own_name(own: dict[str, torch.Tensor], name: str) -> str:
    if name not in own:
        raise KeyError(f"the policy's weight {name!r} is not a weight of the engine's model")
    return name
