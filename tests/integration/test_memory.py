"""Peak memory readings: a stretch's peak shows a buffer that was freed, and the next stretch starts over."""

from __future__ import annotations

import os

import pytest
import torch

from rlstack.workers.memory import peaks_since_last


@pytest.mark.skipif(
    not os.access("/proc/self/clear_refs", os.W_OK),
    reason="the peak resident set cannot be reset here (not Linux)",
)
def test_a_freed_buffer_shows_in_its_stretch_only():
    peaks_since_last()
    buffer = torch.ones(2**27)  # 512 MiB, touched
    buffer.add_(1)
    del buffer
    during = peaks_since_last()["max_rss_gb"]
    after = peaks_since_last()["max_rss_gb"]
    assert during - after > 0.4


def _out_of_memory(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")


def test_running_out_of_memory_names_the_pass_its_size_and_the_setting_to_lower(tiny_model_dir, monkeypatch):
    """A device's out-of-memory error in a log-prob pass or an update becomes a message naming the pass, the
    micro-batch's size and the config key that bounds it (the row count, or the token budget with dynamic
    batching), instead of a traceback from deep inside the model."""
    from test_distributed import uneven_batch

    from rlstack.config import ActorConfig, AlgorithmConfig
    from rlstack.errors import OutOfMemory
    from rlstack.workers import policy
    from rlstack.workers.policy import PolicyWorker

    def worker(**actor_kwargs) -> PolicyWorker:
        actor = ActorConfig(
            micro_batch_size_per_device_for_update=2, loss_agg_mode="token-mean", **actor_kwargs
        )
        actor.model.model_path = str(tiny_model_dir)
        return PolicyWorker(actor, AlgorithmConfig(), 8, total_steps=1, seed=1)

    batch = uneven_batch(vocab=60)
    monkeypatch.setattr(policy, "response_logits", _out_of_memory)
    with pytest.raises(OutOfMemory) as e:
        worker().update(batch, 8)
    message = str(e.value)
    assert (
        "out of memory in the actor update of a micro-batch of 2 trajectories of up to 11 tokens (21 attended, padded to 14 columns)"
        in message
    )
    assert "lower worker.actor.micro_batch_size_per_device_for_update=2" in message
    assert "enable_gradient_checkpointing" in message and "Tried to allocate 2.00 GiB" in message

    monkeypatch.setattr(policy, "forward_logprobs", _out_of_memory)
    dynamic = worker(dynamic_batching=True, max_token_len_per_device_for_experience=40)
    with pytest.raises(
        OutOfMemory,
        match=r"in the log-prob pass of a micro-batch of 4 trajectories of up to 12 tokens \(40 attended",
    ) as e:
        dynamic.compute_logprobs(batch)
    assert "lower worker.actor.max_token_len_per_device_for_experience=40 (the tokens" in str(e.value)
    assert "gradient_checkpointing" not in str(e.value)  # no backward pass to save memory in
    assert "gradient_checkpointing" not in str(e.value)  # no backward pass to save memory in
