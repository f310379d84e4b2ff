"""`rlstack board` finds the runs under a folder: any folder below holding what the trainer writes first
(`metrics.jsonl`, `config.yaml`, `generations/`), not looking inside a run nor into hidden folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.board import Board, check_run_dirs, find_runs, run_names
from rlstack.errors import RLStackError


def _run(d: Path, *files: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for f in files:
        if f == "generations":
            (d / f).mkdir()
        else:
            (d / f).write_text(json.dumps({"step": 1, "critic/score/mean": 0.5}) + "\n")
    return d


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    """`outputs/` as runs leave it: projects of experiments, a run that only started, folders that are none."""
    root = tmp_path / "outputs"
    _run(root / "examples" / "grpo_addition", "metrics.jsonl", "config.yaml")
    _run(root / "examples" / "dapo", "metrics.jsonl")
    _run(root / "demo" / "demo" / "grpo", "metrics.jsonl", "generations")
    _run(root / "demo" / "demo" / "sft", "config.yaml")  # started: no metrics yet
    _run(root / "demo" / "demo" / "grpo" / "huggingface" / "nested", "config.yaml")  # inside a run
    _run(root / ".cache" / "old", "metrics.jsonl")  # hidden
    (root / "board_screenshots").mkdir()
    (root / "board_screenshots" / "curves.png").write_bytes(b"")
    return root


def test_a_folder_of_runs_yields_every_run_below_it(outputs: Path):
    assert find_runs(outputs) == [
        outputs / "demo" / "demo" / "grpo",
        outputs / "demo" / "demo" / "sft",
        outputs / "examples" / "dapo",
        outputs / "examples" / "grpo_addition",
    ]
    examples = outputs / "examples"
    assert find_runs(examples) == [examples / "dapo", examples / "grpo_addition"]


def test_a_run_directory_is_itself_the_one_run(outputs: Path):
    run = outputs / "demo" / "demo" / "grpo"
    assert find_runs(run) == [run]


def test_run_dirs_and_folders_of_runs_mix_without_repeats(outputs: Path):
    runs = check_run_dirs([outputs / "examples" / "dapo", outputs / "examples", outputs / "demo"])
    assert runs == [
        (outputs / "examples" / "dapo").resolve(),
        (outputs / "examples" / "grpo_addition").resolve(),
        (outputs / "demo" / "demo" / "grpo").resolve(),
        (outputs / "demo" / "demo" / "sft").resolve(),
    ]
    assert run_names(runs) == ["dapo", "grpo_addition", "grpo", "sft"]


def test_the_board_serves_the_runs_found_under_a_folder(outputs: Path):
    board = Board([outputs / "examples"], port=0)
    try:
        status, _, body = board.respond("/api/runs")
        assert status == 200
        assert [(r["name"], r["path"]) for r in json.loads(body)] == [
            ("dapo", str((outputs / "examples" / "dapo").resolve())),
            ("grpo_addition", str((outputs / "examples" / "grpo_addition").resolve())),
        ]
    finally:
        board.server.server_close()


def test_a_folder_without_runs_is_refused_with_the_fix(outputs: Path):
    with pytest.raises(RLStackError, match="board_screenshots holds neither .* no folder below it does"):
        check_run_dirs([outputs / "board_screenshots"])
    with pytest.raises(RLStackError, match="is not a directory"):
        check_run_dirs([outputs / "missing"])
