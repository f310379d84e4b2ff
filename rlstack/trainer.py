"""The training loop: one driver, the workers behind typed handles (`workers/group.py`, `workers/start.py`;
docs/layout.md maps the rest of the code).

What a step runs is decided once, by the step plan (`rlstack/plan.py`); collecting the batch lives in
`collection.py`, the weight sync and its check in `weight_sync.py`, validation in `validation.py`, and
the algorithm's math between the workers' passes in `algos/step.py`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch

from rlstack import checkpoint
from rlstack.algos.step import step_advantages, visual_dependency
from rlstack.batch import Batch
from rlstack.batch_metrics import batch_metrics, generation_rows, total_tokens
from rlstack.collection import Collector
from rlstack.config import Config, to_yaml
from rlstack.data.dataset import PromptLoader, prompt_sets
from rlstack.models.loading import load_tokenizer_and_processor, model_dir
from rlstack.plan import StepPlan
from rlstack.producer import RolloutProducer, staleness
from rlstack.resume import check_resume, record
from rlstack.rollout.agent import agent_system_prompt
from rlstack.sft import build_warm_models
from rlstack.stops import RunStopped, StopRequest, stop_requests, stopped
from rlstack.timing import timer
from rlstack.tracking import Tracker
from rlstack.validation import validate
from rlstack.weight_sync import PROBE_TEXT, WeightSync
from rlstack.workers.start import start_workers


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        d, w, t, alg = cfg.data, cfg.worker, cfg.trainer, cfg.algorithm
        if t.num_threads > 0:
            torch.set_num_threads(t.num_threads)
        checkpoint.seed_everything(t.seed, t.full_determinism)
        self.run_dir = cfg.run_dir
        self.ckpt_root = self.run_dir / "checkpoints"
        self.resume_point = check_resume(cfg)  # at load: a resume with other settings stops here
        build_warm_models(cfg)  # builtin:tiny-qwen2-addition, on first use
        tokenizer, processor = load_tokenizer_and_processor(w.actor.model, model_dir(w.actor.model))
        system, images = agent_system_prompt(w.rollout.agent), w.rollout.agent.max_images
        self.train_set, self.val_set = prompt_sets(d, tokenizer, processor, system, images)
        self.loader = PromptLoader(self.train_set, d.rollout_batch_size, d.shuffle, d.seed)
        by_epochs = len(self.loader) * t.total_epochs
        self.total_steps = min(by_epochs, t.max_steps) if t.max_steps else by_epochs
        self.plan = StepPlan.of(cfg)
        self.workers = ws = start_workers(cfg, self.plan, self.total_steps)
        self.groups, self.cluster, self.rewards = ws.groups, ws.cluster, ws.rewards
        self.policy, self.rollout, self.ref, self.critic = ws.policy, ws.rollout, ws.ref, ws.critic
        self.engine = self.rollout.capabilities()
        self.collector = Collector(
            cfg, self.plan, self.loader, ws.rollout, ws.rewards, tokenizer.pad_token_id
        )
        probe = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
        tolerance, apart = w.rollout.weight_sync_tolerance, self.plan.rollout_apart
        self.weight_sync = WeightSync(ws.policy, ws.rollout, apart, probe, tolerance, self.engine.name)
        self.kl_coef = alg.kl_coef
        """The in-reward KL coefficient (adapted each step with `kl_type=adaptive`; saved in checkpoints)."""
        self.step = 0
        self.step_metrics: dict[str, float] = {}
        """The last step's metrics (with its validation's): what its checkpoint records."""
        self.said_no_metric = False
        self.tracker: Tracker | None = None
        self.resumed_buffer: list = []
        """Asynchronous GRPO: batches the producer had made when the resumed checkpoint was saved."""
        self.producer: RolloutProducer | None = None
        """Asynchronous GRPO's rollout thread, running during `fit`."""

    # ------------------------------------------------------------------------------------ loop

    def fit(self) -> dict[str, float]:
        """Train for `total_steps`; returns the last step's metrics."""
        self._resume()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.resume_point is not None:
            record(self.cfg, self.resume_point, self.step)
        (self.run_dir / "config.yaml").write_text(to_yaml(self.cfg))
        (self.run_dir / "step_plan.json").write_text(json.dumps(self.plan.to_dict(), indent=2) + "\n")
        print(
            f"[rlstack] run directory: {self.run_dir}  (watch it: rlstack board {self.run_dir})", flush=True
        )
        print(f"[rlstack] {self.plan.summary()}", flush=True)
        if self.cfg.worker.rollout.auto_reason:
            r = self.cfg.worker.rollout
            print(
                f"[rlstack] rollout engine: {r.name} (worker.rollout.name=auto: {r.auto_reason})", flush=True
            )
        self.tracker = Tracker.of_run(self.cfg, self.total_steps, self.step)
        with stop_requests("the step in progress") as stop:
            try:
                return self._fit(stop)
            finally:
                if self.producer is not None:
                    self.producer.close()
                self.tracker.close()
                self.workers.close()

    def _fit(self, stop: StopRequest) -> dict[str, float]:
        t = self.cfg.trainer
        metrics: dict[str, float] = {}
        if self.val_set is not None and (t.val_only or (self.step == 0 and t.val_before_train)):
            metrics = self.validate()
            self.tracker.log(metrics, self.step, advance=False)
        if t.val_only:
            return metrics
        if stop.signum is not None:
            raise RunStopped(f"stopped by {stop.name} before training; nothing to save", stop.signum, None)
        if self.plan.asynchronous and self.step < self.total_steps:
            self.producer = RolloutProducer(
                self.collector.collect,
                self.plan.max_age,
                self.step + 1,
                self.total_steps,
                self.step,
                self.resumed_buffer,
            ).start()
        while self.step < self.total_steps:
            self.step += 1
            metrics = self.train_step()
            last = self.step == self.total_steps
            if self.val_set is not None and (last or (t.val_freq > 0 and self.step % t.val_freq == 0)):
                metrics |= self.validate()
            self.tracker.log(metrics, self.step)
            self.step_metrics = metrics
            saved = None
            if not t.save_model_only and (last or (t.save_freq > 0 and self.step % t.save_freq == 0)):
                saved = self.save_checkpoint()
            if stop.signum is not None and not last:
                raise self._stopped(stop, saved)
        self.policy.save_model(self.run_dir / "huggingface")
        return metrics

    def _stopped(self, stop: StopRequest, saved: Path | None) -> RunStopped:
        """Stop after a signal, at the end of a step: a checkpoint first (`trainer.save_on_interrupt`)."""
        t = self.cfg.trainer
        if saved is None and t.save_on_interrupt:
            saved = self.save_checkpoint()
        where = f"stopped by {stop.name} after step {self.step} of {self.total_steps}"
        resumes = bool(t.find_last_checkpoint or t.load_checkpoint_path)
        return stopped(stop, where, saved, resumes, "trainer.save_on_interrupt=false")

    def train_step(self) -> dict[str, float]:
        plan = self.plan
        timing: dict[str, float] = defaultdict(float)
        metrics: dict[str, float] = {}
        with timer(timing, "step"):
            batch = self._next_batch(timing, metrics)
            if plan.old_logprobs:
                with timer(timing, "old"):
                    batch = self.policy.compute_logprobs(batch)
            if plan.vppo:
                with timer(timing, "vppo"):
                    batch = self.policy.compute_masked_image_logprobs(batch)
                    vd = visual_dependency(
                        batch["old_logprobs"],
                        batch["masked_logprobs"],
                        batch["response_mask"],
                        self.cfg.algorithm.vppo_dependency_clamp,
                        self.cfg.algorithm.top_p_perception_tokens,
                    )
                    batch["visual_dependency"], batch["perception_mask"] = vd.dependency, vd.perception_mask
                    metrics |= vd.metrics
            if self.ref is not None:
                with timer(timing, "ref"):
                    batch = self.ref.compute_ref_logprobs(batch)
            if self.critic is not None:
                with timer(timing, "values"):
                    batch = self.critic.compute_values(batch)
            with timer(timing, "adv"):
                metrics |= self._advantages(batch)
            if self.critic is not None:
                with timer(timing, "update_critic"):
                    metrics |= self.critic.update(batch, plan.critic_mini_batch)
            if self.step > plan.critic_warmup:
                if plan.check_weight_sync:
                    self.weight_sync.remember()
                with timer(timing, "update_actor"):
                    metrics |= self.policy.update(batch, plan.actor_mini_batch)
                # the batches that need older weights first (in flight, the weights land in them instead)
                if self.producer is not None and not plan.in_flight:
                    timing["wait_rollout"] += self.producer.wait_produced(self.step + plan.max_age)
                with timer(timing, "sync"):
                    synced = self.weight_sync.sync(self.step)
                if self.producer is not None:
                    self.producer.synced(self.step)
                if synced:
                    metrics["rollout/weight_sync_mb"] = synced / 2**20
                if plan.check_weight_sync:
                    metrics |= self.weight_sync.check(self.step)
        self.tracker.log_generations(
            generation_rows(batch, self.cfg.trainer.train_generations_to_log, self.step), self.step, "train"
        )
        metrics |= batch_metrics(batch)
        metrics |= {f"timing_s/agent_{k}": v for k, v in batch.meta.get("agent_timing", {}).items()}
        metrics |= self.rewards.pop_metrics()
        metrics |= {f"timing_s/{k}": v for k, v in timing.items()}
        metrics["perf/total_num_tokens"] = total_tokens(batch)
        metrics["perf/time_per_step"] = timing["step"]
        metrics["perf/throughput"] = metrics["perf/total_num_tokens"] / timing["step"]
        return metrics

    def _next_batch(self, timing: dict[str, float], metrics: dict[str, float]) -> Batch:
        """This step's batch, its metrics and timings added: from the producer's buffer (asynchronous
        GRPO), or collected now."""
        if self.producer is None:
            batch, collected, collect_timing = self.collector.collect(self.step)
            metrics |= collected
            timing |= collect_timing
            return batch
        batch, produced, produced_timing, waited = self.producer.get(self.step)
        metrics |= produced
        timing |= produced_timing
        timing["wait_rollout"] = waited
        metrics |= staleness(batch, self.step)
        metrics["async/buffer_fill"] = self.producer.buffered()
        return batch

    def _advantages(self, batch: Batch) -> dict[str, float]:
        """Adds `advantages` and `returns` (the in-reward KL subtracted first, VPPO's shaping applied)."""
        out = step_advantages(
            batch["scores"],
            batch["response_mask"],
            batch["uid"],
            self.plan.advantages,
            self.kl_coef,
            old_logprobs=batch.get("old_logprobs"),
            ref_logprobs=batch.get("ref_logprobs"),
            values=batch.get("values"),
            baseline_scores=batch.get("baseline_scores"),
            visual_dependency=batch.get("visual_dependency"),
        )
        batch["advantages"], batch["returns"], self.kl_coef = out.advantages, out.returns, out.kl_coef
        return out.metrics

    def validate(self) -> dict[str, float]:
        """Generate for every validation prompt with the `val_*` sampling settings and score it."""
        assert self.val_set is not None
        r = self.cfg.worker.rollout
        metrics, val = validate(
            self.val_set, self.rollout, self.rewards, self.cfg.data.val_batch_size, r.seed, r.val_n
        )
        if self.tracker is not None:
            rows = generation_rows(val, self.cfg.trainer.val_generations_to_log, self.step)
            self.tracker.log_generations(rows, self.step, "val")
        return metrics

    # ----------------------------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> Path:
        if self.producer is None:
            return self._save_checkpoint([])
        with self.producer.paused() as buffered:  # the loader and seeds stay where the buffer leaves them
            return self._save_checkpoint(buffered)

    def _save_checkpoint(self, buffered: list) -> Path:
        def write(path: Path) -> None:
            self.policy.save_checkpoint(path)
            self.rollout.save_checkpoint(path)
            if self.critic is not None:
                self.critic.save_checkpoint(path)
            state = {
                "kind": "train",
                "step": self.step,
                "loader": self.loader.state_dict(),
                "rng": checkpoint.rng_state(),
                "kl_coef": self.kl_coef,
                "rollouts": self.collector.rounds,
                "async_buffer": buffered,
            }
            torch.save(state, path / "trainer_state.pt")
            (path / "config.yaml").write_text(to_yaml(self.cfg))  # what a resume compares with

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
        return checkpoint.save_atomically(self.ckpt_root, self.step, write, t.save_limit, metrics, best)

    def _resume(self) -> None:
        if self.resume_point is None:
            return
        path = self.resume_point.path
        self.policy.load_checkpoint(path)
        self.rollout.load_checkpoint(path)
        if self.critic is not None:
            self.critic.load_checkpoint(path)
        state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
        self.step = state["step"]
        if not any(c.key == "algorithm.kl_coef" for c in self.resume_point.changes):
            self.kl_coef = state["kl_coef"]  # adapted (kl_type=adaptive) unless the config sets a new one
        self.collector.rounds, self.resumed_buffer = state.get("rollouts", 0), state.get("async_buffer", [])
        self.loader.load_state_dict(state["loader"])
        checkpoint.set_rng_state(state["rng"])
        self.weight_sync.sync(self.step)
        print(f"resumed from {path} at step {self.step}")
        checkpoint.say_later_checkpoints(self.ckpt_root, self.step)
