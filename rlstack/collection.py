"""Collecting a step's training batch: rollout rounds (`n` scored samples per prompt, ReMax's greedy
baseline), DAPO's dynamic sampling with PyVision's trajectory filters, the truncation mask, and prompt
groups dropped for a tool call past its timeout. The synchronous loop calls `Collector.collect` for
every step; asynchronous GRPO's producer thread calls it ahead of the trainer."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch

from rlstack.algos.filters import (
    group_filter,
    rank_groups_by_std,
    select_to_fill,
    trajectory_filter,
    truncation_mask,
)
from rlstack.algos.groups import group_index
from rlstack.batch import Batch
from rlstack.config import Config
from rlstack.data.dataset import PromptLoader
from rlstack.errors import RLStackError
from rlstack.plan import StepPlan
from rlstack.rewards.manager import Rewards, reward_function_for
from rlstack.rollout.engine import mix_seed
from rlstack.timing import timer
from rlstack.workers.rollout import RolloutWorker

Collected = tuple[Batch, dict[str, float], dict[str, float]]
"""A step's batch, its metrics and its phase timings."""


def seed_prompts(prompts: Batch, seed: int, round_: int, places: Iterable[int]) -> Batch:
    """Each prompt's sampling seed (`sample_seed`), from the rollout seed, the round (-1: validation)
    and the prompt's place, so that its samples do not depend on how prompts are split across ranks."""
    prompts["sample_seed"] = torch.tensor([mix_seed(seed, round_, i) for i in places])
    return prompts


ROUNDS_KEY = "collector_rounds"
"""The trainer state's (`trainer_state.pt`) entry holding `Collector.rounds`."""
OLD_ROUNDS_KEY = "rollouts"
"""Its name in checkpoints written before it was renamed: still read."""


def saved_rounds(state: dict) -> int:
    """`Collector.rounds` of a trainer state, under its name or its old one (0 when neither is there)."""
    return state.get(ROUNDS_KEY, state.get(OLD_ROUNDS_KEY, 0))


class Collector:
    def __init__(
        self,
        cfg: Config,
        plan: StepPlan,
        loader: PromptLoader,
        rollout: RolloutWorker,
        rewards: Rewards,
        pad_token_id: int | None,
    ):
        """`rollout`: the rollout workers' handle; `rewards`: what scores the trajectories."""
        self.cfg, self.plan, self.loader = cfg, plan, loader
        self.rollout_workers, self.rewards, self.pad_token_id = rollout, rewards, pad_token_id
        self.rounds = 0
        """Rollout rounds so far (several per step with dynamic sampling): with the rollout seed and the
        prompt's place in its round, it seeds the prompt's samples (`sample_seed`), so that they do not
        depend on how the prompts are split across ranks. Saved in checkpoints (`ROUNDS_KEY`)."""
        self.dropped_groups = 0
        """Prompt groups dropped for a tool call past `tool_timeout_s` since the last step's count."""

    def collect(self, step: int) -> Collected:
        """Step `step`'s scored (and with online filtering, filtered) batch, its metrics and timings."""
        timing: dict[str, float] = defaultdict(float)
        metrics: dict[str, float] = {}
        if self.plan.online_filtering:
            batch = self._filtered(step, timing, metrics)
        else:
            batch = self.generate_and_score(self.loader.next_batch(), step, timing)
        if self.plan.mask_truncated:
            batch["response_mask"] = truncation_mask(batch["truncated"], batch["response_mask"])
        if self.plan.drop_timed_out_groups:
            metrics["rollout/dropped_groups"], self.dropped_groups = self.dropped_groups, 0
        return batch, metrics, timing

    def generate_and_score(self, prompts: Batch, step: int, timing: dict[str, float]) -> Batch:
        """One rollout round: sample `n` responses per prompt and score them (plus ReMax's greedy baseline),
        without the groups a tool call timed out in."""
        self.rounds += 1
        seed_prompts(prompts, self.cfg.worker.rollout.seed, self.rounds, range(len(prompts)))
        with timer(timing, "gen"):
            batch = self.rollout_workers.generate(prompts)
        with timer(timing, "reward"):
            batch = self.rewards.score(batch)
        if self.plan.remax_baseline:
            with timer(timing, "baseline"):
                baseline = self.rewards.score(self.rollout_workers.generate_greedy(prompts))
                batch["baseline_scores"] = baseline["scores"].repeat_interleave(self.cfg.worker.rollout.n)
        return self.drop_timed_out_groups(batch, step)

    def drop_timed_out_groups(self, batch: Batch, step: int) -> Batch:
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
                f"every prompt group of step {step} had a tool call past worker.rollout.agent.tool_timeout_s="
                f"{self.cfg.worker.rollout.agent.tool_timeout_s} s: raise the limit, or look at the tools"
            )
        return batch.select(keep)

    def _filtered(self, step: int, timing: dict[str, float], metrics: dict[str, float]) -> Batch:
        """DAPO dynamic sampling: keep groups whose mean `filter_key` lies strictly inside (low, high), and
        draw more prompts until `rollout_batch_size` groups are kept."""
        a, want = self.cfg.algorithm, self.cfg.data.rollout_batch_size
        kept: list[Batch] = []
        num_kept = tries = 0
        while num_kept < want:
            tries += 1
            if not a.unlimited_tries and tries > a.max_try_make_batch:
                raise RLStackError(
                    f"online filtering kept {num_kept} of {want} prompt groups after algorithm.max_try_make_batch="
                    f"{a.max_try_make_batch} rounds: nearly every group is all-correct or all-wrong on "
                    f"{a.filter_key!r}. Widen algorithm.filter_low/filter_high, raise max_try_make_batch, or "
                    "turn algorithm.online_filtering off"
                )
            prompts = Batch.concat([self.loader.next_batch() for _ in range(a.oversample_factor)])
            batch = self.generate_and_score(prompts, step, timing)
            # a row whose reward call failed (on_error=score) has only overall and errors: NaN, as its group
            components = batch["reward_components"]
            missing = [i for i, c in enumerate(components) if a.filter_key not in c and not c.get("errors")]
            if missing:
                i = missing[0]
                source = batch["data_source"][i]
                raise RLStackError(
                    f"algorithm.filter_key={a.filter_key!r} is not returned by the reward function of data source "
                    f"{source!r} ({reward_function_for(self.cfg.worker.reward, source)}); it "
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
