"""The step plan: which phases a training step runs and where each lives, decided once from the config.

The trainer, the role builder and the workers read the plan instead of each re-deriving it from
config flags; it is written beside the resolved config (`step_plan.json` in the run directory) and
printed when the run starts, so that a user sees e.g. that old log-probs are skipped because the
step is provably on-policy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from rlstack.algos.advantages import AdvEstimator
from rlstack.algos.kl import KLPenalty
from rlstack.config import AlgorithmConfig, Config


def exact_kl(alg: AlgorithmConfig) -> bool:
    """The KL loss is taken over whole next-token distributions (`kl_penalty=full`), inside the update."""
    return alg.use_kl_loss and alg.kl_penalty == KLPenalty.FULL


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
    rollout_apart: bool
    """Rollout workers are Ray actors of their own, sent the policy's weights after every update (else
    they live beside the policy, in its ranks)."""
    asynchronous: bool
    """Asynchronous GRPO: rollouts are made in a thread of their own while the policy trains, by an engine
    with its own copy of the weights."""
    max_age: int
    """Asynchronous GRPO: how many steps older than the policy a batch's weights may be (0: synchronous)."""
    in_flight: bool
    """Asynchronous GRPO's in-flight weight updates."""
    check_weight_sync: bool
    """After every sync, a fixed probe is scored by the engine and the policy."""
    logprob_temperature: float
    """The temperature the policy's log-probs are taken at: the rollout's sampling temperature (1 for
    greedy sampling), so that they match the distribution the tokens were drawn from."""
    actor_mini_batch: int
    """Trajectories per policy mini-batch (`worker.actor.global_batch_size` x `worker.rollout.n`)."""
    critic_mini_batch: int
    """Trajectories per critic mini-batch."""
    critic_warmup: int
    """Steps that update only the critic."""

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
            rollout_apart=not w.rollout.colocated,
            asynchronous=alg.async_grpo.enabled,
            max_age=max_age,
            in_flight=alg.async_grpo.enabled and alg.async_grpo.in_flight,
            check_weight_sync=w.rollout.check_weight_sync,
            logprob_temperature=w.rollout.temperature if w.rollout.temperature > 0 else 1.0,
            actor_mini_batch=w.actor.global_batch_size * w.rollout.n,
            critic_mini_batch=w.critic.global_batch_size * w.rollout.n,
            critic_warmup=cfg.trainer.critic_warmup,
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
        placed = "rollout apart" if self.rollout_apart else "rollout beside the policy"
        return f"step plan: {' -> '.join(self.phases())} ({mode}, {placed}{where})"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"phases": self.phases()}
