"""docs/metrics.md describes every metric whose full name the code writes (a string constant such as
"actor/pg_loss"); the end-to-end runs check the names a run logs, this the names no test run reaches."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFIXES = (
    "actor|agent|async|critic|online_filtering|perf|prompt_length|response_length|reward|rollout|sft"
    "|timing_s|val|vppo"
)
METRIC = re.compile(rf"({PREFIXES})/[A-Za-z0-9_@/]+")


def metric_names(source: str) -> set[str]:
    """The string constants of `source` that are whole metric names (not the pieces of an f-string)."""
    tree = ast.parse(source)
    pieces = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in pieces
        and METRIC.fullmatch(node.value)
    }


def test_every_metric_name_in_the_code_is_in_the_glossary():
    glossary = (ROOT / "docs" / "metrics.md").read_text()
    written = {
        (name, path.relative_to(ROOT))
        for path in sorted((ROOT / "rlstack").rglob("*.py"))
        for name in metric_names(path.read_text())
    }
    assert len(written) > 40  # the scan sees the code's metrics
    missing = sorted(f"{name} ({path})" for name, path in written if f"`{name}`" not in glossary)
    assert not missing, "logged but not described in docs/metrics.md: " + ", ".join(missing)


@pytest.mark.parametrize(
    "source, names",
    [
        ('m = {"actor/pg_loss": 1.0, "agent/num_turns/mean": 2}', {"actor/pg_loss", "agent/num_turns/mean"}),
        ('path = "rollout/hf.py"; text = "the actor/critic split"', set()),  # a file, a sentence
        ('key = f"agent/end_reason/{reason}"', set()),  # a name made at run time
    ],
)
def test_the_scan_takes_whole_names_only(source, names):
    assert metric_names(source) == names
