"""The run loop that `rlstack train`, `sft` and `eval` share (`rlstack/run_loop.py`), driven by a job that
does no work: the length of a run, the validation and checkpoint schedules, where a stop request is
honoured, and resuming a job's state."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
from pathlib import Path

import pytest
import torch

from rlstack.config import load_config
from rlstack.run_loop import RunLoop, length_note, run_length
from rlstack.stops import RunStopped, Stopped


class Job:
    """Records what the loop asks of it; `signal_at` sends this process SIGINT during that step (0: during
    the opening validation), as Ctrl-C would."""

    def __init__(self, loop: RunLoop, signal_at: int | None = None, validates: bool = True):
        self.loop, self.signal_at, self.validates = loop, signal_at, validates
        self.events: list[str] = []
        self.position = 0
        """What the job's state stands for (a data loader's position)."""

    def _maybe_signal(self) -> None:
        if self.signal_at == self.loop.step:
            os.kill(os.getpid(), signal.SIGINT)

    def train_step(self) -> dict[str, float]:
        self.events.append(f"step {self.loop.step}")
        self.position += 1
        self._maybe_signal()
        return {"draw": random.random()}

    def validate(self) -> dict[str, float]:
        self.events.append(f"validate {self.loop.step}")
        if self.loop.step == 0:
            self._maybe_signal()
        return {"val/score": float(self.loop.step)}

    @contextlib.contextmanager
    def held(self):
        yield {"position": self.position}

    def save_workers(self, path: Path) -> None:
        self.events.append(f"save {self.loop.step}")

    def load(self, path: Path, state: dict) -> None:
        self.events.append(f"load {path.name}")
        self.position = state["position"]

    def save_model(self, path: Path) -> None:
        self.events.append("model")

    def close(self) -> None:
        self.events.append("close")


def _cfg(tmp_path: Path, *overrides: str):
    return load_config(
        [f"trainer.output_dir={tmp_path}", "trainer.logger=[file]", "trainer.num_threads=1", *overrides]
    )


def _steps(loop: RunLoop) -> list[int]:
    return [json.loads(line)["step"] for line in (loop.run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("overrides", "per_epoch", "steps"),
    [
        ((), 4, 4),  # one epoch
        (("trainer.total_epochs=3",), 4, 12),
        (("trainer.max_steps=10",), 4, 10),  # the length, past one epoch (EasyR1, TRL)
        (("trainer.max_steps=3", "trainer.total_epochs=5"), 4, 3),  # the epochs ignored
        (("trainer.step_cap=5", "trainer.total_epochs=3"), 4, 5),  # NeMo RL: the steps come first
        (("trainer.step_cap=100", "trainer.total_epochs=3"), 4, 12),  # NeMo RL: the epochs come first
        (("trainer.max_steps=10", "trainer.step_cap=6"), 4, 6),
    ],
)
def test_the_length_of_a_run(tmp_path: Path, overrides: tuple[str, ...], per_epoch: int, steps: int):
    assert run_length(_cfg(tmp_path, *overrides).trainer, per_epoch) == steps


def test_nemo_rls_max_num_steps_caps_its_max_num_epochs(tmp_path: Path):
    """NeMo RL stops at whichever of `grpo.max_num_steps` and `grpo.max_num_epochs` comes first."""
    config = tmp_path / "nemo.yaml"
    config.write_text(
        "grpo:\n  max_num_epochs: 2\n  max_num_steps: 5\n  num_prompts_per_step: 2\n"
        "policy:\n  train_global_batch_size: 2\ndata:\n  train_data_path: builtin:addition@train\n"
    )
    t = load_config([f"config={config}"]).trainer
    assert (t.total_epochs, t.step_cap, t.max_steps) == (2, 5, None)
    assert run_length(t, 4) == 5  # 8 steps in two epochs: the cap comes first
    assert run_length(t, 2) == 4  # 4 steps in two epochs: the epochs come first


def test_a_run_validates_logs_and_saves_on_its_schedules(tmp_path: Path):
    cfg = _cfg(tmp_path, "trainer.val_freq=2", "trainer.save_freq=3", "trainer.save_limit=-1")
    loop = RunLoop(cfg, "train")
    job = Job(loop)
    metrics = loop.fit(job, 4, {"extra.json": "{}\n"}, ("a note",))
    assert job.events == [
        "validate 0",
        "step 1",
        "step 2",
        "validate 2",
        "step 3",
        "save 3",
        "step 4",
        "validate 4",
        "save 4",
        "model",
        "close",
    ]
    assert metrics["val/score"] == 4.0 and _steps(loop) == [0, 1, 2, 3, 4]
    assert (loop.run_dir / "extra.json").is_file() and (loop.run_dir / "config.yaml").is_file()
    state = torch.load(loop.ckpt_root / "global_step_3" / "trainer_state.pt", weights_only=False)
    assert (state["kind"], state["step"], state["position"]) == ("train", 3, 3) and "rng" in state


@pytest.mark.parametrize("kind", ["train", "sft"])
def test_a_stop_request_finishes_the_step_saves_and_stops(tmp_path: Path, kind: str):
    loop = RunLoop(_cfg(tmp_path, "trainer.val_before_train=false"), kind)
    job = Job(loop, signal_at=2)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs in the background (nohup, CI)
    with pytest.raises(RunStopped) as stopped:
        loop.fit(job, 4)
    assert stopped.value.signum == signal.SIGINT
    assert str(stopped.value).startswith("stopped by SIGINT after step 2 of 4; checkpoint ")
    assert "the same command resumes from it" in str(stopped.value)
    assert stopped.value.checkpoint == loop.ckpt_root / "global_step_2"
    assert job.events == ["step 1", "step 2", "save 2", "close"]
    assert _steps(loop) == [1, 2]
    assert signal.getsignal(signal.SIGINT) is before  # the handlers are put back


def test_a_stop_request_reuses_the_checkpoint_of_its_step_or_saves_nothing_when_told(tmp_path: Path):
    loop = RunLoop(_cfg(tmp_path, "trainer.val_before_train=false", "trainer.save_freq=2"), "sft")
    job = Job(loop, signal_at=2)
    with pytest.raises(RunStopped):
        loop.fit(job, 4)
    assert job.events.count("save 2") == 1  # step 2's scheduled checkpoint is the one a resume finds
    cfg = _cfg(tmp_path / "b", "trainer.val_before_train=false", "trainer.save_on_interrupt=false")
    loop = RunLoop(cfg, "train")
    with pytest.raises(
        RunStopped, match=r"after step 1 of 3; nothing saved \(trainer.save_on_interrupt=false\)"
    ):
        loop.fit(Job(loop, signal_at=1), 3)
    assert not loop.ckpt_root.exists()


def test_a_stop_request_during_the_first_validation_stops_before_training(tmp_path: Path):
    loop = RunLoop(_cfg(tmp_path), "train")
    job = Job(loop, signal_at=0)
    with pytest.raises(RunStopped, match="stopped by SIGINT before training; nothing to save"):
        loop.fit(job, 3)
    assert job.events == ["validate 0", "close"]


def test_a_stop_request_during_the_last_unit_of_work_changes_nothing(tmp_path: Path):
    loop = RunLoop(_cfg(tmp_path, "trainer.val_before_train=false"), "train")
    job = Job(loop, signal_at=3)
    loop.fit(job, 3)
    assert job.events[-3:] == ["save 3", "model", "close"]
    # a training config's validation-only run: the validation is its only unit of work
    loop = RunLoop(_cfg(tmp_path / "val", "trainer.val_only=true"), "train")
    job = Job(loop, signal_at=0)
    assert loop.fit(job, 0) == {"val/score": 0.0}
    assert job.events == ["validate 0", "close"]


def test_an_evaluation_stops_at_the_first_request(tmp_path: Path):
    """`rlstack eval` has nothing to save: a first signal stops it at once (the job still closes)."""
    loop = RunLoop(_cfg(tmp_path, "trainer.val_only=true"), "eval")
    job = Job(loop, signal_at=0)
    with pytest.raises(RunStopped, match="^evaluation stopped by SIGINT; nothing written$") as stop:
        loop.fit(job, 0)
    assert stop.value.signum == signal.SIGINT and stop.value.checkpoint is None
    assert job.events == ["validate 0", "close"]


def test_a_signal_while_the_run_closes_is_a_request_not_an_interrupt(tmp_path: Path):
    """The workers shut down (trackers upload, Ray stops) with the stop handler still in place: a first
    signal then changes nothing, where an interrupt would cut the shutdown short."""
    loop = RunLoop(_cfg(tmp_path, "trainer.val_before_train=false"), "train")

    class SignalledAtClose(Job):
        def close(self):
            os.kill(os.getpid(), signal.SIGINT)
            super().close()

    job = SignalledAtClose(loop)
    loop.fit(job, 2)
    assert job.events[-2:] == ["model", "close"]


def test_a_max_steps_past_the_epochs_is_said(tmp_path: Path):
    t = _cfg(tmp_path, "trainer.max_steps=7", "trainer.total_epochs=2").trainer
    assert "3 passes over the training rows (3 steps each)" in length_note(t, 3)
    assert "trainer.step_cap=7" in length_note(t, 3)
    assert length_note(t, 4) is None  # 8 steps by the epochs: max_steps ends the run first
    capped = _cfg(tmp_path, "trainer.max_steps=7", "trainer.step_cap=3").trainer  # ends within the epoch
    assert length_note(capped, 3) is None


def test_a_second_stop_request_stops_at_once(tmp_path: Path):
    loop = RunLoop(_cfg(tmp_path, "trainer.val_before_train=false"), "train")

    class Twice(Job):
        def train_step(self):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            return {}

    job = Twice(loop)
    with pytest.raises(Stopped):
        loop.fit(job, 3)
    assert job.events == ["close"] and not loop.ckpt_root.exists()


def test_a_resumed_run_goes_on_from_its_checkpoint_with_a_longer_length(tmp_path: Path):
    loop = RunLoop(_cfg(tmp_path, "trainer.max_steps=2", "trainer.val_before_train=false"), "sft")
    first = Job(loop)
    loop.fit(first, 2)
    after_two = [first.train_step() for _ in range(2)]  # what steps 3 and 4 draw when run straight on
    # the length keys may change on resume: the run goes on to step 4 with the job's state and the RNG
    cfg = _cfg(tmp_path, "trainer.max_steps=4", "trainer.step_cap=9", "trainer.val_before_train=false")
    loop = RunLoop(cfg, "sft")
    assert [c.key for c in loop.resume_point.changes] == ["trainer.max_steps", "trainer.step_cap"]
    job = Job(loop)
    loop.fit(job, run_length(cfg.trainer, 1))
    assert job.events[:3] == ["load global_step_2", "step 3", "step 4"] and job.position == 4
    rows = [json.loads(line) for line in (loop.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["draw"] for r in rows[2:]] == pytest.approx([m["draw"] for m in after_two])


def test_a_run_resumes_only_its_own_kind_of_checkpoint(tmp_path: Path):
    loop = RunLoop(_cfg(tmp_path, "trainer.val_before_train=false"), "sft")
    loop.fit(Job(loop), 1)
    with pytest.raises(ValueError, match="which `rlstack sft` wrote, and this is `rlstack train`"):
        RunLoop(_cfg(tmp_path, "trainer.val_before_train=false"), "train")
