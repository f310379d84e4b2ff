"""Asynchronous GRPO (`algorithm.async_grpo`): rollouts of later steps overlap training, with trajectories
exactly `max_trajectory_age_steps` old; 0 is the synchronous loop."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from digits_run import digits_run
from pinned import deterministic_metrics

from rlstack.producer import ProducerFailed
from rlstack.trainer import Trainer

ASYNC_ONLY = ("async/", "rollout/weight_sync_mb")  # metrics a synchronous run has no counterpart of


def _cfg(model: Path, out: Path, name: str, *extra: str):
    return digits_run(model, out, name, *extra, steps=4)


def _without_async(metrics: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {s: {k: v for k, v in m.items() if not k.startswith(ASYNC_ONLY)} for s, m in metrics.items()}


def test_max_age_0_is_the_synchronous_loop(tiny_model_dir: Path, tmp_path: Path):
    sync = _cfg(tiny_model_dir, tmp_path, "sync", "worker.actor.rollout_correction=tis")
    Trainer(sync).fit()
    asy = _cfg(
        tiny_model_dir,
        tmp_path,
        "async0",
        "worker.actor.rollout_correction=tis",
        "algorithm.async_grpo.enabled=true",
        "algorithm.async_grpo.max_trajectory_age_steps=0",
    )
    Trainer(asy).fit()
    want, got = deterministic_metrics(sync.run_dir), deterministic_metrics(asy.run_dir)
    assert want["4"]["actor/grad_norm"] > 0
    assert _without_async(got) == want
    for m in got.values():
        assert m["async/staleness/max"] == 0
        # on-policy: the engine's behaviour log-probs are the policy's, the importance weights 1
        assert m["actor/rollout_correction_weight"] == pytest.approx(1.0, abs=1e-4)


def test_max_age_1_trains_on_trajectories_exactly_one_step_old_and_repeats(
    tiny_model_dir: Path, tmp_path: Path
):
    runs = []
    for name in ("a", "b"):
        cfg = _cfg(tiny_model_dir, tmp_path, f"async1_{name}", "algorithm.async_grpo.enabled=true")
        Trainer(cfg).fit()
        runs.append(deterministic_metrics(cfg.run_dir))
    got = runs[0]
    # step 1 and 2 sample from the initial weights, step k >= 2 from those after step k - 2
    assert [got[s]["async/staleness/max"] for s in ("1", "2", "3", "4")] == [0, 1, 1, 1]
    assert [got[s]["async/staleness/mean"] for s in ("1", "2", "3", "4")] == [0, 1, 1, 1]
    assert all(m["actor/grad_norm"] > 0 for m in got.values())
    assert runs[1] == runs[0]  # a fixed schedule, not a race: the same metrics every time


def test_resume_with_a_full_buffer_continues_like_an_uninterrupted_run(tiny_model_dir: Path, tmp_path: Path):
    extra = ["algorithm.async_grpo.enabled=true", "trainer.save_freq=2"]
    whole = _cfg(tiny_model_dir, tmp_path, "whole", *extra)
    Trainer(whole).fit()

    class StopAfterStep2(Trainer):
        def train_step(self):
            if self.step == 3:
                raise KeyboardInterrupt
            return super().train_step()

    parts = _cfg(tiny_model_dir, tmp_path, "parts", *extra)
    with pytest.raises(KeyboardInterrupt):
        StopAfterStep2(parts).fit()
    import torch

    saved = torch.load(
        parts.run_dir / "checkpoints" / "global_step_2" / "trainer_state.pt", weights_only=False
    )
    assert [step for step, *_ in saved["async_buffer"]][:1] == [3]  # step 3's batch was already made
    Trainer(parts).fit()
    assert deterministic_metrics(parts.run_dir) == deterministic_metrics(whole.run_dir)


@pytest.mark.timeout(120)
def test_an_error_in_the_producer_surfaces_in_the_trainer_with_its_cause(
    tiny_model_dir: Path, tmp_path: Path
):
    cfg = _cfg(
        tiny_model_dir,
        tmp_path,
        "boom",
        "algorithm.async_grpo.enabled=true",
        "worker.reward.reward_function_kwargs={}",
    )
    trainer = Trainer(cfg)
    original = trainer.rewards.score

    def failing(batch):
        if trainer.collector.rounds >= 3:
            raise RuntimeError("the judge went away")
        return original(batch)

    trainer.rewards.score = failing
    with pytest.raises(ProducerFailed, match="the rollout producer failed") as e:
        trainer.fit()
    assert "the judge went away" in str(e.value.__cause__)
    assert not trainer.producer.thread.is_alive()


def test_staleness_is_logged_against_the_bound(tiny_model_dir: Path, tmp_path: Path):
    cfg = _cfg(
        tiny_model_dir,
        tmp_path,
        "age2",
        "algorithm.async_grpo.enabled=true",
        "algorithm.async_grpo.max_trajectory_age_steps=2",
    )
    Trainer(cfg).fit()
    got = deterministic_metrics(cfg.run_dir)
    assert [got[s]["async/staleness/max"] for s in ("1", "2", "3", "4")] == [0, 1, 2, 2]
    assert all(math.isfinite(m["actor/pg_loss"]) for m in got.values())


def test_dynamic_sampling_runs_in_the_producer_as_in_the_synchronous_loop(
    tiny_model_dir: Path, tmp_path: Path
):
    dapo = [
        "algorithm.online_filtering=true",
        "algorithm.filter_key=overall",
        "algorithm.filter_low=0.1",  # groups whose mean digit share is below 0.1 are drawn again
        "algorithm.max_try_make_batch=50",
    ]
    sync = _cfg(tiny_model_dir, tmp_path, "dapo_sync", *dapo)
    Trainer(sync).fit()
    asy = _cfg(
        tiny_model_dir,
        tmp_path,
        "dapo_async0",
        *dapo,
        "algorithm.async_grpo.enabled=true",
        "algorithm.async_grpo.max_trajectory_age_steps=0",
    )
    Trainer(asy).fit()
    want, got = deterministic_metrics(sync.run_dir), deterministic_metrics(asy.run_dir)
    assert any(m["online_filtering/num_tries"] > 1 for m in want.values())  # rounds were drawn again
    assert _without_async(got) == want


def _generation_waits_for_the_weights(trainer: Trainer, timeout: float) -> None:
    """Generation call k >= 2 holds before its second decoding step until the engine has been sent
    version k - 1 (the weights the trainer makes while the producer generates batch k), or `timeout`
    seconds: where updates land in flight they land there, deterministically."""
    import threading

    engine = trainer.groups["rollout"].worker.engine
    received, calls, steps, cond = [0], [0], [0], threading.Condition()
    update, generate, between = engine.update_weights, engine.generate, engine._between_steps

    def update_weights(weights, version, **kw):
        update(weights, version, **kw)
        with cond:
            received[0] = max(received[0], version)
            cond.notify_all()

    def counted_generate(*args, **kw):
        calls[0] += 1
        steps[0] = 0
        return generate(*args, **kw)

    def held():
        steps[0] += 1
        if steps[0] == 1 and calls[0] >= 2:
            with cond:
                cond.wait_for(lambda: received[0] >= calls[0] - 1, timeout=timeout)
        between()

    engine.update_weights, engine.generate, engine._between_steps = update_weights, counted_generate, held


@pytest.mark.parametrize("in_flight", [False, True])
def test_in_flight_weight_updates_land_in_the_generation_in_progress(
    tiny_model_dir: Path, tmp_path: Path, in_flight: bool
):
    cfg = _cfg(
        tiny_model_dir,
        tmp_path,
        f"in_flight_{in_flight}",
        "algorithm.async_grpo.enabled=true",
        "algorithm.async_grpo.max_trajectory_age_steps=1",
        f"algorithm.async_grpo.in_flight_weight_updates={in_flight}",
        "data.max_response_length=4",
        "worker.reward.reward_function=builtin:exact_match",  # never right: responses stay 4 tokens long
    )
    trainer = Trainer(cfg)
    # in flight, the weights come while the generation holds; otherwise the trainer waits for the
    # generation to end before it sends them, and the hold runs out
    _generation_waits_for_the_weights(trainer, timeout=60 if in_flight else 0.2)
    trainer.fit()
    got = deterministic_metrics(cfg.run_dir)
    steps = ("1", "2", "3", "4")
    # the bound holds either way: a batch starts from weights at most one step old
    assert [got[s]["async/staleness/max"] for s in steps] == [0, 1, 1, 1]
    # step 1's batch is generated while the trainer waits for it; from step 2 on, every batch is being
    # generated when the trainer has the previous step's weights: in flight they sample every token
    # after the first (of the rows that go on past it)
    reached = [got[s]["async/in_flight_rows"] for s in steps]
    if in_flight:
        assert reached[0] == 0 and all(r >= 0.5 for r in reached[1:]), reached
    else:
        assert reached == [0.0] * 4
    assert not trainer.producer.thread.is_alive()


def test_in_flight_weight_updates_that_cannot_work_are_config_errors(tiny_model_dir: Path, tmp_path: Path):
    from rlstack.config import ConfigError

    with pytest.raises(ConfigError) as e:
        _cfg(
            tiny_model_dir,
            tmp_path,
            "bad",
            "algorithm.async_grpo.in_flight_weight_updates=true",
            "worker.rollout.name=vllm",
            "trainer.backend=ray",
        )
    message = str(e.value)  # every problem at once
    assert "set algorithm.async_grpo.enabled=true" in message
    assert "the vllm engine runs its generate call to the end" in message
    assert "needs the rollout in actors of its own (worker.rollout.colocated=false)" in message


def test_in_flight_weight_updates_without_staleness_are_a_config_error(tiny_model_dir: Path, tmp_path: Path):
    from rlstack.config import ConfigError

    with pytest.raises(ConfigError, match="max_trajectory_age_steps = 0 does nothing"):
        _cfg(
            tiny_model_dir,
            tmp_path,
            "bad0",
            "algorithm.async_grpo.enabled=true",
            "algorithm.async_grpo.max_trajectory_age_steps=0",
            "algorithm.async_grpo.in_flight_weight_updates=true",
        )
