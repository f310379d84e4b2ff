"""The training loop: one driver, workers behind `WorkerGroup`s (see DESIGN.md)."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

from rlstack import checkpoint
from rlstack.algos.advantages import (
    AdvantageInputs,
    AdvantageParams,
    AdvEstimator,
    compute_advantages,
    outcome_token_rewards,
)
from rlstack.algos.filters import (
    group_filter,
    rank_groups_by_std,
    select_to_fill,
    trajectory_filter,
    truncation_mask,
)
from rlstack.algos.groups import group_index, pass_at_k_means
from rlstack.algos.kl import KLPenalty, adaptive_kl_coef, kl_in_reward
from rlstack.algos.vppo import advantage_shaping_scale, perception_token_mask, token_visual_dependency
from rlstack.batch import Batch
from rlstack.config import Config, resolve_device, to_dict, to_yaml
from rlstack.data.dataset import PromptDataset, PromptLoader
from rlstack.errors import RLStackError
from rlstack.models.loading import load_tokenizer_and_processor, model_dir
from rlstack.producer import RolloutProducer, staleness
from rlstack.rewards.manager import build_reward_manager, reward_function_for
from rlstack.rollout.agent import agent_system_prompt
from rlstack.rollout.engine import mix_seed
from rlstack.tracking import (
    Tracker,
    agent_metrics,
    batch_metrics,
    generation_rows,
    reward_component_means,
    total_tokens,
)
from rlstack.workers.group import LocalWorkerGroup, WorkerGroup
from rlstack.workers.roles import build_roles


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        d, w, t = cfg.data, cfg.worker, cfg.trainer
        if t.num_threads > 0:
            torch.set_num_threads(t.num_threads)
        checkpoint.seed_everything(t.seed, t.full_determinism)
        self.run_dir = cfg.run_dir
        self.ckpt_root = self.run_dir / "checkpoints"
        model_path = model_dir(w.actor.model)
        tokenizer, processor = load_tokenizer_and_processor(w.actor.model, model_path)
        self.pad_token_id = tokenizer.pad_token_id
        self.probe = tokenizer("The weight-sync probe: 12 + 34 = 46.", add_special_tokens=False)["input_ids"]
        """Fixed text (no images, whatever the model) that `check_weight_sync` scores with engine and policy."""
        self.probe_synced: list[float] | None = None
        """The policy's log-probs of the probe at the weights of the last sync (None: none checked yet)."""
        system = agent_system_prompt(w.rollout.agent)
        images = w.rollout.agent.max_images
        self.train_set = PromptDataset.from_config(d.train_files, tokenizer, d, -1, processor, system, images)
        self.val_set = (
            PromptDataset.from_config(d.val_files, tokenizer, d, d.val_max_samples, processor, system, images)
            if d.val_files
            else self.train_set.held_out(d.val_split, d.seed, d.val_max_samples)
            if d.val_split > 0
            else None
        )
        self.loader = PromptLoader(self.train_set, d.rollout_batch_size, d.shuffle, d.seed)
        by_epochs = len(self.loader) * t.total_epochs
        self.total_steps = min(by_epochs, t.max_steps) if t.max_steps else by_epochs
        alg = cfg.algorithm
        self.mini_batch_size = w.actor.global_batch_size * w.rollout.n
        # One mini-batch and one epoch: the update's first forward pass is on-policy, so old = current
        # (an in-reward KL needs the old log-probs before the update, so it computes them).
        self.max_age = alg.async_grpo.max_trajectory_age_steps if alg.async_grpo.enabled else 0
        self.on_policy = (
            self.max_age == 0
            and w.actor.ppo_epochs == 1
            and d.rollout_batch_size == w.actor.global_batch_size
            and not alg.use_kl_in_reward
            and not alg.use_vppo_on_perception
        )
        device = resolve_device(t.device)
        self.cluster = None
        """The Ray rank actors (`trainer.backend=ray`), closed at the end of `fit`."""
        if t.backend == "ray":
            from rlstack.workers.ray_group import RayCluster

            self.cluster = RayCluster(cfg, self.total_steps, device)
            groups: dict[str, WorkerGroup] = {role: self.cluster.group(role) for role in self.cluster.roles}
        else:
            groups = {
                role: LocalWorkerGroup(w) for role, w in build_roles(cfg, self.total_steps, device).items()
            }
        self.actor: WorkerGroup = groups["actor"]
        self.rollout_workers: WorkerGroup = groups["rollout"]
        self.engine = self.rollout_workers.call("capabilities")
        self.ref: WorkerGroup | None = groups.get("ref")
        self.critic: WorkerGroup | None = groups.get("critic")
        self.kl_coef = alg.kl_coef
        """The in-reward KL coefficient (adapted each step with `kl_type=adaptive`; saved in checkpoints)."""
        if self.cluster is not None:  # scoring runs in CPU actors, off the training ranks
            from rlstack.workers.ray_group import RayRewards

            try:
                self.rewards = RayRewards(self.cluster, cfg)
            except BaseException:
                self.cluster.close()
                raise
        else:
            self.rewards = build_reward_manager(w.reward, d.max_response_length)
        self.step = 0
        self.rollouts = 0
        """Rollout rounds so far (several per step with dynamic sampling): with the rollout seed and the
        prompt's place in its round, it seeds the prompt's samples (`sample_seed`), so that they do not
        depend on how the prompts are split across ranks. Saved in checkpoints."""
        self.tracker: Tracker | None = None
        self.dropped_groups = 0
        """Prompt groups dropped for a tool call past `tool_timeout_s` since the last step's count."""
        self.resumed_buffer: list = []
        """Asynchronous GRPO: batches the producer had made when the resumed checkpoint was saved."""
        self.producer: RolloutProducer | None = None
        """Asynchronous GRPO's rollout thread (`algorithm.async_grpo.enabled`), running during `fit`."""

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
            if self.cfg.algorithm.async_grpo.enabled and self.step < self.total_steps:
                self.producer = RolloutProducer(
                    self._collect_step,
                    self.max_age,
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
                if not t.save_model_only and (last or (t.save_freq > 0 and self.step % t.save_freq == 0)):
                    self.save_checkpoint()
            self.actor.call("save_model", self.run_dir / "huggingface")
        finally:
            if self.producer is not None:
                self.producer.close()
            self.tracker.close()
            self.rewards.close()
            if self.cluster is not None:
                self.cluster.close()
        return metrics

    def train_step(self) -> dict[str, float]:
        timing: dict[str, float] = defaultdict(float)
        metrics: dict[str, float] = {}
        with _timer(timing, "step"):
            if self.producer is not None:
                batch, produced, produced_timing, waited = self.producer.get(self.step)
                metrics |= produced
                timing |= produced_timing
                timing["wait_rollout"] = waited
                metrics |= staleness(batch, self.step)
                metrics["async/buffer_fill"] = self.producer.buffered()
            else:
                batch, metrics_, timing_ = self._collect_step(self.step)
                metrics |= metrics_
                timing |= timing_
            if not self.on_policy:
                with _timer(timing, "old"):
                    batch = self.actor.call("compute_logprobs", batch)
            if self.cfg.algorithm.use_vppo_on_perception:
                with _timer(timing, "vppo"):
                    metrics |= self.visual_dependency(batch)
            if self.ref is not None:
                with _timer(timing, "ref"):
                    batch = self.ref.call("compute_ref_logprobs", batch)
            if self.critic is not None:
                with _timer(timing, "values"):
                    batch = self.critic.call("compute_values", batch)
            with _timer(timing, "adv"):
                metrics |= self.advantages(batch)
            if self.critic is not None:
                with _timer(timing, "update_critic"):
                    critic_mini = self.cfg.worker.critic.global_batch_size * self.cfg.worker.rollout.n
                    metrics |= self.critic.call("update", batch, critic_mini)
            if self.step > self.cfg.trainer.critic_warmup:
                if self.cfg.worker.rollout.check_weight_sync and self.probe_synced is None:
                    self.probe_synced = self.actor.call("score", *self._probe())  # the weights the engine has
                with _timer(timing, "update_actor"):
                    metrics |= self.actor.call("update", batch, self.mini_batch_size)
                # the batches that need older weights first (in flight, the weights land in them instead)
                if self.producer is not None and not self.cfg.algorithm.async_grpo.in_flight:
                    timing["wait_rollout"] += self.producer.wait_produced(self.step + self.max_age)
                with _timer(timing, "sync"):
                    synced = self.sync_weights()
                if self.producer is not None:
                    self.producer.synced(self.step)
                if synced:
                    metrics["rollout/weight_sync_mb"] = synced / 2**20
                if self.cfg.worker.rollout.check_weight_sync:
                    metrics |= self.check_weight_sync()
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

    def _collect_step(self, step: int) -> tuple[Batch, dict[str, float], dict[str, float]]:
        """Step `step`'s scored (and with online filtering, filtered) batch, its metrics and timings (run by
        the producer thread in asynchronous GRPO)."""
        timing: dict[str, float] = defaultdict(float)
        metrics: dict[str, float] = {}
        if self.cfg.algorithm.online_filtering:
            batch = self.collect_filtered(timing, metrics)
        else:
            batch = self.rollout(self.loader.next_batch(), timing)
        if self.cfg.algorithm.mask_truncated_responses:
            batch["response_mask"] = truncation_mask(batch["truncated"], batch["response_mask"])
        if self.cfg.worker.rollout.agent.tool_timeout_s is not None:
            metrics["rollout/dropped_groups"], self.dropped_groups = self.dropped_groups, 0
        return batch, metrics, timing

    def sync_weights(self) -> int:
        """Bring the rollout engines to the policy's current weights (version = the step): each rollout
        worker pulls them from its colocated policy; an engine sharing the policy's module only records
        the version; rollout workers placed apart are sent them. Returns the bytes one engine received."""
        if self.cfg.worker.rollout.colocated:
            return self.rollout_workers.call("sync_weights", self.step)
        # rollout workers placed apart: the policy's whole weights (gathered on its rank 0) go to each of them
        return self.rollout_workers.call("update_weights", self.actor.call("gathered_weights"), self.step)

    def _probe(self) -> tuple[list[int], list[int]]:
        """The weight-sync probe: a fixed text's first 8 tokens as the prompt, the rest as what is scored."""
        return self.probe[:8], self.probe[8:]

    def check_weight_sync(self) -> dict[str, float]:
        """Score a fixed text probe with the engine and with the policy; fail loudly when they disagree (an
        engine left on stale weights): past `weight_sync_tolerance`, or, below it, when the engine scores
        the probe at least twice as close to the weights of the previous sync as to the policy's now
        (what an engine that kept the old weights does however little the update moved the probe; an
        engine in step with the policy differs from both by its own numerics alone). Differences below
        1% of the tolerance are taken as equal."""
        engines = self.rollout_workers.call("score", *self._probe())  # one per rank
        policy = self.actor.call("score", *self._probe())
        previous, self.probe_synced = self.probe_synced, policy
        now = [_max_diff(engine, policy) for engine in engines]
        tolerance = self.cfg.worker.rollout.weight_sync_tolerance
        metrics = {"rollout/weight_sync_max_diff": max(now)}
        stale = ""
        if not max(now) <= tolerance:
            stale = (
                f"differ from the policy's by up to {max(now):.3g} on a fixed probe "
                f"(worker.rollout.weight_sync_tolerance={tolerance})"
            )
        elif previous is not None:
            before = [_max_diff(engine, previous) for engine in engines]
            metrics["rollout/weight_sync_previous_diff"] = max(before)
            metrics["rollout/weight_sync_policy_moved"] = _max_diff(policy, previous)
            closer = [(n, b) for n, b in zip(now, before) if n > tolerance / 100 and 2 * b < n]
            if closer:
                n, b = closer[0]
                stale = (
                    f"are closer to the previous weights' (up to {b:.3g} apart) than to the policy's now "
                    f"(up to {n:.3g}) on a fixed probe"
                )
        if stale:
            raise RLStackError(
                f"after the weight sync of step {self.step}, the rollout engine's log-probs {stale}: the "
                f"{self.engine.name} engine is not sampling from the weights being trained. Training on its "
                "samples would be off-policy without anyone knowing; stopping instead"
            )
        return metrics

    def rollout(self, prompts: Batch, timing: dict[str, float]) -> Batch:
        """Sample `n` responses per prompt and score them (plus ReMax's greedy baseline)."""
        self.rollouts += 1
        self._seed_prompts(prompts, self.rollouts, range(len(prompts)))
        with _timer(timing, "gen"):
            batch = self.rollout_workers.call("generate", prompts)
        with _timer(timing, "reward"):
            batch = self.rewards.score(batch)
        if self.cfg.algorithm.adv_estimator == AdvEstimator.REMAX:
            with _timer(timing, "baseline"):
                baseline = self.rewards.score(self.rollout_workers.call("generate_greedy", prompts))
                batch["baseline_scores"] = baseline["scores"].repeat_interleave(self.cfg.worker.rollout.n)
        return self._drop_timed_out_groups(batch)

    def _seed_prompts(self, prompts: Batch, round_: int, places) -> Batch:
        """Each prompt's sampling seed (`sample_seed`), from the rollout seed, the round (-1: validation)
        and the prompt's place, so that its samples do not depend on how prompts are split across ranks."""
        seed = self.cfg.worker.rollout.seed
        prompts["sample_seed"] = torch.tensor([mix_seed(seed, round_, i) for i in places])
        return prompts

    def _drop_timed_out_groups(self, batch: Batch) -> Batch:
        """Without the groups that have a trajectory whose tool call timed out
        (`worker.rollout.agent.tool_timeout_s`): a straggler never wedges the step nor trains half a group."""
        if "end_reason" not in batch:
            return batch
        timed_out = {u for u, r in zip(batch["uid"], batch["end_reason"]) if r == "timeout"}
        if not timed_out:
            return batch
        self.dropped_groups += len(timed_out)
        keep = [i for i, u in enumerate(batch["uid"]) if u not in timed_out]
        if not keep:
            raise RLStackError(
                f"every prompt group of step {self.step} had a tool call past worker.rollout.agent.tool_timeout_s="
                f"{self.cfg.worker.rollout.agent.tool_timeout_s} s: raise the limit, or look at the tools"
            )
        return batch.select(keep)

    def collect_filtered(self, timing: dict[str, float], metrics: dict[str, float]) -> Batch:
        """DAPO dynamic sampling: keep groups whose mean `filter_key` lies strictly inside (low, high), and
        draw more prompts until `rollout_batch_size` groups are kept."""
        a, want = self.cfg.algorithm, self.cfg.data.rollout_batch_size
        kept: list[Batch] = []
        num_kept = tries = 0
        while num_kept < want:
            tries += 1
            if tries > a.max_try_make_batch:
                raise RLStackError(
                    f"online filtering kept {num_kept} of {want} prompt groups after algorithm.max_try_make_batch="
                    f"{a.max_try_make_batch} rounds: nearly every group is all-correct or all-wrong on "
                    f"{a.filter_key!r}. Widen algorithm.filter_low/filter_high, raise max_try_make_batch, or "
                    "turn algorithm.online_filtering off"
                )
            prompts = Batch.concat([self.loader.next_batch() for _ in range(a.oversample_factor)])
            batch = self.rollout(prompts, timing)
            # a row whose reward call failed (on_error=score) has only overall and errors: NaN, as its group
            components = batch["reward_components"]
            missing = [i for i, c in enumerate(components) if a.filter_key not in c and not c.get("errors")]
            if missing:
                i = missing[0]
                raise RLStackError(
                    f"algorithm.filter_key={a.filter_key!r} is not returned by the reward function of data source "
                    f"{batch['data_source'][i]!r} ({reward_function_for(self.cfg.worker.reward, batch['data_source'][i])}); it "
                    f"returns {sorted(batch['reward_components'][i])}"
                )
            metric = torch.tensor([c.get(a.filter_key, float("nan")) for c in components])
            groups = group_index(batch["uid"])
            keep = group_filter(metric, groups, a.filter_low, a.filter_high) & self._trajectory_filter(batch)
            order = rank_groups_by_std(batch["scores"], groups) if a.rank_groups_by_std else None
            rows = select_to_fill(keep, groups, want - num_kept, order)
            if len(rows):
                kept.append(batch.select(rows))
                num_kept += len(set(kept[-1]["uid"]))
        metrics["online_filtering/num_tries"] = tries
        metrics["online_filtering/kept_groups_per_try"] = num_kept / tries
        return Batch.concat(kept, pad_values={"input_ids": self.pad_token_id})

    def _trajectory_filter(self, batch: Batch) -> torch.Tensor:
        """PyVision's trajectory-level filters (end reason, length, has an image), after group filtering."""
        a = self.cfg.algorithm
        images = batch.get("images") or [[] for _ in range(len(batch))]
        return trajectory_filter(
            batch["end_reason"],
            batch["response_mask"].sum(-1),
            torch.tensor([len(im) > 0 for im in images]),
            set(a.trajectory_filter_end_reasons)
            if a.trajectory_filter_end_reasons is not None
            else set(batch["end_reason"]),
            a.trajectory_filter_max_length,
            a.trajectory_filter_require_image,
        )

    def advantages(self, batch: Batch) -> dict[str, float]:
        """Adds `advantages` and `returns`; subtracts the in-reward KL first when configured."""
        a, mask = self.cfg.algorithm, batch["response_mask"]
        token_rewards, scores = outcome_token_rewards(batch["scores"], mask), batch["scores"]
        metrics: dict[str, float] = {}
        if a.use_kl_in_reward:
            token_rewards, scores, mean_kl = kl_in_reward(
                token_rewards,
                scores,
                batch["old_logprobs"],
                batch["ref_logprobs"],
                mask,
                KLPenalty(a.kl_penalty),
                self.kl_coef,
            )
            metrics = {"actor/reward_kl_penalty": mean_kl, "actor/reward_kl_penalty_coeff": self.kl_coef}
            if a.kl_type == "adaptive":
                self.kl_coef = adaptive_kl_coef(self.kl_coef, mean_kl, a.kl_target, a.kl_horizon, len(batch))
        inputs = AdvantageInputs(
            token_rewards=token_rewards,
            scores=scores,
            groups=group_index(batch["uid"]),
            response_mask=mask,
            values=batch.get("values"),
            baseline_scores=batch.get("baseline_scores"),
        )
        params = AdvantageParams(gamma=a.gamma, lam=a.lam, norm_adv_by_std_in_grpo=a.norm_adv_by_std_in_grpo)
        batch["advantages"], batch["returns"] = compute_advantages(
            AdvEstimator(a.adv_estimator), inputs, params
        )
        if a.use_vppo_on_perception and a.use_advantage_shaping:
            scale = advantage_shaping_scale(batch["visual_dependency"], mask, a.advantage_scaling_min)
            batch["advantages"] = batch["advantages"] * scale[:, None]
            metrics |= {
                "vppo/advantage_scale/max": float(scale.max()),
                "vppo/advantage_scale/min": float(scale.min()),
            }
        return metrics

    def visual_dependency(self, batch: Batch) -> dict[str, float]:
        """VPPO: each sampled token's dependency on the image (k3 KL between the old policy with the image
        and with a patch-masked image), `perception_mask` (the top `top_p_perception_tokens` per response)."""
        a, mask = self.cfg.algorithm, batch["response_mask"]
        batch = self.actor.call("compute_masked_image_logprobs", batch)
        dependency = token_visual_dependency(
            batch["old_logprobs"], batch["masked_logprobs"], mask, a.vppo_dependency_clamp
        )
        batch["visual_dependency"] = dependency
        batch["perception_mask"] = perception_token_mask(dependency, mask, a.top_p_perception_tokens).float()
        tokens = mask.sum().clamp(min=1)
        return {
            "vppo/dependency/mean": float(dependency.sum() / tokens),
            "vppo/perception_token_fraction": float(batch["perception_mask"].sum() / tokens),
        }

    # ------------------------------------------------------------------------------ validation

    def validate(self) -> dict[str, float]:
        """Generate for every validation prompt with the `val_*` sampling settings and score it."""
        assert self.val_set is not None
        scored = []
        size = self.cfg.data.val_batch_size
        for idx in _chunks(range(len(self.val_set)), size if size > 0 else max(1, len(self.val_set))):
            prompts = self._seed_prompts(self.val_set.batch(idx), -1, idx)
            batch = self.rollout_workers.call("generate", prompts, validate=True)
            scored.append(self.rewards.score(batch))
        val = Batch.concat(scored)
        per_source: dict[str, list[float]] = defaultdict(list)
        uids: dict[str, list[str]] = defaultdict(list)
        for comp, source, uid in zip(val["reward_components"], val["data_source"], val["uid"]):
            per_source[source].append(comp.get("accuracy", comp["overall"]))
            uids[source].append(uid)
        metrics = {f"val/{s}/accuracy": sum(v) / len(v) for s, v in per_source.items()}
        if self.cfg.worker.rollout.val_n > 1:  # several samples per prompt: pass@k (accuracy 1 = solved)
            for source, accuracy in per_source.items():
                solved = [a >= 1 for a in accuracy]
                metrics |= {
                    f"val/{source}/pass@{k}": v for k, v in pass_at_k_means(solved, uids[source]).items()
                }
        statuses = Counter(
            (source, info["status"])
            for info, source in zip(val["reward_info"], val["data_source"])
            if isinstance(info.get("status"), str)
        )
        metrics |= {f"val/{s}/status/{st}": n / len(per_source[s]) for (s, st), n in statuses.items()}
        metrics |= {f"val/{k}": v for k, v in reward_component_means(val).items()}
        metrics["val/reward_score"] = float(val["scores"].mean())
        metrics["val/response_length/mean"] = float(val["response_mask"].sum(-1).float().mean())
        metrics |= {f"val/{k}": v for k, v in self.rewards.pop_metrics().items()}
        metrics |= {f"val/{k}": v for k, v in agent_metrics(val).items()}
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
            self.actor.call("save_checkpoint", path)
            self.rollout_workers.call("save_checkpoint", path)
            if self.critic is not None:
                self.critic.call("save_checkpoint", path)
            torch.save(
                {
                    "step": self.step,
                    "loader": self.loader.state_dict(),
                    "rng": checkpoint.rng_state(),
                    "kl_coef": self.kl_coef,
                    "rollouts": self.rollouts,
                    "async_buffer": buffered,
                },
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
        self.rollout_workers.call("load_checkpoint", path)
        if self.critic is not None:
            self.critic.call("load_checkpoint", path)
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        self.step, self.kl_coef = state["step"], state["kl_coef"]
        self.rollouts, self.resumed_buffer = state.get("rollouts", 0), state.get("async_buffer", [])
        self.loader.load_state_dict(state["loader"])
        checkpoint.set_rng_state(state["rng"])
        self.sync_weights()
        print(f"resumed from {path} at step {self.step}")


def _max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


@contextmanager
def _timer(timing: dict[str, float], name: str):
    """Adds the phase's wall time to `timing[name]`; on a GPU after the work it queued has run (else it
    would be counted in whichever phase waits for it next)."""
    gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
    if gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    yield
    if gpu:
        torch.cuda.synchronize()
    timing[name] += time.perf_counter() - start


def _chunks(seq: range, size: int) -> list[list[int]]:
    return [list(seq[i : i + size]) for i in range(0, len(seq), size)]
