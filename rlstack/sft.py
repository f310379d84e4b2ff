"""Supervised fine-tuning on (prompt, answer) rows, as a trainer like GRPO's: the warm start before RL.

Reads the same configuration as `rlstack train`: `data.*` for rows and prompt formatting
(`data.rollout_batch_size` rows per step), `worker.actor.*` for the model (LoRA included), optimizer and
micro-batches, `trainer.*` for steps, validation, checkpoints, trackers, ranks and output; `algorithm.*`
does not apply. The model learns the `data.answer_key` field followed by EOS (a list of chat messages:
the assistant turns). The run has a run directory of its own (`sft_run_config`), with `config.yaml`,
`metrics.jsonl` and the trackers, checkpoints it resumes from (`trainer.resume_mode` as for GRPO), and
the final model in `huggingface/`. Validation reports the loss on the validation rows (`val/sft_loss`)
and, when their answers are plain values, generates and scores them with the run's reward functions as
GRPO's validation does (`val/<source>/accuracy`, ...). Seeding, resume, the run directory, the trackers,
stops (SIGINT / SIGTERM: after the step in progress, with a checkpoint) and the validation and checkpoint
schedules are the run loop's (`run_loop.py`), as for GRPO; `trainer.max_steps` is the run's length.

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
from collections.abc import Iterator
from pathlib import Path

from rlstack import checkpoint
from rlstack.batch_metrics import generation_rows
from rlstack.checkpoint import write_dir_atomically
from rlstack.config import (
    BUILTIN_DIRS,
    BUILTIN_MODEL,
    BUILTIN_WARM_MODEL,
    Config,
    load_config,
)
from rlstack.data.dataset import PromptLoader, prompt_sets, sft_batch
from rlstack.models.loading import cache_dir, load_tokenizer_and_processor, model_dir
from rlstack.plan import StepPlan
from rlstack.rollout.agent import agent_system_prompt
from rlstack.run_loop import RunLoop, run_length
from rlstack.timing import timer
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
    """Supervised fine-tuning as a `Job` of the run loop (`run_loop.py`): its step one update on a batch of
    rows, its state the data position."""

    def __init__(self, cfg: Config):
        self.cfg = cfg = sft_run_config(cfg)
        d, w = cfg.data, cfg.worker
        self.loop = RunLoop(cfg, "sft")  # seeds; a resume with other settings stops here
        self.run_dir = cfg.run_dir
        build_warm_models(cfg)
        self.tokenizer, self.processor = load_tokenizer_and_processor(w.actor.model, model_dir(w.actor.model))
        system, images = agent_system_prompt(w.rollout.agent), w.rollout.agent.max_images
        self.train_set, self.val_set = prompt_sets(d, self.tokenizer, self.processor, system, images)
        self.validates = self.val_set is not None
        self.loader = PromptLoader(self.train_set, d.rollout_batch_size, d.shuffle, d.seed)
        self.total_steps = run_length(cfg.trainer, len(self.loader))
        # The workers of GRPO without its algorithm: no reference, critic or old log-probs, and log-probs
        # (the loss) at temperature 1; the rollout engine only generates for validation.
        work, plan = StepPlan.without_algorithm(cfg)
        self.plan = plan
        self.workers = ws = start_workers(work, plan, self.total_steps)
        self.policy, self.rollout, self.rewards = ws.policy, ws.rollout, ws.rewards

    @property
    def step(self) -> int:
        return self.loop.step

    def fit(self) -> Path:
        """Train for `total_steps` (from the checkpoint it resumes, if any); returns the final model's
        directory."""
        self.loop.fit(self, self.total_steps)
        return self.run_dir / "huggingface"

    def train_step(self) -> dict[str, float]:
        timing: dict[str, float] = defaultdict(float)
        with timer(timing, "step"):
            batch = sft_batch(self.train_set, self.loader.next_indices(), self.tokenizer, self.processor)
            metrics = self.policy.sft_update(batch, len(batch))
        tokens = float(batch["attention_mask"].sum())
        return metrics | {
            "sft/answer_tokens": float(batch["response_mask"].sum()) / len(batch),
            "perf/total_num_tokens": tokens,
            "perf/throughput": tokens / timing["step"],
            "perf/time_per_step": timing["step"],
            "timing_s/step": timing["step"],
        }

    def validate(self) -> dict[str, float]:
        """`val/sft_loss` over every validation row; when their answers are plain values, the rows are also
        generated and scored as GRPO's validation does."""
        assert self.val_set is not None
        d, r = self.cfg.data, self.cfg.worker.rollout
        sync_engines(
            self.policy, self.rollout, self.plan.rollout_colocated, self.step
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
            rows = generation_rows(val, self.cfg.trainer.val_generations_to_log, self.step)
            self.loop.tracker.log_generations(rows, self.step, "val")
        return metrics

    # ----------------------------------------------------------------------------- checkpoints

    @contextlib.contextmanager
    def held(self) -> Iterator[dict]:
        yield {"loader": self.loader.state_dict()}

    def save_workers(self, path: Path) -> None:
        self.policy.save_checkpoint(path)
        self.rollout.save_checkpoint(path)

    def load(self, path: Path, state: dict) -> None:
        self.policy.load_checkpoint(path)
        self.rollout.load_checkpoint(path)
        self.loader.load_state_dict(state["loader"])

    def save_model(self, path: Path) -> None:
        self.policy.save_model(path)

    def close(self) -> None:
        self.workers.close()


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
