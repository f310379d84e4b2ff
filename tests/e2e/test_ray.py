"""`trainer.backend=ray`: rank actors on a local Ray cluster run the same loop as the embedded default."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from digits_run import AGENT_RUN, digits_run
from pinned import deterministic_metrics
from safetensors.torch import load_file

from rlstack.cli import main
from rlstack.collection import seed_prompts
from rlstack.config import ConfigError, load_config
from rlstack.models.loading import load_causal_lm, load_tokenizer
from rlstack.trainer import Trainer
from rlstack.workers.ray_group import WorkerDied

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)  # 2 ranks + reward workers
    yield
    ray.shutdown()


def _cfg(model: Path, out: Path, name: str, *extra: str):
    return digits_run(model, out, name, *extra, steps=3)


@pytest.fixture(scope="module")
def local_run(tiny_model_dir: Path, tmp_path_factory) -> dict[str, dict[str, float]]:
    cfg = _cfg(tiny_model_dir, tmp_path_factory.mktemp("local"), "local")
    Trainer(cfg).fit()
    metrics = deterministic_metrics(cfg.run_dir)
    assert metrics["3"]["actor/grad_norm"] > 0  # the run trains
    return metrics


@pytest.mark.long  # two ranks (below) make the same comparison
def test_one_ray_rank_gives_the_local_metrics(ray_cluster, local_run, tiny_model_dir: Path, tmp_path: Path):
    on_ray = _cfg(tiny_model_dir, tmp_path, "ray1", "trainer.backend=ray")
    Trainer(on_ray).fit()
    assert deterministic_metrics(on_ray.run_dir) == local_run


# Two ranks sample the same tokens as one process (per-prompt seeds); their sums and FSDP2's reduction
# round differently from one process, so the metrics agree to float32 rounding, not bit for bit.
TOLERANCE = dict(rel_tol=1e-4, abs_tol=1e-5)
# what worker.rollout.check_weight_sync=true adds to a run's metrics
SYNC_CHECK = {
    "rollout/weight_sync_max_diff",
    "rollout/weight_sync_previous_diff",
    "rollout/weight_sync_policy_moved",
}


def assert_metrics_close(got: dict, want: dict, only_got: set[str] = frozenset()) -> None:
    """The same steps and metrics (`got` may also hold `only_got`), every value within `TOLERANCE`."""
    assert sorted(got) == sorted(want)
    for step, metrics in want.items():
        assert sorted(got[step].keys() - only_got) == sorted(metrics), step
        for key, value in metrics.items():
            assert math.isclose(got[step][key], value, **TOLERANCE), (step, key, got[step][key], value)


TWO_RANKS = (
    "trainer.backend=ray",
    "trainer.n_gpus_per_node=2",
    "worker.reward.num_workers=2",  # each reward actor scores half the rows
    "worker.rollout.check_weight_sync=true",  # each rank's engine copy: the policy's log-probs
    "worker.rollout.weight_sync_tolerance=1e-5",
    "trainer.save_freq=2",  # checkpoints at steps 2 and 3 (the last)
)


@pytest.fixture(scope="module")
def two_ranks(ray_cluster, tiny_model_dir, tmp_path_factory):
    """A 3-step run on two Ray ranks, uninterrupted: its config and last metrics (two tests read it; under
    pytest-xdist a worker that runs only one of them makes the run for it)."""
    cfg = _cfg(tiny_model_dir, tmp_path_factory.mktemp("two_ranks"), "ray2", *TWO_RANKS)
    return cfg, Trainer(cfg).fit()


def test_two_ray_ranks_give_the_local_metrics_shard_the_policy_and_keep_every_engine_in_sync(
    two_ranks, local_run, tiny_model_dir, tmp_path
):
    cfg, last = two_ranks
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["actor/grad_norm"] > 0 and r["rollout/weight_sync_max_diff"] <= 1e-5 for r in rows)
    assert all(r["rollout/weight_sync_mb"] > 0 for r in rows)
    # the one-process run's metrics (local shares the module, so it syncs nothing; the check adds its own)
    assert_metrics_close(
        deterministic_metrics(cfg.run_dir), local_run, {"rollout/weight_sync_mb", *SYNC_CHECK}
    )
    assert last["response_length/mean"] > 0
    # the sharded checkpoint and the gathered Hugging Face model: the final model is the trained one
    ckpt = cfg.run_dir / "checkpoints" / "global_step_3"
    assert (ckpt / "actor_dcp").is_dir() and (ckpt / "model" / "config.json").is_file()
    assert not list((ckpt / "model").glob("*.safetensors"))  # the weights are the shards
    final = load_causal_lm(str(cfg.run_dir / "huggingface")).state_dict()
    start = load_causal_lm(str(tiny_model_dir)).state_dict()
    assert max(float((final[k] - start[k]).abs().max()) for k in start) > 1e-4

    # `rlstack merge` turns the shards into a Hugging Face model: the trained weights, the trainer's log-probs
    assert main(["merge", str(ckpt), "--out", str(tmp_path / "merged")]) == 0
    merged = load_causal_lm(str(tmp_path / "merged")).eval()
    assert all(torch.equal(final[k], merged.state_dict()[k]) for k in final)
    trained = load_causal_lm(str(cfg.run_dir / "huggingface")).eval()
    ids = torch.tensor([load_tokenizer(str(tmp_path / "merged"))("12+34=46")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(merged(input_ids=ids).logits, trained(input_ids=ids).logits)

    # one process resumes the 2-rank checkpoint: its shards are gathered into the whole model, the
    # optimizer state comes with them, and training goes on from step 3
    resumed = _cfg(
        tiny_model_dir,
        Path(cfg.trainer.output_dir),  # the run's reward file, as the checkpoint records it
        "resumed_on_one",
        f"trainer.load_checkpoint_path={ckpt}",
        "trainer.max_steps=4",
    )
    trainer = Trainer(resumed)
    trainer.loop._resume(trainer)  # what fit() does first
    assert trainer.step == 3
    policy = trainer.groups["actor"].worker
    weights = policy.model.state_dict()
    assert all(torch.equal(weights[k], final[k]) for k in final)
    exp_avg = [policy.optimizer.state[p]["exp_avg"] for p in policy.model.parameters()]
    assert len(exp_avg) == len(list(policy.model.parameters())) and any(
        bool(a.abs().sum() > 0) for a in exp_avg
    )
    trainer.fit()
    assert [
        json.loads(line)["step"] for line in (resumed.run_dir / "metrics.jsonl").read_text().splitlines()
    ] == [4]


def test_ranks_that_do_not_split_a_mini_batch_are_refused_at_load(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="do not split evenly over 3 ranks"):
        _cfg(tiny_model_dir, tmp_path, "bad", "trainer.backend=ray", "trainer.n_gpus_per_node=3")
    with pytest.raises(ConfigError, match="set trainer.backend=ray"):  # asked for one process explicitly
        _cfg(tiny_model_dir, tmp_path, "bad", "trainer.backend=local", "trainer.n_gpus_per_node=2")
    assert _cfg(tiny_model_dir, tmp_path, "auto", "trainer.n_gpus_per_node=2").trainer.backend == "ray"


class KillRankOne(Trainer):
    """Kills rank 1's process (SIGKILL, as the kernel's OOM killer would) before step 2."""

    killed_at: float | None = None

    def train_step(self):
        if self.step == 2:
            host, pid, node = self.cluster.where[1]
            os.kill(pid, signal.SIGKILL)
            KillRankOne.killed_at = time.monotonic()
        return super().train_step()


@pytest.mark.long  # test_ray_nodes kills a rank of a two-node run the same way, with the same checks
@pytest.mark.timeout(240)
def test_a_killed_rank_ends_the_run_with_its_name_within_60_seconds(ray_cluster, tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path, "killed", "trainer.backend=ray", "trainer.n_gpus_per_node=2")
    trainer = KillRankOne(cfg)
    with pytest.raises(WorkerDied, match=r"rank 1 of 2 \(host .*, pid \d+\) died"):
        trainer.fit()
    assert time.monotonic() - KillRankOne.killed_at < 60


@pytest.mark.long  # the agent on ranks: tests/integration's tool tests and the Ray runs above cover each half
@pytest.mark.timeout(300)
def test_two_ray_ranks_run_the_python_tool_agent_like_one_process(ray_cluster, tmp_path: Path):
    from visual_agent import build_tool_vlm

    (tmp_path / "tool_vlm").mkdir()
    model = build_tool_vlm(tmp_path / "tool_vlm", "builtin:tiny-qwen2.5-vl")
    runs = {}
    for name, extra in (("local", []), ("ray2", ["trainer.backend=ray", "trainer.n_gpus_per_node=2"])):
        cfg = load_config(
            [f"worker.actor.model.model_path={model}", f"trainer.output_dir={tmp_path}", *AGENT_RUN, *extra]
            + ["worker.actor.micro_batch_size_per_device_for_update=4", "trainer.num_threads=1"]
            + [f"trainer.experiment_name=agent_{name}"]
        )
        Trainer(cfg).fit()
        runs[name] = deterministic_metrics(cfg.run_dir)
    local, ray2 = runs["local"], runs["ray2"]
    assert local["1"]["agent/tool_calls/mean"] > 0 and local["1"]["agent/tool_success_rate"] > 0
    assert sorted(local) == ["1", "2"]
    assert_metrics_close(ray2, local, {"rollout/weight_sync_mb"})


def test_kill_and_resume_from_a_sharded_checkpoint_matches_an_uninterrupted_run(
    two_ranks, tiny_model_dir, tmp_path
):
    whole, _ = two_ranks  # the same run uninterrupted

    class StopAfterStep2(Trainer):
        def train_step(self):
            if self.step == 3:  # the run dies after step 2's checkpoint
                raise KeyboardInterrupt
            return super().train_step()

    parts = _cfg(tiny_model_dir, tmp_path, "parts", *TWO_RANKS)
    with pytest.raises(KeyboardInterrupt):
        StopAfterStep2(parts).fit()
    Trainer(parts).fit()  # finds global_step_2 and goes on
    want, got = deterministic_metrics(whole.run_dir), deterministic_metrics(parts.run_dir)
    assert sorted(got) == ["1", "2", "3"]
    assert got == want
    # the weights after step 3's update, which the optimizer's state from steps 1-2 (the checkpoint's) shapes
    trained, resumed = (load_file(c.run_dir / "huggingface" / "model.safetensors") for c in (whole, parts))
    assert trained.keys() == resumed.keys()
    assert all(torch.equal(trained[k], resumed[k]) for k in trained)


@pytest.mark.long  # rollouts in their own actor: the async test below; weights reaching it: the in-flight test
def test_rollout_workers_placed_apart_from_the_policy_give_the_local_metrics(
    ray_cluster, local_run, tiny_model_dir: Path, tmp_path: Path
):
    cfg = _cfg(
        tiny_model_dir,
        tmp_path,
        "apart",
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=2",  # two policy ranks ...
        "worker.rollout.colocated=false",  # ... and one rollout actor of its own, sent their weights
        "worker.rollout.num_ranks=1",
        "worker.rollout.check_weight_sync=true",
        "worker.rollout.weight_sync_tolerance=1e-5",
    )
    trainer = Trainer(cfg)
    assert trainer.groups["rollout"].world_size == 1 and trainer.groups["actor"].world_size == 2
    trainer.fit()
    got = deterministic_metrics(cfg.run_dir)
    assert_metrics_close(got, local_run, {"rollout/weight_sync_mb", *SYNC_CHECK})
    for m in got.values():
        assert m["rollout/weight_sync_max_diff"] <= 1e-5 and m["rollout/weight_sync_mb"] > 0


def test_rollout_placed_apart_needs_ray(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="colocated = false .* set trainer.backend=ray"):
        _cfg(tiny_model_dir, tmp_path, "bad", "trainer.backend=local", "worker.rollout.colocated=false")
    assert _cfg(tiny_model_dir, tmp_path, "auto", "worker.rollout.colocated=false").trainer.backend == "ray"


def test_async_grpo_with_rollouts_in_their_own_actor_gives_the_local_async_metrics(
    ray_cluster, tiny_model_dir: Path, tmp_path: Path
):
    asy = ["algorithm.async_grpo.enabled=true", "algorithm.async_grpo.max_trajectory_age_steps=1"]
    local = _cfg(tiny_model_dir, tmp_path, "async_local", *asy)
    Trainer(local).fit()
    apart = _cfg(
        tiny_model_dir,
        tmp_path,
        "async_apart",
        *asy,
        "trainer.backend=ray",
        "worker.rollout.colocated=false",  # generation overlaps training in another process
    )
    Trainer(apart).fit()
    want, got = deterministic_metrics(local.run_dir), deterministic_metrics(apart.run_dir)
    assert [want[s]["async/staleness/max"] for s in ("1", "2", "3")] == [0, 1, 1]
    assert_metrics_close(got, want)


def test_in_flight_weights_reach_a_rollout_actor_while_it_generates(
    ray_cluster, tiny_model_dir: Path, tmp_path: Path
):
    """With in-flight weight updates the rollout actor runs two calls at a time: weights sent while it
    generates a (large) batch return at once and land in that generation."""
    cfg = _cfg(
        tiny_model_dir,
        tmp_path,
        "in_flight_apart",
        "algorithm.async_grpo.enabled=true",
        "algorithm.async_grpo.in_flight_weight_updates=true",
        "trainer.backend=ray",
        "worker.rollout.colocated=false",
        "data.rollout_batch_size=64",
        "worker.rollout.n=16",
        "data.max_response_length=256",
    )
    trainer = Trainer(cfg)
    try:
        host = trainer.cluster.rollout_hosts[0]
        prompts = seed_prompts(trainer.loader.next_batch(), cfg.worker.rollout.seed, 1, range(64))
        weights = trainer.policy.gathered_weights()
        assert isinstance(
            weights, ray.ObjectRef
        )  # left on rank 0: the rollout actor fetches it, not the driver
        began = time.perf_counter()
        generating = host.call.remote("rollout", "generate", prompts)
        time.sleep(1.0)  # the generation of 1,024 trajectories of up to 256 tokens is under way
        sent = host.call.remote("rollout", "update_weights", weights, 1)
        ready, _ = ray.wait([generating, sent], num_returns=1, timeout=120)
        took = time.perf_counter() - began
        assert ready == [sent], f"the weights waited for the generation to end ({took:.1f} s)"
        assert ray.get(sent) > 0
        batch = ray.get(generating)
        assert set(batch["weight_version"].tolist()) == {0}  # began with the initial weights
        # the update landed during it: the rows still going on then end with the new weights' tokens
        last, lengths = batch["weight_version_last"], batch["response_mask"].sum(-1)
        assert set(last.tolist()) <= {0, 1} and (last == 1).sum() > 0
        assert (last == 0).sum() == 0 or lengths[last == 0].max() < lengths[last == 1].min()
    finally:
        trainer.cluster.close()
