"""Metrics and generations: the run's progress, generations/, and the trackers of `trainer.logger`, each a
`MetricTracker` in `TRACKERS`: the console, metrics.jsonl, TensorBoard, and the trackers users already run
(W&B, SwanLab, MLflow, Trackio), each an optional package.

Metric names follow veRL/EasyR1; every one is described in docs/metrics.md. Every tracker gets the
metrics, the resolved config, and the validation generations as a table (step, prompt, response,
ground truth, score, end reason), with their images where the tracker takes images.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from rlstack.config import Config, TrainerConfig, to_dict
from rlstack.errors import RLStackError


class MetricTracker(Protocol):
    """A tracker of `trainer.logger` (`TRACKERS`): built from the `TrackedRun`, it takes each step's metrics
    and the validation generations, and closes with the run."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        """One call's metrics (floats, sorted by name) at `step`."""

    def log_generations(self, rows: list[dict[str, Any]], step: int, run_dir: Path) -> None:
        """The validation generations of `step` (`generation_rows`; images as paths relative to `run_dir`)."""

    def close(self) -> None:
        """The run ended: write what is buffered, release what is held."""


class Progress:
    """The run's progress, whatever the trackers: a bar on a terminal; elsewhere (a log file, a scheduler's
    output) one line every `every` steps (0: about 20 lines a run). The console tracker shows the main
    metrics beside it."""

    def __init__(self, experiment: str, total_steps: int, every: int):
        self.experiment, self.total_steps = experiment, total_steps
        self.every = every or max(1, round(total_steps / 20))
        self.bar: tqdm | None = None
        self.start: float
        """When the run started (`begin`), for the elapsed time of each line."""
        self.shown: dict[str, str] = {}
        """What the console tracker gave to show with the step being logged (cleared by `update`)."""

    def begin(self, step: int) -> None:
        """Start the clock and, on a terminal, the bar at `step` (after the trackers started, so that what
        they say on starting comes before it)."""
        self.start = time.perf_counter()
        if sys.stderr.isatty():
            self.bar = tqdm(
                total=self.total_steps, initial=step, desc=self.experiment, unit="step", dynamic_ncols=True
            )

    def show(self, values: dict[str, str]) -> None:
        self.shown = values

    def update(self, step: int, advance: bool) -> None:
        """`step` was logged; `advance`: it is a step of the run (not a validation logged on its own)."""
        shown, self.shown = self.shown, {}
        if self.bar is not None:
            if shown:
                self.bar.set_postfix(shown, refresh=False)
            if advance:
                self.bar.update(1)
            else:
                self.bar.refresh()
        elif advance and (step % self.every == 0 or step == self.total_steps or step == 1):
            values = "".join(f", {k}={v}" for k, v in shown.items())
            elapsed = time.perf_counter() - self.start
            print(
                f"[rlstack] step {step}/{self.total_steps} ({elapsed:.0f} s){values}",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@dataclass(frozen=True)
class TrackedRun:
    """What a tracker is built from: the run directory, the resolved config, the project and experiment
    names, the step the run starts from (past 0: resumed from a checkpoint of that step), and its progress."""

    run_dir: Path
    config: dict
    project: str
    experiment: str
    start_step: int
    progress: Progress


class Tracker:
    """The trackers of a run's `trainer.logger` and its progress: what the loop logs goes to each tracker, in
    `TRACKERS`' order, then to the progress; every kind of generations goes to `generations/`, whatever the
    trackers, and the validation ones to the trackers too."""

    def __init__(
        self,
        run_dir: Path,
        loggers: list[str],
        config: dict,
        project: str,
        experiment: str,
        total_steps: int,
        start_step: int = 0,
        progress_every: int = 0,
    ):
        """`progress_every`: steps between two progress lines where stderr is not a terminal (0: about 20
        lines a run)."""
        self.run_dir = run_dir
        self.gen_dir = run_dir / "generations"
        self.gen_dir.mkdir(parents=True, exist_ok=True)
        self.progress = Progress(experiment, total_steps, progress_every)
        run = TrackedRun(run_dir, config, project, experiment, start_step, self.progress)
        self.trackers: list[MetricTracker] = [cls(run) for name, cls in TRACKERS.items() if name in loggers]
        self.progress.begin(start_step)

    @classmethod
    def of_run(cls, cfg: Config, total_steps: int, step: int) -> Tracker:
        """The tracker of a run (train, sft, eval): `trainer.logger`, project and experiment, the config,
        the progress from `step` of `total_steps`."""
        t = cfg.trainer
        return cls(
            cfg.run_dir,
            t.logger,
            to_dict(cfg),
            t.project_name,
            t.experiment_name,
            total_steps,
            step,
            t.progress_every,
        )

    def log(self, metrics: dict[str, float], step: int, advance: bool = True) -> None:
        metrics = {k: float(v) for k, v in sorted(metrics.items())}
        for tracker in self.trackers:
            tracker.log(metrics, step)
        self.progress.update(step, advance)

    def log_generations(self, rows: list[dict[str, Any]], step: int, kind: str) -> None:
        """`generations/<kind>_step_<step>.jsonl`, one row per trajectory; its images (`images`: the
        prompt's, `tool_images`: the tools') are saved once each under `images/` and referenced there by
        their path in the run directory."""
        rows = [self._with_image_files(r) for r in rows]
        with (self.gen_dir / f"{kind}_step_{step}.jsonl").open("w") as f:
            for r in rows:
                f.write(json.dumps(r, default=str) + "\n")
        if kind == "val" and rows:
            for tracker in self.trackers:
                tracker.log_generations(rows, step, self.run_dir)

    def _with_image_files(self, row: dict[str, Any]) -> dict[str, Any]:
        out = dict(row)
        for key in ("images", "tool_images"):
            if row.get(key):
                out[key] = [save_image_once(image, self.run_dir) for image in row[key]]
        return out

    def close(self) -> None:
        self.progress.close()
        for tracker in self.trackers:
            tracker.close()


# ------------------------------------------------------------------------------------- trackers


class FileTracker:
    """`metrics.jsonl`: a line per `log`, with its step and when (for the board's time axes); a value that
    is not finite is written as a string (`"nan"`, `"inf"`). A resumed run first drops the lines past its
    checkpoint's step, written by a run that was killed before its next checkpoint."""

    def __init__(self, run: TrackedRun):
        self.path = run.run_dir / "metrics.jsonl"
        _truncate_after(self.path, run.start_step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, "timestamp": round(time.time(), 3)}
        with self.path.open("a") as f:
            f.write(json.dumps(row | {k: _json_safe(v) for k, v in metrics.items()}) + "\n")

    def log_generations(self, rows: list[dict[str, Any]], step: int, run_dir: Path) -> None:
        """Nothing: the generations are in `generations/`, which `Tracker` writes whatever the trackers."""

    def close(self) -> None:
        """Nothing: each `log` opens and closes the file."""


def _json_safe(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


def _truncate_after(path: Path, step: int) -> None:
    """Drop metric lines past `step` (written by a run that was killed before its next checkpoint)."""
    if not path.exists():
        return
    lines = path.read_text().splitlines()
    kept = [ln for ln in lines if ln.strip() and json.loads(ln).get("step", 0) <= step]
    path.write_text("".join(ln + "\n" for ln in kept))


class TensorBoardTracker:
    """TensorBoard's event files under the run directory's `tensorboard/`; a resumed run's writer purges the
    events past its checkpoint's step."""

    def __init__(self, run: TrackedRun):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(
            str(run.run_dir / "tensorboard"), purge_step=run.start_step + 1 if run.start_step else None
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_generations(self, rows: list[dict[str, Any]], step: int, run_dir: Path) -> None:
        """Nothing: TensorBoard gets the metrics only."""

    def close(self) -> None:
        self.writer.close()


CONSOLE_KEYS = {
    "critic/score/mean": "score",
    "val/reward_score": "val",
    "actor/pg_loss": "pg_loss",
    "response_length/mean": "resp_len",
}
"""The metrics the console tracker shows, by their short names."""


class ConsoleTracker:
    """The main metrics (`CONSOLE_KEYS` and each validation accuracy) beside the run's progress."""

    def __init__(self, run: TrackedRun):
        self.progress = run.progress

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = {name: f"{metrics[k]:.3g}" for k, name in CONSOLE_KEYS.items() if k in metrics}
        shown.update(
            {k: f"{v:.3f}" for k, v in metrics.items() if k.startswith("val/") and k.endswith("/accuracy")}
        )
        self.progress.show(shown)

    def log_generations(self, rows: list[dict[str, Any]], step: int, run_dir: Path) -> None:
        """Nothing: the console shows metrics only."""

    def close(self) -> None:
        """Nothing: the progress closes with the `Tracker`."""


TABLE_COLUMNS = ("step", "prompt", "response", "ground_truth", "score", "end_reason")


def table_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """The generations as table rows (`TABLE_COLUMNS`), text cells as strings."""
    return [
        [
            r["step"],
            str(r["prompt"]),
            str(r["response"]),
            str(r["ground_truth"]),
            float(r["score"]),
            r["end_reason"],
        ]
        for r in rows
    ]


def row_images(row: dict[str, Any]) -> list[str]:
    """A generation row's image files (the prompt's, then the tools'), relative to the run directory."""
    return list(row.get("images", [])) + list(row.get("tool_images", []))


def _require(package: str, logger: str, extra: str):
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise RLStackError(
            f"trainer.logger includes {logger}, but the {package} package is not installed: "
            f"pip install 'rlstack[{extra}]' (or drop {logger} from trainer.logger)"
        ) from e


class WandbTracker:
    """Weights & Biases (`WANDB_MODE=offline` writes under the run directory only).

    The W&B project and run name are `trainer.project_name` and `trainer.experiment_name`, passed to
    `wandb.init` as veRL and EasyR1 pass theirs; an argument of `wandb.init` wins over W&B's environment
    variables, so a project the config names wins over `WANDB_PROJECT`. Where the config leaves them at
    rlstack's defaults (`rlstack`, `default`), `WANDB_PROJECT` and `WANDB_NAME` name them when set (the run
    directory keeps the config's names; `trainer.project_name: ${oc.env:WANDB_PROJECT,rlstack}` gives both
    the variable's). The other `WANDB_*` variables (`WANDB_ENTITY`, `WANDB_RUN_GROUP`, `WANDB_TAGS`,
    `WANDB_NOTES`, `WANDB_MODE`, `WANDB_API_KEY`, ...) are W&B's own, read by `wandb.init`; W&B's files go in
    the run directory (`dir=`), not `WANDB_DIR`."""

    def __init__(self, run: TrackedRun):
        self.wandb = _require("wandb", "wandb", "wandb")
        project, experiment = wandb_names(run.project, run.experiment)
        self.run = self.wandb.init(
            project=project, name=experiment, config=run.config, dir=str(run.run_dir), resume="allow"
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_generations(self, rows: list[dict[str, Any]], step: int, run_dir: Path) -> None:
        """A table of the rows; their images in columns `image_0`, `image_1`, ... (a W&B table cell holds
        one image, not a list of them)."""
        images = [row_images(r) for r in rows]
        width = max((len(i) for i in images), default=0)
        table = self.wandb.Table(columns=[*TABLE_COLUMNS, *(f"image_{k}" for k in range(width))])
        for paths, cells in zip(images, table_rows(rows)):
            pictures = [self.wandb.Image(str(run_dir / p)) for p in paths]
            table.add_data(*cells, *pictures, *[None] * (width - len(pictures)))
        self.run.log({"val/generations": table}, step=step)

    def close(self) -> None:
        self.run.finish()


def wandb_names(project: str, experiment: str) -> tuple[str, str]:
    """The W&B project and run name: the config's (`trainer.project_name`, `trainer.experiment_name`), or
    `WANDB_PROJECT` / `WANDB_NAME` where the config's is rlstack's default (said on stderr)."""
    defaults = {f.name: f.default for f in fields(TrainerConfig)}
    names = {"project_name": project, "experiment_name": experiment}
    for key, variable in (("project_name", "WANDB_PROJECT"), ("experiment_name", "WANDB_NAME")):
        if names[key] == defaults[key] and os.environ.get(variable):
            names[key] = os.environ[variable]
            print(
                f"[rlstack] W&B {'project' if key == 'project_name' else 'run name'}: {names[key]} "
                f"({variable}; trainer.{key} is at its default, {defaults[key]})",
                file=sys.stderr,
            )
    return names["project_name"], names["experiment_name"]


class SwanlabTracker:
    """SwanLab (`SWANLAB_MODE`: cloud by default as in EasyR1; offline or local write under the run
    directory's `swanlog/`)."""

    def __init__(self, run: TrackedRun):
        self.swanlab = _require("swanlab", "swanlab", "swanlab")
        self.run = self.swanlab.init(
            project=run.project,
            experiment_name=run.experiment,
            config=run.config,
            logdir=str(run.run_dir / "swanlog"),
            mode=os.environ.get("SWANLAB_MODE", "cloud"),
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.swanlab.log(metrics, step=step)

    def log_generations(self, rows: list[dict[str, Any]], step: int, run_dir: Path) -> None:
        texts = [
            self.swanlab.Text(
                "\n\n".join(f"[{c}]\n{v}" for c, v in zip(TABLE_COLUMNS, cells)), caption=f"sample {i}"
            )
            for i, cells in enumerate(table_rows(rows))
        ]
        logged: dict[str, Any] = {"val/generations": texts}
        images = [
            self.swanlab.Image(str(run_dir / p), caption=f"sample {i}")
            for i, r in enumerate(rows)
            for p in row_images(r)
        ]
        if images:
            logged["val/generation_images"] = images
        self.swanlab.log(logged, step=step)

    def close(self) -> None:
        self.swanlab.finish()


_MLFLOW_UNSAFE = re.compile(r"[^\w./\- :]")


class MlflowTracker:
    """MLflow: the server of `MLFLOW_TRACKING_URI`, or else a file store under the run directory's
    `mlruns/` (`mlflow ui --backend-store-uri <run_dir>/mlruns` shows it)."""

    def __init__(self, run: TrackedRun):
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps file stores opt-in
        self.mlflow = _require("mlflow", "mlflow", "mlflow")
        self.mlflow.set_tracking_uri(
            os.environ.get("MLFLOW_TRACKING_URI") or (run.run_dir / "mlruns").resolve().as_uri()
        )
        self.mlflow.set_experiment(run.project)
        self.run = self.mlflow.start_run(run_name=run.experiment)
        self.mlflow.log_params({k: str(v)[:500] for k, v in _flatten(run.config).items()})
        self.logged_images: set[str] = set()

    def log(self, metrics: dict[str, float], step: int) -> None:
        # MLflow takes names of letters, digits and `_ - . / : ` only: `val/humaneval/pass@4` -> `pass_at_4`
        names = {k: _MLFLOW_UNSAFE.sub("_", k.replace("@", "_at_")) for k in metrics}
        self.mlflow.log_metrics({names[k]: v for k, v in metrics.items() if math.isfinite(v)}, step=step)

    def log_generations(self, rows: list[dict[str, Any]], step: int, run_dir: Path) -> None:
        cells = table_rows(rows)
        data = {c: [row[i] for row in cells] for i, c in enumerate(TABLE_COLUMNS)}
        data["images"] = [", ".join(row_images(r)) for r in rows]
        self.mlflow.log_table(data=data, artifact_file=f"generations/val_step_{step}.json")
        for path in {p for r in rows for p in row_images(r)} - self.logged_images:
            self.mlflow.log_artifact(str(run_dir / path), artifact_path="images")
            self.logged_images.add(path)

    def close(self) -> None:
        self.mlflow.end_run()


class TrackioTracker:
    """Trackio: a local SQLite store in `TRACKIO_DIR` (default `~/.cache/huggingface/trackio`, read when
    trackio is first imported); `trackio show` opens its dashboard."""

    def __init__(self, run: TrackedRun):
        self.trackio = _require("trackio", "trackio", "trackio")
        self.run = self.trackio.init(
            project=run.project,
            name=run.experiment,
            config=run.config,
            resume="allow",
            embed=False,
            auto_log_cpu=False,
            auto_log_gpu=False,
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.trackio.log(metrics, step=step)

    def log_generations(self, rows: list[dict[str, Any]], step: int, run_dir: Path) -> None:
        import pandas as pd
        from PIL import Image

        frame = pd.DataFrame(table_rows(rows), columns=list(TABLE_COLUMNS))
        frame["image"] = [
            self.trackio.Image(Image.open(run_dir / row_images(r)[0])) if row_images(r) else None
            for r in rows
        ]
        self.trackio.log({"val/generations": self.trackio.Table(dataframe=frame)}, step=step)

    def close(self) -> None:
        self.trackio.finish()


TRACKERS: dict[str, Callable[[TrackedRun], MetricTracker]] = {
    "file": FileTracker,
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "swanlab": SwanlabTracker,
    "mlflow": MlflowTracker,
    "trackio": TrackioTracker,
    "console": ConsoleTracker,
}
"""The trackers by `trainer.logger` name (every name `config.trainer.LOGGERS` allows), each built from the
`TrackedRun`; a run's get each call in this order (console last: it shows what the others logged)."""


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            flat |= _flatten(v, f"{prefix}{k}.")
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def save_image_once(image, run_dir: Path) -> str:
    """`image` as `images/<hash of its pixels>.png` under `run_dir` (written only if not there yet); its path
    relative to `run_dir`."""
    import hashlib

    digest = hashlib.sha1(f"{image.mode}{image.size}".encode() + image.tobytes()).hexdigest()[:20]
    path = Path("images") / f"{digest}.png"
    if not (run_dir / path).is_file():
        (run_dir / "images").mkdir(exist_ok=True)
        tmp = run_dir / "images" / f".{digest}.tmp.png"
        image.save(tmp)
        tmp.replace(run_dir / path)
    return str(path)
