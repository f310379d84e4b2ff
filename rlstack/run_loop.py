"""One loop for every kind of run: `rlstack train` (`trainer.py`), `rlstack sft` (`sft.py`) and `rlstack
eval` (`evaluate.py`) differ in their step and their state, not in how they seed, resume, log, stop and
save. A kind of run is a `Job`; `RunLoop` does the rest, the same way for each:

    RunLoop(cfg, kind)        seed; find the checkpoint to resume (at load, before any model is read)
    fit(job, total_steps)     the job's state and the loop's (step, RNG) from that checkpoint
                              the run directory: config.yaml, the resume's record, the tracker
                              validate once before the first step (trainer.val_before_train, val_only)
        for each step:        job.train_step(); validate, log and save on their schedules;
                              a stop request (SIGINT, SIGTERM): save, then stop (RunStopped)
                              the final model (huggingface/)

A stop request is honoured at one point for every kind of run: after a unit of work (the opening
validation, a step with its validation and checkpoint). A request made during the run's last unit changes
nothing: the run is done. `rlstack eval` is a validation-only run (`trainer.val_only`) with no steps and
no checkpoints: having nothing to save, it stops at the first signal.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Literal, Protocol

import torch

from rlstack import checkpoint
from rlstack.config import Config, to_yaml
from rlstack.config.trainer import TrainerConfig
from rlstack.resume import check_resume, record
from rlstack.stops import RunStopped, Stopped, StopRequest, stop_requests, stopped
from rlstack.tracking import Tracker

Kind = Literal["train", "sft", "eval"]


class Job(Protocol):
    """What a kind of run supplies. The loop owns the step (`RunLoop.step`), the tracker and the schedules.
    Of a validation-only run (`rlstack eval`) the loop calls only `validates`, `validate` and `close`."""

    validates: bool
    """The run has something to validate on (a validation set)."""

    def train_step(self) -> dict[str, float]:
        """Step `RunLoop.step` (already advanced); its metrics."""
        ...

    def validate(self) -> dict[str, float]:
        """Validation's metrics at `RunLoop.step` (its generations it logs itself)."""
        ...

    def held(self) -> AbstractContextManager[dict]:
        """The job's part of `trainer_state.pt` (its data position, ...), with nothing of the job moving
        until the checkpoint is written (asynchronous GRPO pauses its producer)."""
        ...

    def save_workers(self, path: Path) -> None:
        """Write the workers' state (model, optimizer, engine) into the checkpoint directory `path`."""
        ...

    def load(self, path: Path, state: dict) -> None:
        """Go on from the checkpoint `path`: the workers' state, and the job's part of `state`."""
        ...

    def save_model(self, path: Path) -> None:
        """Write the final model (Hugging Face format) into `path`."""
        ...

    def close(self) -> None:
        """Stop the workers (and any thread of the job's)."""
        ...


def run_length(t: TrainerConfig, steps_per_epoch: int) -> int:
    """The run's steps: `trainer.max_steps` when set, however many passes over the rows that takes (EasyR1's
    and TRL's meaning), else `trainer.total_epochs` passes; `trainer.step_cap` then caps it (NeMo RL's
    `grpo.max_num_steps` beside `max_num_epochs`: whichever ends the run first)."""
    steps = t.max_steps if t.max_steps is not None else steps_per_epoch * t.total_epochs
    return min(steps, t.step_cap) if t.step_cap is not None else steps


def length_note(t: TrainerConfig, steps_per_epoch: int) -> str | None:
    """What an RL run's start says where `trainer.max_steps` outruns `trainer.total_epochs` (the epochs are
    then ignored; until 2026-11-29 they capped an RL run, where SFT always took max_steps as its length),
    None otherwise."""
    if run_length(t, steps_per_epoch) <= steps_per_epoch * t.total_epochs:
        return None
    passes = -(-t.max_steps // max(steps_per_epoch, 1))
    return (
        f"trainer.max_steps={t.max_steps} is the run's length: {passes} passes over the training rows "
        f"({steps_per_epoch} steps each), so trainer.total_epochs={t.total_epochs} is ignored; to stop at the "
        f"epochs instead, set trainer.step_cap={t.max_steps} and leave max_steps out"
    )


class RunLoop:
    def __init__(self, cfg: Config, kind: Kind):
        """Seeds the run and finds the checkpoint it resumes from: before the job loads anything, so that a
        resume with other settings stops before a model is read."""
        t = cfg.trainer
        if t.num_threads > 0:
            torch.set_num_threads(t.num_threads)
        checkpoint.seed_everything(t.seed, t.full_determinism)
        self.cfg, self.kind = cfg, kind
        self.run_dir = cfg.run_dir
        self.ckpt_root = self.run_dir / "checkpoints"
        self.resume_point = check_resume(cfg, kind) if kind != "eval" else None
        self.step = 0
        self.total_steps = 0
        self.step_metrics: dict[str, float] = {}
        """The last step's metrics (with its validation's): what its checkpoint records."""
        self.tracker: Tracker | None = None
        self.saved: tuple[int, Path] | None = None
        """The step of the last checkpoint this process saved, and where."""
        self.said_no_metric = False

    def fit(
        self, job: Job, total_steps: int, files: dict[str, str] | None = None, notes: tuple[str, ...] = ()
    ) -> dict[str, float]:
        """Run `job` to step `total_steps` (from the checkpoint it resumes, if any); returns the last metrics.
        `files` are written beside `config.yaml` and `notes` printed after the run directory's line."""
        self.total_steps = total_steps
        with stop_requests(self._after(), at_once=self.kind == "eval") as stop:
            try:  # closed inside: a signal while the workers shut down is a request, not an interrupt
                self._resume(job)
                self._open(files or {}, notes)
                return self._loop(job, stop)
            except Stopped as e:
                if self.kind != "eval":
                    raise
                raise RunStopped(f"evaluation stopped by {e}; nothing written", e.signum, None) from None
            finally:
                if self.tracker is not None:
                    self.tracker.close()
                job.close()

    def _loop(self, job: Job, stop: StopRequest) -> dict[str, float]:
        t = self.cfg.trainer
        metrics: dict[str, float] = {}
        if job.validates and (t.val_only or (self.step == 0 and t.val_before_train)):
            metrics = job.validate()
            self.tracker.log(metrics, self.step, advance=False)
        if t.val_only:
            return metrics
        if stop.signum is not None:
            raise RunStopped(f"stopped by {stop.name} before training; nothing to save", stop.signum, None)
        while self.step < self.total_steps:
            self.step += 1
            metrics = job.train_step()
            last = self.step == self.total_steps
            if job.validates and (last or _every(t.val_freq, self.step)):
                metrics |= job.validate()
            self.tracker.log(metrics, self.step)
            self.step_metrics = metrics
            if not t.save_model_only and (last or _every(t.save_freq, self.step)):
                self.save(job)
            if stop.signum is not None and not last:
                raise self._stopped(job, stop)
        job.save_model(self.run_dir / "huggingface")
        return metrics

    # ------------------------------------------------------------------------------- the run's ends

    def _open(self, files: dict[str, str], notes: tuple[str, ...]) -> None:
        """The run directory (config.yaml, what a resume changed, the job's `files`) and the tracker."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.resume_point is not None:
            record(self.cfg, self.resume_point, self.step)
        (self.run_dir / "config.yaml").write_text(to_yaml(self.cfg))
        for name, text in files.items():
            (self.run_dir / name).write_text(text)
        print(
            f"[rlstack] run directory: {self.run_dir}  (watch it: rlstack board {self.run_dir})", flush=True
        )
        for note in notes:
            print(f"[rlstack] {note}", flush=True)
        self.tracker = Tracker.of_run(self.cfg, self.total_steps, self.step)

    def _after(self) -> str:
        """When a first stop request stops the run, as the signal's handler says it."""
        if self.cfg.trainer.val_only:
            return "after the validation in progress"
        saves = self.cfg.trainer.save_on_interrupt
        return (
            f"after the step in progress ({'a checkpoint is saved first' if saves else 'nothing is saved'})"
        )

    def _stopped(self, job: Job, stop: StopRequest) -> RunStopped:
        """A signal stopped the run at the end of a step: a checkpoint first (`trainer.save_on_interrupt`)."""
        t = self.cfg.trainer
        saved = self.saved[1] if self.saved and self.saved[0] == self.step else None
        if saved is None and t.save_on_interrupt:
            saved = self.save(job)
        where = f"stopped by {stop.name} after step {self.step} of {self.total_steps}"
        resumes = bool(t.find_last_checkpoint or t.load_checkpoint_path)
        return stopped(stop, where, saved, resumes, "trainer.save_on_interrupt=false")

    # ----------------------------------------------------------------------------- checkpoints

    def save(self, job: Job) -> Path:
        """A checkpoint of step `self.step`: the workers' state, `trainer_state.pt` (the loop's step and RNG,
        the job's state) and the config it was trained with (what a resume compares with)."""
        t = self.cfg.trainer
        best = (t.save_best_metric, t.save_best_mode) if t.save_best_metric else None
        metrics = self.step_metrics
        if best and best[0] not in metrics and not self.said_no_metric:
            self.said_no_metric = True
            print(
                f"[rlstack] warning: step {self.step}'s metrics have no {best[0]} (trainer.save_best_metric): its "
                f"checkpoint ranks last; metrics it has: {', '.join(sorted(metrics)[:12])}, ...",
                flush=True,
            )
        with job.held() as state:

            def write(path: Path) -> None:
                job.save_workers(path)
                own = {"kind": self.kind, "step": self.step, "rng": checkpoint.rng_state()}
                torch.save(own | state, path / "trainer_state.pt")
                (path / "config.yaml").write_text(to_yaml(self.cfg))

            path = checkpoint.save_atomically(self.ckpt_root, self.step, write, t.save_limit, metrics, best)
        self.saved = (self.step, path)
        return path

    def _resume(self, job: Job) -> None:
        if self.resume_point is None:
            return
        path = self.resume_point.path
        state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
        self.step = state["step"]
        job.load(path, state)
        checkpoint.set_rng_state(state["rng"])
        print(f"resumed from {path} at step {self.step}")
        checkpoint.say_later_checkpoints(self.ckpt_root, self.step)


def _every(freq: int, step: int) -> bool:
    """A schedule of `trainer.val_freq` / `save_freq` (-1: only at the end) falls on `step`."""
    return freq > 0 and step % freq == 0
