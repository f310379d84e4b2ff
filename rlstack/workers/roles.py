"""The role workers one process (or one rank) holds, colocated: policy, rollout, and the reference
and critic where the step plan has them. The same builder serves the embedded default (one process)
and every rank of a Ray worker group (`workers/ray_group.py`)."""

from __future__ import annotations

from typing import Any

from rlstack.config import Config
from rlstack.models.loading import model_dir
from rlstack.plan import StepPlan
from rlstack.workers.critic import CriticWorker
from rlstack.workers.policy import PolicyWorker, RefWorker
from rlstack.workers.rollout import RolloutWorker


def role_classes(plan: StepPlan) -> dict[str, type]:
    """The worker class of each role the plan has (a LoRA policy is its own reference)."""
    roles: dict[str, type] = {"actor": PolicyWorker, "rollout": RolloutWorker}
    if plan.separate_reference:
        roles["ref"] = PolicyWorker if plan.reference == "policy_base" else RefWorker
    if plan.critic:
        roles["critic"] = CriticWorker
    return roles


def build_roles(cfg: Config, plan: StepPlan, total_steps: int, device: str) -> dict[str, Any]:
    """`actor`, `rollout` (unless it is placed apart: `worker.rollout.colocated=false`), and where the plan
    has them `ref` and `critic` workers, in this process."""
    w, d = cfg.worker, cfg.data
    policy = PolicyWorker(
        w.actor,
        cfg.algorithm,
        d.max_response_length,
        total_steps,
        w.rollout.seed,
        device,
        temperature=plan.logprob_temperature,
        old_logprobs=plan.old_logprobs,
        loss=plan.actor_loss,
    )
    roles: dict[str, Any] = {"actor": policy}
    if plan.rollout_colocated:
        roles["rollout"] = RolloutWorker(
            w.rollout,
            w.actor.model,
            d.max_response_length,
            policy,
            device,
            own_copy=plan.asynchronous,  # the trainer updates the policy while the engine generates
            in_flight=plan.in_flight,
        )
    if plan.reference == "policy_base":  # the policy's base with the adapters switched off
        roles["ref"] = policy
    elif plan.reference == "worker":
        roles["ref"] = RefWorker(w.actor, w.ref, device, plan.logprob_temperature)
    if plan.critic:
        roles["critic"] = CriticWorker(
            w.critic, model_dir(w.actor.model), total_steps, device, w.actor.ulysses_size
        )
    return roles
