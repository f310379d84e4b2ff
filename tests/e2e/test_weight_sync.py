"""The weight-sync probe: differences logged, a stale engine caught (above and below the tolerance), a sleeping engine woken."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_runs import (
    _digits_reward,
    _metrics,
    _overrides,
)

from rlstack.config import load_config
from rlstack.trainer import Trainer


def test_weight_sync_check_logs_the_difference_and_stops_on_a_stale_engine(
    tiny_model_dir: Path, tmp_path: Path
):
    import copy

    from rlstack.errors import RLStackError

    args = [
        "trainer.max_steps=2",
        "data.val_files=",
        "trainer.logger=[file]",
        "trainer.save_model_only=true",
        _digits_reward(tmp_path),
        "worker.rollout.check_weight_sync=true",
    ]
    cfg = load_config(_overrides(tiny_model_dir, tmp_path / "ok", *args))
    Trainer(cfg).fit()
    metrics = _metrics(cfg.run_dir)
    assert any(metrics[s]["actor/grad_norm"] > 0 for s in (1, 2))
    assert all(metrics[s]["rollout/weight_sync_max_diff"] < 1e-5 for s in (1, 2))
    assert all(metrics[s]["timing_s/sync"] >= 0 for s in (1, 2))

    # An engine that kept its own copy of the initial weights: the check must catch it
    cfg = load_config(_overrides(tiny_model_dir, tmp_path / "stale", *args))
    trainer = Trainer(cfg)
    engine = trainer.groups["rollout"].worker.engine
    engine.model = copy.deepcopy(engine.model)
    with pytest.raises(RLStackError, match="not sampling from the weights being trained"):
        trainer.fit()


class _SleepyEngine:
    """The trainer's engine, but with memory that sleeps between rollouts (as vLLM's does on CUDA):
    generating or scoring while asleep is an error."""

    def __init__(self, engine):
        self.inner, self.asleep, self.calls = engine, False, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def sleep(self):
        self.asleep = True
        self.calls.append("sleep")

    def wake_up(self):
        self.asleep = False
        self.calls.append("wake_up")

    def generate(self, requests, sampling):
        assert not self.asleep, "generated on a sleeping engine"
        return self.inner.generate(requests, sampling)

    def probe_logprobs(self, request, token_ids):
        assert not self.asleep, "scored on a sleeping engine"
        self.calls.append("probe_logprobs")
        return self.inner.probe_logprobs(request, token_ids)


def test_the_weight_sync_probe_wakes_an_engine_put_to_sleep_by_a_later_rollout(
    tiny_model_dir: Path, tmp_path: Path
):
    """Asynchronous GRPO's producer can generate the next batch (and put the engine to sleep) between a
    sync and its check: the probe's log-probs must be taken awake, and the engine left asleep as it was."""
    cfg = load_config(
        _overrides(tiny_model_dir, tmp_path, "data.val_files=", "worker.rollout.check_weight_sync=true")
    )
    trainer = Trainer(cfg)
    worker = trainer.groups["rollout"].worker
    engine = worker.engine = worker.loop.engine = _SleepyEngine(worker.engine)
    trainer.collector.collect(1)  # a rollout: the engine sleeps after it
    assert engine.calls == ["wake_up", "sleep"]
    assert trainer.weight_sync.check(trainer.step)["rollout/weight_sync_max_diff"] < 1e-5
    assert engine.calls[2:] == ["wake_up", "probe_logprobs", "sleep"] and engine.asleep
    trainer.weight_sync.sync(
        trainer.step
    )  # wakes the engine for the rollout that follows, and it stays awake
    trainer.weight_sync.check(trainer.step)
    assert engine.calls[5:] == ["wake_up", "wake_up", "probe_logprobs"] and not engine.asleep


def test_an_engine_that_keeps_the_previous_weights_is_caught_below_the_tolerance(
    tiny_model_dir: Path, tmp_path: Path
):
    """An update that moves the probe by less than weight_sync_tolerance still shows an engine left on the
    old weights: its log-probs of the probe are the previous sync's policy's, not the policy's now."""
    from rlstack.errors import RLStackError

    def config(out: Path):
        return load_config(
            _overrides(
                tiny_model_dir,
                out,
                "data.val_files=",
                "trainer.max_steps=2",
                "worker.actor.optim.lr=1e-4",
                "worker.rollout.check_weight_sync=true",
                _digits_reward(tmp_path),
            )
        )

    cfg = config(tmp_path)
    trainer = Trainer(cfg)
    workers = trainer.groups["rollout"]
    frozen = trainer.policy.probe_logprobs(*trainer.weight_sync.probe)  # an engine never synced
    numerics = 1e-4  # an engine's own rounding: in step with the policy, it differs by this much

    def engine_logprobs(stale: bool):
        def call(method, *args, **kwargs):
            if method != "probe_logprobs":
                return type(workers).call(workers, method, *args, **kwargs)
            logprobs = frozen if stale else trainer.policy.probe_logprobs(*args)
            return [[lp + numerics for lp in logprobs]]

        return call

    workers.call = engine_logprobs(stale=False)
    trainer.fit()  # in step: no alarm
    rows = _metrics(cfg.run_dir)
    assert rows[2]["rollout/weight_sync_max_diff"] == pytest.approx(numerics, abs=1e-6)
    assert rows[2]["rollout/weight_sync_policy_moved"] > 10 * numerics

    cfg = config(tmp_path / "stale")
    trainer = Trainer(cfg)
    workers = trainer.groups["rollout"]
    workers.call = engine_logprobs(stale=True)
    with pytest.raises(RLStackError, match=r"closer to the previous weights' \(up to 0.0001 apart\)") as info:
        trainer.fit()
    now = float(str(info.value).split("than to the policy's now (up to ")[1].split(")")[0])
    assert now < cfg.worker.rollout.weight_sync_tolerance  # the tolerance alone would not have seen it
