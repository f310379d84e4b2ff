"""Side-by-side GRPO step rate: rlstack's `Trainer` against TRL's `GRPOTrainer`, on identical work.

Both systems train the same randomly initialised tiny Qwen2 (built once, offline, by
`rlstack.models.loading.write_model_dir`) on the same built-in addition prompts, in the same
order (no shuffling), with the same GRPO settings: prompts per step, samples per prompt, maximum
response length, temperature 1, learning rate, AdamW (betas, weight decay), constant schedule,
clip range, token-mean loss, no KL term, one optimizer step per generation batch made of the same
micro-batches, the same exact-match reward, no validation, no checkpoints, no trackers.

Each system runs in its own subprocess (one after the other, so both see the same machine),
with the same number of torch threads. A step is timed from the start of one step to the start
of the next (everything the loop does between two steps counts), after a few warm-up steps.

    python bench/bench_trl.py                   # both, prints a table, writes bench/results/trl_grpo.json
    python bench/bench_trl.py --steps 4         # quicker
    python bench/bench_trl.py --system trl ...  # one side only (what the main process launches)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "trl_grpo.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", choices=["rlstack", "trl"], help="run one side only (internal)")
    p.add_argument("--model-dir", help="tiny model directory (internal; built when absent)")
    p.add_argument("--json-out", help="where a single side writes its result (internal)")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="responses per prompt")
    p.add_argument("--max-response-length", type=int, default=16, help="tokens per response at most")
    p.add_argument("--micro-batch", type=int, default=64, help="trajectories per forward/backward pass")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--warmup", type=int, default=2, help="steps excluded from the timing")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--rounds", type=int, default=2, help="runs per system, in ABBA order")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads on both sides")
    p.add_argument(
        "--omp-wait-policy",
        default="",
        help="OMP_WAIT_POLICY of both sides (default: unset, the runtime's own policy, as users run); "
        "PASSIVE keeps OpenMP threads from spinning, which makes figures usable on a machine shared with "
        "other CPU work (where spinning threads make steps 10-30x slower) but slows both sides on an idle one",
    )
    p.add_argument("--output", default=str(RESULTS), help="result JSON (main process)")
    return p.parse_args(argv)


def build_rows() -> list[dict]:
    from rlstack.data.tasks import builtin_rows

    return builtin_rows("builtin:addition@train")


def summarize(stamps: list[float], warmup: int, steps: int) -> dict:
    """`stamps[i]` is the start of step i+1; steady-state steps are warmup+1 .. warmup+steps."""
    durations = [b - a for a, b in zip(stamps, stamps[1:])][warmup : warmup + steps]
    assert len(durations) == steps, (len(stamps), warmup, steps)
    total = sum(durations)
    return {
        "timed_steps": steps,
        "timed_s": total,
        "steps_per_s": steps / total,
        "step_s_mean": statistics.mean(durations),
        "step_s_median": statistics.median(durations),
        "step_s_min": min(durations),
        "step_s_max": max(durations),
        "step_s": durations,
    }


def _mean(xs: list[float]) -> float:
    return float(statistics.mean(xs)) if xs else float("nan")


# ---------------------------------------------------------------------------------------- rlstack


def rlstack_overrides(a: argparse.Namespace, model_dir: str, steps: int, out: str) -> list[str]:
    """The rlstack side's config: the benchmark's workload for `steps` steps, run directory under `out`."""
    return [
        f"worker.actor.model.model_path={model_dir}",
        "data.train_files=builtin:addition@train",
        "data.val_files=''",
        "data.shuffle=false",
        f"data.rollout_batch_size={a.prompts}",
        f"data.max_response_length={a.max_response_length}",
        f"worker.actor.global_batch_size={a.prompts}",
        f"worker.actor.micro_batch_size_per_device_for_update={a.micro_batch}",
        f"worker.actor.micro_batch_size_per_device_for_experience={a.micro_batch}",
        f"worker.actor.optim.lr={a.lr}",
        "worker.actor.optim.weight_decay=0.01",
        "worker.actor.clip_ratio_low=0.2",
        "worker.actor.clip_ratio_high=0.28",
        "worker.actor.max_grad_norm=1.0",
        f"worker.rollout.n={a.n}",
        "worker.rollout.temperature=1.0",
        "worker.rollout.top_p=1.0",
        "worker.rollout.top_k=-1",
        "worker.reward.reward_function=builtin:exact_match",
        "algorithm.use_kl_loss=false",
        "algorithm.norm_adv_by_std_in_grpo=true",
        "trainer.logger=[file]",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        "trainer.save_model_only=true",
        "trainer.train_generations_to_log=0",
        f"trainer.max_steps={steps}",
        f"trainer.num_threads={a.threads}",
        f"trainer.output_dir={out}",
        "trainer.experiment_name=bench",
    ]


def run_rlstack(a: argparse.Namespace) -> dict:
    import torch

    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    torch.set_num_threads(a.threads)
    total = a.warmup + a.steps + 1  # one more step: its start closes the last timed step
    with tempfile.TemporaryDirectory(prefix="rlstack-bench-") as out:
        cfg = load_config(rlstack_overrides(a, a.model_dir, total, out))
        assert cfg.data.val_files == "", cfg.data.val_files

        stamps: list[float] = []

        class TimedTrainer(Trainer):
            def train_step(self):
                stamps.append(time.perf_counter())
                return super().train_step()

        t0 = time.perf_counter()
        trainer = TimedTrainer(cfg)
        setup_s = time.perf_counter() - t0
        assert trainer.on_policy, "one mini-batch and one epoch: no separate old-log-prob pass"
        trainer.fit()
        rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if a.warmup < r["step"] <= a.warmup + a.steps]
    result = summarize(stamps, a.warmup, a.steps)
    result.update(
        setup_s=setup_s,
        response_length_mean=_mean([r["response_length/mean"] for r in timed]),
        prompt_length_mean=_mean([r["prompt_length/mean"] for r in timed]),
        trajectories_per_step=a.prompts * a.n,
        reward_mean=_mean([r["critic/score/mean"] for r in timed]),
        phases_s={
            "generate": _mean([r["timing_s/gen"] for r in timed]),
            "reward": _mean([r["timing_s/reward"] for r in timed]),
            "advantages": _mean([r["timing_s/adv"] for r in timed]),
            "update": _mean([r["timing_s/update_actor"] for r in timed]),
            "in_loop_step": _mean([r["timing_s/step"] for r in timed]),
        },
    )
    return result


# -------------------------------------------------------------------------------------------- TRL


def run_trl(a: argparse.Namespace) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlstack.models.loading import load_tokenizer

    torch.set_num_threads(a.threads)
    total = a.warmup + a.steps + 1
    trajectories = a.prompts * a.n
    if trajectories % a.micro_batch:
        raise SystemExit(
            f"--prompts * --n ({trajectories}) must be divisible by --micro-batch ({a.micro_batch})"
        )
    accum = trajectories // a.micro_batch

    rows = build_rows()
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["problem"]}], "answer": r["answer"]} for r in rows]
    )

    def exact_match(completions, answer, **kwargs):
        return [float(c[0]["content"].strip() == str(g).strip()) for c, g in zip(completions, answer)]

    stamps: list[float] = []
    lengths: list[float] = []
    prompt_lengths: list[float] = []
    rollout_s: list[float] = []

    class StepStart(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    class TimedGRPO(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            t = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            rollout_s.append(time.perf_counter() - t)
            lengths.append(float(out["completion_mask"].sum(-1).float().mean()))
            prompt_lengths.append(float(out["prompt_mask"].sum(-1).float().mean()))
            return out

    with tempfile.TemporaryDirectory(prefix="trl-bench-") as out:
        args = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            fp16=False,
            activation_checkpointing=False,  # TRL's GRPO default is True; rlstack does not checkpoint
            per_device_train_batch_size=a.micro_batch,  # trajectories per forward/backward
            gradient_accumulation_steps=accum,
            steps_per_generation=accum,  # one generation batch of prompts*n = one optimizer step
            num_generations=a.n,
            num_iterations=1,
            max_completion_length=a.max_response_length,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            learning_rate=a.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.01,
            adam_beta1=0.9,
            adam_beta2=0.999,
            max_grad_norm=1.0,
            beta=0.0,
            epsilon=0.2,
            epsilon_high=0.28,
            loss_type="dapo",  # token mean over the whole accumulated batch, as rlstack's token-mean
            scale_rewards="group",
            shuffle_dataset=False,
            max_steps=total,
            seed=1,
            report_to="none",
            logging_strategy="no",
            save_strategy="no",
            eval_strategy="no",
            disable_tqdm=True,
            log_completions=False,
            dataloader_num_workers=0,
        )
        assert args.generation_batch_size == trajectories, args.generation_batch_size
        tokenizer = load_tokenizer(a.model_dir)
        t0 = time.perf_counter()
        # As TRL users load a model: Hugging Face's own SDPA attention (rlstack's loader would give TRL its
        # small-query attention path, rlstack.models.attention).
        model = AutoModelForCausalLM.from_pretrained(
            a.model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
        trainer = TimedGRPO(
            model=model,
            reward_funcs=exact_match,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepStart()],
        )
        setup_s = time.perf_counter() - t0
        assert not trainer.model.is_activation_checkpointing, "activation checkpointing must be off"
        trainer.train()
        optimizer_steps = trainer.state.global_step
    assert optimizer_steps == total, (optimizer_steps, total)
    assert len(rollout_s) == total, f"expected one generation per optimizer step, got {len(rollout_s)}"
    sl = slice(a.warmup, a.warmup + a.steps)
    result = summarize(stamps, a.warmup, a.steps)
    result.update(
        setup_s=setup_s,
        response_length_mean=_mean(lengths[sl]),
        prompt_length_mean=_mean(prompt_lengths[sl]),
        trajectories_per_step=trajectories,
        phases_s={"generate_and_score": _mean(rollout_s[sl])},
    )
    result["phases_s"]["update"] = result["step_s_mean"] - result["phases_s"]["generate_and_score"]
    return result


# ------------------------------------------------------------------------------------------- main


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("rlstack", "trl", "transformers", "torch", "accelerate", "datasets"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    try:
        out["rlstack_git"] = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "rlstack"], capture_output=True, text=True
        ).stdout.strip()
        out["rlstack_git"] += "+dirty" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        out["rlstack_git"] = None
    return out


def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "gpu": False,
    }


def run_side(system: str, a: argparse.Namespace, model_dir: str, tmp: str, index: int) -> dict:
    out = Path(tmp) / f"{index}-{system}.json"
    cmd = [
        sys.executable,
        __file__,
        "--system",
        system,
        "--model-dir",
        model_dir,
        "--json-out",
        str(out),
        "--prompts",
        str(a.prompts),
        "--n",
        str(a.n),
        "--max-response-length",
        str(a.max_response_length),
        "--micro-batch",
        str(a.micro_batch),
        "--lr",
        str(a.lr),
        "--warmup",
        str(a.warmup),
        "--steps",
        str(a.steps),
        "--threads",
        str(a.threads),
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    env.pop("OMP_WAIT_POLICY", None)
    if a.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = a.omp_wait_policy
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    print(f"[bench] running {system} ({a.warmup} warm-up + {a.steps} timed steps) ...", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"[bench] {system} failed with exit code {proc.returncode}")
    result = json.loads(out.read_text())
    result["process_wall_s"] = wall
    print(
        f"[bench]   {system}: {result['steps_per_s']:.3f} steps/s over {a.steps} steps ({wall:.0f} s)",
        flush=True,
    )
    return result


def combine(runs: list[dict]) -> dict:
    """Pool the timed steps of every run of one system; the headline rate uses the median step time."""
    steps = [d for r in runs for d in r["step_s"]]
    phase_keys = runs[0]["phases_s"].keys()
    return {
        "steps_per_s": 1.0 / statistics.median(steps),
        "steps_per_s_from_mean": len(steps) / sum(steps),
        "step_s_median": statistics.median(steps),
        "step_s_mean": statistics.mean(steps),
        "step_s_min": min(steps),
        "step_s_max": max(steps),
        "timed_steps": len(steps),
        "response_length_mean": _mean([r["response_length_mean"] for r in runs]),
        "prompt_length_mean": _mean([r["prompt_length_mean"] for r in runs]),
        "trajectories_per_step": runs[0]["trajectories_per_step"],
        "phases_s": {k: _mean([r["phases_s"][k] for r in runs]) for k in phase_keys},
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.system:
        result = {"rlstack": run_rlstack, "trl": run_trl}[a.system](a)
        Path(a.json_out).write_text(json.dumps(result))
        return

    from rlstack.models.loading import write_model_dir

    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {"rlstack": [], "trl": []}
    # ABBA order (rlstack, trl, trl, rlstack, ...) so a drift in machine load hits both sides alike.
    order = [s for i in range(a.rounds) for s in (("rlstack", "trl") if i % 2 == 0 else ("trl", "rlstack"))]
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        model_dir = str(write_model_dir(Path(tmp) / "tiny-qwen2"))
        for i, system in enumerate(order):
            runs[system].append(run_side(system, a, model_dir, tmp, i))
    load_after = os.getloadavg()
    sides = {name: combine(rs) for name, rs in runs.items()}

    r, t = sides["rlstack"], sides["trl"]
    ratio = r["steps_per_s"] / t["steps_per_s"]
    print()
    print(
        f"GRPO steady-state step rate: {a.prompts} prompts x {a.n} samples, <= {a.max_response_length} new "
        f"tokens, {a.threads} torch threads, {a.rounds} run(s) x {a.steps} timed steps per system"
    )
    print(
        f"{'system':<10}{'steps/s':>10}{'s/step':>10}{'min s':>8}{'max s':>8}{'resp len':>10}{'prompt len':>12}"
    )
    for name, s in sides.items():
        print(
            f"{name:<10}{s['steps_per_s']:>10.3f}{s['step_s_median']:>10.3f}{s['step_s_min']:>8.3f}"
            f"{s['step_s_max']:>8.3f}{s['response_length_mean']:>10.2f}{s['prompt_length_mean']:>12.2f}"
        )
    print(f"ratio rlstack/TRL (steps/s, median step time): {ratio:.2f}x")
    print(f"rlstack phases (s/step, mean): {_fmt(r['phases_s'])}")
    print(f"TRL phases (s/step, mean):     {_fmt(t['phases_s'])}")
    print(
        f"load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f} (nproc {machine()['nproc']})"
    )

    result = {
        "benchmark": "GRPO steady-state step rate, rlstack Trainer vs TRL GRPOTrainer",
        "command": " ".join(["python bench/bench_trl.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "ratio_steps_per_s_rlstack_over_trl": round(ratio, 3),
        "settings": {
            "model": "tiny Qwen2 (write_model_dir defaults: hidden 128, 3 layers), random init, float32",
            "task": "builtin:addition@train, chat messages [{'role': 'user', 'content': problem}], no shuffle",
            "reward": "exact match of the stripped completion with the answer",
            "prompts_per_step": a.prompts,
            "n": a.n,
            "trajectories_per_step": a.prompts * a.n,
            "max_response_length": a.max_response_length,
            "micro_batch": a.micro_batch,
            "optimizer_steps_per_generation": 1,
            "temperature": 1.0,
            "lr": a.lr,
            "kl": False,
            "warmup_steps": a.warmup,
            "timed_steps_per_run": a.steps,
            "runs_per_system": a.rounds,
            "torch_threads": a.threads,
            "omp_wait_policy": a.omp_wait_policy or None,
            "steps_per_s": "1 / median step time over all timed steps of all runs (robust to load bursts)",
        },
        "results": {name: _rounded(s) for name, s in sides.items()},
        "versions": versions(),
        "machine": {**machine(), "loadavg_1min_before": load_before[0], "loadavg_1min_after": load_after[0]},
    }
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


def _fmt(phases: dict) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in phases.items())


def _rounded(x):
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


if __name__ == "__main__":
    main()
