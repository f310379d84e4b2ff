"""The role workers one process (or one rank) holds, colocated: policy, rollout, and the reference
and critic when the algorithm needs them. The same builder serves the embedded default (one process)
and every rank of a Ray worker group (`workers/ray_group.py`)."""

from __future__ import annotations

from typing import Any

from rlstack.algos.advantages import AdvEstimator
from rlstack.config import Config
from rlstack.models.loading import model_dir
from rlstack.workers.critic import CriticWorker
from rlstack.workers.policy import PolicyWorker, RefWorker
from rlstack.workers.rollout import RolloutWorker


def needs_ref(cfg: Config) -> bool:
    """A separate reference worker: for an in-reward KL or a sampled-token KL loss (the exact KL,
    `kl_penalty=full`, keeps its reference inside the policy worker)."""
    alg = cfg.algorithm
    return alg.use_kl_in_reward or (alg.use_kl_loss and alg.kl_penalty != "full")


def build_roles(cfg: Config, total_steps: int, device: str) -> dict[str, Any]:
    """`actor`, `rollout` (unless it is placed apart: `worker.rollout.colocated=false`), and where needed
    `ref` and `critic` workers, in this process."""
    w, d = cfg.worker, cfg.data
    policy = PolicyWorker(w.actor, cfg.algorithm, d.max_response_length, total_steps, w.rollout.seed, device)
    roles: dict[str, Any] = {"actor": policy}
    if w.rollout.colocated:
        ag = cfg.algorithm.async_grpo
        roles["rollout"] = RolloutWorker(
            w.rollout,
            w.actor.model,
            d.max_response_length,
            policy,
            device,
            own_copy=ag.enabled,  # the trainer updates the policy while the engine generates
            in_flight=ag.in_flight,
        )
    if needs_ref(cfg):  # a LoRA policy is its own reference: its base with the adapters switched off
        roles["ref"] = policy if policy.lora else RefWorker(w.actor, w.ref, device)
    if cfg.algorithm.adv_estimator == AdvEstimator.GAE:
        roles["critic"] = CriticWorker(w.critic, model_dir(w.actor.model), total_steps, device)
    return roles
