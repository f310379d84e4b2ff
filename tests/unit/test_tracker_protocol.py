"""Every tracker of `trainer.logger` is a `MetricTracker` built from the run (`TRACKERS`), the table holds
every name the config allows, and the file tracker keeps metrics.jsonl as a resumed run needs it."""

from __future__ import annotations

import inspect
import json

import pytest

from rlstack.config.trainer import LOGGERS
from rlstack.tracking import TRACKERS, MetricTracker, Tracker


def test_every_logger_the_config_allows_has_a_tracker():
    assert sorted(TRACKERS) == sorted(LOGGERS)


@pytest.mark.parametrize("name", sorted(TRACKERS))
def test_each_tracker_is_built_from_the_run_and_has_the_protocols_methods(name):
    tracker = TRACKERS[name]
    assert list(inspect.signature(tracker).parameters) == ["run"]
    for method in ("log", "log_generations", "close"):
        assert inspect.signature(getattr(tracker, method)) == inspect.signature(
            getattr(MetricTracker, method)
        )


def test_a_resumed_run_drops_the_metric_lines_past_its_checkpoint_and_appends(tmp_path):
    first = Tracker(tmp_path, ["file"], {}, "p", "e", total_steps=4)
    for step in range(1, 5):
        first.log({"x": step, "y": float("nan")}, step)
    first.close()
    resumed = Tracker(tmp_path, ["file"], {}, "p", "e", total_steps=4, start_step=2)
    resumed.log({"x": 30.0}, 3)
    resumed.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["x"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert rows[0]["y"] == "nan" and list(rows[0]) == ["step", "timestamp", "x", "y"]
