"""Shared by the benchmarks that compare configurations of the trainer run by run: each side in its own
process, one after the other in a fixed order, on one tiny model built for the comparison."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run_sides(script: str, order: list[str], args: list[str], **sizes: int) -> dict[str, list[dict]]:
    """`script --side S --model-dir M --json-out F *args` for each side S of `order` (sides may repeat),
    on a tiny model built once (`write_model_dir`'s sizes, or `sizes`); every run's JSON result, by side,
    in run order."""
    from rlstack.models.loading import write_model_dir

    runs: dict[str, list[dict]] = {s: [] for s in order}
    with tempfile.TemporaryDirectory(prefix="rlstack-bench-") as tmp:
        model_dir = write_model_dir(Path(tmp) / "tiny", **sizes)
        for i, side in enumerate(order):
            out = Path(tmp) / f"{i}_{side}.json"
            cmd = [
                sys.executable,
                script,
                "--side",
                side,
                "--model-dir",
                str(model_dir),
                "--json-out",
                str(out),
            ]
            subprocess.run([*cmd, *args], check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
            runs[side].append(json.loads(out.read_text()))
    return runs


def step_timings(run_dir: Path, warmup: int, keys: tuple[str, ...]) -> dict[str, list[float]]:
    """`timing_s/<key>` of every step after `warmup` steps of a finished run (0 where a step has none)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][warmup:]
    return {k: [r.get(f"timing_s/{k}", 0.0) for r in rows] for k in keys}


def write_result(result: dict, out: str, setup: dict) -> dict:
    """`result` with the run's `setup` and the machine's (cores, torch threads, platform, date), written as
    JSON to `out`; returns it."""
    import platform
    import time

    import torch

    result = result | {
        "setup": setup,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result
