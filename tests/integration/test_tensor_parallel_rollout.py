"""The rollout of an engine split over a tensor-parallel group (vLLM's `tensor_parallel_size` > 1), without
vLLM: two gloo ranks, an engine whose generation is recorded instead of run. The leader runs the rollout
over both ranks' prompts, the follower runs the same engine calls in step, each rank gets back the
trajectories of its own prompts, and a failure on the leader ends the call on both ranks."""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from ranks import run_ranks

from rlstack.batch import Batch
from rlstack.rollout.engine import Completion, Request, SamplingSettings
from rlstack.rollout.vllm import TensorParallelGroup, VLLMEngine, _remove_stale_cpu_shm
from rlstack.workers.rollout import RolloutWorker


class _Engine(VLLMEngine):
    """`VLLMEngine`'s group protocol (generate / follow / release) over a recorded generation."""

    def __init__(self):
        self.tensor_parallel = TensorParallelGroup(2)
        self.calls: list[list[int]] = []
        self.weight_version = 0

    def _generate(self, requests, sampling):
        self.calls.append([r.prompt_ids[0] for r in requests])
        if any(
            r.prompt_ids[0] > 1000 for r in requests
        ):  # as a request too long for the engine, on every rank
            raise ValueError(f"request {len(self.calls)} is too long")
        return [Completion([r.prompt_ids[0] + 1], [0.0], "stop") for r in requests]

    def sleep(self):
        pass

    def wake_up(self):
        pass


class _Loop:
    """Two engine calls per rollout (two turns), `n` rows per prompt; `fail` raises after the first."""

    def __init__(self, engine, fail: bool):
        self.engine, self.fail = engine, fail

    def generate(self, prompts: Batch, n, temperature, top_p, top_k) -> Batch:
        batch = prompts.repeat_interleave(n)
        requests = [Request([int(p)]) for p in batch["prompt"]]
        first = self.engine.generate(requests, SamplingSettings(4))
        if self.fail:
            raise ValueError("a tool broke")
        second = self.engine.generate([Request([c.token_ids[0]]) for c in first], SamplingSettings(4))
        batch["response"] = torch.tensor([c.token_ids[0] for c in second])
        return batch


def _rollout(fail: bool, offset: int = 0):
    import torch.distributed as dist

    worker = RolloutWorker.__new__(RolloutWorker)
    worker.engine = _Engine()
    worker.loop = _Loop(worker.engine, fail)
    worker.lock = threading.Lock()
    worker.asleep = False
    prompts = Batch({"prompt": torch.tensor([10, 20]) + 100 * dist.get_rank() + offset})
    try:
        out = worker._run(prompts, 3, 1.0, 1.0, -1)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "calls": worker.engine.calls}
    return {
        "prompt": out["prompt"].tolist(),
        "response": out["response"].tolist(),
        "calls": worker.engine.calls,
    }


def test_the_leader_rolls_out_both_ranks_prompts_and_each_rank_gets_its_own(tmp_path: Path):
    leader, follower = run_ranks(2, _rollout, False, tmp=tmp_path)
    assert leader["prompt"] == [10, 10, 10, 20, 20, 20]
    assert follower["prompt"] == [110, 110, 110, 120, 120, 120]
    assert follower["response"] == [112] * 3 + [122] * 3  # two turns, each adding 1
    both = [10] * 3 + [20] * 3 + [110] * 3 + [120] * 3
    turns = [both, [p + 1 for p in both]]
    assert leader["calls"] == turns and follower["calls"] == turns  # the same requests, in step


def test_four_ranks_make_two_engines_of_consecutive_ranks(tmp_path: Path):
    ranks = run_ranks(4, _rollout, False, tmp=tmp_path)
    for r, out in enumerate(ranks):
        assert out["prompt"] == [10 + 100 * r] * 3 + [20 + 100 * r] * 3
    group = [[10 + 100 * r] * 3 + [20 + 100 * r] * 3 for r in range(4)]
    first, second = group[0] + group[1], group[2] + group[3]
    assert ranks[0]["calls"][0] == ranks[1]["calls"][0] == first
    assert ranks[2]["calls"][0] == ranks[3]["calls"][0] == second


def test_a_failure_on_the_leader_ends_the_rollout_on_every_rank(tmp_path: Path):
    leader, follower = run_ranks(2, _rollout, True, tmp=tmp_path)
    assert leader["error"] == "ValueError: a tool broke"
    assert follower["error"].startswith(
        "RuntimeError: the rollout failed on rank 0, which leads this rank's engine"
    )
    assert "ValueError: a tool broke" in follower["error"]
    assert len(leader["calls"]) == len(follower["calls"]) == 1


def test_an_engine_call_that_fails_on_every_rank_ends_the_rollout_everywhere(tmp_path: Path):
    leader, follower = run_ranks(2, _rollout, False, 1000, tmp=tmp_path)
    assert leader["error"] == "ValueError: request 1 is too long"
    assert "leads this rank's engine: ValueError: request 1 is too long" in follower["error"]
    assert leader["calls"] == follower["calls"]  # the follower ran the failing call too, then was released


def test_stale_shared_memory_of_killed_runs_is_removed_and_live_segments_are_kept(tmp_path: Path):
    import mmap

    for name in ("-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_1", "other_segment", "-pp:0-[0-1]-cpushm_0"):
        (tmp_path / name).write_bytes(b"\0" * 4096)
    live = tmp_path / "-tp:0-[2-3]-cpushm_0"
    live.write_bytes(b"\0" * 4096)
    with live.open("r+b") as f, mmap.mmap(f.fileno(), 4096):  # mapped by this process: in use
        removed = _remove_stale_cpu_shm(tmp_path)
        assert removed == ["-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_1"]
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "-pp:0-[0-1]-cpushm_0",
            live.name,
            "other_segment",
        ]
