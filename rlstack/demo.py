"""The demo: a tiny model, a short supervised warm start, then GRPO on the same task family.

Everything runs on CPU, offline and seeded. Steps:
1. build a tiny Qwen2 model and character tokenizer (cached under the work directory);
2. warm-start it with a short SFT run on `builtin:addition@train` (cached);
3. measure held-out greedy accuracy on `builtin:addition@test` (1,000 problems never trained on);
4. run GRPO (exact-match reward) from the warm-started model;
5. measure again and print the before/after table.

The recipes are `rlstack/configs/demo_sft.yaml` and `rlstack/configs/demo_grpo.yaml`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rlstack.config import Config, load_config
from rlstack.models.loading import write_model_dir
from rlstack.sft import run_sft
from rlstack.trainer import Trainer

CONFIGS = Path(__file__).parent / "configs"


def run_demo(workdir: Path, grpo_steps: int | None = None) -> dict[str, float]:
    start = time.perf_counter()
    base = workdir / "base_model"
    if not (base / "config.json").is_file():
        write_model_dir(base)
        print(f"[demo] built a tiny Qwen2 model in {base}")

    sft_cfg = load_config(
        [
            f"config={CONFIGS / 'demo_sft.yaml'}",
            f"worker.actor.model.model_path={base}",
            f"trainer.output_dir={workdir}",
        ]
    )
    warm = sft_cfg.run_dir / "huggingface"
    if not (warm / "config.json").is_file():
        print(f"[demo] supervised warm start: {sft_cfg.trainer.max_steps} steps")
        run_sft(sft_cfg)

    overrides = [
        f"config={CONFIGS / 'demo_grpo.yaml'}",
        f"worker.actor.model.model_path={warm}",
        f"trainer.output_dir={workdir}",
        "trainer.find_last_checkpoint=false",
    ]
    if grpo_steps is not None:
        overrides.append(f"trainer.max_steps={grpo_steps}")
    grpo_cfg = load_config(overrides)
    before = _accuracy(grpo_cfg, warm)
    print(f"[demo] GRPO: {grpo_cfg.trainer.max_steps} steps from the warm-started model")
    after_metrics = Trainer(grpo_cfg).fit()
    after = after_metrics["val/addition/accuracy"]
    elapsed = time.perf_counter() - start
    result = {
        "held_out_problems": _num_val(grpo_cfg),
        "accuracy_before_grpo": before,
        "accuracy_after_grpo": after,
        "gain_points": 100 * (after - before),
        "wall_time_s": elapsed,
    }
    (grpo_cfg.run_dir / "demo_result.json").write_text(json.dumps(result, indent=2))
    _print_table(result, grpo_cfg)
    return result


def _accuracy(cfg: Config, model_dir: Path) -> float:
    """Held-out greedy accuracy of `model_dir`, by a validation-only run."""
    val_cfg = load_config(
        [
            f"config={CONFIGS / 'demo_grpo.yaml'}",
            f"worker.actor.model.model_path={model_dir}",
            f"trainer.output_dir={cfg.trainer.output_dir}",
            "trainer.experiment_name=warm_start_eval",
            "trainer.val_only=true",
            "trainer.logger=[file]",
        ]
    )
    return Trainer(val_cfg).fit()["val/addition/accuracy"]


def _num_val(cfg: Config) -> int:
    from rlstack.data.tasks import builtin_rows

    rows = builtin_rows(cfg.data.val_files)
    return len(rows) if cfg.data.val_max_samples < 0 else min(len(rows), cfg.data.val_max_samples)


def _print_table(r: dict[str, float], cfg: Config) -> None:
    print()
    print(f"Held-out greedy accuracy on {r['held_out_problems']} addition problems never seen in training")
    print("| model                         | accuracy |")
    print("|-------------------------------|----------|")
    print(f"| warm start (SFT)              | {100 * r['accuracy_before_grpo']:7.1f}% |")
    print(f"| after GRPO                    | {100 * r['accuracy_after_grpo']:7.1f}% |")
    print(f"| gain                          | {r['gain_points']:+7.1f}  |")
    print(f"\nrun directory: {cfg.run_dir}  (metrics.jsonl, generations/, tensorboard/, huggingface/)")
    print(f"total time: {r['wall_time_s']:.0f} s")
