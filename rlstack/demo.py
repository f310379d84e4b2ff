"""The demos: a tiny model, a short supervised warm start, then GRPO on the same task family.

Everything runs on CPU, offline and seeded. Steps:
1. build a tiny model (cached under the work directory);
2. warm-start it with a short SFT run (cached);
3. measure held-out greedy accuracy;
4. run GRPO from the warm-started model;
5. measure again and print the before/after table.

Tasks (`rlstack demo --task ...`):
- `addition` (default, `make demo`): a tiny Qwen2 on `builtin:addition`, exact-match reward;
  recipes `rlstack/configs/demo_sft.yaml` and `demo_grpo.yaml`.
- `visual`: a tiny Qwen2.5-VL on `builtin:visual` (read a tiny digit in a cluttered picture) as a
  tool-using agent: it writes Python that crops the original picture in a sandboxed interpreter,
  reads the crop, and answers; warm start on whole trajectories (`builtin:visual_tool_sft`), then
  agentic GRPO with DeepEyes' composite reward; recipes `demo_visual_sft.yaml`, `demo_visual_grpo.yaml`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from rlstack.config import Config, load_config
from rlstack.models.loading import write_model_dir
from rlstack.sft import run_sft
from rlstack.trainer import Trainer

CONFIGS = Path(__file__).parent / "configs"


@dataclass(frozen=True)
class DemoTask:
    sft_config: str
    grpo_config: str
    source: str
    """The validation data source whose accuracy is reported."""
    vision: bool
    description: str


TASKS = {
    "addition": DemoTask("demo_sft.yaml", "demo_grpo.yaml", "addition", False, "addition problems"),
    "visual": DemoTask(
        "demo_visual_sft.yaml", "demo_visual_grpo.yaml", "visual", True, "cluttered pictures (tiny digit)"
    ),
}


def run_demo(workdir: Path, grpo_steps: int | None = None, task: str = "addition") -> dict[str, float]:
    start = time.perf_counter()
    spec = TASKS[task]
    base = workdir / ("base_vision_model" if spec.vision else "base_model")
    if not (base / "config.json").is_file():
        write_model_dir(base, vision=spec.vision)
        print(f"[demo] built a tiny {'Qwen2.5-VL' if spec.vision else 'Qwen2'} model in {base}")

    sft_cfg = load_config(
        [
            f"config={CONFIGS / spec.sft_config}",
            f"worker.actor.model.model_path={base}",
            f"trainer.output_dir={workdir}",
        ]
    )
    warm = sft_cfg.run_dir / "huggingface"
    if not (warm / "config.json").is_file():
        print(f"[demo] supervised warm start: {sft_cfg.trainer.max_steps} steps")
        run_sft(sft_cfg)

    overrides = [
        f"config={CONFIGS / spec.grpo_config}",
        f"worker.actor.model.model_path={warm}",
        f"trainer.output_dir={workdir}",
        "trainer.find_last_checkpoint=false",
    ]
    if grpo_steps is not None:
        overrides.append(f"trainer.max_steps={grpo_steps}")
    grpo_cfg = load_config(overrides)
    before = _evaluate(grpo_cfg, warm, spec)
    print(f"[demo] GRPO: {grpo_cfg.trainer.max_steps} steps from the warm-started model")
    after_metrics = Trainer(grpo_cfg).fit()
    key = f"val/{spec.source}/accuracy"
    result = {
        "task": task,
        "held_out_problems": _num_val(grpo_cfg),
        "accuracy_before_grpo": before[key],
        "accuracy_after_grpo": after_metrics[key],
        "gain_points": 100 * (after_metrics[key] - before[key]),
        "wall_time_s": time.perf_counter() - start,
    }
    for name, short in (
        ("val/agent/tool_calls/mean", "tool_calls_per_answer"),
        ("val/agent/tool_success_rate", "tool_success_rate"),
    ):
        if name in before:
            result[f"{short}_before_grpo"] = before[name]
            result[f"{short}_after_grpo"] = after_metrics[name]
    (grpo_cfg.run_dir / "demo_result.json").write_text(json.dumps(result, indent=2))
    _print_table(result, grpo_cfg, spec)
    return result


def _evaluate(cfg: Config, model_dir: Path, spec: DemoTask) -> dict[str, float]:
    """Held-out greedy validation metrics of `model_dir`, by a validation-only run."""
    val_cfg = load_config(
        [
            f"config={CONFIGS / spec.grpo_config}",
            f"worker.actor.model.model_path={model_dir}",
            f"trainer.output_dir={cfg.trainer.output_dir}",
            "trainer.experiment_name=warm_start_eval",
            "trainer.val_only=true",
            "trainer.logger=[file]",
        ]
    )
    return Trainer(val_cfg).fit()


def _num_val(cfg: Config) -> int:
    from rlstack.data.tasks import builtin_rows

    rows = builtin_rows(cfg.data.val_files)
    return len(rows) if cfg.data.val_max_samples < 0 else min(len(rows), cfg.data.val_max_samples)


def _print_table(r: dict, cfg: Config, spec: DemoTask) -> None:
    print()
    print(f"Held-out greedy accuracy on {r['held_out_problems']} {spec.description} never seen in training")
    print("| model                         | accuracy |")
    print("|-------------------------------|----------|")
    print(f"| warm start (SFT)              | {100 * r['accuracy_before_grpo']:7.1f}% |")
    print(f"| after GRPO                    | {100 * r['accuracy_after_grpo']:7.1f}% |")
    print(f"| gain                          | {r['gain_points']:+7.1f}  |")
    if "tool_calls_per_answer_before_grpo" in r:
        print(
            f"tool calls per answer: {r['tool_calls_per_answer_before_grpo']:.2f} -> "
            f"{r['tool_calls_per_answer_after_grpo']:.2f}; "
            f"tool success rate: {100 * r['tool_success_rate_before_grpo']:.0f}% -> "
            f"{100 * r['tool_success_rate_after_grpo']:.0f}%"
        )
    print(f"\nrun directory: {cfg.run_dir}  (metrics.jsonl, generations/, tensorboard/, huggingface/)")
    print(f"total time: {r['wall_time_s']:.0f} s")
