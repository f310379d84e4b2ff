"""`worker.actor.skip_zero_advantage`: rows whose advantages are all 0 take no pass in the update, and the
update is the one every row's pass gives (their loss and gradient are exactly 0)."""

from __future__ import annotations

import pytest
import torch
from test_padding_free import recording_gradients, skewed_batch

from rlstack.batch import Batch
from rlstack.config import ActorConfig, AlgorithmConfig, ConfigError, ModelConfig, load_config
from rlstack.workers import training
from rlstack.workers.policy import PolicyWorker
from rlstack.workers.training import computed_rows


def with_zero_groups(batch: Batch, groups: list[int]) -> Batch:
    """`batch` (groups of 4 rows) with every advantage of `groups` set to 0."""
    advantages = batch["advantages"].clone()
    for g in groups:
        advantages[4 * g : 4 * g + 4] = 0
    return Batch({**batch.columns, "advantages": advantages}, batch.meta)


def policy(tiny_model_dir, skip: bool, loss_agg_mode: str = "token-mean", **actor) -> PolicyWorker:
    cfg = ActorConfig(
        loss_agg_mode=loss_agg_mode,
        model=ModelConfig(model_path=str(tiny_model_dir)),
        global_batch_size=4,
        micro_batch_size_per_device_for_update=4,
        skip_zero_advantage=skip,
        **actor,
    )
    cfg.optim.lr = 1e-3
    cfg.optim.weight_decay = 0.1
    return PolicyWorker(
        cfg, AlgorithmConfig(), max_response_length=40, total_steps=5, seed=0, temperature=0.9
    )


class CountingRows:
    """A worker's update micro-batching that records the rows of each micro-batch it cuts."""

    def __init__(self, worker: PolicyWorker):
        self.inner, self.rows = worker.update_micro_batching, []
        worker.update_micro_batching = self

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def split(self, batch: Batch):
        parts = self.inner.split(batch)
        self.rows += [len(mb) for _, mb in parts]
        return parts


def updates(tiny_model_dir, batches: list[Batch], skip: bool, **actor):
    worker = policy(tiny_model_dir, skip, **actor)
    grads, rows = recording_gradients(worker), CountingRows(worker).rows
    metrics = []
    for b in batches:  # on-policy: the old log-probs are the worker's own
        b = worker.compute_logprobs(Batch(dict(b.columns), b.meta))
        metrics.append(worker.update(b, mini_batch_size=len(b)))
    weights = torch.cat([p.detach().flatten() for p in worker.model.parameters()])
    return torch.cat(grads), weights, rows, metrics


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_the_update_without_zero_advantage_rows_is_the_update_with_them(tiny_model_dir, tok, agg):
    batch = with_zero_groups(skewed_batch(tok, rows=16), [0, 2])  # rows 0-3 and 8-11 have advantage 0
    off = updates(tiny_model_dir, [batch], False, loss_agg_mode=agg)
    on = updates(tiny_model_dir, [batch], True, loss_agg_mode=agg)
    assert off[0].abs().max() > 1e-3
    torch.testing.assert_close(on[0], off[0], atol=1e-6, rtol=1e-5)  # the gradient
    torch.testing.assert_close(on[1], off[1], atol=1e-6, rtol=0)  # the weights after
    assert sum(off[2]) == 16 and sum(on[2]) == 8  # rows forwarded
    m_off, m_on = off[3][0], on[3][0]
    assert m_on["actor/pg_loss"] == pytest.approx(m_off["actor/pg_loss"], abs=1e-6)
    assert m_on["actor/grad_norm"] == pytest.approx(m_off["actor/grad_norm"], rel=1e-5)
    tokens = batch["response_mask"].sum(-1)
    share = float(tokens[[0, 1, 2, 3, 8, 9, 10, 11]].sum() / tokens.sum())
    assert m_on["actor/skipped_tokens"] == pytest.approx(share)
    assert "actor/skipped_tokens" not in m_off


def test_token_mean_metrics_are_over_the_rows_computed(tiny_model_dir, tok):
    batch = with_zero_groups(skewed_batch(tok, rows=16), [1, 3])
    worker = policy(tiny_model_dir, True)
    entropy = worker.compute_logprobs(Batch(dict(batch.columns), batch.meta))["entropy"]
    metrics = worker.update(batch, mini_batch_size=len(batch))
    kept = batch["response_mask"][[0, 1, 2, 3, 8, 9, 10, 11]].float()
    expected = (entropy[[0, 1, 2, 3, 8, 9, 10, 11]] * kept).sum() / kept.sum()
    assert metrics["actor/entropy"] == pytest.approx(float(expected), rel=1e-4)


def test_a_mini_batch_of_zero_advantages_steps_as_on_a_zero_gradient(tiny_model_dir, tok):
    """AdamW moves weights on a zero gradient (its moments, weight decay); with no pass at all the
    gradients would be missing and the step would leave the weights: one row still takes a pass."""
    moving = skewed_batch(tok, rows=8)
    still = with_zero_groups(skewed_batch(tok, rows=8, seed=1), [0, 1])
    off = updates(tiny_model_dir, [moving, still], False)
    on = updates(tiny_model_dir, [moving, still], True)
    assert off[0][-1000:].abs().max() == 0  # the second step's gradient is 0 ...
    torch.testing.assert_close(on[1], off[1], atol=1e-6, rtol=0)  # ... and still moves the weights alike
    assert sum(on[2][-1:]) == 1 and on[3][1]["actor/skipped_tokens"] < 1


def test_computed_rows_keep_the_marked_rows_then_the_shortest_as_many_as_the_busiest_rank(monkeypatch):
    lengths = [5, 1, 4, 2, 3, 6]
    mask = (torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]).long()
    mb = Batch({"x": torch.arange(6), "attention_mask": mask})
    marked = torch.tensor([False, True, False, False, True, False])
    assert computed_rows(mb, marked)["x"].tolist() == [1, 4]
    assert computed_rows(mb, torch.zeros(6, dtype=torch.bool))["x"].tolist() == [1]  # the shortest
    assert computed_rows(mb, torch.ones(6, dtype=torch.bool)) is mb
    # a vision batch whose image rows all have zero advantages: one of them still takes a pass
    grids = [
        torch.tensor([[1, 2, 2]]) if i in (3, 5) else torch.zeros(0, 3, dtype=torch.long) for i in range(6)
    ]
    pictured = Batch({**mb.columns, "image_grid_thw": grids})
    assert computed_rows(pictured, marked)["x"].tolist() == [1, 3, 4]
    assert computed_rows(pictured, marked | (torch.arange(6) == 5))["x"].tolist() == [1, 4, 5]
    monkeypatch.setattr(training.distributed, "gather_objects", lambda n: [n, 4])  # another rank needs 4
    assert computed_rows(mb, marked)["x"].tolist() == [1, 2, 3, 4]  # the two shortest others


@pytest.mark.parametrize(
    "term",
    [
        "algorithm.use_kl_loss=true",
        "worker.actor.entropy_coeff=0.01",
        "algorithm.use_entropy_penalty=true",
        "worker.actor.top_entropy_quantile=0.2",
    ],
)
def test_a_term_that_reads_every_row_is_refused_with_skipping(term):
    with pytest.raises(ConfigError) as e:
        load_config(["worker.actor.skip_zero_advantage=true", term])
    assert "worker.actor.skip_zero_advantage=true" in str(e.value) and term.split("=")[0] in str(e.value)
    load_config([term])  # alone it loads
