"""The rollout worker: a generation engine, the rollout loop that drives it, and the agent's tools."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from rlstack.batch import Batch
from rlstack.config import RolloutConfig
from rlstack.models.vision import VisionProcessor
from rlstack.rollout.agent import AgentLoop
from rlstack.rollout.engine import Engine, EngineCapabilities, Request
from rlstack.rollout.hf import HFEngine
from rlstack.tools.registry import build_toolset
from rlstack.workers.policy import PolicyWorker


class RolloutWorker:
    """Generates trajectories (`n` per prompt; multi-turn with tools) and keeps its engine's weights
    in step with the policy. Every row carries the `weight_version` that generated it.

    Colocated with the policy in one process, the embedded default samples from the policy's own
    module with the HF engine: `update_weights` then only records the version.
    """

    def __init__(self, cfg: RolloutConfig, max_response_length: int, policy: PolicyWorker):
        self.cfg = cfg
        processor = policy.processor
        multimodal = processor is not None
        self.engine: Engine = HFEngine(policy.model, policy.tokenizer, seed=cfg.seed, multimodal=multimodal)
        tools = cfg.agent.tools
        self.processor = processor or VisionProcessor(policy.tokenizer, None)
        self.multimodal = multimodal
        self.loop = AgentLoop(
            self.engine,
            self.processor,
            build_toolset(tools, key="worker.rollout.agent.tools") if tools else None,
            cfg.agent,
            max_response_length,
            multimodal=multimodal,
        )

    def capabilities(self) -> EngineCapabilities:
        return self.engine.capabilities

    def generate(self, prompts: Batch, validate: bool = False) -> Batch:
        """`worker.rollout.n` trajectories per prompt (`val_n` and the `val_*` settings with `validate`)."""
        r = self.cfg
        if validate:
            out = self.loop.generate(prompts, r.val_n, r.val_temperature, r.val_top_p, r.val_top_k)
        else:
            out = self.loop.generate(prompts, r.n, r.temperature, r.top_p, r.top_k)
        return self._stamped(out)

    def generate_greedy(self, prompts: Batch) -> Batch:
        """One greedy trajectory per prompt, tools included (ReMax's baseline)."""
        return self._stamped(self.loop.generate(prompts, 1, 0.0))

    def _stamped(self, batch: Batch) -> Batch:
        batch["weight_version"] = torch.full((len(batch),), self.engine.weight_version, dtype=torch.long)
        return batch

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | None, version: int) -> None:
        """Load the policy's weights into the engine (None for an engine that shares the policy's module)."""
        self.engine.update_weights(weights, version)

    def score(self, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
        """The engine's log-probs of `token_ids` after a text prompt (the weight-sync probe)."""
        request = Request(prompt_ids)
        if self.multimodal:
            request.pixel_values, request.image_grid_thw = self.processor.process_images(
                [], "the weight-sync probe"
            )
        return self.engine.score(request, token_ids)

    def save_checkpoint(self, path: Path) -> None:
        torch.save({"engine": self.engine.state_dict()}, path / "rollout_state.pt")

    def load_checkpoint(self, path: Path) -> None:
        self.engine.load_state_dict(torch.load(path / "rollout_state.pt", weights_only=False)["engine"])
