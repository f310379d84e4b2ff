"""Each algorithm option trains end to end on the tiny model: off-policy mini-batches, KL losses and in-reward KL, every advantage estimator and policy loss, overlong punishment, rollout corrections, the exact KL."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from config_files import EASYR1_RUN
from e2e_runs import (
    PARITY_REWARD,
    _metrics,
    _overrides,
    _two_steps,
)

from rlstack.algos.advantages import AdvEstimator
from rlstack.config import load_config
from rlstack.trainer import Trainer


@pytest.mark.slow
def test_off_policy_mini_batches_and_kl_loss(tiny_model_dir: Path, tmp_path: Path):
    """Two mini-batches and two epochs: old log-probs are computed and ratios move off 1; KL uses a reference."""
    cfg = load_config(
        _overrides(
            tiny_model_dir,
            tmp_path,
            "trainer.max_steps=2",
            "trainer.val_before_train=false",
            "data.val_files=",
            "trainer.save_model_only=true",
            "worker.actor.global_batch_size=2",
            "worker.actor.ppo_epochs=2",
            "worker.actor.micro_batch_size_per_device_for_update=4",
            "worker.actor.optim.lr=1e-2",
            "algorithm.use_kl_loss=true",
            "algorithm.kl_coef=0.1",
        )
    )
    trainer = Trainer(cfg)
    assert trainer.plan.old_logprobs and trainer.ref is not None
    trainer.fit()
    m = _metrics(cfg.run_dir)
    assert "timing_s/old" in m[1] and "timing_s/ref" in m[1]
    # the plan written beside the config names exactly the phases the step timed
    plan = json.loads((cfg.run_dir / "step_plan.json").read_text())
    assert plan["old_logprobs"] and plan["reference"] == "worker"
    timed = {k.removeprefix("timing_s/") for k in m[1] if k.startswith("timing_s/")} - {"step"}
    assert timed == set(plan["phases"])
    assert m[2]["actor/ppo_kl"] != 0.0  # later mini-batches see weights moved by earlier ones
    assert m[2]["actor/kl_loss"] > 0.0 and m[2]["actor/kl_coef"] == 0.1


ESTIMATORS = [e.value for e in AdvEstimator]
LOSSES = [  # None: loss_agg_mode unset, the loss's own mode (seq-mean-token-mean) is used
    ("vanilla", "token-mean"),
    ("gspo", None),
    ("gspo_token", "seq-mean-token-mean"),
    ("cispo", "seq-mean-token-sum-norm"),
    ("sapo", None),
]


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_two_steps_with_each_advantage_estimator(tiny_model_dir: Path, tmp_path: Path, estimator: str):
    m = _two_steps(
        tiny_model_dir,
        tmp_path,
        f"algorithm.adv_estimator={estimator}",
        "worker.critic.global_batch_size=4",
        "worker.critic.micro_batch_size_per_device_for_update=8",
    )
    for step in (1, 2):
        assert math.isfinite(m[step]["actor/pg_loss"]) and math.isfinite(m[step]["critic/advantages/mean"])
    if estimator == "gae":
        assert {
            "critic/vf_loss",
            "critic/vf_explained_var",
            "timing_s/values",
            "timing_s/update_critic",
        } <= set(m[2])
    if estimator == "remax":
        assert "timing_s/baseline" in m[2]


@pytest.mark.slow
@pytest.mark.parametrize(("loss", "agg"), LOSSES)
def test_two_steps_with_each_policy_loss(tiny_model_dir: Path, tmp_path: Path, loss: str, agg: str | None):
    m = _two_steps(
        tiny_model_dir,
        tmp_path,
        f"worker.actor.loss_type={loss}",
        *([f"worker.actor.loss_agg_mode={agg}"] if agg else []),
        "worker.actor.global_batch_size=2",  # two mini-batches: the second is off-policy
        "worker.actor.micro_batch_size_per_device_for_update=4",
    )
    assert math.isfinite(m[2]["actor/pg_loss"]) and m[2]["actor/ppo_kl"] != 0.0


@pytest.mark.slow
def test_in_reward_kl_with_the_adaptive_controller_and_critic_warmup(tiny_model_dir: Path, tmp_path: Path):
    m = _two_steps(
        tiny_model_dir,
        tmp_path,
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_type=adaptive",
        "algorithm.kl_coef=0.05",
        "algorithm.kl_penalty=kl",
        "trainer.critic_warmup=1",
        "worker.critic.global_batch_size=4",
        "worker.critic.micro_batch_size_per_device_for_update=8",
        "worker.actor.entropy_coeff=0.01",
    )
    assert "actor/pg_loss" not in m[1] and "critic/vf_loss" in m[1]  # step 1 trains only the critic
    assert "actor/pg_loss" in m[2]
    assert m[1]["actor/reward_kl_penalty_coeff"] == 0.05
    assert m[2]["actor/reward_kl_penalty_coeff"] != 0.05  # adapted after step 1


def test_in_reward_kl_reaches_grpo_advantages_in_the_trainer(tiny_model_dir: Path, tmp_path: Path):
    """Equal scores, different KL to the reference: GRPO's advantages must see the KL (veRL sums token rewards)."""
    from rlstack.batch import Batch

    cfg = load_config(
        _overrides(
            tiny_model_dir,
            tmp_path,
            "algorithm.use_kl_in_reward=true",
            "algorithm.kl_coef=0.5",
            "algorithm.kl_penalty=kl",
        )
    )
    trainer = Trainer(cfg)
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [0, 1, 0], [0, 1, 0]])
    batch = Batch(
        {
            "uid": ["a", "a", "b", "b"],
            "scores": torch.ones(4),
            "response_mask": mask,
            "old_logprobs": torch.zeros(4, 3),
            "ref_logprobs": torch.tensor(
                [[0.0, -0.4, -0.4], [0.0, 0.0, 0.0], [0.0, 0.0, -math.inf], [0.0, -1.0, 0.0]]
            ),
        }
    )
    metrics = trainer._advantages(batch)
    adv = batch["advantages"][:, 1]
    assert adv[0] < 0 < adv[1] and adv[3] < 0 < adv[2]  # the response with more KL gets the lower advantage
    assert batch["scores"].tolist() == [1.0] * 4  # the logged scores stay the reward function's
    assert metrics["actor/reward_kl_penalty"] == pytest.approx((0.4 + 0.0 + 0.0 + 1.0) / 4)


@pytest.mark.slow
def test_overlong_punishment_and_truncation_masking(tiny_model_dir: Path, tmp_path: Path):
    m = _two_steps(
        tiny_model_dir,
        tmp_path,
        "worker.reward.overlong_buffer_length=4",
        "worker.reward.overlong_penalty_factor=1.0",
        "algorithm.mask_truncated_responses=true",
    )
    # the random model mostly runs to the 6-token limit: penalty -1 there, -0.25 per token into the buffer
    assert -1.0 <= m[1]["reward/overlong"] < 0
    assert m[1]["critic/score/mean"] == pytest.approx(m[1]["reward/overall"] + m[1]["reward/overlong"])


@pytest.mark.slow
@pytest.mark.parametrize("correction", ["tis", "icepop", "seq-mask-tis"])
def test_rollout_corrections_and_high_entropy_selection_train(
    tiny_model_dir: Path, tmp_path: Path, correction: str
):
    m = _two_steps(
        tiny_model_dir,
        tmp_path,
        f"worker.actor.rollout_correction={correction}",
        "worker.actor.top_entropy_quantile=0.2",
        "worker.actor.global_batch_size=2",
        "worker.actor.micro_batch_size_per_device_for_update=4",
    )
    # the HF engine's numerics match the trainer's, so the weights sit at 1 (or 0 outside a band)
    assert 0.0 < m[2]["actor/rollout_correction_weight"] <= 1.0 + 1e-4
    assert math.isfinite(m[2]["actor/pg_loss"])


@pytest.mark.slow
def test_exact_full_kl_loss_uses_a_colocated_reference(tiny_model_dir: Path, tmp_path: Path):
    reward = tmp_path / "parity.py"
    reward.write_text(PARITY_REWARD)  # nonzero advantages, so the first update moves the policy
    cfg = load_config(
        _overrides(
            tiny_model_dir,
            tmp_path,
            "trainer.max_steps=2",
            "trainer.val_before_train=false",
            "data.val_files=",
            "trainer.logger=[file]",
            "trainer.save_model_only=true",
            "algorithm.use_kl_loss=true",
            "algorithm.kl_penalty=full",
            f"worker.reward.reward_function={reward}:compute_score",
        )
    )
    trainer = Trainer(cfg)
    assert trainer.ref is None and trainer.groups["actor"].worker.ref_model is not None
    trainer.fit()
    m = _metrics(cfg.run_dir)
    assert m[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # the policy starts as the reference
    assert m[2]["actor/kl_loss"] > 1e-6  # and moves away after one update


@pytest.mark.parametrize("use_kl_loss", [False, True])
def test_an_easyr1_config_puts_the_kl_where_easyr1_does(
    tiny_model_dir: Path, tmp_path: Path, use_kl_loss: bool
):
    """EasyR1 subtracts kl_coef x KL from the reward unless disable_kl or use_kl_loss: its file trains so."""
    path = tmp_path / "easyr1.yaml"
    path.write_text(
        "algorithm:\n  adv_estimator: grpo\n  disable_kl: false\n"
        f"  use_kl_loss: {str(use_kl_loss).lower()}\n  kl_penalty: low_var_kl\n  kl_coef: 0.05\n"
    )
    cfg = load_config([f"config={path}", *EASYR1_RUN])
    assert (cfg.algorithm.use_kl_in_reward, cfg.algorithm.use_kl_loss) == (not use_kl_loss, use_kl_loss)
    # left out, the in-reward KL takes EasyR1's own coefficient and estimator (rlstack's are a KL loss's)
    bare = tmp_path / "bare.yaml"
    bare.write_text("algorithm:\n  disable_kl: false\n")
    a = load_config([f"config={bare}", *EASYR1_RUN]).algorithm
    assert (a.use_kl_in_reward, a.kl_coef, a.kl_penalty) == (True, 1e-3, "kl")
    reward = tmp_path / "parity.py"
    reward.write_text(
        PARITY_REWARD
    )  # nonzero advantages: the first update moves the policy off the reference
    data = [a for a in EASYR1_RUN if a.startswith("data.")]
    m = _two_steps(
        tiny_model_dir,
        tmp_path / "run",
        f"config={path}",
        *data,
        f"worker.reward.reward_function={reward}:compute_score",
        "worker.actor.optim.lr=1e-2",
    )
    for step in (1, 2):
        if use_kl_loss:
            assert "actor/reward_kl_penalty" not in m[step] and "actor/kl_loss" in m[step]
        else:
            assert m[step]["actor/reward_kl_penalty_coeff"] == 0.05 and "actor/kl_loss" not in m[step]
    if not use_kl_loss:  # measured and subtracted: none while the policy is the reference, some once it moved
        assert m[1]["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-7)
        assert m[2]["actor/reward_kl_penalty"] > 1e-6


def test_vppo_entropy_tokens_take_the_policy_gradient_in_a_run(tiny_model_dir: Path, tmp_path: Path):
    """VPPO's `algorithm.use_vppo_on_entropy` (its train scripts set it, true or false): on a text model,
    the policy loss only on each response's top `top_p_entropy_tokens` by entropy; the same run
    without it has the same rollouts and advantages and another gradient."""
    reward = tmp_path / "parity.py"
    reward.write_text(PARITY_REWARD)  # nonzero advantages
    runs = {}
    for on in (False, True):
        runs[on] = _two_steps(
            tiny_model_dir,
            tmp_path / str(on),
            f"worker.reward.reward_function={reward}:compute_score",
            f"algorithm.use_vppo_on_entropy={on}",
            "algorithm.top_p_entropy_tokens=0.2",
        )[1]
    assert runs[True]["critic/advantages/max"] == runs[False]["critic/advantages/max"] != 0
    # a fifth of the tokens carry the gradient: the update's gradient is another
    assert runs[True]["actor/grad_norm"] != pytest.approx(runs[False]["actor/grad_norm"], rel=1e-3)


def test_cpu_offload_on_one_process_trains_like_the_plain_policy(tiny_model_dir: Path, tmp_path: Path):
    """EasyR1's offload_params on one GPU: FSDP2's CPU offload over a group of one process, the policy's
    shards, gradients and optimizer state in host memory; the same training as without it."""
    from rlstack.workers import distributed

    plain = _two_steps(tiny_model_dir, tmp_path / "plain")
    seen = {}
    real = distributed.shard_model

    def spy(model, device, param_dtype=None, offload=False):
        seen["offload"], seen["world"] = offload, distributed.current().world_size
        return real(model, device, param_dtype, offload)

    try:
        distributed.shard_model = spy
        offloaded = _two_steps(tiny_model_dir, tmp_path / "offload", "worker.actor.fsdp.offload_params=true")
        assert not distributed.sharded() and not torch.distributed.is_initialized()  # the run ended its group
    finally:
        distributed.shard_model = real
        distributed.close_alone_group()
    assert seen == {"offload": True, "world": 1}
    for step in (1, 2):
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"):
            assert offloaded[step][key] == pytest.approx(plain[step][key], abs=1e-4), (step, key)
