"""`algorithm.*`: advantages, KL, online filtering, VPPO and asynchronous GRPO."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rlstack.config.fields import field

if TYPE_CHECKING:
    from rlstack.config.schema import Config

GROUP_ESTIMATORS = {"grpo", "rloo", "grpo_passk", "loo_std", "reinforce_plus_plus_baseline"}
"""Estimators that compare the responses to one prompt (they need `worker.rollout.n >= 2`)."""


@dataclass
class AsyncGRPOConfig:
    enabled: bool = False
    """Generate and score the next steps' batches while training (NeMo RL's async GRPO; `rlstack/producer.py`)."""
    max_trajectory_age_steps: int = field(1, ge=0)
    """No trajectory is trained on more than this many training steps (weight versions) after the weights that generated it (0: the synchronous loop). Above 0, set worker.actor.rollout_correction=tis too (NeMo RL requires its importance-sampling correction in async mode; docs/benchmarks.md has what it does on the demo task)."""
    in_flight_weight_updates: bool = False
    """Push new weights to the engine without waiting for the generation in progress: they land between two of its decoding steps, so trajectories are fresher than the bound (but the run depends on timing: not reproducible bit for bit). Needs an engine with its own copy of the model (hf); with trainer.backend=ray, worker.rollout.colocated=false."""

    @property
    def in_flight(self) -> bool:
        """In-flight weight updates are on (they only apply to an asynchronous run)."""
        return self.enabled and self.in_flight_weight_updates


AdvEstimatorName = Literal[
    "gae",
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "grpo_passk",
    "loo_std",
]
"""The advantage estimators (`rlstack.algos.advantages.AdvEstimator` is made of these)."""
KLPenaltyName = Literal["kl", "abs", "mse", "low_var_kl", "kl+", "abs+", "mse+", "low_var_kl+", "full"]
"""The KL estimators (`rlstack.algos.kl.KLPenalty`)."""


@dataclass
class AlgorithmConfig:
    adv_estimator: AdvEstimatorName = "grpo"
    """Advantage estimator (gae needs the critic section; the others use outcome scores)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide group advantages by the group's standard deviation (false: Dr.GRPO)."""
    gamma: float = field(1.0, ge=0, le=1)
    """Discount factor (gae, reinforce_plus_plus)."""
    lam: float = field(1.0, ge=0, le=1)
    """GAE lambda."""
    use_kl_loss: bool = False
    """Add a KL(policy || reference) term to the actor loss (builds a reference model)."""
    use_kl_in_reward: bool = False
    """Subtract kl_coef * KL per token from the reward before advantages (builds a reference model)."""
    kl_penalty: KLPenaltyName = "low_var_kl"
    """KL estimator: k1 (kl), abs, k2 (mse), k3 (low_var_kl); `+`: that value with k2's gradient; full: exact KL over the vocabulary (KL loss only)."""
    kl_coef: float = field(1.0e-2, ge=0)
    """Weight of the KL term (the initial weight with the adaptive controller)."""
    kl_type: Literal["fixed", "adaptive"] = "fixed"
    """Keep kl_coef fixed, or adapt it toward kl_target (only with use_kl_in_reward)."""
    kl_target: float = field(0.1, gt=0)
    """Target KL of the adaptive controller."""
    kl_horizon: int = field(10000, ge=1)
    """Horizon (in trajectories) of the adaptive controller."""
    online_filtering: bool = False
    """DAPO dynamic sampling: drop groups whose mean `filter_key` is not strictly inside (filter_low, filter_high), and sample more prompts until the batch is full."""
    filter_key: str = "overall"
    """Reward component the online filter looks at (`overall` or a key the reward function returns)."""
    filter_low: float = 0.01
    """Keep a group only if its mean filter_key is above this."""
    filter_high: float = 0.99
    """Keep a group only if its mean filter_key is below this."""
    async_grpo: AsyncGRPOConfig = field(default_factory=AsyncGRPOConfig)
    """Asynchronous GRPO: rollouts overlap training, with bounded staleness."""
    max_try_make_batch: int = field(20, ge=1, also=(-1,), why="-1: no limit, as in EasyR1")
    """Generation rounds allowed to fill one batch with online filtering before the run stops with an error (-1: no limit, EasyR1's value: rounds go on until the batch is full)."""

    @property
    def unlimited_tries(self) -> bool:
        """`max_try_make_batch = -1`: online filtering draws rounds until the batch is full."""
        return self.max_try_make_batch == -1

    oversample_factor: int = field(1, ge=1)
    """With online filtering, draw this many batches of prompts per generation round (PyVision oversampling)."""
    rank_groups_by_std: bool = False
    """With online filtering, fill the batch with the kept groups of highest reward std first (PyVision)."""
    trajectory_filter_end_reasons: list[str] | None = None
    """With online filtering, drop trajectories whose end_reason is not listed, after group filtering (None: keep all)."""
    trajectory_filter_max_length: int | None = field(None, ge=1)
    """With online filtering, drop trajectories with more response tokens than this (None: no limit)."""
    trajectory_filter_require_image: bool = False
    """With online filtering, drop trajectories that hold no image (agent runs)."""
    mask_truncated_responses: bool = False
    """DAPO overlong filtering: responses cut at max_response_length get no loss."""
    use_vppo_on_perception: bool = False
    """VPPO (vision models): train only on the response tokens whose distribution depends most on the image."""
    top_p_perception_tokens: float = field(0.2, gt=0, le=1)
    """VPPO: fraction of each response's tokens kept, those of highest visual dependency (VPPO's default; its 7B and 8B scripts set 0.4)."""
    use_vppo_on_entropy: bool = False
    """VPPO: train only on each response's tokens of highest entropy (with use_vppo_on_perception: on those or the perception tokens)."""
    top_p_entropy_tokens: float = field(0.2, gt=0, le=1)
    """VPPO: fraction of each response's tokens kept by entropy (use_vppo_on_entropy)."""
    use_advantage_shaping: bool = False
    """VPPO: scale each trajectory's advantages by its mean visual dependency (mean scale 1)."""
    advantage_scaling_min: float = field(0.8, ge=0, le=1)
    """VPPO: the scale given to the least image-dependent trajectory of the batch (VPPO's default; its scripts set 0.9)."""
    use_entropy_penalty: bool = False
    """VPPO: add entropy_penalty_coef * mean(-log pi) of the sampled tokens to the loss."""
    entropy_penalty_coef: float = 0.06
    """VPPO: weight of the entropy penalty."""
    vppo_mask_prob: float = field(0.5, gt=0, lt=1)
    """VPPO: probability that each image patch is blacked out when measuring visual dependency."""
    vppo_dependency_clamp: float = field(10.0, gt=0)
    """VPPO: upper clamp of the per-token visual dependency (k3 estimate of the KL)."""


def algorithm_rules(cfg: Config, p: list[str]) -> None:
    """Filtering, the group estimators' n, KL settings that contradict each other, VPPO's parts, async."""
    alg = cfg.algorithm
    if alg.online_filtering and not alg.filter_low < alg.filter_high:
        p.append(
            f"algorithm.filter_low ({alg.filter_low}) must be below algorithm.filter_high ({alg.filter_high}): "
            "groups are kept when their mean lies strictly between them"
        )
    pyvision = (
        alg.oversample_factor > 1
        or alg.rank_groups_by_std
        or alg.trajectory_filter_end_reasons is not None
        or alg.trajectory_filter_max_length is not None
        or alg.trajectory_filter_require_image
    )
    if pyvision and not alg.online_filtering:
        p.append(
            "algorithm.oversample_factor, rank_groups_by_std and trajectory_filter_* act while filtering a batch: "
            "set algorithm.online_filtering=true (with filter_low=-1e9, filter_high=1e9 to keep every group)"
        )
    n = cfg.worker.rollout.n
    if alg.adv_estimator in GROUP_ESTIMATORS and n < 2:
        p.append(
            f"algorithm.adv_estimator={alg.adv_estimator} compares responses within a group, "
            f"so worker.rollout.n must be at least 2 (got {n}); set worker.rollout.n=8 for example"
        )
    if alg.use_kl_loss and alg.use_kl_in_reward:
        p.append(
            "algorithm.use_kl_loss and algorithm.use_kl_in_reward are both true: the KL would be counted twice; "
            "keep one (use_kl_loss for GRPO-style runs, use_kl_in_reward for PPO-style runs)"
        )
    if alg.kl_type == "adaptive" and not alg.use_kl_in_reward:
        p.append(
            "algorithm.kl_type=adaptive adapts the in-reward KL coefficient: set algorithm.use_kl_in_reward=true, "
            "or use kl_type=fixed"
        )
    if alg.kl_penalty == "full" and alg.use_kl_in_reward:
        p.append(
            "algorithm.kl_penalty=full needs the reference model's whole distributions during the update, so it "
            "works as a KL loss only: set algorithm.use_kl_loss=true and use_kl_in_reward=false, or pick low_var_kl"
        )
    if alg.kl_penalty.endswith("+") and alg.use_kl_in_reward:
        p.append(
            f"algorithm.kl_penalty={alg.kl_penalty}: the `+` estimators only change the gradient, which an in-reward "
            "KL never takes; use it with use_kl_loss, or drop the `+`"
        )
    if alg.use_advantage_shaping and not alg.use_vppo_on_perception:
        p.append(
            "algorithm.use_advantage_shaping scales advantages by VPPO's visual dependency: set "
            "algorithm.use_vppo_on_perception=true"
        )
    _async_rules(cfg, p)


def _async_rules(cfg: Config, p: list[str]) -> None:
    """In-flight weight updates: an asynchronous run, an age above 0, an engine that takes weights mid-call."""
    ag, r = cfg.algorithm.async_grpo, cfg.worker.rollout
    if not ag.in_flight_weight_updates:
        return
    if not ag.enabled:
        p.append(
            "algorithm.async_grpo.in_flight_weight_updates = true lands weights during the generation of an "
            "asynchronous run: set algorithm.async_grpo.enabled=true, or leave it off"
        )
    elif ag.max_trajectory_age_steps == 0:
        p.append(
            "algorithm.async_grpo.in_flight_weight_updates = true with max_trajectory_age_steps = 0 does "
            "nothing (the producer waits for every update before it generates): raise the age, or leave "
            "in-flight updates off"
        )
    if r.name != "hf":
        p.append(
            f"algorithm.async_grpo.in_flight_weight_updates = true: the {r.name} engine runs "
            "its generate call to the end before it takes weights; in-flight updates need "
            "worker.rollout.name=hf (or leave them off)"
        )
    if cfg.trainer.backend == "ray" and r.colocated:
        p.append(
            "algorithm.async_grpo.in_flight_weight_updates = true with trainer.backend=ray needs the rollout "
            "in actors of its own (worker.rollout.colocated=false): a colocated rank runs one call at a time, "
            "so its weights could only arrive after the generation"
        )
