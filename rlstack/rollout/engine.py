"""The seam between training and generation: token-in / token-out engines.

An engine turns requests (prompt token ids, plus images for a vision-language model) and one set
of sampling settings into completions: the sampled token ids, the behaviour log-prob of each, and
why generation stopped. It knows nothing about trajectories, tools or rewards; the agent loop
(`rollout/agent.py`) is its only caller for generation, single-turn too. The rollout worker hands each
rollout to the engine (`rollout`), so that an engine split over several ranks (vLLM's tensor
parallelism) can run the loop on its group's leader alone.

Weights reach an engine through `update_weights(named tensors under Hugging Face names, version)`.
An engine that samples from the policy's own module (`EngineCapabilities.shares_policy_weights`,
the embedded HF engine) needs no tensors: the trainer only tells it the version. `sleep()` /
`wake_up()` free and restore the engine's memory between rollouts where the platform supports it
(`EngineCapabilities.sleep`); elsewhere they do nothing. An engine with `in_flight_updates` takes
`update_weights` from another thread while `generate` runs (asynchronous GRPO's in-flight weight
updates): the weights land between two decoding steps.

Engines: `hf` (`rollout/hf.py`, the embedded default) and `vllm` (`rollout/vllm.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from PIL import Image

from rlstack.batch import Batch
from rlstack.errors import RLStackError

FinishReason = Literal["stop", "length"]
"""`stop`: the completion ended at EOS or a stop string (its last token); `length`: `max_tokens` ran out."""


class RequestTooLong(RLStackError):
    """A request does not fit in the engine's context (never truncated silently)."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index = index


@dataclass(frozen=True)
class SamplingSettings:
    """How every request of one `generate` call is sampled. `temperature == 0` decodes greedily."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1: no top-k truncation."""
    stop: tuple[str, ...] = ()
    """Strings that end a completion once its text contains one (the tokens that complete it are kept)."""
    ignore_eos: bool = False
    """End-of-sequence tokens do not end a completion: it runs to `max_tokens` (or a stop string)."""


@dataclass
class Request:
    """One completion to generate: a prompt (the whole context so far, for a multi-turn trajectory)."""

    prompt_ids: list[int]
    images: list[Image.Image] = field(default_factory=list)
    """The context's images in order, as the model's processor will see them (vision-language models)."""
    pixel_values: torch.Tensor | None = None
    """The processor's patches of `images` (what an engine sharing the policy's processor feeds the model)."""
    image_grid_thw: torch.Tensor | None = None
    """`[len(images), 3]` patch grid of each image, in the same order."""
    seed: int | None = None
    """Sampling seed (0 <= seed < 2**63): the same request with the same seed gets the same completion from
    the same weights, whatever other requests share the call (vLLM's per-request seed). This is what
    makes a seeded run's samples independent of how its prompts are split across ranks. None: the
    engine's own random stream."""
    keep: bool = False
    """The caller may continue this completion in a later call (a multi-turn trajectory's next turn): an
    engine that can keeps its KV cache and returns it in `Completion.cache`."""
    cache: object | None = None
    """A `Completion.cache` of an earlier call that this prompt continues (the prompt starts with that
    completion's prompt and tokens): the engine prefills only what comes after. Ignored where it does not
    fit (other tokens, other weights, another engine); each is used at most once."""


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mix_seed(*parts: int) -> int:
    """A seed in [0, 2**63) from integers, well mixed (splitmix64 over them in turn): how the trainer
    and the rollout loop derive per-request seeds from the run's seed."""
    x = 0
    for p in parts:
        x = _splitmix64(x ^ (p & _MASK64))
    return x >> 1


def end_token_ids(tokenizer_eos: int | None, generation_eos: int | Sequence[int] | None) -> frozenset[int]:
    """The tokens that end a completion: the tokenizer's EOS and the model's generation config's (Qwen's
    chat models list both `<|im_end|>` and `<|endoftext|>`), as `generate` and vLLM stop at."""
    ids = [generation_eos] if isinstance(generation_eos, int) else list(generation_eos or [])
    return frozenset(i for i in [tokenizer_eos, *ids] if isinstance(i, int) and i >= 0)


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    """The behaviour log-prob of each sampled token, under the temperature-scaled distribution (what the
    policy's forward pass scores): before top-k / top-p truncation with the HF engine, renormalised over
    the kept tokens with vLLM (which the config refuses to combine with `rollout_correction`)."""
    finish_reason: FinishReason
    weight_version: int | None = None
    """The version of the weights that sampled its last token (it can be newer than the version the
    call began with where weights land in flight); None where the engine does not say."""
    cache: object | None = None
    """With `Request.keep`, where the engine keeps KV caches between calls (the HF engine): what to pass as
    `Request.cache` of the request that continues this completion. Opaque; it holds memory until dropped."""


@dataclass(frozen=True)
class EngineCapabilities:
    name: str
    shares_policy_weights: bool
    """Samples from the policy's own module: `update_weights` needs no tensors."""
    sleep: bool
    """`sleep()` really frees memory (False: it is a no-op)."""
    multimodal: bool
    """Accepts requests with images."""
    prefix_caching: bool
    """Reuses the KV cache of a shared prefix (the `n` samples of a prompt; a trajectory's earlier turns:
    vLLM by its automatic prefix caching, the HF engine by `Request.cache`)."""
    in_flight_updates: bool = False
    """`update_weights` may be called from another thread while `generate` runs; it returns without
    waiting for the generation, and the weights land between two of its decoding steps: the tokens after that are sampled,
    and their behaviour log-probs computed, with the new weights (the KV cache of the tokens before
    stays as the old weights made it, as in NeMo RL's in-flight updates without KV recomputation)."""
    out_of_memory_fix: str = "lower {sizes} or data.max_response_length"
    """What to change when generating runs out of device memory, said in the error; `{sizes}` stands for the
    call's batch-size keys (the rollout's, or validation's)."""


class Engine(Protocol):
    capabilities: EngineCapabilities
    eos_token_ids: frozenset[int]
    """The tokens that end a completion (`end_token_ids`): a completion that ends with one is done."""
    weight_version: int
    """The version of the weights it samples from (the trainer's step at the last `update_weights` that
    has landed)."""

    def generate(self, requests: Sequence[Request], sampling: SamplingSettings) -> list[Completion]:
        """One completion per request, in order."""
        ...

    def probe_logprobs(self, request: Request, token_ids: list[int]) -> list[float]:
        """Log-probs (temperature 1) of `token_ids` following the request's prompt, under the engine's
        current weights (the weight-sync check compares them with the policy's)."""
        ...

    def rollout(self, prompts: Batch, rows_per_prompt: int, run: Callable[[Batch], Batch]) -> Batch:
        """The trajectories of this rank's `prompts`: `run(prompts)`, the rollout loop over this engine. An
        engine split over several ranks (vLLM's tensor parallelism) runs the loop once, on the group's
        leader, over the prompts of the whole group, and hands each rank its own `rows_per_prompt` rows per
        prompt; the rollout worker does not know the difference."""
        ...

    def update_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]] | None, version: int, private: bool = False
    ) -> None:
        """Load `weights` (Hugging Face parameter names) and record `version`. `None` is accepted only by
        an engine that shares the policy's weights. `private`: the tensors are the engine's to keep (sent
        from another process), not the policy's live ones (an engine that lands weights in flight must
        copy live ones first)."""
        ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

    def state_dict(self) -> dict:
        """What a checkpoint keeps to continue sampling the same way (e.g. the sampler's RNG)."""
        ...

    def load_state_dict(self, state: dict) -> None: ...
