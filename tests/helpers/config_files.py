"""Config files written by tests, and the problems loading them reports."""

from __future__ import annotations

import logging
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rlstack.config import ConfigError, load_config

EASYR1_RUN = [
    "data.train_files=builtin:addition@train",
    "data.prompt_key=problem",
    "worker.actor.model.model_path=builtin:tiny-qwen2",
    "worker.reward.reward_function=builtin:exact_match",
    "worker.rollout.n=2",
]
"""Beside a file with EasyR1's keys: what EasyR1 has no default for (rlstack asks for them), the built-in
task's prompt field (EasyR1's default is `prompt`) and a group of 2 (EasyR1's default n is 1, which GRPO
cannot use)."""


OWN_ROWS = [
    "data.max_prompt_length=64",
    "data.max_response_length=16",
    "worker.reward.reward_function=builtin:exact_match",
]
"""What a config on its own rows names (rlstack's defaults for these are the tiny demo's: `config.own_data`)."""


def write_yaml(path: Path, text: str) -> Path:
    """`text` (dedented) written at `path`."""
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def load_with_notes(args: list[str], caplog: pytest.LogCaptureFixture) -> tuple[Any, list[str]]:
    """The config of `args` (machine problems as warnings, as a seed system's file on this machine needs) and
    the notes the seed systems' translations logged."""
    with caplog.at_level(logging.WARNING, logger="rlstack.config.compat"):
        cfg = load_config(args, machine_checks="warn")
    return cfg, [r.getMessage().removeprefix("config: ") for r in caplog.records]


def problems_of(args: list[str]) -> list[str]:
    """The problems `load_config(args)` reports (it must refuse the config)."""
    with pytest.raises(ConfigError) as info:
        load_config(args)
    return info.value.problems


def launch_arguments(script: Path, cwd: Path, env: dict[str, str] | None = None) -> list[str]:
    """The arguments a seed system's launch script passes to `python3 -m verl.trainer.main`, as bash expands
    them (its variables, quotes, `$(date ...)`), run in `cwd` with only PATH and `env` in the environment."""
    shim = 'python3() { shift 2; printf "%s\\0" "$@"; }; source "$0"'  # python3 -m verl.trainer.main ARGS
    ran = subprocess.run(
        ["bash", "-c", shim, str(script)],
        cwd=cwd,
        env={"PATH": os.environ["PATH"], **(env or {})},
        capture_output=True,
        check=True,
    )
    return [a for a in ran.stdout.decode().split("\0") if a]
