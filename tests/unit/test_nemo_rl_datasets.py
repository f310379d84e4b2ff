"""NeMo RL's registry datasets rlstack reads as Hub rows (OpenR1-Math-220k, AIME2026) and the one it cannot name
exactly (AIME2025) (`rlstack/config/compat/nemo_rl_data.py`). Each over NeMo RL's grpo_math_1B.yaml as it
ships, with NeMo RL's `++key=value` overrides."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlstack.config import ConfigError, load_config

NEMO = Path(__file__).resolve().parent.parent / "fixtures" / "nemo_rl"
DEEPSCALER = ["++data.train.dataset_name=DeepScaler", "++data.train.split_validation_size=0"]
"""Training rows whose class holds out none, so that validation rows are the ones named."""


@pytest.fixture()
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """`config=` NeMo RL's grpo_math_1B.yaml as shipped, run where its prompt file is."""
    shutil.copy(NEMO / "shipped" / "grpo_math_1B.yaml", tmp_path / "grpo_math_1B.yaml")
    (tmp_path / "examples" / "prompts").mkdir(parents=True)
    shutil.copy(NEMO / "cot.txt", tmp_path / "examples" / "prompts" / "cot.txt")
    monkeypatch.chdir(tmp_path)
    return f"config={tmp_path / 'grpo_math_1B.yaml'}"


def _load(args: list[str], caplog: pytest.LogCaptureFixture) -> tuple[Any, list[str]]:
    with caplog.at_level(logging.WARNING, logger="rlstack.config.compat"):
        cfg = load_config(args, machine_checks="warn")
    return cfg, [r.getMessage().removeprefix("config: ") for r in caplog.records]


def _problems(args: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(args, machine_checks="warn")
    return e.value.problems


@pytest.mark.parametrize(
    ("overrides", "files", "val_split"),
    [
        ([], "open-r1/OpenR1-Math-220k:default@train", 0.05),
        (
            ["++data.train.subset=extended", "++data.train.split_validation_size=0"],
            "open-r1/OpenR1-Math-220k:extended@train",
            0.0,
        ),
        (
            ["++data.train.split_validation_size=0.1"],
            "MathArena/aime_2026@train",
            0.0,
        ),  # AIME's class ignores it
    ],
)
def test_nemo_rls_math_registry_names_are_the_hub_rows_their_classes_load(
    base, caplog, overrides, files, val_split
):
    name = {"open-r1": "OpenR1-Math-220k", "MathArena": "AIME2026"}[files.split("/")[0]]
    cfg, notes = _load([base, f"++data.train.dataset_name={name}", *overrides], caplog)
    d = cfg.data
    assert (d.train_files, d.prompt_key, d.answer_key) == (files, "problem", "answer")
    assert (d.val_files, d.val_split) == ("", val_split)
    assert any(n.startswith(f"data.train.dataset_name={name!r}") and files in n for n in notes)
    for key in (o.lstrip("+").split("=")[0] for o in overrides):  # each read, and said
        assert any(n.startswith(key) for n in notes), key


@pytest.mark.parametrize("which", ["train", "validation"])
def test_aime2025_two_hub_configs_in_one_set_is_refused_by_name_with_what_to_set(base, which):
    (problem,) = _problems([base, *DEEPSCALER, f"++data.{which}.dataset_name=AIME2025"])
    assert problem.startswith(f"data.{which}.dataset_name='AIME2025' (command-line override")
    assert "joins the rows of two Hub configs of opencompass/AIME2025, AIME2025-I and AIME2025-II" in problem
    assert "rlstack reads one Hub config per data.train_files or data.val_files" in problem
    assert f"name it in data.{which}.data_path" in problem


def test_a_data_path_of_the_rows_aime2025_asks_for_loads(base, tmp_path):
    (tmp_path / "aime2025.jsonl").write_text('{"problem": "What is 1 + 1?", "answer": "2"}\n')
    cfg = load_config(
        [
            base,
            *DEEPSCALER,
            "++data.validation.data_path=aime2025.jsonl",
            "++data.default.input_key=problem",
            "++data.default.output_key=answer",
        ],
        machine_checks="warn",
    )
    assert (cfg.data.val_files, cfg.data.prompt_key, cfg.data.answer_key) == (
        "aime2025.jsonl",
        "problem",
        "answer",
    )
