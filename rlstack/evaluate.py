"""`rlstack eval`: a model or a checkpoint evaluated on one or more datasets with the reward functions of
training, the way GRPO's validation generates and scores (`validation.py`): greedy (accuracy per data
source), and with `n > 1` also `n` samples per prompt at a temperature (pass@k per data source, Chen et
al.'s unbiased estimator). The config is a training config (`config=... a.b=c`): the model, the prompt
format, the rewards, tools, the engine and the ranks are read from it as `rlstack train` reads them.

Writes a run directory of its own (`<experiment_name>_eval`): `eval.json` (every metric, per dataset and
mode), `config.yaml`, `metrics.jsonl` (one row, step 0, the board's curves), `generations/` (every
trajectory, the board's rollout browser), and prints a table. Another evaluation there replaces it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from rlstack.algos.groups import pass_at_k
from rlstack.batch import Batch
from rlstack.batch_metrics import generation_rows
from rlstack.config import Config, ConfigError
from rlstack.data.dataset import PromptDataset
from rlstack.models.loading import load_tokenizer_and_processor, model_dir
from rlstack.plan import StepPlan
from rlstack.rollout.agent import agent_system_prompt
from rlstack.run_loop import RunLoop
from rlstack.sft import build_warm_models
from rlstack.validation import validate
from rlstack.weight_sync import sync_engines
from rlstack.workers.rollout import GroupSampling
from rlstack.workers.start import start_workers


@dataclass(frozen=True)
class EvalSettings:
    datasets: list[str]
    """Data specs, each as `data.val_files` takes one (empty: `data.val_files`)."""
    n: int = 1
    """Samples per prompt of the sampled pass (1: greedy only)."""
    ks: tuple[int, ...] = ()
    """The k of pass@k (empty: 1, 2, 4, ... up to n, and n)."""
    temperature: float = 1.0
    """Temperature of the sampled pass (top-p and top-k: `worker.rollout.val_top_p` / `val_top_k`)."""
    checkpoint: str | None = None
    """An rlstack checkpoint (`checkpoints/global_step_N`) whose policy is evaluated instead of
    `worker.actor.model.model_path` (sharded, LoRA or whole, as it was saved)."""

    def problems(self) -> list[str]:
        p = []
        if self.n < 1:
            p.append(f"--n {self.n}: the samples per prompt must be at least 1")
        bad = [k for k in self.ks if not 1 <= k <= self.n]
        if bad:
            p.append(
                f"--k {bad}: each k of pass@k must be between 1 and --n ({self.n}); raise --n or lower k"
            )
        if self.n > 1 and self.temperature <= 0:
            p.append(
                f"--temperature {self.temperature}: {self.n} samples per prompt need a temperature above 0"
            )
        if self.checkpoint and not (Path(self.checkpoint) / "trainer_state.pt").is_file():
            p.append(
                f"--checkpoint {self.checkpoint}: not an rlstack checkpoint (no trainer_state.pt in "
                f"{Path(self.checkpoint).resolve()}); point it at a run's checkpoints/global_step_N"
            )
        return p


def eval_run_config(cfg: Config) -> Config:
    """The config an evaluation records: its run directory is `<experiment_name>_eval`, never the training
    run's, and it is a validation-only run (`trainer.val_only`) that resumes nothing (`--checkpoint` names
    the weights it evaluates)."""
    t = cfg.trainer
    name = t.experiment_name if t.experiment_name.endswith("eval") else f"{t.experiment_name}_eval"
    only = dataclasses.replace(
        t, experiment_name=name, val_only=True, find_last_checkpoint=False, load_checkpoint_path=None
    )
    return dataclasses.replace(cfg, trainer=only)


def pass_at_ks(batch: Batch, ks: list[int]) -> dict[str, float]:
    """`<source>/pass@k` for each k: the mean over the source's prompts (rows grouped by uid) of the
    unbiased pass@k, a sample counting as solved when its accuracy (else its overall reward) is 1."""
    solved: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for comp, source, uid in zip(batch["reward_components"], batch["data_source"], batch["uid"]):
        solved[source][uid].append(comp.get("accuracy", comp["overall"]) >= 1)
    out = {}
    for source, prompts in solved.items():
        for k in ks:
            values = [pass_at_k(len(v), sum(v), k) for v in prompts.values()]
            out[f"{source}/pass@{k}"] = sum(values) / len(values)
    return out


class Evaluator:
    """An evaluation as a `Job` of the run loop (`run_loop.py`): a validation-only run, its validation every
    dataset's greedy and sampled passes; no steps, no checkpoints."""

    validates = True

    def __init__(self, cfg: Config, settings: EvalSettings):
        problems = settings.problems()
        if any(not spec.strip() for spec in settings.datasets):
            problems.append("--data '': an empty dataset spec; give a file, folder, builtin:NAME or Hub name")
        datasets = settings.datasets or ([cfg.data.val_files] if cfg.data.val_files else [])
        if not datasets:
            problems.append("nothing to evaluate: give --data SPEC (repeatable) or data.val_files=SPEC")
        if problems:
            raise ConfigError(problems)
        self.cfg = cfg = eval_run_config(cfg)
        self.loop = RunLoop(cfg, "eval")
        self.settings, self.datasets = settings, datasets
        build_warm_models(cfg)
        w = cfg.worker
        tok, processor = load_tokenizer_and_processor(w.actor.model, model_dir(w.actor.model))
        system, images = agent_system_prompt(w.rollout.agent), w.rollout.agent.max_images
        self.sets = {
            spec: PromptDataset.from_config(
                spec, tok, cfg.data, cfg.data.val_max_samples, processor, system, images
            )
            for spec in datasets
        }
        # The workers of a run without its algorithm: the policy (what is evaluated), the engine, rewards.
        work, plan = StepPlan.without_algorithm(cfg)
        self.plan = plan
        self.workers = ws = start_workers(work, plan, 1)
        self.policy, self.rollout, self.rewards = ws.policy, ws.rollout, ws.rewards
        self.result: dict = {}
        """What `eval.json` holds, once evaluated."""

    def run(self) -> dict:
        """Evaluate every dataset; returns what `eval.json` holds."""
        run_dir = self.cfg.run_dir
        replace_earlier_eval(run_dir)
        self.loop.fit(self, 0)
        (run_dir / "eval.json").write_text(json.dumps(self.result, indent=2) + "\n")
        print(table(self.result))
        print(f"[rlstack] eval written to {run_dir / 'eval.json'} (rlstack board {run_dir})")
        return self.result

    def validate(self) -> dict[str, float]:
        """Every dataset, greedy and (`n > 1`) sampled, with the weights evaluated; the metrics logged at
        step 0, every trajectory in `generations/`."""
        cfg, s = self.cfg, self.settings
        if s.checkpoint:
            self.policy.load_checkpoint(Path(s.checkpoint))
        sync_engines(self.policy, self.rollout, self.plan.rollout_colocated, 0)  # the weights evaluated
        ks = list(s.ks) or sorted({2**i for i in range(s.n.bit_length()) if 2**i <= s.n} | {s.n})
        result: dict = {
            "model": cfg.worker.actor.model.model_path,
            "checkpoint": s.checkpoint,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "datasets": {},
        }
        logged: dict[str, float] = {}
        rows: list[dict] = []
        d, r = cfg.data, cfg.worker.rollout
        one_greedy = GroupSampling(1, 0.0, 1.0, -1)
        for spec, dataset in self.sets.items():
            entry: dict = {"rows": len(dataset)}
            greedy, batch = validate(
                dataset, self.rollout, self.rewards, d.val_batch_size, r.seed, 1, one_greedy
            )
            entry["greedy"] = _strip(greedy)
            rows += [r | {"eval": "greedy"} for r in generation_rows(batch, len(batch), 0)]
            if s.n > 1:
                sampling = GroupSampling(s.n, s.temperature, r.val_top_p, r.val_top_k)
                sampled, batch = validate(
                    dataset, self.rollout, self.rewards, d.val_batch_size, r.seed, 1, sampling
                )
                entry["sampled"] = _strip(sampled) | pass_at_ks(batch, ks)
                entry["sampled_settings"] = {"n": s.n, "temperature": s.temperature, "k": ks}
                rows += [r | {"eval": "sampled"} for r in generation_rows(batch, len(batch), 0)]
            result["datasets"][spec] = entry
            for mode in ("greedy", "sampled"):
                logged |= {f"eval/{mode}/{k}": v for k, v in entry.get(mode, {}).items()}
        self.loop.tracker.log_generations(rows, 0, "val")
        self.result = result
        return logged

    def close(self) -> None:
        self.workers.close()


EVAL_OUTPUTS = ("eval.json", "metrics.jsonl", "generations", "tensorboard")
"""What an evaluation writes in its run directory besides config.yaml (the trackers' own folders aside)."""


def replace_earlier_eval(run_dir: Path) -> None:
    """An evaluation replaces the one before it in the same run directory, whole (not its eval.json alone,
    with a second step-0 row in metrics.jsonl and generations mixed), and says so."""
    earlier = [run_dir / name for name in EVAL_OUTPUTS if (run_dir / name).exists()]
    if not earlier:
        return
    print(
        f"[rlstack] replacing the earlier evaluation in {run_dir} (a trainer.experiment_name of its own keeps "
        "both)",
        flush=True,
    )
    for path in earlier:
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _strip(metrics: dict[str, float]) -> dict[str, float]:
    """Validation's metrics without their `val/` prefix."""
    return {k.removeprefix("val/"): v for k, v in metrics.items()}


def table(result: dict) -> str:
    """One line per dataset and data source: greedy accuracy, and pass@k of the sampled pass."""
    lines = []
    for spec, entry in result["datasets"].items():
        sources = sorted({k.split("/")[0] for k in entry["greedy"] if k.endswith("/accuracy")})
        for source in sources:
            cells = [f"greedy {entry['greedy'][f'{source}/accuracy']:.1%}"]
            sampled = entry.get("sampled", {})
            cells += [
                f"{k.split('/')[1]} {v:.1%}" for k, v in sampled.items() if k.startswith(f"{source}/pass@")
            ]
            lines.append(f"{spec}  [{source}, {entry['rows']} prompts]  " + "  ".join(cells))
    return "\n".join(lines)
