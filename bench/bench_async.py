"""Steps per second of asynchronous GRPO (staleness 1 and 2; staleness 1 with in-flight weight updates)
against the synchronous loop, side by side.

Generation and training run in separate processes: `trainer.backend=ray` with one policy rank and one
rollout actor of its own (`worker.rollout.colocated=false`), plus a reward actor, each with one torch
thread, on the tiny model. The workload (8 prompts x 8 samples, 48 new tokens, two mini-batches) makes
generation and training take comparable time on a 2-core CPU. Synchronous: the rollout actor and the
policy rank take turns. Asynchronous (`algorithm.async_grpo`): the rollout actor generates the next
steps' batches while the policy rank trains.

Each side runs in its own process, in the order sync, async1, async1-inflight, async2, async2,
async1-inflight, async1, sync (so that a change in machine load hits every side); step times come from
`timing_s/step` after warm-up steps.

    python bench/bench_async.py                # writes bench/results/async.json
    python bench/bench_async.py --steps 6      # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

from sides import run_sides, step_timings

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "async.json"
ASYNC1 = ["algorithm.async_grpo.enabled=true", "algorithm.async_grpo.max_trajectory_age_steps=1"]
SIDES = {
    "sync": [],
    "async1": ASYNC1,
    "async1-inflight": [*ASYNC1, "algorithm.async_grpo.in_flight_weight_updates=true"],
    "async2": ["algorithm.async_grpo.enabled=true", "algorithm.async_grpo.max_trajectory_age_steps=2"],
}
ORDER = ["sync", "async1", "async1-inflight", "async2", "async2", "async1-inflight", "async1", "sync"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=sorted(SIDES), help="run one side only (internal)")
    p.add_argument("--model-dir", help="tiny model directory (internal)")
    p.add_argument("--json-out", help="where a single side writes its result (internal)")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--max-response-length", type=int, default=48)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (two mini-batches of half each)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--output", default=str(RESULTS))
    return p.parse_args(argv)


def run_side(a: argparse.Namespace) -> dict:
    import ray

    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory(prefix="rlstack-bench-async-") as out:
        cfg = load_config(
            [
                f"worker.actor.model.model_path={a.model_dir}",
                "data.train_files=builtin:addition@train",
                "data.val_files=",
                f"data.rollout_batch_size={a.prompts}",
                f"data.max_response_length={a.max_response_length}",
                f"worker.rollout.n={a.n}",
                f"worker.actor.global_batch_size={max(1, a.prompts // 2)}",
                f"worker.actor.micro_batch_size_per_device_for_update={min(32, max(1, a.prompts // 2) * a.n)}",
                "worker.actor.optim.lr=1e-5",
                "worker.reward.reward_function=builtin:exact_match",
                "trainer.backend=ray",
                "worker.rollout.colocated=false",
                "trainer.logger=[file]",
                "trainer.save_freq=-1",
                "trainer.save_model_only=true",
                f"trainer.max_steps={a.warmup + a.steps}",
                "trainer.num_threads=1",
                f"trainer.output_dir={out}",
                *SIDES[a.side],
            ]
        )
        Trainer(cfg).fit()
        return step_timings(
            cfg.run_dir, a.warmup, ("step", "gen", "update_actor", "old", "sync", "wait_rollout")
        )


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.side:
        Path(a.json_out).write_text(json.dumps(run_side(a)))
        return
    runs = run_sides(
        __file__,
        ORDER,
        [
            "--warmup",
            str(a.warmup),
            "--steps",
            str(a.steps),
            "--max-response-length",
            str(a.max_response_length),
            "--prompts",
            str(a.prompts),
            "--n",
            str(a.n),
        ],
    )
    result: dict = {
        "settings": vars(a),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    for side, rs in runs.items():
        result[side] = {f"{k}_s_median": statistics.median(x for r in rs for x in r[k]) for k in rs[0]} | {
            "runs": rs
        }
        result[side]["steps_per_s"] = 1 / result[side]["step_s_median"]
    for side in SIDES.keys() - {"sync"}:
        result[f"{side}_speedup"] = result[side]["steps_per_s"] / result["sync"]["steps_per_s"]
    Path(a.output).parent.mkdir(parents=True, exist_ok=True)
    Path(a.output).write_text(json.dumps(result, indent=1))
    print(
        "| side | steps/s | step (s) | generate (s) | old log-probs (s) | update (s) | sync (s) | speed-up |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for side in SIDES:
        r = result[side]
        up = 1.0 if side == "sync" else result[f"{side}_speedup"]
        print(
            f"| {side} | {r['steps_per_s']:.2f} | {r['step_s_median']:.3f} | {r['gen_s_median']:.3f} | "
            f"{r['old_s_median']:.3f} | {r['update_actor_s_median']:.3f} | {r['sync_s_median']:.3f} | {up:.2f}x |"
        )
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
