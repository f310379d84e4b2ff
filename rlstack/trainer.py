"""The training step of GRPO and its family: one driver, the workers behind typed handles
(`workers/group.py`, `workers/start.py`; docs/layout.md maps the rest of the code). Seeding, resume, the
run directory, the tracker, stops and the validation and checkpoint schedules are the run loop's
(`run_loop.py`), shared with `rlstack sft` and `rlstack eval`.

What a step runs is decided once, by the step plan (`rlstack/plan.py`); collecting the batch lives in
`collection.py`, the weight sync and its check in `weight_sync.py`, validation in `validation.py`, and
the algorithm's math between the workers' passes in `algos/step.py`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from rlstack.algos.step import step_advantages, visual_dependency
from rlstack.batch import Batch
from rlstack.batch_metrics import batch_metrics, generation_rows, total_tokens
from rlstack.collection import ROUNDS_KEY, Collector, saved_rounds
from rlstack.config import Config
from rlstack.data.dataset import PromptLoader, prompt_sets
from rlstack.models.loading import load_tokenizer_and_processor, model_dir
from rlstack.plan import StepPlan
from rlstack.producer import RolloutProducer, staleness
from rlstack.rollout.agent import agent_system_prompt
from rlstack.run_loop import RunLoop, length_note, run_length
from rlstack.sft import build_warm_models
from rlstack.timing import timer
from rlstack.tracking import Tracker
from rlstack.validation import validate
from rlstack.weight_sync import PROBE_TEXT, WeightSync
from rlstack.workers.start import start_workers


class Trainer:
    """GRPO and its family as a `Job` of the run loop (`run_loop.py`): its step below, its state the data
    position, the adapted KL coefficient, the rollout rounds and asynchronous GRPO's buffer."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        d, w, alg = cfg.data, cfg.worker, cfg.algorithm
        self.loop = RunLoop(cfg, "train")  # seeds; a resume with other settings stops here
        self.run_dir = cfg.run_dir
        build_warm_models(cfg)  # builtin:tiny-qwen2-addition, on first use
        tokenizer, processor = load_tokenizer_and_processor(w.actor.model, model_dir(w.actor.model))
        system, images = agent_system_prompt(w.rollout.agent), w.rollout.agent.max_images
        self.train_set, self.val_set = prompt_sets(d, tokenizer, processor, system, images)
        self.validates = self.val_set is not None
        self.loader = PromptLoader(self.train_set, d.rollout_batch_size, d.shuffle, d.seed)
        self.total_steps = run_length(cfg.trainer, len(self.loader))
        self.plan = StepPlan.of(cfg)
        self.workers = ws = start_workers(cfg, self.plan, self.total_steps)
        self.groups, self.cluster, self.rewards = ws.groups, ws.cluster, ws.rewards
        self.policy, self.rollout, self.ref, self.critic = ws.policy, ws.rollout, ws.ref, ws.critic
        self.engine = self.rollout.capabilities()
        self.collector = Collector(
            cfg, self.plan, self.loader, ws.rollout, ws.rewards, tokenizer.pad_token_id
        )
        probe = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
        tolerance, colocated = w.rollout.weight_sync_tolerance, self.plan.rollout_colocated
        self.weight_sync = WeightSync(ws.policy, ws.rollout, colocated, probe, tolerance, self.engine.name)
        self.kl_coef = alg.kl_coef
        """The in-reward KL coefficient (adapted each step with `kl_type=adaptive`; saved in checkpoints)."""
        self.resumed_buffer: list = []
        """Asynchronous GRPO: batches the producer had made when the resumed checkpoint was saved."""
        self.producer: RolloutProducer | None = None
        """Asynchronous GRPO's rollout thread, started by the first step."""

    @property
    def step(self) -> int:
        """The step in progress (the last one done between steps)."""
        return self.loop.step

    @property
    def tracker(self) -> Tracker | None:
        return self.loop.tracker

    # ------------------------------------------------------------------------------------ loop

    def fit(self) -> dict[str, float]:
        """Train for `total_steps`; returns the last step's metrics."""
        notes = [self.plan.summary()]
        if note := length_note(self.cfg.trainer, len(self.loader)):
            notes.append(note)
        if self.cfg.worker.rollout.auto_reason:
            r = self.cfg.worker.rollout
            notes.append(f"rollout engine: {r.name} (worker.rollout.name=auto: {r.auto_reason})")
        plan = json.dumps(self.plan.to_dict(), indent=2) + "\n"
        return self.loop.fit(self, self.total_steps, {"step_plan.json": plan}, tuple(notes))

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
        GRPO, whose thread the first step starts), or collected now."""
        if self.plan.asynchronous and self.producer is None:
            self.producer = RolloutProducer(
                self.collector.collect,
                self.plan.max_age,
                self.step,
                self.total_steps,
                self.step - 1,
                self.resumed_buffer,
            ).start()
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

    @contextmanager
    def held(self) -> Iterator[dict]:
        pause = self.producer.paused() if self.producer is not None else nullcontext([])
        with pause as buffered:  # the loader and seeds stay where asynchronous GRPO's buffer leaves them
            yield {
                "loader": self.loader.state_dict(),
                "kl_coef": self.kl_coef,
                ROUNDS_KEY: self.collector.rounds,
                "async_buffer": buffered,
            }

    def save_workers(self, path: Path) -> None:
        self.policy.save_checkpoint(path)
        self.rollout.save_checkpoint(path)
        if self.critic is not None:
            self.critic.save_checkpoint(path)

    def load(self, path: Path, state: dict) -> None:
        self.policy.load_checkpoint(path)
        self.rollout.load_checkpoint(path)
        if self.critic is not None:
            self.critic.load_checkpoint(path)
        if not any(c.key == "algorithm.kl_coef" for c in self.loop.resume_point.changes):
            self.kl_coef = state["kl_coef"]  # adapted (kl_type=adaptive) unless the config sets a new one
        self.collector.rounds, self.resumed_buffer = saved_rounds(state), state.get("async_buffer", [])
        self.loader.load_state_dict(state["loader"])
        self.weight_sync.sync(state["step"])

    def save_model(self, path: Path) -> None:
        self.policy.save_model(path)

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()
        self.workers.close()
