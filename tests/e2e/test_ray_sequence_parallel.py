"""Sequence parallelism on Ray ranks: 2 ranks that split every sequence of the policy (one data-parallel
group: both get every row) run the one-process GRPO steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from digits_run import digits_run
from pinned import deterministic_metrics
from test_ray import assert_metrics_close

from rlstack.models.loading import write_model_dir
from rlstack.trainer import Trainer

ray = pytest.importorskip("ray")


@pytest.mark.long
@pytest.mark.timeout(400)
def test_two_ray_ranks_splitting_each_sequence_give_the_local_metrics(tmp_path: Path):
    model = write_model_dir(tmp_path / "sp", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)
    local = digits_run(model, tmp_path / "local", "local", "worker.actor.padding_free=true")
    Trainer(local).fit()
    cfg = digits_run(
        model,
        tmp_path / "ray",
        "ray_sp",
        "worker.actor.padding_free=true",
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=2",
    )
    cfg.worker.actor.ulysses_size = 2  # set past the EasyR1 key reader, which still refuses the key
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        Trainer(cfg).fit()
    finally:
        ray.shutdown()
    got, want = deterministic_metrics(cfg.run_dir), deterministic_metrics(local.run_dir)
    assert want["3"]["actor/grad_norm"] > 0
    assert_metrics_close(got, want, {"rollout/weight_sync_mb"})
