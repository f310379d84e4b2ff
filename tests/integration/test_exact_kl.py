"""`algorithm.kl_penalty=full`: the KL between the policy's and the reference's whole next-token distributions,
at the temperature the samples were drawn at, as the log-probs are."""

from __future__ import annotations

import torch
from test_padding_free import skewed_batch

import rlstack.workers.policy as policy_module
from rlstack.algos.kl import kl_full
from rlstack.config import ActorConfig, AlgorithmConfig, ModelConfig
from rlstack.models.logprobs import response_logits
from rlstack.workers.policy import PolicyWorker, _model_inputs


def test_the_exact_kl_reads_both_distributions_at_the_sampling_temperature(tiny_model_dir, tok, monkeypatch):
    seen = []

    def recording(logits, ref_logits):
        seen.append((logits.detach().clone(), ref_logits.detach().clone()))
        return kl_full(logits, ref_logits)

    monkeypatch.setattr(policy_module, "kl_full", recording)
    actor = ActorConfig(
        loss_agg_mode="token-mean",
        model=ModelConfig(model_path=str(tiny_model_dir)),
        global_batch_size=4,
        micro_batch_size_per_device_for_update=4,
    )
    algorithm = AlgorithmConfig(use_kl_loss=True, kl_penalty="full", kl_coef=0.1)
    worker = PolicyWorker(actor, algorithm, max_response_length=40, total_steps=5, seed=0, temperature=0.7)
    assert worker.exact_kl
    batch = skewed_batch(tok, rows=4)
    with torch.no_grad():
        raw = response_logits(worker.model, **_model_inputs(worker.model, batch.trimmed(), "cpu")).logits
    metrics = worker.update(batch, mini_batch_size=4)
    logits, ref_logits = seen[0]
    torch.testing.assert_close(logits, raw / 0.7, atol=1e-5, rtol=1e-5)
    # the reference holds the initial weights: the same logits, at the same temperature
    torch.testing.assert_close(ref_logits, raw / 0.7, atol=1e-5, rtol=1e-5)
    assert "actor/kl_loss" in metrics
