"""`data.*`: the training and validation rows, and how prompts are cut and rendered."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rlstack.config.fields import field
from rlstack.config.paths import is_template_text, path_problems

if TYPE_CHECKING:
    from rlstack.config.schema import Config


@dataclass
class DataConfig:
    train_files: str = "builtin:addition@train"
    """Training rows: a JSONL/JSON/parquet file, a directory of them, an HF dataset `name@split`, or `builtin:<task>@<split>`."""
    val_files: str = field("builtin:addition@test", resume=True)
    """Validation rows, in any form `train_files` accepts; empty string disables validation."""
    val_split: float = field(0.0, ge=0, lt=1, why="a fraction of the training rows")
    """With val_files empty: this fraction of the training rows is held out for validation instead (NeMo RL's split_validation_size), picked with data.seed."""
    format: Literal["auto", "none", "nemotron_code", "gsm8k", "geometry3k", "verl", "humaneval"] = "auto"
    """Known row layout to convert to problem/answer/data_source/images/extra (auto: detect per file; none: as is)."""
    prompt_key: str = "problem"
    """Row field holding the prompt: a string, or a list of chat messages."""
    answer_key: str = "answer"
    """Row field holding the ground truth passed to the reward function."""
    data_source_key: str = "data_source"
    """Row field naming the source (for a known format, also one of its own fields, e.g. Nemotron's source or dataset); validation accuracy is reported per source."""
    format_prompt: str | None = None
    """Optional Jinja2 template rendered with the row (`content` = the prompt) to build the user message: a file, or the template itself (text with {{ or {%; NeMo RL's prompt_file is read as one)."""
    apply_chat_template: bool = True
    """Wrap the prompt with the tokenizer's chat template (when it has one)."""
    max_prompt_length: int = field(64, ge=1)
    """Longest prompt, in tokens."""
    max_response_length: int = field(16, ge=1)
    """Longest response, in tokens; generation stops there."""
    rollout_batch_size: int = field(32, ge=1)
    """Prompts per training step (each is sampled `worker.rollout.n` times)."""
    val_batch_size: int = field(256, ge=1, also=(-1,), why="every prompt in one call", resume=True)
    """Prompts per generation call during validation (-1: all of them in one call, as EasyR1)."""
    val_max_samples: int = field(-1, ge=1, also=(-1,), resume=True)
    """Use at most this many validation rows (-1: all)."""
    shuffle: bool = True
    """Shuffle the training rows each epoch (seeded by `data.seed` and the epoch)."""
    seed: int = field(1, ge=0, lt=2**32, why="numpy takes seeds of 32 bits")
    """Seed of the shuffling."""
    filter_overlong_prompts: bool = True
    """Drop rows whose prompt is longer than `max_prompt_length` (otherwise such a row is an error)."""
    image_key: str = "images"
    """Field of a row holding its images (a list; EasyR1's image_key)."""
    image_dir: str | None = None
    """Folder that relative image paths in the rows are relative to (default: the data file's folder)."""
    min_pixels: int = field(262144, ge=1)
    """Vision models: images smaller than this many pixels are scaled up (aspect kept, sides multiples of 28)."""
    max_pixels: int = field(4194304, ge=1)
    """Vision models: images larger than this many pixels are scaled down; bounds the image tokens per image."""


def data_rules(cfg: Config, p: list[str]) -> None:
    """Rules across `data.*` keys; the files it names."""
    d = cfg.data
    if 0 < d.val_split < 1 and d.val_files:
        p.append(
            f"data.val_split = {d.val_split} holds out training rows for validation, but data.val_files = "
            f"{d.val_files!r} names validation rows already: set data.val_files='' or data.val_split=0"
        )
    if d.max_pixels < d.min_pixels:
        p.append(
            f"data.min_pixels ({d.min_pixels}) and data.max_pixels ({d.max_pixels}) must satisfy 1 <= min <= max"
        )
    path_problems(
        p,
        ("data.train_files", d.train_files),
        ("data.val_files", d.val_files),
        ("data.format_prompt", None if is_template_text(d.format_prompt or "") else d.format_prompt),
        ("data.image_dir", d.image_dir),
    )
