"""The rollout worker: a generation engine, the rollout loop that drives it, and the agent's tools."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import PreTrainedTokenizerFast

from rlstack.batch import Batch
from rlstack.config import ModelConfig, RolloutConfig
from rlstack.errors import OutOfMemory
from rlstack.models.loading import load_tokenizer_and_processor, model_dir, resolve_model_path
from rlstack.models.vision import VisionProcessor
from rlstack.rollout.agent import AgentLoop
from rlstack.rollout.engine import Engine, EngineCapabilities, Request
from rlstack.rollout.hf import HFEngine
from rlstack.tools.registry import build_toolset
from rlstack.workers import distributed
from rlstack.workers.group import Dispatch, remote
from rlstack.workers.memory import device_memory_in_use
from rlstack.workers.policy import PolicyWorker, load_trained_model


class GroupSampling(NamedTuple):
    """How the rollout worker samples each prompt's group in one `generate` call: the group's size `n` (samples
    per prompt), temperature (0: greedy), top-p, top-k. The engine's `SamplingSettings` are per request (one
    completion each: token budget, stop strings), built from these by the rollout loop."""

    n: int
    temperature: float
    top_p: float
    top_k: int


@dataclass(frozen=True)
class EngineInputs:
    """What the rollout worker builds its engine from (each engine's builder in `ENGINES` takes what it
    needs)."""

    rollout: RolloutConfig
    model: ModelConfig
    path: str
    """The model's local directory (`model_dir`)."""
    tokenizer: PreTrainedTokenizerFast
    multimodal: bool
    """The model is a vision-language model (it has a processor)."""
    device: str
    policy: PolicyWorker | None
    """The colocated policy worker (None: the rollout worker is placed apart from it)."""
    own_copy: bool
    """Generate from a copy of the model even beside an unsharded policy (asynchronous GRPO)."""


def hf_engine(e: EngineInputs) -> Engine:
    """The HF engine: sampling from the colocated policy's own module, or from a whole copy of its own where
    there is no policy beside it, `own_copy` asks for one, or the policy is sharded."""
    r = e.rollout
    if e.policy is None or e.own_copy or distributed.sharded():
        # Its parameters keep requires_grad (no gradient is ever made: it only samples): torch picks other
        # kernels for parameters without it, whose sums round differently than the policy's module.
        copy = load_trained_model(e.model, e.path, e.device).eval()
        return HFEngine(
            copy,
            e.tokenizer,
            seed=r.seed,
            multimodal=e.multimodal,
            shares_policy_weights=False,
            share_prefix=r.enable_prefix_caching,
        )
    return HFEngine(
        e.policy.model,
        e.tokenizer,
        seed=r.seed,
        multimodal=e.multimodal,
        share_prefix=r.enable_prefix_caching,
    )


def vllm_engine(e: EngineInputs) -> Engine:
    """The vLLM engine, with its own copy of the model loaded from its directory (vLLM, an optional package, is
    imported only here)."""
    from rlstack.rollout.vllm import VLLMEngine, VLLMSettings

    r, m = e.rollout, e.model
    return VLLMEngine(
        VLLMSettings(
            model_path=e.path,
            tokenizer_path=resolve_model_path(m.tokenizer_path) if m.tokenizer_path else None,
            dtype=m.dtype,
            seed=r.seed,
            multimodal=e.multimodal,
            max_model_len=r.max_model_len or 0,
            gpu_memory_utilization=r.gpu_memory_utilization,
            tensor_parallel_size=r.tensor_parallel_size,
            enforce_eager=r.enforce_eager,
            enable_prefix_caching=r.enable_prefix_caching,
            max_num_batched_tokens=r.max_num_batched_tokens,
            free_cache_engine=bool(r.free_cache_engine),
            trust_remote_code=m.trust_remote_code,
            image_limit=r.agent.max_images,
        )
    )


ENGINES: dict[str, Callable[[EngineInputs], Engine]] = {"hf": hf_engine, "vllm": vllm_engine}
"""The engine builders by `worker.rollout.name` (resolved at load: `auto` is never left here)."""


class RolloutWorker:
    """Generates trajectories (`n` per prompt; multi-turn with tools) and keeps its engine's weights
    in step with the policy. Every row carries the `weight_version` that generated it.

    Colocated with the policy in one process, the embedded default samples from the policy's own
    module with the HF engine: `update_weights` then only records the version. The vLLM engine
    keeps its own copy of the model, loaded from `model.model_path` and updated after every step.

    With `in_flight` (asynchronous GRPO's `in_flight_weight_updates`), `update_weights` does not wait for
    the generation in progress: the engine lands the weights between two of its decoding steps. A row's
    `weight_version` is then the version its generation began with (the oldest weights that sampled any
    of its tokens) and `weight_version_last` the version of the weights that sampled its last token.
    The weight-sync check (`probe_logprobs`) waits for the generation in progress, which costs what in-flight
    updates save.
    """

    def __init__(
        self,
        cfg: RolloutConfig,
        model: ModelConfig,
        max_response_length: int,
        policy: PolicyWorker | None,
        device: str = "cpu",
        rank: int | None = None,
        own_copy: bool = False,
        in_flight: bool = False,
    ):
        """`policy`: the colocated policy worker, or None for a rollout worker placed apart from it
        (`worker.rollout.colocated=false`), which loads its own tokenizer, processor and model copy and is
        sent the policy's weights. `rank`: this worker's place among the rollout workers (default: its
        data-parallel rank). `own_copy`: generate from a copy of the model even beside an unsharded
        policy (asynchronous GRPO: the trainer updates the policy's module while the engine generates).
        `in_flight`: weight updates land during a generation (the engine must support it)."""
        self.cfg = cfg
        self.rank = distributed.current().rank if rank is None else rank
        path = model_dir(model)
        if policy is not None:
            tokenizer, processor, device = policy.tokenizer, policy.processor, policy.device
        else:
            tokenizer, processor = load_tokenizer_and_processor(model, path)
        multimodal = processor is not None
        if cfg.name not in ENGINES:  # `auto` is resolved when the config loads (`load_config`)
            raise ValueError(
                f"worker.rollout.name={cfg.name!r}: build the worker from a config load_config returned (it "
                f"resolves auto), or name an engine: {', '.join(ENGINES)}"
            )
        self.engine = ENGINES[cfg.name](
            EngineInputs(cfg, model, path, tokenizer, multimodal, device, policy, own_copy)
        )
        self.policy = policy
        if in_flight and not self.engine.capabilities.in_flight_updates:
            raise ValueError(
                f"the {self.engine.capabilities.name} engine (sharing the policy's weights: "
                f"{self.engine.capabilities.shares_policy_weights}) cannot take weights during a generation"
            )
        self.in_flight = in_flight
        self.asleep = False
        """The engine was put to sleep after the last generation (and no weight update has woken it since)."""
        self.lock = threading.Lock()
        """Held by generation and weight loading: unless `in_flight`, a weight update waits for the
        generation call in progress (asynchronous GRPO's producer thread) and never lands in the middle
        of one."""
        tools = cfg.agent.tools
        self.processor = processor or VisionProcessor(tokenizer, None)
        self.multimodal = multimodal
        self.loop = AgentLoop(
            self.engine,
            self.processor,
            build_toolset(tools, "worker.rollout.agent.tools", cfg.agent.tool_contract) if tools else None,
            cfg.agent,
            max_response_length,
            multimodal=multimodal,
            ignore_eos=cfg.ignore_eos,
        )

    @remote(Dispatch.ALL)
    def capabilities(self) -> EngineCapabilities:
        return self.engine.capabilities

    @remote(Dispatch.ROWS)
    def generate(
        self, prompts: Batch, for_validation: bool = False, sampling: GroupSampling | None = None
    ) -> Batch:
        """`worker.rollout.n` trajectories per prompt with the training sampling settings; `val_n` and the
        `val_*` settings `for_validation`; `sampling`'s settings when given (`rlstack eval`).
        `for_validation` also makes an out-of-memory error name the validation sizes."""
        r = self.cfg
        if sampling is not None:
            return self._run(prompts, *sampling, for_validation=for_validation)
        if for_validation:
            return self._run(
                prompts, r.val_n, r.val_temperature, r.val_top_p, r.val_top_k, for_validation=True
            )
        return self._run(prompts, r.n, r.temperature, r.top_p, r.top_k)

    @remote(Dispatch.ROWS)
    def generate_greedy(self, prompts: Batch) -> Batch:
        """One greedy trajectory per prompt, tools included (ReMax's baseline)."""
        return self._run(prompts, 1, 0.0, 1.0, -1)

    def _run(
        self,
        prompts: Batch,
        n: int,
        temperature: float,
        top_p: float,
        top_k: int,
        for_validation: bool = False,
    ) -> Batch:
        with self.lock:
            self._wake_up()
            first = self.engine.weight_version
            try:
                batch = self.engine.rollout(
                    prompts, n, lambda p: self.loop.generate(p, n, temperature, top_p, top_k)
                )
            except torch.OutOfMemoryError as e:
                raise OutOfMemory(self._out_of_memory(len(prompts), n, e, for_validation)) from e
            finally:
                self.engine.sleep()
                self.asleep = True
        batch["weight_version"] = torch.full((len(batch),), first, dtype=torch.long)
        if "weight_version_last" not in batch:  # the engine does not say: no update lands during a call
            batch["weight_version_last"] = batch["weight_version"].clone()
        return batch

    def _out_of_memory(self, prompts: int, n: int, e: torch.OutOfMemoryError, for_validation: bool) -> str:
        engine = self.engine.capabilities.name
        where = f"out of memory generating {prompts} prompts x {n} with the {engine} engine{device_memory_in_use()}"
        if for_validation:
            sizes = (
                "data.val_batch_size (a positive number of prompts per call, not -1) or worker.rollout.val_n"
            )
        else:
            sizes = "data.rollout_batch_size, worker.rollout.n"
        fix = self.engine.capabilities.out_of_memory_fix.format(sizes=sizes)
        return f"{where}: {fix}. The device said: {str(e).splitlines()[0]}"

    @remote(Dispatch.ALL)
    def update_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]] | None, version: int, private: bool = True
    ) -> int:
        """Load the policy's weights into the engine (None for an engine that shares the policy's module);
        returns the bytes loaded. `private`: the tensors are the engine's to keep (sent from another
        process), not the policy's live ones."""
        loaded = 0

        def counted():
            nonlocal loaded
            for name, tensor in weights:
                loaded += tensor.numel() * tensor.element_size()
                yield name, tensor

        if self.in_flight:  # the engine lands them between two decoding steps of a generation in progress
            self.engine.update_weights(None if weights is None else counted(), version, private=private)
            return loaded
        with self.lock:
            self._wake_up()  # stays awake for the rollout that follows
            self.engine.update_weights(None if weights is None else counted(), version)
        return loaded

    @remote(Dispatch.ALL)
    def sync_weights(self, version: int) -> int:
        """Bring the engine to the colocated policy's current weights, streamed from it under Hugging Face
        names (gathered from the shards on every rank); an engine sharing the module records the version.
        Returns the bytes streamed into the engine (0 when it shares the module)."""
        if self.policy is None:
            raise ValueError(
                "a rollout worker placed apart from the policy is sent its weights (update_weights)"
            )
        shares = self.engine.capabilities.shares_policy_weights
        return self.update_weights(None if shares else self.policy.named_weights(), version, private=False)

    @remote(Dispatch.EACH)
    def probe_logprobs(self, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
        """The engine's log-probs of `token_ids` after a text prompt (the weight-sync probe); every rank's
        engine is asked."""
        request = Request(prompt_ids)
        if self.multimodal:
            request.pixel_values, request.image_grid_thw = self.processor.process_images(
                [], "the weight-sync probe"
            )
        with self.lock:
            # Asynchronous GRPO's producer may have generated (and put the engine to sleep) since the sync:
            # the probe's log-probs are taken awake, and the engine goes back to sleep as it was.
            asleep = self.asleep
            self._wake_up()
            try:
                return self.engine.probe_logprobs(request, token_ids)
            finally:
                if asleep:
                    self.engine.sleep()
                    self.asleep = True

    def _wake_up(self) -> None:
        """Wake the engine; one that really sleeps (vLLM on CUDA) first gets the memory PyTorch's caching
        allocator still holds from the update back (its own allocator cannot reuse those blocks)."""
        if self.asleep and self.engine.capabilities.sleep and torch.cuda.is_available():
            gc.collect()
            torch.cuda.empty_cache()
        self.engine.wake_up()
        self.asleep = False

    @remote(Dispatch.ALL)
    def save_checkpoint(self, path: Path) -> None:
        """The engine's sampling state; each rank's its own (`rollout_state.pt` for rank 0)."""
        torch.save({"engine": self.engine.state_dict()}, path / _rollout_state(self.rank))

    @remote(Dispatch.ALL)
    def load_checkpoint(self, path: Path) -> None:
        """This rank's sampling state, or rank 0's for a rank the saving run did not have."""
        own = path / _rollout_state(self.rank)
        state = torch.load(
            own if own.is_file() else path / _rollout_state(0), map_location="cpu", weights_only=False
        )
        self.engine.load_state_dict(state["engine"])


def _rollout_state(rank: int) -> str:
    return "rollout_state.pt" if rank == 0 else f"rollout_state.rank{rank}.pt"
