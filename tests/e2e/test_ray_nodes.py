"""Two Ray nodes on this machine (Ray's `cluster_utils.Cluster`): a 2-rank job with one rank per node,
and a rank killed mid-run ending it with a message that names it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from test_ray import _cfg

from rlstack.errors import RLStackError
from rlstack.trainer import Trainer
from rlstack.workers.ray_group import WorkerDied

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


class KillRankOneAtStep3(Trainer):
    killed_at: float | None = None

    def train_step(self):
        if self.step == 3:
            host, pid, node = self.cluster.where[1]
            os.kill(pid, signal.SIGKILL)
            KillRankOneAtStep3.killed_at = time.monotonic()
        return super().train_step()


@pytest.mark.timeout(300)
def test_two_nodes_run_a_two_rank_job_and_a_killed_rank_ends_it(
    two_nodes, tiny_model_dir: Path, tmp_path: Path
):
    cfg = _cfg(
        tiny_model_dir,
        tmp_path,
        "two_nodes",
        "trainer.backend=ray",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        "trainer.max_steps=4",
    )
    trainer = KillRankOneAtStep3(cfg)
    assert trainer.cluster.where[0][2] != trainer.cluster.where[1][2]  # one rank on each node
    with pytest.raises(WorkerDied, match=r"rank 1 of 2 \(host .*, pid \d+\) died") as e:
        trainer.fit()
    assert time.monotonic() - KillRankOneAtStep3.killed_at < 60
    assert "resume from the last checkpoint" in str(e.value)
    steps = [json.loads(line)["step"] for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # the two steps before the kill trained across the nodes


def test_more_nodes_than_the_cluster_has_is_one_clear_message(
    two_nodes, tiny_model_dir: Path, tmp_path: Path
):
    cfg = _cfg(tiny_model_dir, tmp_path, "four_nodes", "trainer.backend=ray", "trainer.nnodes=4")
    with pytest.raises(
        RLStackError, match=r"4 node\(s\) with \{'CPU': 1\} free each, but the Ray cluster has 2 node"
    ):
        Trainer(cfg)


def test_the_drivers_judge_address_and_key_reach_reward_actors_on_every_node(two_nodes, monkeypatch):
    """The judge's URL and key as the driver reads them (here only in its environment, set after the nodes
    started, so that no node has them) reach each reward actor, which checks the judge and asks it."""
    from types import SimpleNamespace

    from judge_server import JudgeServer
    from scored_batches import make_batch

    from rlstack.config import load_config
    from rlstack.workers.ray_group import RayRewards

    server = JudgeServer()
    monkeypatch.setenv("LLM_AS_A_JUDGE_BASE", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-driver")
    cfg = load_config(
        [
            "worker.reward.reward_function=builtin:math",
            "worker.reward.math.judge_fallback=true",  # words: the rule leaves them to the judge
            "worker.reward.num_workers=2",
        ]
    )
    cluster = SimpleNamespace(get=lambda refs, who=None: ray.get(refs), extra_actors=[], env={})
    try:
        rewards = RayRewards(cluster, cfg, cpus=1.0)
        out = rewards.score(
            make_batch(["<answer>Mon</answer>", "<answer>Tue</answer>"], ["Monday", "Tuesday"])
        )
        rewards.close()
    finally:
        for actor in cluster.extra_actors:
            ray.kill(actor)
        server.stop()
    assert [c["accuracy"] for c in out["reward_components"]] == [1.0, 1.0]
    assert server.model_requests == 2  # each actor's check at start
    assert len(server.chat_requests) == 4 and set(server.api_keys) == {"Bearer sk-driver"}
