"""`worker.critic.*` (the value model of GAE) and `worker.ref.*` (the frozen reference policy)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rlstack.config.actor import (
    OptimConfig,
    attention_heads,
    budget_problems,
    clamp_micro_batch,
    divisors_hint,
    heads_problem,
    optim_problems,
)
from rlstack.config.fields import field
from rlstack.config.model import builtin_model_problems
from rlstack.config.paths import path_problems

if TYPE_CHECKING:
    from rlstack.config.schema import Config


@dataclass
class CriticModelConfig:
    model_path: str | None = None
    """Model the critic starts from (default: the actor's); a scalar value head is added on top."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of the critic."""
    trust_remote_code: bool = False
    """Allow model code shipped inside the model directory."""


@dataclass
class CriticConfig:
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """The value model."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1.0e-5))
    """The critic optimizer."""
    global_batch_size: int = field(32, ge=1)
    """Prompts per critic optimizer step (mini-batch of `global_batch_size * n` trajectories)."""
    micro_batch_size_per_device_for_update: int = field(64, ge=1, resume=True)
    """Trajectories per forward/backward pass of the critic update."""
    micro_batch_size_per_device_for_experience: int = field(128, ge=1, resume=True)
    """Trajectories per forward pass when computing values."""
    ppo_epochs: int = field(1, ge=1)
    """Passes over the rollout batch per critic update."""
    cliprange_value: float = field(0.5, ge=0)
    """Clip range of the value update around the values at collection time."""
    max_grad_norm: float = field(
        1.0, gt=0, also=(math.inf,), why="clipping to 0 stops every update; inf: no clipping"
    )
    """Gradient clipping norm of the critic."""
    padding_free: bool = False
    """Pack each micro-batch's rows into one sequence without their padding (as worker.actor.padding_free)."""
    dynamic_batching: bool = False
    """Form micro-batches by a token budget instead of a row count (as worker.actor.dynamic_batching)."""
    max_token_len_per_device_for_update: int = field(16384, ge=1, resume=True)
    """Dynamic batching: attended tokens per forward/backward pass of the critic update."""
    max_token_len_per_device_for_experience: int = field(32768, ge=1, resume=True)
    """Dynamic batching: attended tokens per forward pass computing values."""


@dataclass
class RefConfig:
    micro_batch_size_per_device_for_experience: int = field(128, ge=1, resume=True)
    """Trajectories per forward pass of the reference model."""
    max_token_len_per_device_for_experience: int = field(32768, ge=1, resume=True)
    """Dynamic batching (worker.actor.dynamic_batching, which the reference follows, as padding_free): attended tokens per forward pass."""


def critic_micro_batch(cfg: Config) -> str | None:
    """The critic's update micro-batch clamped to its mini-batch (`clamp_micro_batch`), where it is built (gae)."""
    cr, n = cfg.worker.critic, cfg.worker.rollout.n
    if cfg.algorithm.adv_estimator != "gae":
        return None
    factors = f"worker.critic.global_batch_size * worker.rollout.n = {cr.global_batch_size} * {n}"
    return clamp_micro_batch("worker.critic", cr, factors, cr.global_batch_size * n)


def critic_rules(cfg: Config, p: list[str]) -> None:
    """The critic's batches (with gae, where it is built) and its model."""
    d, cr, n = cfg.data, cfg.worker.critic, cfg.worker.rollout.n
    if cfg.algorithm.adv_estimator == "gae":
        if (
            min(d.rollout_batch_size, cr.global_batch_size) >= 1
            and d.rollout_batch_size % cr.global_batch_size
        ):
            p.append(
                f"data.rollout_batch_size ({d.rollout_batch_size}) must be divisible by "
                f"worker.critic.global_batch_size ({cr.global_batch_size}); pick a divisor such as "
                f"{divisors_hint(d.rollout_batch_size)}"
            )
        mini, micro = cr.global_batch_size * n, cr.micro_batch_size_per_device_for_update
        if min(mini, micro) >= 1 and not cr.dynamic_batching and mini % micro:
            p.append(
                f"worker.critic.global_batch_size * worker.rollout.n = {mini} trajectories must be divisible "
                f"by worker.critic.micro_batch_size_per_device_for_update ({micro}); "
                f"pick a divisor such as {divisors_hint(mini)}"
            )
        if cr.dynamic_batching:
            budget_problems(
                cfg,
                p,
                [
                    (
                        "worker.critic.max_token_len_per_device_for_update",
                        cr.max_token_len_per_device_for_update,
                    ),
                    (
                        "worker.critic.max_token_len_per_device_for_experience",
                        cr.max_token_len_per_device_for_experience,
                    ),
                ],
            )
    optim_problems(p, "worker.critic.optim", cr.optim)
    builtin_model_problems(p, "worker.critic.model.model_path", cr.model.model_path)
    if cfg.algorithm.adv_estimator == "gae":
        path_problems(p, ("worker.critic.model.model_path", cr.model.model_path))
        critic_sequence_parallel_problems(cfg, p)


def critic_sequence_parallel_problems(cfg: Config, p: list[str]) -> None:
    """The critic splits its passes as the policy does (`worker.actor.ulysses_size`): padding-free, with heads
    that divide."""
    cr, u = cfg.worker.critic, cfg.worker.actor.ulysses_size
    if u <= 1:
        return
    if not cr.padding_free:
        p.append(
            f"worker.actor.ulysses_size={u} splits the critic's sequences too, which needs its padding-free "
            "layout: set worker.critic.padding_free=true"
        )
    heads = attention_heads(cr.model.model_path)  # unset: the policy's model, checked with it
    if heads and (problem := heads_problem(u, *heads, cr.model.model_path)):
        p.append(f"{problem} (the critic, worker.critic.model.model_path)")
