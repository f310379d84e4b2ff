"""The step plan: which phases a training step runs and where each lives, decided once from the config.

The trainer, the role builder and the workers read the plan instead of each re-deriving it from
config flags; it is written beside the resolved config (`step_plan.json` in the run directory) and
printed when the run starts, so that a user sees e.g. that old log-probs are skipped because the
step is provably on-policy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from rlstack.algos.actor_loss import ActorLossParams
from rlstack.algos.advantages import AdvantageParams, AdvEstimator
from rlstack.algos.kl import KLPenalty
from rlstack.algos.policy_loss import (
    LossAggMode,
    PolicyLoss,
    PolicyLossParams,
    RolloutCorrection,
    RolloutCorrectionParams,
)
from rlstack.algos.step import StepParams
from rlstack.config import ActorConfig, AlgorithmConfig, Config


def exact_kl(alg: AlgorithmConfig) -> bool:
    """The KL loss is taken over whole next-token distributions (`kl_penalty=full`), inside the update."""
    return alg.use_kl_loss and alg.kl_penalty == KLPenalty.FULL


def actor_loss_params(c: ActorConfig, alg: AlgorithmConfig) -> ActorLossParams:
    """The actor's loss as `worker.actor` and `algorithm` choose it: the one place the config becomes the
    loss's parameters (`StepPlan.actor_loss`)."""
    return ActorLossParams(
        loss_type=PolicyLoss(c.loss_type),
        agg_mode=LossAggMode(c.loss_agg_mode),
        policy=PolicyLossParams(c.clip_ratio_low, c.clip_ratio_high, c.clip_ratio_dual),
        rollout_correction=RolloutCorrection(c.rollout_correction) if c.rollout_correction else None,
        rollout_correction_params=RolloutCorrectionParams(
            c.rollout_correction_low, c.rollout_correction_high
        ),
        top_entropy_quantile=c.top_entropy_quantile,
        vppo_perception=alg.use_vppo_on_perception,
        vppo_entropy_top_p=alg.top_p_entropy_tokens if alg.use_vppo_on_entropy else None,
        vppo_entropy_penalty_coef=alg.entropy_penalty_coef if alg.use_entropy_penalty else None,
        entropy_coeff=c.entropy_coeff,
        kl_penalty=KLPenalty(alg.kl_penalty) if alg.use_kl_loss else None,
        kl_coef=alg.kl_coef,
    )


def step_params(alg: AlgorithmConfig) -> StepParams:
    """The advantages' parameters as `algorithm` chooses them (`StepPlan.advantages`)."""
    return StepParams(
        AdvEstimator(alg.adv_estimator),
        AdvantageParams(gamma=alg.gamma, lam=alg.lam, norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo),
        KLPenalty(alg.kl_penalty) if alg.use_kl_in_reward else None,
        (alg.kl_target, alg.kl_horizon) if alg.kl_type == "adaptive" else None,
        alg.advantage_scaling_min if alg.use_vppo_on_perception and alg.use_advantage_shaping else None,
    )


Reference = Literal["none", "worker", "policy_base", "in_update"]


@dataclass(frozen=True)
class StepPlan:
    old_logprobs: bool
    """Old log-probs are computed after the rollout. False when the step is provably on-policy (one
    mini-batch, one epoch, no staleness, nothing needs them before the update): the update's first
    forward pass then serves as the old policy."""
    reference: Reference
    """Where the reference model's log-probs come from: `none` (no KL term); `worker` (a frozen copy in
    a reference worker, adding `ref_logprobs`); `policy_base` (LoRA: the policy's base with the
    adapters switched off, adding `ref_logprobs`); `in_update` (`kl_penalty=full`: whole next-token
    distributions, inside the policy's update)."""
    kl_in_reward: bool
    """The KL to the reference is subtracted from the rewards before the advantages."""
    critic: bool
    """A value model (GAE): values before the advantages, a critic update before the policy's."""
    remax_baseline: bool
    """ReMax: one greedy trajectory per prompt is scored as the baseline."""
    vppo: bool
    """VPPO: each token's dependency on the image (a second pass with masked images) after the old
    log-probs."""
    online_filtering: bool
    """DAPO's dynamic sampling: rollout rounds until enough prompt groups pass the filters."""
    mask_truncated: bool
    """Truncated responses get an all-zero `response_mask`."""
    drop_timed_out_groups: bool
    """Prompt groups with a tool call past the tool timeout are dropped."""
    rollout_colocated: bool
    """Rollout workers live beside the policy, in its ranks (`worker.rollout.colocated`); else they are Ray
    actors of their own, sent the policy's weights after every update."""
    asynchronous: bool
    """Asynchronous GRPO: rollouts are made in a thread of their own while the policy trains, by an engine
    with its own copy of the weights."""
    max_age: int
    """Asynchronous GRPO: how many steps older than the policy a batch's weights may be (0: synchronous)."""
    in_flight: bool
    """Asynchronous GRPO's in-flight weight updates."""
    check_weight_sync: bool
    """After every sync, the engine's and the policy's log-probs of a fixed probe are compared."""
    logprob_temperature: float
    """The temperature the policy's log-probs are taken at: the rollout's sampling temperature (1 for
    greedy sampling), so that they match the distribution the tokens were drawn from."""
    actor_mini_batch: int
    """Trajectories per policy mini-batch (`worker.actor.global_batch_size` x `worker.rollout.n`)."""
    critic_mini_batch: int
    """Trajectories per critic mini-batch."""
    critic_warmup: int
    """Steps that update only the critic."""
    advantages: StepParams
    """How the step turns scores into advantages (estimator, its parameters, the in-reward KL, VPPO's shaping)."""
    actor_loss: ActorLossParams
    """The policy's loss and every term around it, as the policy worker computes it."""

    @classmethod
    def of(cls, cfg: Config) -> StepPlan:
        alg, w, d = cfg.algorithm, cfg.worker, cfg.data
        max_age = alg.async_grpo.max_trajectory_age_steps if alg.async_grpo.enabled else 0
        on_policy = (
            max_age == 0
            and w.actor.ppo_epochs == 1
            and d.rollout_batch_size == w.actor.global_batch_size
            and not alg.use_kl_in_reward  # it needs the old log-probs before the update
            and not alg.use_vppo_on_perception  # so does the visual dependency
        )
        reference: Reference = "none"
        if exact_kl(alg):
            reference = "in_update"
        elif alg.use_kl_in_reward or alg.use_kl_loss:
            reference = "policy_base" if w.actor.model.lora.rank > 0 else "worker"
        return cls(
            old_logprobs=not on_policy,
            reference=reference,
            kl_in_reward=alg.use_kl_in_reward,
            critic=alg.adv_estimator == AdvEstimator.GAE,
            remax_baseline=alg.adv_estimator == AdvEstimator.REMAX,
            vppo=alg.use_vppo_on_perception,
            online_filtering=alg.online_filtering,
            mask_truncated=alg.mask_truncated_responses,
            drop_timed_out_groups=w.rollout.agent.tool_timeout_s is not None,
            rollout_colocated=w.rollout.colocated,
            asynchronous=alg.async_grpo.enabled,
            max_age=max_age,
            in_flight=alg.async_grpo.enabled and alg.async_grpo.in_flight,
            check_weight_sync=w.rollout.check_weight_sync,
            logprob_temperature=w.rollout.temperature if w.rollout.temperature > 0 else 1.0,
            actor_mini_batch=w.actor.global_batch_size * w.rollout.n,
            critic_mini_batch=w.critic.global_batch_size * w.rollout.n,
            critic_warmup=cfg.trainer.critic_warmup,
            advantages=step_params(alg),
            actor_loss=actor_loss_params(w.actor, alg),
        )

    @classmethod
    def without_algorithm(cls, cfg: Config) -> tuple[Config, StepPlan]:
        """A run that uses the workers but not the RL algorithm (`rlstack sft`, `rlstack eval`): the config
        its workers are built from (the default `algorithm.*`: no reference, critic or old log-probs) and
        its plan, with log-probs at temperature 1 and no weight-sync probe."""
        work = dataclasses.replace(cfg, algorithm=AlgorithmConfig())
        plan = dataclasses.replace(cls.of(work), logprob_temperature=1.0, check_weight_sync=False)
        return work, plan

    @property
    def separate_reference(self) -> bool:
        """A role computes `ref_logprobs` before the advantages (a reference worker or the LoRA base)."""
        return self.reference in ("worker", "policy_base")

    def phases(self) -> list[str]:
        """The step's phases in order, as logged under `timing_s/`."""
        steps = ["gen", "reward"]
        steps += ["baseline"] if self.remax_baseline else []
        steps += ["old"] if self.old_logprobs else []
        steps += ["vppo"] if self.vppo else []
        steps += ["ref"] if self.separate_reference else []
        steps += ["values"] if self.critic else []
        steps += ["adv"]
        steps += ["update_critic"] if self.critic else []
        return [*steps, "update_actor", "sync"]

    def summary(self) -> str:
        """One line for the log: the phases, and where the reference and the rollout live."""
        where = {
            "none": "",
            "worker": ", reference: a frozen copy",
            "policy_base": ", reference: the LoRA base",
            "in_update": ", reference: inside the update (exact KL)",
        }[self.reference]
        mode = f"asynchronous, max age {self.max_age}" if self.asynchronous else "synchronous"
        placed = "rollout beside the policy" if self.rollout_colocated else "rollout apart"
        return f"step plan: {' -> '.join(self.phases())} ({mode}, {placed}{where})"

    def to_dict(self) -> dict:
        return {
            **{f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)},
            "phases": self.phases(),
        }


def _plain(value):
    """A plan field as JSON takes it: records as mappings of their fields, enums as their values."""
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value.value if isinstance(value, Enum) else value
