"""Step time of `trainer.backend=ray` against the embedded default (`local`), side by side.

The same seeded GRPO run on the tiny model (16 prompts x 8 samples, two mini-batches) runs as:
- `local`: every worker in the driver's process;
- `ray1`: one Ray rank (the same work in a Ray actor, plus Ray's calls, object transfers and the
  reward worker actor): the overhead Ray adds per step;
- `ray2`: two Ray ranks (FSDP2 over gloo, each rank generating half the prompts from its own
  copy of the model): what data parallelism costs or saves on this machine, and the weight-sync time
  (gathering the sharded policy and loading it into each rank's engine copy).

Each configuration runs in its own process, in the order local, ray1, ray2, ray2, ray1, local (so
that a change in machine load hits every side), with the same total torch threads (`--threads`:
local and ray1 use them all, each of ray2's ranks half). Step times come from `timing_s/step` after
warm-up steps; the Ray cluster's start-up is not counted.

    python bench/bench_ray.py                 # writes bench/results/ray.json
    python bench/bench_ray.py --steps 4       # quicker
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
RESULTS = ROOT / "bench" / "results" / "ray.json"
SIDES = {
    "local": [],
    "ray1": ["trainer.backend=ray"],
    "ray2": ["trainer.backend=ray", "trainer.n_gpus_per_node=2"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=sorted(SIDES), help="run one side only (internal)")
    p.add_argument("--model-dir", help="tiny model directory (internal)")
    p.add_argument("--json-out", help="where a single side writes its result (internal)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--threads", type=int, default=2, help="torch threads in all (ray2: per rank half)")
    p.add_argument("--output", default=str(RESULTS))
    return p.parse_args(argv)


def run_side(a: argparse.Namespace) -> dict:
    import ray

    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    ranks = 2 if a.side == "ray2" else 1
    if a.side != "local":
        ray.init(num_cpus=ranks + 1, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory(prefix="rlstack-bench-ray-") as out:
        cfg = load_config(
            [
                f"worker.actor.model.model_path={a.model_dir}",
                "data.train_files=builtin:addition@train",
                "data.val_files=",
                "data.rollout_batch_size=16",
                "data.max_response_length=16",
                "worker.rollout.n=8",
                "worker.actor.global_batch_size=8",
                "worker.actor.micro_batch_size_per_device_for_update=64",
                "worker.actor.optim.lr=1e-5",
                "worker.reward.reward_function=builtin:exact_match",
                "trainer.logger=[file]",
                "trainer.val_before_train=false",
                "trainer.save_freq=-1",
                "trainer.save_model_only=true",
                f"trainer.max_steps={a.warmup + a.steps}",
                f"trainer.num_threads={max(1, a.threads // ranks)}",
                f"trainer.output_dir={out}",
                *SIDES[a.side],
            ]
        )
        Trainer(cfg).fit()
        t = step_timings(cfg.run_dir, a.warmup, ("step", "sync", "gen", "update_actor"))
    return {"step_s": t["step"], "sync_s": t["sync"], "gen_s": t["gen"], "update_s": t["update_actor"]}


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.side:
        Path(a.json_out).write_text(json.dumps(run_side(a)))
        return
    runs = run_sides(
        __file__,
        ["local", "ray1", "ray2", "ray2", "ray1", "local"],
        ["--warmup", str(a.warmup), "--steps", str(a.steps), "--threads", str(a.threads)],
    )
    result: dict = {
        "settings": vars(a),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    for side, rs in runs.items():
        steps = [s for r in rs for s in r["step_s"]]
        result[side] = {
            "step_s_median": statistics.median(steps),
            "sync_s_median": statistics.median(s for r in rs for s in r["sync_s"]),
            "gen_s_median": statistics.median(s for r in rs for s in r["gen_s"]),
            "update_s_median": statistics.median(s for r in rs for s in r["update_s"]),
            "runs": rs,
        }
    for side in ("ray1", "ray2"):
        result[f"{side}_step_time_over_local"] = (
            result[side]["step_s_median"] / result["local"]["step_s_median"]
        )
    Path(a.output).parent.mkdir(parents=True, exist_ok=True)
    Path(a.output).write_text(json.dumps(result, indent=1))
    print("| side | step (s, median) | gen (s) | update (s) | sync (s) | step time / local |")
    print("| --- | --- | --- | --- | --- | --- |")
    for side in SIDES:
        r = result[side]
        ratio = 1.0 if side == "local" else result[f"{side}_step_time_over_local"]
        print(
            f"| {side} | {r['step_s_median']:.3f} | {r['gen_s_median']:.3f} | {r['update_s_median']:.3f} | "
            f"{r['sync_s_median']:.4f} | {ratio:.2f}x |"
        )
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
