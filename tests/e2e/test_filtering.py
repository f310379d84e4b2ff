"""DAPO's dynamic sampling and PyVision's trajectory filters through the trainer's collection."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from e2e_runs import (
    PARITY_REWARD,
    _overrides,
)

from rlstack.config import load_config
from rlstack.trainer import Trainer


def _dapo_trainer(model: Path, out: Path, *extra: str) -> Trainer:
    reward = out / "parity.py"
    out.mkdir(parents=True, exist_ok=True)
    reward.write_text(PARITY_REWARD)
    return Trainer(
        load_config(
            _overrides(
                model,
                out,
                "trainer.max_steps=2",
                "trainer.val_before_train=false",
                "data.val_files=",
                "trainer.logger=[file]",
                "trainer.save_model_only=true",
                "algorithm.online_filtering=true",
                f"worker.reward.reward_function={reward}:compute_score",
                *extra,
            )
        )
    )


@pytest.mark.slow
def test_dynamic_sampling_fills_the_batch_with_mixed_groups_only(tiny_model_dir: Path, tmp_path: Path):
    trainer = _dapo_trainer(tiny_model_dir, tmp_path, "algorithm.filter_key=parity")
    metrics: dict[str, float] = {}
    batch = trainer.collector._filtered(1, defaultdict(float), metrics)
    uids = batch["uid"]
    assert len(set(uids)) == 4 and len(batch) == 16  # rollout_batch_size groups of n
    for uid in set(uids):
        group = [s for s, u in zip(batch["scores"].tolist(), uids) if u == uid]
        assert 0 < sum(group) / len(group) < 1
    assert metrics["online_filtering/num_tries"] >= 1
    trainer.fit()  # and the filtered batches train


def test_a_filter_key_that_a_data_sources_function_does_not_return_is_named(
    tiny_model_dir: Path, tmp_path: Path
):
    from rlstack.errors import RLStackError

    # the training rows' source is scored by exact match, which returns no parity
    trainer = _dapo_trainer(
        tiny_model_dir,
        tmp_path,
        "algorithm.filter_key=parity",
        "worker.reward.reward_function_by_source={addition: 'builtin:exact_match'}",
    )
    with pytest.raises(RLStackError, match=r"of data source 'addition' \(builtin:exact_match\); it returns"):
        trainer.collector._filtered(1, defaultdict(float), {})


def test_a_failed_reward_call_under_the_score_policy_drops_its_group_not_the_run(
    tiny_model_dir: Path, tmp_path: Path
):
    reward = tmp_path / "flaky.py"
    reward.write_text(
        "CALLS = []\n"
        "def compute_score(reward_inputs):\n"
        "    CALLS.append(1)\n"
        "    if len(CALLS) == 3:  # one row's call fails\n"
        "        raise RuntimeError('sandbox timed out')\n"
        "    return [{'overall': float(len(x['response']) % 2), 'parity': float(len(x['response']) % 2)}"
        " for x in reward_inputs]\n"
    )
    trainer = _dapo_trainer(
        tiny_model_dir,
        tmp_path,
        "algorithm.filter_key=parity",
        f"worker.reward.reward_function={reward}:compute_score",
        "worker.reward.on_error=score",
        "worker.reward.num_workers=16",  # one call per row: only the failing rows fail
    )
    batch = trainer.collector._filtered(1, defaultdict(float), {})
    assert all("parity" in c for c in batch["reward_components"])  # the failed rows' groups were dropped


@pytest.mark.slow
def test_dynamic_sampling_that_cannot_fill_a_batch_stops_with_advice(tiny_model_dir: Path, tmp_path: Path):
    from rlstack.errors import RLStackError

    # exact match on a random model: every group is all-wrong, so nothing is ever kept
    trainer = _dapo_trainer(
        tiny_model_dir,
        tmp_path,
        "worker.reward.reward_function=builtin:exact_match",
        "algorithm.max_try_make_batch=2",
    )
    with pytest.raises(RLStackError, match="max_try_make_batch=2"):
        trainer.fit()


def test_a_filter_key_the_reward_does_not_return_is_named(tiny_model_dir: Path, tmp_path: Path):
    from rlstack.errors import RLStackError

    trainer = _dapo_trainer(tiny_model_dir, tmp_path, "algorithm.filter_key=acc")
    with pytest.raises(RLStackError, match=r"filter_key='acc'.*\['overall', 'parity'\]"):
        trainer.collector._filtered(1, defaultdict(float), {})


@pytest.mark.slow
def test_pyvision_partial_filtering_oversamples_ranks_and_drops_trajectories(
    tiny_model_dir: Path, tmp_path: Path
):
    trainer = _dapo_trainer(
        tiny_model_dir,
        tmp_path,
        "algorithm.oversample_factor=2",
        "algorithm.rank_groups_by_std=true",
        "algorithm.trajectory_filter_max_length=4",
        "algorithm.max_try_make_batch=50",
    )
    metrics: dict[str, float] = {}
    batch = trainer.collector._filtered(1, defaultdict(float), metrics)
    assert len(set(batch["uid"])) == 4
    assert (
        int(batch["response_mask"].sum(-1).max()) <= 4
    )  # longer trajectories were dropped from their groups
    assert metrics["online_filtering/kept_groups_per_try"] > 0


def test_pyvision_options_without_online_filtering_are_a_config_error():
    from rlstack.config import ConfigError

    with pytest.raises(ConfigError, match="set algorithm.online_filtering=true"):
        load_config(["algorithm.rank_groups_by_std=true"])
