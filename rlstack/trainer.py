"""The training loop: one driver, workers behind `WorkerGroup`s (see DESIGN.md)."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

from rlstack import checkpoint
from rlstack.algos.advantages import ESTIMATORS, AdvEstimator, group_index
from rlstack.batch import Batch
from rlstack.config import Config, to_dict, to_yaml
from rlstack.data.dataset import PromptDataset, PromptLoader
from rlstack.models.loading import load_tokenizer, resolve_model_path
from rlstack.rewards.loader import load_reward_function
from rlstack.rewards.manager import RewardManager
from rlstack.tracking import Tracker, batch_metrics, generation_rows, total_tokens
from rlstack.workers.actor import ActorWorker, RefWorker
from rlstack.workers.group import LocalWorkerGroup, WorkerGroup


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        d, w, t = cfg.data, cfg.worker, cfg.trainer
        if t.num_threads > 0:
            torch.set_num_threads(t.num_threads)
        checkpoint.seed_everything(t.seed)
        self.run_dir = cfg.run_dir
        self.ckpt_root = self.run_dir / "checkpoints"
        model_path = resolve_model_path(w.actor.model.model_path)
        tokenizer = load_tokenizer(
            w.actor.model.tokenizer_path or model_path, w.actor.model.trust_remote_code
        )
        self.train_set = PromptDataset.from_config(d.train_files, tokenizer, d)
        self.val_set = (
            PromptDataset.from_config(d.val_files, tokenizer, d, d.val_max_samples) if d.val_files else None
        )
        self.loader = PromptLoader(self.train_set, d.rollout_batch_size, d.shuffle, d.seed)
        by_epochs = len(self.loader) * t.total_epochs
        self.total_steps = min(by_epochs, t.max_steps) if t.max_steps else by_epochs
        self.mini_batch_size = w.actor.global_batch_size * w.rollout.n
        # One mini-batch and one epoch: the update's first forward pass is on-policy, so old = current.
        self.on_policy = w.actor.ppo_epochs == 1 and d.rollout_batch_size == w.actor.global_batch_size
        self.actor: WorkerGroup = LocalWorkerGroup(
            ActorWorker(w.actor, w.rollout, cfg.algorithm, d.max_response_length, self.total_steps)
        )
        self.ref: WorkerGroup | None = None
        if cfg.algorithm.use_kl_loss:
            self.ref = LocalWorkerGroup(RefWorker(w.actor, w.ref.micro_batch_size_per_device_for_experience))
        self.rewards = RewardManager(
            load_reward_function(w.reward.reward_function), w.reward.reward_function_kwargs
        )
        self.step = 0
        self.tracker: Tracker | None = None

    # ------------------------------------------------------------------------------------ loop

    def fit(self) -> dict[str, float]:
        """Train for `total_steps`; returns the last step's metrics."""
        t = self.cfg.trainer
        self._resume()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(to_yaml(self.cfg))
        self.tracker = Tracker(
            self.run_dir,
            t.logger,
            to_dict(self.cfg),
            t.project_name,
            t.experiment_name,
            self.total_steps,
            self.step,
        )
        metrics: dict[str, float] = {}
        try:
            if self.val_set is not None and (t.val_only or (self.step == 0 and t.val_before_train)):
                metrics = self.validate()
                self.tracker.log(metrics, self.step, advance=False)
            if t.val_only:
                return metrics
            while self.step < self.total_steps:
                self.step += 1
                metrics = self.train_step()
                last = self.step == self.total_steps
                if self.val_set is not None and (last or (t.val_freq > 0 and self.step % t.val_freq == 0)):
                    metrics |= self.validate()
                self.tracker.log(metrics, self.step)
                if not t.save_model_only and (last or (t.save_freq > 0 and self.step % t.save_freq == 0)):
                    self.save_checkpoint()
            self.actor.call("save_model", self.run_dir / "huggingface")
        finally:
            self.tracker.close()
        return metrics

    def train_step(self) -> dict[str, float]:
        timing: dict[str, float] = defaultdict(float)
        with _timer(timing, "step"):
            with _timer(timing, "gen"):
                batch = self.actor.call("generate", self.loader.next_batch())
            with _timer(timing, "reward"):
                batch = self.rewards.score(batch)
            if not self.on_policy:
                with _timer(timing, "old"):
                    batch = self.actor.call("compute_logprobs", batch)
            if self.ref is not None:
                with _timer(timing, "ref"):
                    batch = self.ref.call("compute_ref_logprobs", batch)
            with _timer(timing, "adv"):
                batch["advantages"] = self.advantages(batch)
            with _timer(timing, "update_actor"):
                metrics = self.actor.call("update", batch, self.mini_batch_size)
        self.tracker.log_generations(
            generation_rows(batch, self.cfg.trainer.train_generations_to_log, self.step), self.step, "train"
        )
        metrics |= batch_metrics(batch)
        metrics |= {f"timing_s/{k}": v for k, v in timing.items()}
        metrics["perf/total_num_tokens"] = total_tokens(batch)
        metrics["perf/time_per_step"] = timing["step"]
        metrics["perf/throughput"] = metrics["perf/total_num_tokens"] / timing["step"]
        return metrics

    def advantages(self, batch: Batch) -> torch.Tensor:
        a = self.cfg.algorithm
        estimator = ESTIMATORS[AdvEstimator(a.adv_estimator)]
        return estimator(
            batch["scores"],
            group_index(batch["uid"]),
            batch["response_mask"],
            norm_by_std=a.norm_adv_by_std_in_grpo,
        )

    # ------------------------------------------------------------------------------ validation

    def validate(self) -> dict[str, float]:
        """Generate for every validation prompt with the `val_*` sampling settings and score it."""
        assert self.val_set is not None
        scored = []
        for idx in _chunks(range(len(self.val_set)), self.cfg.data.val_batch_size):
            batch = self.actor.call("generate", self.val_set.batch(idx), validate=True)
            scored.append(self.rewards.score(batch))
        val = Batch.concat(scored)
        per_source: dict[str, list[float]] = defaultdict(list)
        for comp, source in zip(val["reward_components"], val["data_source"]):
            per_source[source].append(comp.get("accuracy", comp["overall"]))
        metrics = {f"val/{s}/accuracy": sum(v) / len(v) for s, v in per_source.items()}
        metrics["val/reward_score"] = float(val["scores"].mean())
        metrics["val/response_length/mean"] = float(val["response_mask"].sum(-1).float().mean())
        if self.tracker is not None:
            rows = generation_rows(val, self.cfg.trainer.val_generations_to_log, self.step)
            self.tracker.log_generations(rows, self.step, "val")
        return metrics

    # ----------------------------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> Path:
        def write(path: Path) -> None:
            self.actor.call("save_checkpoint", path)
            torch.save(
                {"step": self.step, "loader": self.loader.state_dict(), "rng": checkpoint.rng_state()},
                path / "trainer_state.pt",
            )

        return checkpoint.save_atomically(self.ckpt_root, self.step, write, self.cfg.trainer.save_limit)

    def _resume(self) -> None:
        t = self.cfg.trainer
        path = Path(t.load_checkpoint_path) if t.load_checkpoint_path else None
        if path is None and t.find_last_checkpoint:
            path = checkpoint.latest_checkpoint(self.ckpt_root)
        if path is None:
            return
        if not (path / "trainer_state.pt").is_file():
            raise FileNotFoundError(f"{path} is not an rlstack checkpoint (no trainer_state.pt)")
        self.actor.call("load_checkpoint", path)
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        self.step = state["step"]
        self.loader.load_state_dict(state["loader"])
        checkpoint.set_rng_state(state["rng"])
        print(f"resumed from {path} at step {self.step}")


@contextmanager
def _timer(timing: dict[str, float], name: str):
    start = time.perf_counter()
    yield
    timing[name] += time.perf_counter() - start


def _chunks(seq: range, size: int) -> list[list[int]]:
    return [list(seq[i : i + size]) for i in range(0, len(seq), size)]
