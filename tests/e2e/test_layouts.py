"""Memory-saving layouts train exactly like the plain one: gradient checkpointing, padding-free dynamic batches, LoRA (sync, checkpoints, resume); validation leaves training untouched; out-of-memory messages name what to lower."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from digits_run import digits_run
from e2e_runs import (
    _deterministic,
    _digits_reward,
    _metrics,
    _overrides,
    _two_steps,
)

from rlstack.config import load_config
from rlstack.trainer import Trainer


def test_gradient_checkpointing_gives_the_same_update(tiny_model_dir: Path, tmp_path: Path):
    runs = []
    for name, flag in (("plain", "false"), ("checkpointed", "true")):
        cfg = load_config(
            _overrides(
                tiny_model_dir,
                tmp_path / name,
                "trainer.max_steps=1",
                "data.val_files=",
                "trainer.logger=[file]",
                "trainer.save_model_only=true",
                _digits_reward(tmp_path),
                f"worker.actor.model.enable_gradient_checkpointing={flag}",
            )
        )
        trainer = Trainer(cfg)
        assert trainer.groups["actor"].worker.model.is_gradient_checkpointing == (flag == "true")
        trainer.fit()
        runs.append(_metrics(cfg.run_dir)[1])
    assert runs[0]["actor/grad_norm"] > 0
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/ppo_kl"):
        assert runs[0][key] == pytest.approx(runs[1][key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize(
    "extra",
    [
        ("algorithm.use_kl_loss=true", "algorithm.kl_penalty=low_var_kl"),  # the reference worker too
        (  # the critic too
            "algorithm.adv_estimator=gae",
            "worker.critic.global_batch_size=4",
            "worker.critic.micro_batch_size_per_device_for_update=4",
        ),
    ],
    ids=["grpo-kl", "gae"],
)
def test_padding_free_dynamic_batches_give_the_padded_step(tiny_model_dir: Path, tmp_path: Path, extra):
    """One seeded training step (its log-probs, KL, values, losses and gradient norms) does not depend on
    how the micro-batches are laid out and cut."""
    runs = []
    for name, layout in (
        ("padded", ()),
        (
            "packed",
            (
                "worker.actor.padding_free=true",
                "worker.actor.dynamic_batching=true",
                "worker.actor.max_token_len_per_device_for_update=80",
                "worker.actor.max_token_len_per_device_for_experience=80",
                "worker.ref.max_token_len_per_device_for_experience=80",
                "worker.critic.padding_free=true",
                "worker.critic.dynamic_batching=true",
                "worker.critic.max_token_len_per_device_for_update=80",
                "worker.critic.max_token_len_per_device_for_experience=80",
            ),
        ),
    ):
        runs.append(
            _two_steps(
                tiny_model_dir,
                tmp_path / name,
                "trainer.max_steps=1",
                _digits_reward(tmp_path),
                *extra,
                *layout,
            )[1]
        )
    padded, packed = (_deterministic(r) for r in runs)
    assert padded["actor/grad_norm"] > 0 and set(padded) == set(packed)
    for key in padded:
        assert packed[key] == pytest.approx(padded[key], rel=1e-4, abs=1e-5), key


@pytest.mark.slow
def test_a_lora_run_syncs_merged_weights_checkpoints_adapters_and_resumes(
    tiny_model_dir: Path, tmp_path: Path
):
    """LoRA through the trainer: the reference is the base (KL loss), a rollout engine with its own copy
    (asynchronous GRPO) gets the merged weights and passes the stale-weight check, checkpoints hold the
    adapters only, and a resumed run continues as the uninterrupted one."""
    args = (
        "trainer.val_before_train=false",
        "data.val_files=",
        "trainer.logger=[file]",
        "trainer.max_steps=3",
        "trainer.save_freq=1",
        "trainer.save_limit=-1",
        _digits_reward(tmp_path),
        "worker.actor.model.lora.rank=8",
        "worker.actor.model.lora.alpha=16",
        "worker.actor.optim.lr=2e-2",
        "algorithm.use_kl_loss=true",
        "algorithm.kl_penalty=low_var_kl",
        "algorithm.async_grpo.enabled=true",
        "algorithm.async_grpo.max_trajectory_age_steps=0",
        "worker.rollout.check_weight_sync=true",
    )
    cfg = load_config(_overrides(tiny_model_dir, tmp_path / "straight", *args))
    trainer = Trainer(cfg)
    assert trainer.groups["ref"].worker is trainer.groups["actor"].worker  # no second copy of the model
    assert not trainer.groups["rollout"].worker.engine.capabilities.shares_policy_weights
    trainer.fit()
    straight = _metrics(cfg.run_dir)
    assert straight[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # the adapters start at zero
    assert straight[2]["actor/kl_loss"] > 1e-6
    assert all(straight[s]["rollout/weight_sync_max_diff"] < 1e-5 for s in (1, 2, 3))
    model_files = {f.name for f in (cfg.run_dir / "checkpoints" / "global_step_2" / "model").iterdir()}
    assert "adapter_model.safetensors" in model_files and "model.safetensors" not in model_files

    resumed = load_config(_overrides(tiny_model_dir, tmp_path / "resumed", *args))
    shutil.copytree(
        cfg.run_dir / "checkpoints" / "global_step_2", resumed.run_dir / "checkpoints" / "global_step_2"
    )
    Trainer(resumed).fit()
    again = _metrics(resumed.run_dir)
    assert sorted(again) == [3]
    assert _deterministic(again[3]) == _deterministic(straight[3])


@pytest.mark.parametrize("placement", ["local", pytest.param("ray_apart", marks=pytest.mark.long)])
def test_validation_leaves_training_as_it_was(tiny_model_dir: Path, tmp_path: Path, placement: str):
    """A run validated before every step trains exactly as one validated only at the end: validation draws
    from none of training's random streams and leaves the policy and the engine as it found them."""
    extra = ["data.val_files=builtin:addition@test", "data.val_max_samples=16"]
    if placement == "ray_apart":
        ray = pytest.importorskip("ray")
        extra += ["trainer.backend=ray", "worker.rollout.colocated=false"]
    runs = {}
    for name, val in (("often", ["trainer.val_freq=1"]), ("at_end", ["trainer.val_before_train=false"])):
        cfg = digits_run(tiny_model_dir, tmp_path, name, *extra, *val)
        if placement == "ray_apart":
            ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
        try:
            Trainer(cfg).fit()
        finally:
            if placement == "ray_apart":
                ray.shutdown()
        runs[name] = {
            step: {k: v for k, v in _deterministic(row).items() if not k.startswith("val/")}
            for step, row in _metrics(cfg.run_dir).items()
            if step > 0
        }
    assert runs["often"][3]["actor/grad_norm"] > 0
    assert runs["often"] == runs["at_end"]


@pytest.mark.parametrize("validate", [False, True])
def test_running_out_of_memory_while_generating_names_the_settings_to_lower(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch, validate: bool
):
    from rlstack.errors import OutOfMemory
    from rlstack.rollout import hf

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    overrides = ["trainer.max_steps=1", f"trainer.val_before_train={validate}", "data.val_batch_size=-1"]
    trainer = Trainer(load_config(_overrides(tiny_model_dir, tmp_path, *overrides)))
    monkeypatch.setattr(hf, "sample", out_of_memory)
    with pytest.raises(OutOfMemory) as e:
        trainer.fit()
    message = str(e.value)
    if validate:  # every validation prompt in one call (val_batch_size=-1), one response each
        assert message.startswith(
            f"out of memory generating {len(trainer.val_set)} prompts x 1 with the hf engine: "
        )
        assert (
            "lower data.val_batch_size (a positive number of prompts per call, not -1) or worker.rollout.val_n"
            in message
        )
    else:
        assert message.startswith("out of memory generating 4 prompts x 4 with the hf engine: ")
        assert "lower data.rollout_batch_size, worker.rollout.n or data.max_response_length" in message
    assert message.endswith("The device said: CUDA out of memory. Tried to allocate 9.00 GiB")
