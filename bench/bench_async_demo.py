"""Wall-clock time to reach the synchronous run's final held-out accuracy, asynchronous vs synchronous
GRPO, on the demo task (`rlstack/configs/demo_grpo.yaml`, from the demo's warm start).

All sides run the demo's GRPO recipe with generation and training in separate processes
(`trainer.backend=ray`, one policy rank, one rollout actor with `worker.rollout.colocated=false`, one
torch thread each), validating every `--val-freq` steps, one after the other, each in its own process:

- `sync`: the synchronous loop, the recipe's `--steps` steps;
- `async1`: `algorithm.async_grpo`, staleness 1, `--async-steps` steps (by default 1.5x as many: the
  same training time, as the asynchronous loop steps about 1.5x as fast; the cosine schedule spans
  the run's own steps, as a user would set it for that budget);
- `async1-tis`: the same with `worker.actor.rollout_correction=tis` (the decoupled objective: the
  loss of a token weighted by proximal / behaviour probability, truncated at 2);
- `async1-inflight` (on request, `--sides`): `async1` with in-flight weight updates.

Time is the trainer's own step time summed (`timing_s/step`: validation and start-up left out). The
figure of merit is the training time until a side first reaches the synchronous run's final
held-out accuracy.

    python bench/bench_async_demo.py --seed 1   # bench/results/async_demo.json (about 20 min)
    python bench/bench_async_demo.py --seed 2 --output bench/results/async_demo_seed2.json
    python bench/bench_async_demo.py --steps 200 --async-steps 300  # quicker
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "async_demo.json"
CONFIGS = ROOT / "rlstack" / "configs"
ASYNC1 = ["algorithm.async_grpo.enabled=true", "algorithm.async_grpo.max_trajectory_age_steps=1"]
SIDES = {
    "sync": [],
    "async1": ASYNC1,
    "async1-tis": [*ASYNC1, "worker.actor.rollout_correction=tis"],
    "async1-inflight": [*ASYNC1, "algorithm.async_grpo.in_flight_weight_updates=true"],
}
DEFAULT_SIDES = "sync,async1,async1-tis"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=sorted(SIDES), help="run one side only (internal)")
    p.add_argument("--warm", help="the warm-started model (internal)")
    p.add_argument("--workdir", help="where a side writes its run (internal)")
    p.add_argument(
        "--steps", type=int, default=500, help="GRPO steps of the synchronous side (the demo's: 500)"
    )
    p.add_argument("--async-steps", type=int, default=750, help="GRPO steps of the asynchronous sides")
    p.add_argument("--sides", default=DEFAULT_SIDES, help="comma-separated sides to run (sync always runs)")
    p.add_argument("--val-freq", type=int, default=25)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", default=str(RESULTS))
    return p.parse_args(argv)


def run_side(a: argparse.Namespace) -> None:
    import ray

    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    cfg = load_config(
        [
            f"config={CONFIGS / 'demo_grpo.yaml'}",
            f"worker.actor.model.model_path={a.warm}",
            f"trainer.output_dir={a.workdir}",
            f"trainer.experiment_name={a.side}",
            f"trainer.max_steps={a.steps if a.side == 'sync' else a.async_steps}",
            f"trainer.val_freq={a.val_freq}",
            f"trainer.seed={a.seed}",
            f"data.seed={a.seed}",
            f"worker.rollout.seed={a.seed}",
            "trainer.num_threads=1",
            "trainer.logger=[file]",
            "trainer.save_freq=-1",
            "trainer.save_model_only=true",
            "trainer.backend=ray",
            "worker.rollout.colocated=false",
            *SIDES[a.side],
        ]
    )
    Trainer(cfg).fit()


def curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, training seconds so far, held-out accuracy) at every validation."""
    points, seconds = [], 0.0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        seconds += r.get("timing_s/step", 0.0)
        if "val/addition/accuracy" in r:
            points.append((r["step"], seconds, r["val/addition/accuracy"]))
    return points


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.side:
        run_side(a)
        return
    from rlstack.config import load_config
    from rlstack.models.loading import write_model_dir
    from rlstack.sft import run_sft

    sides = ["sync", *(s for s in a.sides.split(",") if s != "sync")]
    curves = {}
    for side in sides:
        if side not in SIDES:
            raise SystemExit(f"unknown side {side!r}; the sides are {', '.join(SIDES)}")
    with tempfile.TemporaryDirectory(prefix="rlstack-bench-async-demo-") as tmp:
        base = write_model_dir(Path(tmp) / "base")
        sft = load_config(
            [
                f"config={CONFIGS / 'demo_sft.yaml'}",
                f"worker.actor.model.model_path={base}",
                f"trainer.output_dir={tmp}",
                f"trainer.seed={a.seed}",
                f"data.seed={a.seed}",
                "trainer.logger=[file]",
            ]
        )
        warm = run_sft(sft)
        warm_digest = hashlib.sha256(
            b"".join(f.read_bytes() for f in sorted(warm.glob("*.safetensors")))
        ).hexdigest()
        for side in sides:
            cmd = [sys.executable, __file__, "--side", side, "--warm", str(warm), "--workdir", tmp]
            cmd += ["--steps", str(a.steps), "--async-steps", str(a.async_steps)]
            cmd += ["--val-freq", str(a.val_freq), "--seed", str(a.seed)]
            subprocess.run(cmd, check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
            curves[side] = curve(Path(tmp) / "demo" / side)
    target = curves["sync"][-1][2]
    reached = {
        side: next(((step, s) for step, s, acc in points if acc >= target), None)
        for side, points in curves.items()
    }
    result = {
        "settings": vars(a),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "warm_start_sha256": warm_digest,
        "target_accuracy": target,
        "curves": curves,
        "reached": reached,
    }
    result["time_ratio_sync_over_side"] = {
        side: reached["sync"][1] / at[1] for side, at in reached.items() if at is not None and side != "sync"
    }
    Path(a.output).parent.mkdir(parents=True, exist_ok=True)
    Path(a.output).write_text(json.dumps(result, indent=1))
    print(f"target: the synchronous run's final held-out accuracy, {100 * target:.1f}%")
    print("| side | final accuracy | training time (s) | reached the target at step | after (s) |")
    print("| --- | --- | --- | --- | --- |")
    for side, points in curves.items():
        at = reached[side]
        where = f"{at[0]} | {at[1]:.0f}" if at else "never | -"
        print(f"| {side} | {100 * points[-1][2]:.1f}% | {points[-1][1]:.0f} | {where} |")
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
