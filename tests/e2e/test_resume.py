"""Resume that never lies: a rerun of a run directory with other settings stops at load and lists them,
unless they may change on resume or `trainer.resume_mode=accept_changes`; then the new settings are the
ones trained with, `config.yaml` holds them and `config_history.jsonl` records the change."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from e2e_runs import _metrics, _overrides

from rlstack.config import ConfigError, load_config
from rlstack.resume import Change, changes
from rlstack.trainer import Trainer

SHORT = ("data.val_files=", "trainer.val_before_train=false", "worker.actor.optim.lr=1e-5")


def _run(model: Path, out: Path, *extra: str) -> Trainer:
    trainer = Trainer(load_config(_overrides(model, out, *SHORT, *extra)))
    trainer.fit()
    return trainer


def _history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "config_history.jsonl").read_text().splitlines()]


def test_a_rerun_with_another_lr_stops_at_load_listing_the_change(tiny_model_dir: Path, tmp_path: Path):
    first = _run(tiny_model_dir, tmp_path, "trainer.max_steps=2")
    saved = (first.run_dir / "config.yaml").read_text()
    cfg = load_config(
        _overrides(tiny_model_dir, tmp_path, *SHORT, "trainer.max_steps=3", "worker.actor.optim.lr=5e-4")
    )
    with pytest.raises(ConfigError) as e:
        Trainer(cfg)
    text = str(e.value)
    assert "worker.actor.optim.lr: 1e-05 -> 0.0005" in text
    assert "checkpoints/global_step_2" in text
    assert "trainer.experiment_name=" in text and "trainer.resume_mode=accept_changes" in text
    assert "trainer.max_steps" not in text  # it may change on resume: not a reason to stop
    assert (first.run_dir / "config.yaml").read_text() == saved  # nothing rewritten
    assert not (first.run_dir / "config_history.jsonl").exists()


def test_the_cli_says_it_in_one_message_without_a_traceback(tiny_model_dir: Path, tmp_path: Path):
    _run(tiny_model_dir, tmp_path, "trainer.max_steps=1")
    args = _overrides(tiny_model_dir, tmp_path, *SHORT, "trainer.max_steps=2", "worker.rollout.n=2")
    proc = subprocess.run(
        [sys.executable, "-m", "rlstack", "train", *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2
    assert "worker.rollout.n: 4 -> 2" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_accepted_changes_are_trained_with_and_recorded(tiny_model_dir: Path, tmp_path: Path):
    first = _run(tiny_model_dir, tmp_path, "trainer.max_steps=2")
    assert _metrics(first.run_dir)[2]["actor/lr"] == pytest.approx(1e-5)
    resumed = _run(
        tiny_model_dir,
        tmp_path,
        "trainer.max_steps=3",
        "worker.actor.optim.lr=5e-4",
        "trainer.resume_mode=accept_changes",
    )
    assert resumed.step == 3
    metrics = _metrics(resumed.run_dir)
    assert metrics[3]["actor/lr"] == pytest.approx(5e-4)  # the new rate, not the checkpoint's
    optimizer = resumed.groups["actor"].worker.optimizer
    assert all(g["lr"] == pytest.approx(5e-4) for g in optimizer.param_groups)
    saved = yaml.safe_load((resumed.run_dir / "config.yaml").read_text())
    assert saved["worker"]["actor"]["optim"]["lr"] == 5e-4
    [line] = _history(resumed.run_dir)
    assert line["step"] == 2 and line["resume_mode"] == "accept_changes"
    assert line["changes"] == {"worker.actor.optim.lr": [1e-5, 5e-4], "trainer.max_steps": [2, 3]}
    assert line["checkpoint"].endswith("global_step_2")
    # the checkpoint of step 3 holds the settings it was trained with: the next rerun compares with them
    assert yaml.safe_load((resumed.run_dir / "checkpoints/global_step_3/config.yaml").read_text()) == saved


def test_keys_that_may_change_resume_and_are_listed(tiny_model_dir: Path, tmp_path: Path, capsys):
    _run(tiny_model_dir, tmp_path, "trainer.max_steps=1")
    resumed = _run(tiny_model_dir, tmp_path, "trainer.max_steps=2", "trainer.save_freq=1")
    assert resumed.step == 2
    out = capsys.readouterr().out
    assert "trainer.max_steps: 1 -> 2  (may change on resume)" in out
    [line] = _history(resumed.run_dir)
    assert line["changes"] == {"trainer.max_steps": [1, 2], "trainer.save_freq": [-1, 1]}
    assert line["resume_mode"] == "strict"


def test_the_same_command_resumes_without_a_history_line(tiny_model_dir: Path, tmp_path: Path):
    _run(tiny_model_dir, tmp_path, "trainer.max_steps=1", "trainer.save_freq=1")
    again = _run(tiny_model_dir, tmp_path, "trainer.max_steps=1", "trainer.save_freq=1")
    assert again.step == 1
    assert not (again.run_dir / "config_history.jsonl").exists()


def test_changes_compare_leaves_skip_keys_an_older_config_lacks_and_hide_secrets(tmp_path: Path):
    cfg = load_config(["worker.reward.judge.api_key=sk-new", "worker.actor.optim.lr=2e-6"])
    saved = yaml.safe_load(
        "worker:\n  actor:\n    optim: {lr: 1.0e-06, betas: [0.9, 0.999]}\n"
        "  reward:\n    judge: {api_key: sk-old}\ntrainer: {max_steps: 5}\n"
    )
    found = {c.key: c for c in changes(saved, cfg)}
    # the key saved in the clear (before rlstack masked secrets) and the new one are both *** when compared
    assert set(found) == {"worker.actor.optim.lr", "trainer.max_steps"}
    assert not found["worker.actor.optim.lr"].free and found["trainer.max_steps"].free
    assert str(Change("worker.reward.judge.api_key", "sk-old", "sk-new", True)).count("***") == 2
    assert (
        str(Change("worker.reward.judge.api_key", "***", "", True))
        == 'worker.reward.judge.api_key: "***" -> ""'
    )
    assert str(Change("trainer.env_vars", {"A": "x"}, {"A": "y"}, True)) == 'trainer.env_vars: "***" -> "***"'
    assert str(Change("a.b", [1, 2], None, False)) == "a.b: [1, 2] -> null"


def test_a_load_checkpoint_path_that_is_no_checkpoint_is_a_config_problem(
    tiny_model_dir: Path, tmp_path: Path
):
    cfg = load_config(_overrides(tiny_model_dir, tmp_path, f"trainer.load_checkpoint_path={tmp_path}"))
    with pytest.raises(ConfigError, match=r"no trainer_state.pt"):
        Trainer(cfg)


def test_a_checkpoint_the_other_command_wrote_is_refused_at_load(tiny_model_dir: Path, tmp_path: Path):
    from rlstack.sft import run_sft

    args = _overrides(
        tiny_model_dir, tmp_path, *SHORT, "trainer.max_steps=1", "trainer.experiment_name=sft_then_rl"
    )
    run_sft(load_config(args))  # its name ends with sft: the SFT run keeps it
    with pytest.raises(ConfigError, match=r"which `rlstack sft` wrote, and this is `rlstack train`"):
        Trainer(load_config(args))


def test_a_one_process_checkpoint_is_refused_on_several_ranks_at_load(tiny_model_dir: Path, tmp_path: Path):
    _run(tiny_model_dir, tmp_path, "trainer.max_steps=1")
    cfg = load_config(
        _overrides(
            tiny_model_dir,
            tmp_path,
            *SHORT,
            "trainer.max_steps=2",
            "trainer.backend=ray",
            "trainer.n_gpus_per_node=2",
        )
    )
    with pytest.raises(ConfigError, match=r"which a one-process run wrote \(no actor_dcp/\)"):
        Trainer(cfg)


def test_going_on_from_an_earlier_checkpoint_says_which_later_ones_it_replaces(
    tiny_model_dir: Path, tmp_path: Path, capsys
):
    first = _run(tiny_model_dir, tmp_path, "trainer.max_steps=2", "trainer.save_freq=1")
    early = first.run_dir / "checkpoints" / "global_step_1"
    capsys.readouterr()
    _run(
        tiny_model_dir,
        tmp_path,
        "trainer.max_steps=2",
        "trainer.save_freq=1",
        f"trainer.load_checkpoint_path={early}",
    )
    out = capsys.readouterr().out
    assert (
        "also holds global_step_2, from after step 1: this run goes on from step 1 and replaces them" in out
    )
    steps = [json.loads(line)["step"] for line in (first.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps.count(2) == 1  # the step-2 row of the first run replaced, not doubled
    # a refused resume from a named checkpoint: a new experiment name alone would resume from it again
    with pytest.raises(
        ConfigError, match="drop trainer.load_checkpoint_path and give it a trainer.experiment_name"
    ):
        Trainer(
            load_config(
                _overrides(
                    tiny_model_dir,
                    tmp_path,
                    *SHORT,
                    "worker.actor.optim.lr=1e-3",
                    f"trainer.load_checkpoint_path={early}",
                )
            )
        )
