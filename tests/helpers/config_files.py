"""Config files written by tests, and the problems loading them reports."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rlstack.config import ConfigError, load_config


def write_yaml(path: Path, text: str) -> Path:
    """`text` (dedented) written at `path`."""
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def problems_of(args: list[str]) -> list[str]:
    """The problems `load_config(args)` reports (it must refuse the config)."""
    with pytest.raises(ConfigError) as info:
        load_config(args)
    return info.value.problems
