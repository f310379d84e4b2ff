"""Metrics of seeded runs pinned to the values the code gave before rollout engines moved behind
`rollout/engine.py` (issue 10): that refactor, and any later one, must change no numbers.

The pinned values live in `fixtures/pinned_metrics.json`, one entry per run name. They were made on
this project's CI machine; another CPU may round differently (the sampler draws from the model's
probabilities, so a last-bit difference can flip a token). To re-pin after a change that alters
numbers on purpose, run the pinning tests with `RLSTACK_REPIN=1` and say why in the commit.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

PINNED = Path(__file__).parents[1] / "fixtures" / "pinned_metrics.json"
NON_DETERMINISTIC = (
    "timestamp",
    "timing_s/",
    "perf/throughput",
    "perf/time_per_step",
    "perf/max_",
    "async/buffer_fill",
)


def deterministic_metrics(run_dir: Path) -> dict[str, dict[str, float]]:
    """Step (as a string) -> the run's metrics at that step, timings left out."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {str(r["step"]): {k: v for k, v in r.items() if not k.startswith(NON_DETERMINISTIC)} for r in rows}


def assert_matches_pinned(name: str, got: dict[str, dict[str, float]]) -> None:
    pinned = json.loads(PINNED.read_text()) if PINNED.exists() else {}
    if os.environ.get("RLSTACK_REPIN"):
        pinned[name] = got
        PINNED.write_text(json.dumps(pinned, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"re-pinned {name}")
    want = pinned[name]
    assert sorted(got) == sorted(want), "steps differ"
    for step in want:
        assert sorted(got[step]) == sorted(want[step]), f"step {step}: metric names differ"
        for key, value in want[step].items():
            assert math.isclose(got[step][key], value, rel_tol=1e-5, abs_tol=1e-6), (
                f"{name}, step {step}, {key}: {got[step][key]} != pinned {value}"
            )
