"""Pieces of the loop on their own: checkpoints keep the GPU generators and the collector's rounds (under
their old key too), phase timers wait for queued GPU work."""

from __future__ import annotations

import time
from collections import defaultdict

import torch


def test_checkpoints_keep_the_gpu_generators_where_cuda_is_in_use(monkeypatch):
    from rlstack import checkpoint

    gpu_states = [torch.tensor([1, 2, 3], dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.is_initialized", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    monkeypatch.setattr("torch.cuda.get_rng_state_all", lambda: gpu_states)
    monkeypatch.setattr("torch.cuda.set_rng_state_all", restored.append)
    state = checkpoint.rng_state()
    assert state["cuda"] is gpu_states
    checkpoint.set_rng_state(state)
    assert restored == [gpu_states]
    monkeypatch.setattr(
        "torch.cuda.device_count", lambda: 2
    )  # resumed on another number of GPUs: left as seeded
    checkpoint.set_rng_state(state)
    assert len(restored) == 1


def test_the_collectors_rounds_load_from_a_checkpoint_under_their_name_or_their_old_one():
    from rlstack.collection import ROUNDS_KEY, saved_rounds

    assert ROUNDS_KEY == "collector_rounds"
    assert saved_rounds({"step": 4, "collector_rounds": 7}) == 7
    assert saved_rounds({"step": 4, "rollouts": 7}) == 7  # written before the key was renamed
    assert saved_rounds({"step": 4, "collector_rounds": 7, "rollouts": 3}) == 7
    assert saved_rounds({"step": 4}) == 0


def test_phase_timers_wait_for_the_gpu_work_they_queued(monkeypatch):
    from rlstack.timing import timer as _timer

    synced = []
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.is_initialized", lambda: True)
    monkeypatch.setattr("torch.cuda.synchronize", lambda: synced.append(time.perf_counter()))
    timing = defaultdict(float)
    with _timer(timing, "gen"):
        time.sleep(0.01)
    assert len(synced) == 2 and timing["gen"] >= 0.01  # before (earlier work is not counted) and after
