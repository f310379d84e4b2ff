"""`trainer.*`: the loop's length, validation, checkpoints, trackers, and where it runs (backend, ranks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rlstack.config.fields import field
from rlstack.config.paths import path_problems

if TYPE_CHECKING:
    from rlstack.config.schema import Config

LOGGERS = ("console", "file", "tensorboard", "wandb", "swanlab", "mlflow", "trackio")
"""The trackers `trainer.logger` may list."""


@dataclass
class TrainerConfig:
    project_name: str = field("rlstack", resume=True)
    """Project folder under `output_dir`, and the tracker's project."""
    experiment_name: str = field("default", resume=True)
    """Run folder under the project."""
    output_dir: str = field("outputs", resume=True)
    """Root of the run directories."""
    total_epochs: int = field(1, ge=1, resume=True)
    """Passes over the training rows: the run's length when max_steps is null."""
    max_steps: int | None = field(None, ge=1, why="null: the epochs decide", resume=True)
    """The run's length in steps, however many passes over the training rows that takes (total_epochs is then ignored; EasyR1's and TRL's max_steps); null: total_epochs decides."""
    step_cap: int | None = field(None, ge=1, why="null: no cap", resume=True)
    """End the run after this many steps if its length (total_epochs, or max_steps) has not ended it first; never lengthens a run (NeMo RL's grpo.max_num_steps beside max_num_epochs: whichever comes first); null: no cap."""
    critic_warmup: int = field(0, ge=0)
    """Steps that train only the critic before the actor starts updating (gae)."""
    val_freq: int = field(-1, ge=1, also=(-1,), why="-1: only at the end", resume=True)
    """Validate every this many steps (-1: only at the end)."""
    val_before_train: bool = field(True, resume=True)
    """Validate once before the first step."""
    val_only: bool = field(False, resume=True)
    """Validate and stop."""
    val_generations_to_log: int = field(8, ge=0, resume=True)
    """Validation generations written to `generations/` each time."""
    train_generations_to_log: int = field(4, ge=0, resume=True)
    """Training generations written to `generations/` each step."""
    save_freq: int = field(-1, ge=1, also=(-1,), why="-1: only at the end", resume=True)
    """Save a checkpoint every this many steps (-1: only at the end)."""
    save_limit: int = field(2, ge=1, also=(-1,), why="-1: all", resume=True)
    """Keep this many checkpoints (-1: all): the newest, or the best by save_best_metric and the newest too."""
    save_best_metric: str = field("", resume=True)
    """With save_limit: keep the save_limit checkpoints best by this metric of metrics.jsonl (val/reward_score), and the latest; empty: the latest."""
    save_best_mode: Literal["max", "min"] = field("max", resume=True)
    """Whether a higher (max) or lower (min) save_best_metric is better."""
    save_model_only: bool = field(False, resume=True)
    """At the end, write only the Hugging Face model, no resumable checkpoint."""
    save_on_interrupt: bool = field(True, resume=True)
    """On SIGINT (Ctrl-C) or SIGTERM, finish the step in progress and save a checkpoint before stopping (a second signal stops at once)."""
    find_last_checkpoint: bool = field(True, resume=True)
    """Resume from the newest complete checkpoint of the run directory."""
    load_checkpoint_path: str | None = field(None, resume=True)
    """Resume from this checkpoint directory instead."""
    resume_mode: Literal["strict", "accept_changes"] = field("strict", resume=True)
    """On resume, settings other than those that may change then (the run's length, logging, validation, saving, micro-batch sizes, where it runs: ranks, engine, device; `rlstack config-keys --resumable`) must equal the checkpoint's (strict: else the run stops at load and lists them); accept_changes: train on with the new ones from the checkpoint, recorded in config_history.jsonl."""
    logger: list[str] = field(default_factory=lambda: ["console", "file", "tensorboard"], resume=True)
    """Trackers: `console` (the main metrics beside the progress, which shows whatever the loggers), `file` (metrics.jsonl), `tensorboard`, `wandb`, `swanlab` (SWANLAB_MODE: cloud, offline, local), `mlflow` (MLFLOW_TRACKING_URI, else a file store in the run directory's mlruns/), `trackio` (TRACKIO_DIR); each optional tracker gets metrics, the config and the validation generations as a table."""
    progress_every: int = field(0, ge=0, resume=True)
    """Where stderr is not a terminal (a log file, a scheduler's output): steps between two progress lines (0: about 20 a run); a terminal gets a progress bar."""
    seed: int = field(1, ge=0, lt=2**32, why="numpy takes seeds of 32 bits")
    """Seed of torch, numpy and random."""
    full_determinism: bool = False
    """Deterministic GPU kernels (torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG, cuDNN, flash-attn) in every process, as TRL's full_determinism: slower; CPU runs are deterministic without it."""
    num_threads: int = field(0, ge=0, resume=True)
    """torch CPU threads (0: leave torch's default)."""
    device: Literal["auto", "cpu", "cuda"] = field("auto", resume=True)
    """Where models train and generate: auto picks CUDA when a GPU is visible, else the CPU."""
    backend: Literal["auto", "local", "ray"] = field("auto", resume=True)
    """local: every worker in this process; ray: one Ray actor per rank, models sharded with FSDP2; auto: ray for several ranks (nnodes x n_gpus_per_node) or rollout actors apart, else local."""
    nnodes: int = field(1, ge=1, resume=True)
    """Nodes of the Ray cluster the run uses (`backend=ray`)."""
    n_gpus_per_node: int = field(1, ge=1, resume=True)
    """Ranks per node (`backend=ray`): one per GPU; on machines without a GPU, CPU ranks."""
    env_vars: dict[str, str] = field(default_factory=dict, resume=True)
    """Environment variables set in every Ray actor (ranks, rollout and reward workers), on every node, over those forwarded from the driver (TOKENIZERS_PARALLELISM, NCCL_DEBUG, VLLM_LOGGING_LEVEL, the HF_* and RLSTACK_CACHE variables that are set; EasyR1's and NeMo RL's runtime_env)."""


def trainer_rules(cfg: Config, p: list[str]) -> None:
    """The critic warm-up, the checkpoint to resume, the trackers, and what the local backend cannot run."""
    t = cfg.trainer
    if t.critic_warmup and cfg.algorithm.adv_estimator != "gae":
        p.append(
            f"trainer.critic_warmup = {t.critic_warmup} only applies to algorithm.adv_estimator=gae (there is no critic "
            f"with {cfg.algorithm.adv_estimator}); set trainer.critic_warmup=0"
        )
    path_problems(p, ("trainer.load_checkpoint_path", t.load_checkpoint_path))
    if (
        t.save_best_metric.startswith("val/")
        and t.save_freq > 0
        and (t.val_freq < 1 or t.save_freq % t.val_freq)
    ):
        p.append(
            f"trainer.save_best_metric = {t.save_best_metric} ranks checkpoints by a validation metric, but a checkpoint "
            f"every {t.save_freq} steps (trainer.save_freq) and validation "
            + (
                f"every {t.val_freq} (trainer.val_freq)"
                if t.val_freq > 0
                else "only at the end (trainer.val_freq=-1)"
            )
            + " leave checkpoints without it: set trainer.val_freq to a divisor of save_freq, or clear "
            "trainer.save_best_metric"
        )
    unknown_loggers = set(t.logger) - set(LOGGERS)
    if unknown_loggers:
        p.append(
            f"trainer.logger: unknown logger(s) {sorted(unknown_loggers)}; choose from {', '.join(LOGGERS)}"
        )
    world = t.nnodes * t.n_gpus_per_node
    if t.backend == "local" and min(t.nnodes, t.n_gpus_per_node) >= 1:
        if not cfg.worker.rollout.colocated:
            p.append(
                "worker.rollout.colocated = false places rollout engines in Ray actors of their own: set "
                "trainer.backend=ray (the local backend runs everything in one process)"
            )
        if world > 1:
            p.append(
                f"trainer.nnodes x trainer.n_gpus_per_node = {world} ranks, but trainer.backend = local runs one "
                "process: set trainer.backend=ray (or both to 1)"
            )
