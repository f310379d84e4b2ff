"""A run end to end on the tiny model: the run directory, metrics, resume after a kill, a NaN stop, seeds, validation only, clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from e2e_runs import (
    _deterministic,
    _metrics,
    _overrides,
    _two_steps,
)

from rlstack.config import load_config
from rlstack.trainer import Trainer

REQUIRED_METRICS = [
    "critic/score/mean",
    "critic/advantages/mean",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    "response_length/mean",
    "response_length/clip_ratio",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/adv",
    "timing_s/update_actor",
    "timing_s/step",
    "perf/throughput",
    "perf/max_rss_gb",
    "reward/overall",
    "reward/accuracy",
]


@pytest.mark.slow
def test_three_step_run_writes_the_whole_run_directory(tiny_model_dir: Path, tmp_path: Path):
    start = time.perf_counter()
    cfg = load_config(_overrides(tiny_model_dir, tmp_path, "trainer.max_steps=3", "trainer.val_freq=2"))
    last = Trainer(cfg).fit()
    assert time.perf_counter() - start < 60

    run = cfg.run_dir
    metrics = _metrics(run)
    assert sorted(metrics) == [0, 1, 2, 3]  # validation before training, then three steps
    for name in REQUIRED_METRICS:
        assert name in metrics[3], name
    assert "val/addition/accuracy" in metrics[0] and "val/reward_score" in metrics[0]
    # the exact-match reward's one component, averaged as the score is (no penalties here)
    assert metrics[0]["val/reward/overall"] == pytest.approx(metrics[0]["val/reward_score"])
    assert "val/addition/accuracy" in metrics[2] and "val/addition/accuracy" not in metrics[1]
    assert last["actor/lr"] == pytest.approx(1e-3)
    assert 0 < metrics[3]["response_length/mean"] <= 6

    glossary = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    logged = {k for row in metrics.values() for k in row if k != "step"}
    for name in logged:
        generic = name.replace("reward/accuracy", "reward/<key>").replace("reward/overall", "reward/<key>")
        generic = generic.replace("val/addition/", "val/<data_source>/")
        assert f"`{generic}`" in glossary, f"{name} is logged but not described in docs/metrics.md"

    assert (run / "config.yaml").read_text().count("rollout_batch_size: 4") == 1
    gens = [
        json.loads(line) for line in (run / "generations" / "train_step_1.jsonl").read_text().splitlines()
    ]
    assert {"prompt", "response", "ground_truth", "score"} <= set(gens[0])
    assert any(f.name.startswith("events.out.tfevents") for f in (run / "tensorboard").iterdir())
    assert (run / "checkpoints" / "global_step_3" / "trainer_state.pt").is_file()

    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(run / "huggingface")
    ckpt = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "global_step_3" / "model")
    for (name, a), (_, b) in zip(final.state_dict().items(), ckpt.state_dict().items()):
        assert torch.equal(a, b), name
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not torch.equal(base.model.embed_tokens.weight, final.model.embed_tokens.weight)


def _train_cmd(model: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rlstack", "train", *_overrides(model, out, *extra)]


SLOW_REWARD = """
import time
REWARD_TYPE = "batch"

def compute_score(reward_inputs):
    time.sleep(0.4)
    return [{"overall": float(x["response"].strip() == str(x["ground_truth"])), "len": len(x["response"])}
            for x in reward_inputs]
"""


@pytest.mark.slow
def test_kill_and_resume_matches_an_uninterrupted_run(tiny_model_dir: Path, tmp_path: Path):
    reward = tmp_path / "slow_reward.py"
    reward.write_text(SLOW_REWARD)
    common = (
        "trainer.max_steps=5",
        "trainer.save_freq=2",
        "trainer.save_limit=-1",
        "trainer.val_before_train=false",
        "data.val_files=",
        f"worker.reward.reward_function={reward}:compute_score",
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    straight = tmp_path / "straight"  # beside the run that is killed
    log = tmp_path / "straight.log"
    with log.open("w") as f:
        uninterrupted = subprocess.Popen(
            _train_cmd(tiny_model_dir, straight, *common), env=env, stdout=f, stderr=f
        )

    resumed = tmp_path / "resumed"
    run_dir = resumed / "rlstack" / "default"
    proc = None
    try:
        proc = subprocess.Popen(
            _train_cmd(tiny_model_dir, resumed, *common),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 120
        while not (run_dir / "checkpoints" / "global_step_2").is_dir():
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.time() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not (run_dir / "checkpoints" / "global_step_4").exists()

        out = subprocess.run(
            _train_cmd(tiny_model_dir, resumed, *common), check=True, env=env, capture_output=True, text=True
        )
        assert "resumed from" in out.stdout and "global_step_2" in out.stdout
        assert uninterrupted.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:  # no run left behind by a failed check
        for p in (uninterrupted, proc):
            if p is not None and p.poll() is None:
                p.kill()

    a, b = _metrics(straight / "rlstack" / "default"), _metrics(run_dir)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5]  # no step logged twice after the kill
    for step in (3, 4, 5):
        assert _deterministic(a[step]) == _deterministic(b[step]), step


def test_a_kill_during_save_never_leaves_a_broken_latest_checkpoint(tmp_path: Path):
    from rlstack.checkpoint import latest_checkpoint, save_atomically

    root = tmp_path / "checkpoints"
    save_atomically(root, 1, lambda p: (p / "state").write_text("ok"), keep=2)

    def crash(p: Path) -> None:
        (p / "state").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_atomically(root, 2, crash, keep=2)
    assert latest_checkpoint(root) == root / "global_step_1"
    save_atomically(root, 3, lambda p: (p / "state").write_text("ok"), keep=2)
    assert not list(root.glob(".tmp*"))  # the leftover of the crashed save is gone
    save_atomically(root, 4, lambda p: (p / "state").write_text("ok"), keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["global_step_3", "global_step_4"]


def test_the_checkpoints_kept_are_the_best_by_the_metric_and_the_newest(tmp_path: Path):
    """trainer.save_best_metric (NeMo RL's keep_top_k with metric_name): the `keep` best, ties to the newer,
    a checkpoint without the metric last, and the newest always (a resume starts there)."""
    from rlstack.checkpoint import checkpoint_metrics, save_atomically

    values = {1: 0.2, 2: 0.9, 3: None, 4: 0.9, 5: 0.5, 6: 0.1}
    for mode, kept in (("max", [2, 4, 5, 6]), ("min", [1, 6])):
        root = tmp_path / mode / "checkpoints"
        for step, value in values.items():
            metrics = {"step": step} if value is None else {"step": step, "val/acc": value}
            keep = 3 if mode == "max" else 2
            save_atomically(
                root, step, lambda p: (p / "state").write_text("ok"), keep, metrics, ("val/acc", mode)
            )
        assert sorted(int(p.name.split("_")[-1]) for p in root.iterdir()) == kept, mode
        assert checkpoint_metrics(root / "global_step_6") == {"step": 6, "val/acc": 0.1}
    root = tmp_path / "earlier" / "checkpoints"  # a run that went on from an earlier step keeps what it saves
    for step in (5, 6, 3):
        save_atomically(
            root, step, lambda p: (p / "state").write_text("ok"), 1, {"val/acc": 0.0}, ("val/acc", "max")
        )
    assert (root / "global_step_3").is_dir()
    root = tmp_path / "newest" / "checkpoints"  # without a metric: the newest `keep`, as before
    for step in range(1, 5):
        save_atomically(root, step, lambda p: (p / "state").write_text("ok"), 2, {"val/acc": 1.0 / step})
    assert sorted(p.name for p in root.iterdir()) == ["global_step_3", "global_step_4"]


@pytest.mark.slow
def test_a_run_keeps_its_best_checkpoints_by_a_validation_metric(tiny_model_dir: Path, tmp_path: Path):
    common = ["trainer.max_steps=4", "trainer.save_freq=1", "trainer.val_freq=1", "trainer.save_limit=1"]
    common += ["trainer.val_before_train=false", "trainer.save_best_metric=val/response_length/mean"]
    cfg = load_config(_overrides(tiny_model_dir, tmp_path, *common, "trainer.save_best_mode=min"))
    Trainer(cfg).fit()
    rows = _metrics(cfg.run_dir)
    ckpts = {int(p.name.split("_")[-1]): p for p in (cfg.run_dir / "checkpoints").glob("global_step_*")}
    best = min(range(1, 5), key=lambda s: (rows[s]["val/response_length/mean"], -s))
    assert sorted(ckpts) == sorted({best, 4})
    for step, path in ckpts.items():
        assert (
            json.loads((path / "metrics.json").read_text())["val/response_length/mean"]
            == rows[step]["val/response_length/mean"]
        )
    # a checkpoint at a step without validation would have no such metric: refused at load
    with pytest.raises(Exception, match="set trainer.val_freq to a divisor of save_freq"):
        load_config(
            _overrides(tiny_model_dir, tmp_path, *common, "trainer.val_freq=2", "trainer.save_freq=3")
        )


NAN_AFTER_FIRST_STEP = """
CALLS = []

def compute_score(reward_inputs):
    CALLS.append(1)
    value = 1.0 if len(CALLS) == 1 else float("nan")
    return [{"overall": value} for _ in reward_inputs]
"""


@pytest.mark.slow
def test_a_nan_loss_stops_the_run_with_a_message_and_keeps_the_last_good_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
):
    reward = tmp_path / "nan_reward.py"
    reward.write_text(NAN_AFTER_FIRST_STEP)
    cmd = _train_cmd(
        tiny_model_dir,
        tmp_path,
        "trainer.max_steps=4",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        "data.val_files=",
        f"worker.reward.reward_function={reward}:compute_score",
    )
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 1
    assert "TrainingDiverged" in out.stderr and "step 2" in out.stderr and "Traceback" not in out.stderr
    ckpts = sorted(p.name for p in (tmp_path / "rlstack" / "default" / "checkpoints").iterdir())
    assert ckpts == ["global_step_1"]


def test_same_config_and_seed_give_the_same_metrics(tiny_model_dir: Path, tmp_path: Path, monkeypatch):
    """Twice the same seeded run, then once more with `trainer.full_determinism` (deterministic kernels
    only, which the CPU path already is): the same metrics every time."""
    for name in ("CUBLAS_WORKSPACE_CONFIG", "FLASH_ATTENTION_DETERMINISTIC"):  # unset again afterwards
        monkeypatch.delenv(name, raising=False)
    runs = []
    try:
        for name, extra in (("a", ()), ("b", ()), ("c", ("trainer.full_determinism=true",))):
            runs.append(_two_steps(tiny_model_dir, tmp_path / name, *extra))
            assert torch.are_deterministic_algorithms_enabled() == bool(extra)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
    first = [_deterministic(r) for r in runs[0].values()]
    assert first == [_deterministic(r) for r in runs[1].values()]
    assert first == [_deterministic(r) for r in runs[2].values()]


def test_the_example_config_and_reward_function_load_and_score(monkeypatch):
    from rlstack.rewards.loader import load_reward_function

    root = Path(__file__).parents[2]
    monkeypatch.chdir(root)
    cfg = load_config(["config=examples/grpo_addition.yaml"])
    assert cfg.worker.rollout.n == 8 and cfg.data.rollout_batch_size == 32
    fn = load_reward_function(cfg.worker.reward.reward_function)
    out = fn.fn(
        [
            {"response": "57", "ground_truth": "57"},
            {"response": "47", "ground_truth": "57"},
            {"response": "", "ground_truth": "5"},
        ]
    )
    assert out == [
        {"overall": 1.0, "accuracy": 1.0, "digits": 1.0},
        {"overall": 0.0, "accuracy": 0.0, "digits": 0.5},
        {"overall": 0.0, "accuracy": 0.0, "digits": 0.0},
    ]


def test_no_reference_model_without_kl(tiny_model_dir: Path, tmp_path: Path):
    trainer = Trainer(load_config(_overrides(tiny_model_dir, tmp_path, "trainer.max_steps=1")))
    assert trainer.ref is None and not trainer.plan.old_logprobs


def test_wandb_without_the_package_is_a_clear_error(tmp_path: Path, monkeypatch):
    import importlib

    from rlstack.errors import RLStackError
    from rlstack.tracking import Tracker

    real_import_module = importlib.import_module

    def no_wandb(name, *args, **kwargs):  # what a machine without the package sees
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import_module(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_wandb)
    with pytest.raises(RLStackError, match=r"rlstack\[wandb\]"):
        Tracker(tmp_path, ["wandb"], {}, "p", "e", total_steps=1)


def test_val_only_validates_the_resumed_checkpoint(tiny_model_dir: Path, tmp_path: Path):
    from transformers import AutoModelForCausalLM

    Trainer(load_config(_overrides(tiny_model_dir, tmp_path, "trainer.max_steps=1"))).fit()
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "rlstack" / "default" / "huggingface")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not torch.equal(trained.model.embed_tokens.weight, base.model.embed_tokens.weight)

    trainer = Trainer(load_config(_overrides(tiny_model_dir, tmp_path, "trainer.val_only=true")))
    metrics = trainer.fit()
    assert "val/addition/accuracy" in metrics and trainer.step == 1
    # the validated weights are the checkpoint's, not the base model's
    assert torch.equal(
        trainer.groups["actor"].worker.model.model.embed_tokens.weight, trained.model.embed_tokens.weight
    )


def test_resuming_a_checkpoint_of_another_model_is_one_clear_message(tiny_model_dir: Path, tmp_path: Path):
    from rlstack.models.loading import write_model_dir

    Trainer(load_config(_overrides(tiny_model_dir, tmp_path, "trainer.max_steps=1"))).fit()
    wider = write_model_dir(tmp_path / "wider", hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
    # at load, from the configs: another model_path is a change a resume may not make
    with pytest.raises(ValueError, match=r"worker.actor.model.model_path: .* -> .*wider"):
        Trainer(load_config(_overrides(wider, tmp_path, "trainer.max_steps=2")))
    # accepted, the checkpoint's weights still have to fit the model
    accept = ("trainer.max_steps=2", "trainer.resume_mode=accept_changes")
    trainer = Trainer(load_config(_overrides(wider, tmp_path, *accept)))
    with pytest.raises(ValueError, match=r"holds a different model .*hidden_size 32 vs 64"):
        trainer.fit()
