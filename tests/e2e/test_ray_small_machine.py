"""Ray with its defaults on a machine whose CPUs the ranks take: two CPU ranks on a 2-CPU cluster (a
laptop's first Ray run) score rewards in the driver and give the local run's metrics; reward actors that
find fewer CPUs than they are share what is left."""

from __future__ import annotations

from pathlib import Path

import pytest
from digits_run import digits_run
from pinned import deterministic_metrics

from rlstack.trainer import Trainer
from rlstack.workers import ray_group

ray = pytest.importorskip("ray")


def test_two_cpu_ranks_on_two_cpus_run_with_the_default_reward_workers(
    tiny_model_dir: Path, tmp_path: Path, capsys
):
    local = digits_run(tiny_model_dir, tmp_path, "local", steps=2)
    Trainer(local).fit()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        cfg = digits_run(
            tiny_model_dir, tmp_path, "ray2", "trainer.backend=ray", "trainer.n_gpus_per_node=2", steps=2
        )
        assert cfg.worker.reward.num_workers == 1  # the default, which used to be refused here
        Trainer(cfg).fit()
    finally:
        ray.shutdown()
    out = capsys.readouterr().out
    assert out.count("rewards are scored in the driver process") == 1
    got, want = deterministic_metrics(cfg.run_dir), deterministic_metrics(local.run_dir)
    assert sorted(got) == ["1", "2"]
    for step in want:  # the same samples, so the same scores (the update rounds differently on 2 ranks)
        assert got[step]["reward/overall"] == pytest.approx(want[step]["reward/overall"], abs=1e-6)
        assert got[step]["critic/score/mean"] == pytest.approx(want[step]["critic/score/mean"], abs=1e-6)


class _Cluster:
    world_size = 2


@pytest.mark.parametrize(
    ("free", "workers", "cpus", "said"),
    [
        (4.0, 2, 1.0, ""),
        (1.0, 2, 0.5, "share them (0.5 CPU each)"),
        (0.0, 1, 0.0, "scored in the driver process (add CPUs"),
        (3.0, 0, 0.0, "worker.reward.num_workers=0"),
    ],
)
def test_reward_actors_take_a_cpu_a_share_or_none(monkeypatch, free, workers, cpus, said):
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": free})
    got_cpus, got_said = ray_group.reward_placement(_Cluster(), workers)
    assert got_cpus == cpus
    assert said in got_said and bool(said) == bool(got_said)


@pytest.mark.long  # the driver's environment reaching actors: test_ray_nodes' judge address and key
def test_every_actor_gets_the_runs_environment_variables(tiny_model_dir: Path, tmp_path: Path, monkeypatch):
    import os

    monkeypatch.setenv("NCCL_DEBUG", "INFO")  # the driver's value is forwarded
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)  # unset: EasyR1's default
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        cfg = digits_run(
            tiny_model_dir,
            tmp_path,
            "env",
            "trainer.backend=ray",
            "trainer.env_vars={MY_FLAG: 'on'}",
            steps=1,
        )
        trainer = Trainer(cfg)
        try:
            actors = trainer.cluster.hosts + trainer.cluster.extra_actors
            assert len(actors) == 2  # the rank and a reward worker
            names = ("MY_FLAG", "NCCL_DEBUG", "VLLM_LOGGING_LEVEL", "TOKENIZERS_PARALLELISM", "RLSTACK_CACHE")
            seen = ray.get(
                [a.__ray_call__.remote(lambda self: {n: os.environ.get(n) for n in names}) for a in actors]
            )
        finally:
            trainer.workers.close()
    finally:
        ray.shutdown()
    for env in seen:
        assert env["MY_FLAG"] == "on" and env["NCCL_DEBUG"] == "INFO" and env["VLLM_LOGGING_LEVEL"] == "WARN"
        assert env["TOKENIZERS_PARALLELISM"] == os.environ.get("TOKENIZERS_PARALLELISM", "true")
        assert env["RLSTACK_CACHE"] == os.environ["RLSTACK_CACHE"]
