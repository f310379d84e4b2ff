"""Supervised fine-tuning on (prompt, answer) rows, as a trainer like GRPO's: the warm start before RL.

Reads the same configuration as `rlstack train`: `data.*` for rows and prompt formatting
(`data.rollout_batch_size` rows per step), `worker.actor.*` for the model (LoRA included), optimizer and
micro-batches, `trainer.*` for steps, validation, checkpoints, trackers, ranks and output; `algorithm.*`
does not apply. The model learns the `data.answer_key` field followed by EOS (a list of chat messages:
the assistant turns). The run has a run directory of its own (`sft_run_config`), with `config.yaml`,
`metrics.jsonl` and the trackers, checkpoints it resumes from (`trainer.resume_mode` as for GRPO), and
the final model in `huggingface/`. Validation reports the loss on the validation rows (`val/sft_loss`)
and, when their answers are plain values, generates and scores them with the run's reward functions as
GRPO's validation does (`val/<source>/accuracy`, ...). SIGINT / SIGTERM stop after the step in progress
with a checkpoint, as in `trainer.py`.

`builtin:tiny-qwen2-addition` is the demo's warm start as a built-in model, so that the examples learn as
shipped: the randomly initialised tiny Qwen2 (`builtin:tiny-qwen2`) answers no addition right and GRPO has
nothing to reward; after the demo's supervised run (`rlstack/configs/demo_sft.yaml`: 300 steps, about a
minute on a 2-core CPU) it answers 33-45% of held-out problems, with right and wrong answers in most groups
of 8 samples: what GRPO, DAPO's filter and a critic learn from. It is built once per cache
(`$RLSTACK_CACHE/models/tiny-qwen2-addition`), under a lock, by the trainer that first names it
(`build_warm_models`, before anything loads a model); every other reader (Ray ranks, the reference, the
critic) finds it there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import torch

from rlstack import checkpoint
from rlstack.batch_metrics import generation_rows
from rlstack.checkpoint import write_dir_atomically
from rlstack.config import (
    BUILTIN_DIRS,
    BUILTIN_MODEL,
    BUILTIN_WARM_MODEL,
    Config,
    load_config,
    to_yaml,
)
from rlstack.data.dataset import PromptLoader, prompt_sets, sft_batch
from rlstack.models.loading import cache_dir, load_tokenizer_and_processor, model_dir
from rlstack.plan import StepPlan
from rlstack.resume import check_resume, record
from rlstack.rollout.agent import agent_system_prompt
from rlstack.stops import RunStopped, StopRequest, stop_requests, stopped
from rlstack.timing import timer
from rlstack.tracking import Tracker
from rlstack.validation import validate
from rlstack.weight_sync import sync_engines
from rlstack.workers.start import start_workers


def sft_run_config(cfg: Config) -> Config:
    """The config an SFT run records: its run directory is its own, `<experiment_name>_sft`, unless the
    experiment's name starts or ends with sft, so that `rlstack sft config=<a GRPO recipe>` never writes
    into that recipe's GRPO run (a checkpoint of the other command is refused at load either way)."""
    name = cfg.trainer.experiment_name
    if name.lower().startswith("sft") or name.lower().endswith("sft"):
        return cfg
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, experiment_name=f"{name}_sft"))


def run_sft(cfg: Config) -> Path:
    """Train; returns the final model's directory (`<run_dir>/huggingface`)."""
    return SFTTrainer(cfg).fit()


class SFTTrainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg = sft_run_config(cfg)
        d, t, w = cfg.data, cfg.trainer, cfg.worker
        if t.num_threads > 0:
            torch.set_num_threads(t.num_threads)
        checkpoint.seed_everything(t.seed, t.full_determinism)
        self.run_dir = cfg.run_dir
        self.resume_point = check_resume(cfg, "sft")  # at load: a resume with other settings stops here
        build_warm_models(cfg)
        self.tokenizer, self.processor = load_tokenizer_and_processor(w.actor.model, model_dir(w.actor.model))
        system, images = agent_system_prompt(w.rollout.agent), w.rollout.agent.max_images
        self.train_set, self.val_set = prompt_sets(d, self.tokenizer, self.processor, system, images)
        self.loader = PromptLoader(self.train_set, d.rollout_batch_size, d.shuffle, d.seed)
        # as TRL's SFT: max_steps, when set, is the length of the run, however many epochs that takes
        self.total_steps = t.max_steps or len(self.loader) * t.total_epochs
        # The workers of GRPO without its algorithm: no reference, critic or old log-probs, and log-probs
        # (the loss) at temperature 1; the rollout engine only generates for validation.
        work, plan = StepPlan.without_algorithm(cfg)
        self.plan = plan
        self.workers = ws = start_workers(work, plan, self.total_steps)
        self.policy, self.rollout, self.rewards = ws.policy, ws.rollout, ws.rewards
        self.step = 0
        self.saved_step, self.last_saved = -1, Path()
        self.step_metrics: dict[str, float] = {}
        """The last step's metrics (with its validation's): what its checkpoint records."""
        """The step of the last checkpoint this process saved, and where."""
        self.tracker: Tracker | None = None

    def fit(self) -> Path:
        """Train for `total_steps` (from the checkpoint it resumes, if any); returns the final model's
        directory."""
        self._resume()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.resume_point is not None:
            record(self.cfg, self.resume_point, self.step)
        (self.run_dir / "config.yaml").write_text(to_yaml(self.cfg))
        print(
            f"[rlstack] run directory: {self.run_dir}  (watch it: rlstack board {self.run_dir})", flush=True
        )
        self.tracker = Tracker.of_run(self.cfg, self.total_steps, self.step)
        with stop_requests("the step in progress") as stop:
            try:
                self._fit(stop)
            finally:
                self.tracker.close()
                self.workers.close()
        return self.run_dir / "huggingface"

    def _fit(self, stop: StopRequest) -> None:
        t = self.cfg.trainer
        if self.val_set is not None and (t.val_only or (self.step == 0 and t.val_before_train)):
            self.tracker.log(self.validate(), self.step, advance=False)
        if t.val_only:
            return
        while self.step < self.total_steps:
            if stop.signum is not None:
                raise self._stopped(stop)
            self.step += 1
            timing: dict[str, float] = defaultdict(float)
            with timer(timing, "step"):
                batch = sft_batch(self.train_set, self.loader.next_indices(), self.tokenizer, self.processor)
                metrics = self.policy.sft_update(batch, len(batch))
            tokens = float(batch["attention_mask"].sum())
            metrics |= {
                "sft/answer_tokens": float(batch["response_mask"].sum()) / len(batch),
                "perf/total_num_tokens": tokens,
                "perf/throughput": tokens / timing["step"],
                "perf/time_per_step": timing["step"],
                "timing_s/step": timing["step"],
            }
            last = self.step == self.total_steps
            if self.val_set is not None and (last or (t.val_freq > 0 and self.step % t.val_freq == 0)):
                metrics |= self.validate()
            self.tracker.log(metrics, self.step)
            self.step_metrics = metrics
            if not t.save_model_only and (last or (t.save_freq > 0 and self.step % t.save_freq == 0)):
                self.save_checkpoint()
        self.policy.save_model(self.run_dir / "huggingface")

    def _stopped(self, stop: StopRequest) -> RunStopped:
        """After a signal, at the end of a step: a checkpoint first (`trainer.save_on_interrupt`)."""
        t = self.cfg.trainer
        where = f"stopped by {stop.name} after SFT step {self.step} of {self.total_steps}"
        saved = None
        if t.save_on_interrupt and self.step > 0:
            saved = self.last_saved if self.saved_step == self.step else self.save_checkpoint()
        return stopped(stop, where, saved, bool(t.find_last_checkpoint or t.load_checkpoint_path))

    def validate(self) -> dict[str, float]:
        """`val/sft_loss` over every validation row; when their answers are plain values, the rows are also
        generated and scored as GRPO's validation does."""
        assert self.val_set is not None
        d, r = self.cfg.data, self.cfg.worker.rollout
        sync_engines(
            self.policy, self.rollout, self.plan.rollout_apart, self.step
        )  # generate with these weights
        size = d.val_batch_size if d.val_batch_size > 0 else len(self.val_set)
        nll, tokens = 0.0, 0.0
        for start in range(0, len(self.val_set), size):
            idx = list(range(start, min(start + size, len(self.val_set))))
            scored = self.policy.compute_logprobs(
                sft_batch(self.val_set, idx, self.tokenizer, self.processor)
            )
            mask = scored["response_mask"].float()
            nll -= float((scored["old_logprobs"] * mask).sum())
            tokens += float(mask.sum())
        metrics = {"val/sft_loss": nll / max(tokens, 1.0)}
        if all(not isinstance(it["ground_truth"], list) for it in self.val_set.items):
            generated, val = validate(
                self.val_set, self.rollout, self.rewards, d.val_batch_size, r.seed, r.val_n
            )
            metrics |= generated
            if self.tracker is not None:
                rows = generation_rows(val, self.cfg.trainer.val_generations_to_log, self.step)
                self.tracker.log_generations(rows, self.step, "val")
        return metrics

    # ----------------------------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> Path:
        def write(path: Path) -> None:
            self.policy.save_checkpoint(path)
            self.rollout.save_checkpoint(path)
            state = {
                "kind": "sft",
                "step": self.step,
                "loader": self.loader.state_dict(),
                "rng": checkpoint.rng_state(),
            }
            torch.save(state, path / "trainer_state.pt")
            (path / "config.yaml").write_text(to_yaml(self.cfg))

        t = self.cfg.trainer
        best = (t.save_best_metric, t.save_best_mode) if t.save_best_metric else None  # val/sft_loss, min
        self.last_saved = checkpoint.save_atomically(
            self.run_dir / "checkpoints", self.step, write, t.save_limit, self.step_metrics, best
        )
        self.saved_step = self.step
        return self.last_saved

    def _resume(self) -> None:
        if self.resume_point is None:
            return
        path = self.resume_point.path
        self.policy.load_checkpoint(path)
        self.rollout.load_checkpoint(path)
        state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
        self.step = state["step"]
        self.loader.load_state_dict(state["loader"])
        checkpoint.set_rng_state(state["rng"])
        print(f"resumed from {path} at step {self.step}")
        checkpoint.say_later_checkpoints(self.run_dir / "checkpoints", self.step)


# ------------------------------------------------------------------------ the built-in warm start

RECIPE = Path(__file__).parent / "configs" / "demo_sft.yaml"
"""The supervised run that makes the warm start (the demo's, seed 1)."""


def warm_model_dir() -> Path:
    return cache_dir() / "models" / BUILTIN_DIRS[BUILTIN_WARM_MODEL]


def named_models(cfg: Config) -> list[str | None]:
    """Every model path of `cfg` (policy, its tokenizer, critic, reward model)."""
    w = cfg.worker
    return [
        w.actor.model.model_path,
        w.actor.model.tokenizer_path,
        w.critic.model.model_path,
        w.reward.reward_model.model_path,
    ]


def build_warm_models(cfg: Config) -> None:
    """Build `builtin:tiny-qwen2-addition` when `cfg` names it and the cache does not hold it yet."""
    out = warm_model_dir()
    if BUILTIN_WARM_MODEL not in named_models(cfg) or (out / "config.json").is_file():
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs on one machine build it once
        if (out / "config.json").is_file():
            return
        print(
            f"[rlstack] {BUILTIN_WARM_MODEL}: building the demo's warm start (the tiny Qwen2 after "
            f"{RECIPE.name}'s supervised steps on addition; under a minute on 2 cores, once) into {out}",
            file=sys.stderr,
            flush=True,
        )
        rng = checkpoint.rng_state()  # the run that asked for it starts as if it were cached
        write_dir_atomically(out, _train)
        checkpoint.set_rng_state(rng)


def _train(into: Path) -> None:
    cfg = load_config(
        [
            f"config={RECIPE}",
            f"worker.actor.model.model_path={BUILTIN_MODEL}",
            f"trainer.output_dir={into / 'run'}",
            "trainer.experiment_name=sft",
            "trainer.find_last_checkpoint=false",
            "trainer.save_model_only=true",
            "trainer.save_on_interrupt=false",  # its directory is temporary: nothing to resume
            # the same model on every machine, and nothing of the GPU left taken by it
            "trainer.device=cpu",
            "trainer.backend=local",
            "worker.rollout.name=hf",
        ]
    )
    with contextlib.redirect_stdout(sys.stderr):  # stdout says where the run that asked for it goes
        model = run_sft(cfg)
    for item in model.iterdir():
        shutil.move(str(item), into / item.name)
    shutil.rmtree(into / "run")
