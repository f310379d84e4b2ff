"""The step plan: which phases a step runs and where the reference and rollout live, decided once from
the config and read by the trainer and the role builder."""

from __future__ import annotations

import pytest

from rlstack.config import load_config
from rlstack.plan import StepPlan
from rlstack.workers.critic import CriticWorker
from rlstack.workers.policy import PolicyWorker, RefWorker
from rlstack.workers.roles import role_classes

BASE = ["config=examples/grpo_addition.yaml"]


def plan(*overrides: str) -> StepPlan:
    return StepPlan.of(load_config([*BASE, *overrides]))


def test_the_example_is_on_policy_with_nothing_but_the_update():
    p = plan()
    assert not p.old_logprobs and p.reference == "none" and not p.critic
    assert p.phases() == ["gen", "reward", "adv", "update_actor", "sync"]
    assert p.actor_mini_batch == 32 * 8 and p.logprob_temperature == 1.0
    assert set(role_classes(p)) == {"actor", "rollout"}
    assert "gen -> reward -> adv -> update_actor -> sync (synchronous" in p.summary()
    assert p.rollout_colocated and "rollout beside the policy" in p.summary()
    apart = plan("worker.rollout.colocated=false")
    assert not apart.rollout_colocated and "rollout apart" in apart.summary()


@pytest.mark.parametrize(
    "overrides, old",
    [
        (["worker.actor.ppo_epochs=2"], True),  # later epochs see moved weights
        (
            ["worker.actor.global_batch_size=16", "worker.actor.micro_batch_size_per_device_for_update=64"],
            True,
        ),
        (["algorithm.async_grpo.enabled=true"], True),  # a batch one step old
        (["algorithm.use_kl_in_reward=true", "algorithm.use_kl_loss=false"], True),  # the KL needs them first
        (["algorithm.adv_estimator=rloo"], False),
    ],
)
def test_old_logprobs_are_computed_exactly_when_the_step_is_not_provably_on_policy(overrides, old):
    p = plan(*overrides)
    assert p.old_logprobs is old
    assert ("old" in p.phases()) is old


def test_where_the_reference_lives():
    assert plan("algorithm.use_kl_loss=true").reference == "worker"
    assert role_classes(plan("algorithm.use_kl_loss=true"))["ref"] is RefWorker
    lora = plan("algorithm.use_kl_loss=true", "worker.actor.model.lora.rank=4")
    assert lora.reference == "policy_base" and role_classes(lora)["ref"] is PolicyWorker
    full = plan("algorithm.use_kl_loss=true", "algorithm.kl_penalty=full")
    assert full.reference == "in_update" and "ref" not in role_classes(full) and "ref" not in full.phases()


def test_critic_baseline_and_sampling_temperature():
    gae = plan("algorithm.adv_estimator=gae")
    assert gae.critic and role_classes(gae)["critic"] is CriticWorker
    assert gae.phases().index("values") < gae.phases().index("adv") < gae.phases().index("update_critic")
    assert "baseline" in plan("algorithm.adv_estimator=remax").phases()
    assert plan("worker.rollout.temperature=0.7").logprob_temperature == 0.7


def test_asynchronous_plan_says_its_bound():
    p = plan("algorithm.async_grpo.enabled=true", "algorithm.async_grpo.max_trajectory_age_steps=2")
    assert p.asynchronous and p.max_age == 2 and "asynchronous, max age 2" in p.summary()
    assert p.to_dict()["phases"] == p.phases()


def test_the_plan_holds_the_algorithms_parameters_as_the_config_chooses_them(tiny_model_dir):
    """One place turns `algorithm` and `worker.actor` into the advantages' and the loss's parameters:
    the plan, which the trainer and the policy worker read and step_plan.json shows."""
    import json

    from rlstack.algos.kl import KLPenalty
    from rlstack.algos.policy_loss import LossAggMode, PolicyLoss, RolloutCorrection
    from rlstack.workers.roles import build_roles

    p = plan(
        "worker.actor.loss_type=gspo",
        "worker.actor.clip_ratio_high=0.3",
        "worker.actor.rollout_correction=tis",
        "algorithm.use_kl_loss=true",
        "algorithm.kl_coef=0.02",
        "algorithm.norm_adv_by_std_in_grpo=false",
    )
    loss, adv = p.actor_loss, p.advantages
    assert (loss.loss_type, loss.agg_mode, loss.policy.clip_ratio_high) == (
        PolicyLoss.GSPO,
        LossAggMode.SEQ_MEAN_TOKEN_MEAN,  # the mode GSPO is defined with
        0.3,
    )
    assert (loss.rollout_correction, loss.kl_penalty, loss.kl_coef) == (
        RolloutCorrection.TIS,
        KLPenalty("low_var_kl"),
        0.02,
    )
    assert adv.kl_in_reward is None and adv.adaptive_kl is None and not adv.advantage.norm_adv_by_std_in_grpo
    in_reward = plan(
        "algorithm.use_kl_in_reward=true", "algorithm.kl_type=adaptive", "algorithm.kl_penalty=kl"
    )
    assert in_reward.advantages.kl_in_reward == KLPenalty.KL and in_reward.advantages.adaptive_kl is not None
    assert in_reward.actor_loss.kl_penalty is None  # the KL is in the reward, not the loss
    shown = json.loads(json.dumps(p.to_dict()))
    assert (
        shown["actor_loss"]["loss_type"] == "gspo" and shown["actor_loss"]["policy"]["clip_ratio_high"] == 0.3
    )
    assert shown["advantages"]["estimator"] == "grpo"
    cfg = load_config(
        [*BASE, "worker.actor.loss_type=cispo", f"worker.actor.model.model_path={tiny_model_dir}"]
    )
    roles = build_roles(cfg, StepPlan.of(cfg), total_steps=1, device="cpu")
    assert roles["actor"].loss.loss_type == PolicyLoss.CISPO  # the worker is handed the plan's record
