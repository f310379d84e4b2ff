"""The run loop `rlstack train`, `sft` and `eval` share (`rlstack/run_loop.py`), on the tiny model: a stop
request is honoured at the same point by each, and `trainer.max_steps` is the length of an RL run as of a
supervised one, past one epoch of the rows (the loader reshuffles each epoch and resumes where it was)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from e2e_runs import _metrics, _overrides

from rlstack.config import load_config
from rlstack.evaluate import EvalSettings, Evaluator
from rlstack.sft import SFTTrainer
from rlstack.stops import RunStopped
from rlstack.trainer import Trainer


def _rows(tmp_path: Path, count: int = 8) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(json.dumps({"problem": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(count))
    )
    return str(path)


def _cfg(model: Path, tmp_path: Path, *extra: str):
    """Eight rows, four a step: an epoch is two steps."""
    return load_config(
        _overrides(
            model,
            tmp_path / "out",
            f"data.train_files={_rows(tmp_path)}",
            "data.val_files=",
            "data.max_prompt_length=64",
            "worker.reward.reward_function=builtin:exact_match",
            "trainer.val_before_train=false",
            "trainer.logger=[file]",
            *extra,
        )
    )


@pytest.mark.parametrize("kind", [Trainer, SFTTrainer], ids=["train", "sft"])
def test_max_steps_past_one_epoch_is_the_length_of_the_run(tiny_model_dir: Path, tmp_path: Path, kind):
    cfg = _cfg(tiny_model_dir, tmp_path, "trainer.max_steps=5", "trainer.total_epochs=1")
    job = kind(cfg)
    assert job.total_steps == 5  # 2.5 epochs
    job.fit()
    assert sorted(_metrics(job.run_dir)) == [1, 2, 3, 4, 5]
    state = torch.load(job.run_dir / "checkpoints" / "global_step_5" / "trainer_state.pt", weights_only=False)
    assert state["loader"] == {"epoch": 2, "index": 1}  # the third pass over the rows, its first batch


def test_the_step_cap_ends_a_run_when_the_epochs_do_not(tiny_model_dir: Path, tmp_path: Path):
    cfg = _cfg(tiny_model_dir, tmp_path, "trainer.total_epochs=3", "trainer.step_cap=4")
    assert Trainer(cfg).total_steps == 4  # 6 steps in three epochs
    cfg = _cfg(tiny_model_dir, tmp_path, "trainer.total_epochs=1", "trainer.step_cap=4")
    assert Trainer(cfg).total_steps == 2  # one epoch ends it first


@pytest.mark.parametrize("kind", [Trainer, SFTTrainer], ids=["train", "sft"])
def test_a_stop_request_is_honoured_after_the_step_in_progress(tiny_model_dir: Path, tmp_path: Path, kind):
    class Signalled(kind):
        def train_step(self):
            metrics = super().train_step()
            if self.step == 2:  # Ctrl-C at the end of step 2's work: its validation, log and save still run
                os.kill(os.getpid(), signal.SIGINT)
            return metrics

    job = Signalled(_cfg(tiny_model_dir, tmp_path, "trainer.max_steps=4"))
    with pytest.raises(RunStopped) as stopped:
        job.fit()
    assert stopped.value.signum == signal.SIGINT
    assert str(stopped.value).startswith("stopped by SIGINT after step 2 of 4; checkpoint ")
    assert stopped.value.checkpoint == job.run_dir / "checkpoints" / "global_step_2"
    assert sorted(_metrics(job.run_dir)) == [1, 2]
    assert not (job.run_dir / "huggingface").exists()
    # the same command goes on from there
    resumed = kind(_cfg(tiny_model_dir, tmp_path, "trainer.max_steps=4"))
    resumed.fit()
    assert sorted(_metrics(job.run_dir)) == [1, 2, 3, 4]


def test_a_stop_request_stops_an_evaluation_at_once(tiny_model_dir: Path, tmp_path: Path):
    """An evaluation has nothing to save: a first signal stops it, with no eval.json half written."""

    class Signalled(Evaluator):
        def validate(self):
            os.kill(os.getpid(), signal.SIGINT)
            return super().validate()

    cfg = _cfg(tiny_model_dir, tmp_path)
    with pytest.raises(RunStopped, match="evaluation stopped by SIGINT; nothing written") as stop:
        Signalled(cfg, EvalSettings([_rows(tmp_path)])).run()
    assert stop.value.signum == signal.SIGINT
    assert not (tmp_path / "out" / "rlstack" / "default_eval" / "eval.json").exists()
