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
