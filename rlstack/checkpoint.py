"""Checkpoint directories: atomic writes, discovery of the newest complete one, pruning, RNG state.

A checkpoint is written into a hidden temporary folder and renamed to `global_step_N` only when
complete, so a kill mid-save never leaves a broken newest checkpoint; leftovers of an
interrupted save are removed at the next save. What is written gets the modes of a plain `open()`
(`default_modes`), not the 0600 of the temporary files safetensors writes through.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def checkpoints(ckpt_root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under `ckpt_root`, oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in ckpt_root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))
    ]
    return sorted(found)


def say_later_checkpoints(ckpt_root: Path, step: int) -> None:
    """A run that goes on from an earlier checkpoint than the run directory's last (trainer.load_checkpoint_path)
    says which later checkpoints it will replace."""
    later = [p.name for s, p in checkpoints(ckpt_root) if s > step]
    if later:
        print(
            f"[rlstack] note: {ckpt_root} also holds {', '.join(later)}, from after step {step}: this run goes "
            f"on from step {step} and replaces them, and metrics.jsonl's later rows, as it reaches their steps "
            "(a new trainer.experiment_name keeps them)",
            flush=True,
        )


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    found = checkpoints(ckpt_root)
    return found[-1][1] if found else None


METRICS = "metrics.json"
"""The step's metrics, in each checkpoint: what `trainer.save_best_metric` ranks checkpoints by."""


def save_atomically(
    ckpt_root: Path,
    step: int,
    write: Callable[[Path], None],
    keep: int,
    metrics: dict[str, float] | None = None,
    best: tuple[str, str] | None = None,
) -> Path:
    """Call `write(tmp_dir)` (and write `metrics` beside it), then publish it as `global_step_<step>` and keep
    `keep` (-1: all) of the checkpoints: the newest, or with `best` = (metric, "max" | "min") the best by
    that metric, ties to the newer, and the newest too (what a resume starts from)."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    for leftover in ckpt_root.glob(".tmp_global_step_*"):
        shutil.rmtree(leftover, ignore_errors=True)
    tmp = ckpt_root / f".tmp_global_step_{step}"
    tmp.mkdir()
    write(tmp)
    if metrics is not None:  # a value that is not finite as text, as metrics.jsonl writes it
        safe = {k: float(v) if math.isfinite(v) else str(v) for k, v in metrics.items()}
        (tmp / METRICS).write_text(json.dumps(safe, indent=2) + "\n")
    default_modes(tmp)
    final = ckpt_root / f"global_step_{step}"
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    if keep > 0:
        for old in _pruned(checkpoints(ckpt_root), keep, best):
            if old != final:  # the one just written, even where a run went on from an earlier step
                shutil.rmtree(old, ignore_errors=True)
    return final


def _pruned(found: list[tuple[int, Path]], keep: int, best: tuple[str, str] | None) -> list[Path]:
    """The checkpoints (`found`, oldest first) beyond `keep`: by age, or by `best`; never the newest."""
    if best is None:
        return [p for _, p in found[:-keep]]
    metric, mode = best
    sign = 1.0 if mode == "max" else -1.0

    def rank(entry: tuple[int, Path]) -> tuple[float, int]:
        value = checkpoint_metrics(entry[1]).get(metric)
        finite = isinstance(value, (int, float)) and math.isfinite(value)
        return (sign * value if finite else float("-inf")), entry[0]  # without it (or NaN): last

    kept = {p for _, p in sorted(found, key=rank, reverse=True)[:keep]} | {found[-1][1]}
    return [p for _, p in found if p not in kept]


def checkpoint_metrics(path: Path) -> dict[str, float]:
    """The metrics of the step a checkpoint holds (empty for a checkpoint written without them)."""
    try:
        return json.loads((path / METRICS).read_text())
    except (OSError, ValueError):
        return {}


def model_dir_once(out: Path, make: Callable[[], None]) -> str:
    """`out`, a model directory made by `make()` the first time it is asked for (`out/config.json` says it
    is there), under a lock beside it, so that two ranks on one machine make it once."""
    import fcntl

    if not (out / "config.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.parent / f".{out.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (out / "config.json").is_file():
                make()
    return str(out)


def write_dir_atomically(out: Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp_dir)` on a hidden sibling of `out`, then put it in `out`'s place (replacing what was
    there): a crash leaves nothing half-written where readers look."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        write(tmp)
        default_modes(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def default_modes(root: Path) -> None:
    """Give `root` and everything below it at least the modes a plain `open()` or `mkdir` gives (0666 or,
    for folders and executables, 0777, less the umask): safetensors (so every `save_pretrained`) writes
    through a temporary file of mode 0600, and `tempfile.mkdtemp` makes 0700 folders, which another user
    (a serving process, a colleague) could not read. No bit is taken away."""
    mask = os.umask(0o022)  # the only way to read it; set back at once
    os.umask(mask)
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        wanted = (0o777 if path.is_dir() or mode & 0o111 else 0o666) & ~mask
        if mode | wanted != mode:
            os.chmod(path, mode | wanted)


def rng_state() -> dict:
    """The global generators' states: Python's, NumPy's, torch's CPU one and, where CUDA is in use, every
    GPU's (dropout on a GPU draws from those)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def seed_everything(seed: int, full_determinism: bool = False) -> None:
    """Seed Python's, NumPy's and torch's generators; with `full_determinism`, also make this process's GPU
    kernels deterministic (before its first cuBLAS call: the workspace setting is read when cuBLAS starts).
    Kernels without a deterministic version then raise an error naming themselves."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if full_determinism:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        os.environ.setdefault("FLASH_ATTENTION_DETERMINISTIC", "1")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
