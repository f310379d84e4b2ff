"""NeMo RL's registry datasets rlstack reads as Hub rows (NuminaMath-1.5, OpenR1-Math-220k, AIME2026), the one it
cannot name exactly (AIME2025), and the keys only some of NeMo RL's dataset classes read: `repeat` (its AIME
classes and NemoGymDataset) and NuminaMath-1.5's row filters (`rlstack/config/compat/nemo_rl_data.py`). Each over NeMo RL's
grpo_math_1B.yaml as it ships, with NeMo RL's `++key=value` overrides."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from config_files import load_with_notes

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


def _problems(args: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(args, machine_checks="warn")
    return e.value.problems


@pytest.mark.parametrize(
    ("overrides", "files", "val_split"),
    [
        (
            ["++data.train.verifiable_only=false", "++data.train.require_valid=false"],
            "AI-MO/NuminaMath-1.5@train",
            0.05,  # the shipped file's split_validation_size, which NuminaMath-1.5's class reads
        ),
        (
            ["++data.default.verifiable_only=false", "++data.default.require_valid=false"],
            "AI-MO/NuminaMath-1.5@train",
            0.05,
        ),
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
    name = {"AI-MO": "NuminaMath-1.5", "open-r1": "OpenR1-Math-220k", "MathArena": "AIME2026"}[
        files.split("/")[0]
    ]
    cfg, notes = load_with_notes([base, f"++data.train.dataset_name={name}", *overrides], caplog)
    d = cfg.data
    assert (d.train_files, d.prompt_key, d.answer_key) == (files, "problem", "answer")
    assert (d.val_files, d.val_split) == ("", val_split)
    assert any(n.startswith(f"data.train.dataset_name={name!r}") and files in n for n in notes)
    for key in (o.lstrip("+").split("=")[0] for o in overrides):  # each read, and said
        assert any(n.startswith(key) for n in notes), key


@pytest.mark.parametrize(
    ("overrides", "on"),
    [
        ([], ["verifiable_only, on by default", "require_valid, on by default"]),
        (["++data.train.require_valid=false"], ["verifiable_only, on by default"]),
        (
            ["++data.default.require_valid=false", "++data.train.verifiable_only=true"],
            ["data.train.verifiable_only=True"],
        ),
    ],
)
def test_numinamaths_row_filters_rlstack_cannot_apply_are_refused_by_name(base, overrides, on):
    """NeMo RL's NuminaMath-1.5 class drops the rows without a checkable answer and those not marked valid;
    rlstack reads every row of the Hub split: the same rows only with both filters off."""
    (problem,) = _problems([base, "++data.train.dataset_name=NuminaMath-1.5", *overrides])
    assert problem.startswith("data.train.dataset_name='NuminaMath-1.5' (command-line override")
    assert "AI-MO/NuminaMath-1.5@train and drops none" in problem
    assert "set data.train.verifiable_only: false and data.train.require_valid: false" in problem
    for filter_on in on:
        assert filter_on in problem, (filter_on, problem)
    assert problem.count(", on by default") + problem.count("=True") == len(on)


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


AIME_16 = [*DEEPSCALER, "++data.validation.dataset_name=AIME2024", "++data.validation.repeat=16"]
"""NeMo RL's DeepScaler recipes' validation (grpo-deepscaler-1.5b-8K.yaml): AIME 2024, each row 16 times."""


@pytest.mark.parametrize(
    ("overrides", "val_n"),
    [
        ([], 16),  # the shipped val_num_generations_per_prompt: 1
        (["++grpo.val_num_generations_per_prompt=2"], 32),  # 16 copies, 2 samples each
        (["worker.rollout.val_n=4"], 4),  # rlstack's key on the command line wins
    ],
)
def test_a_repeated_aime_validation_set_is_as_many_samples_of_each_prompt(base, caplog, overrides, val_n):
    """NeMo RL's AIME classes take their rows `repeat` times over, each copy sampled
    val_num_generations_per_prompt times, and validation's accuracy is the mean reward over all: rlstack's
    val_n samples of each prompt, val/<source>/accuracy their mean."""
    cfg, notes = load_with_notes([base, *AIME_16, *overrides], caplog)
    assert (cfg.data.val_files, cfg.worker.rollout.val_n) == ("HuggingFaceH4/aime_2024@train", val_n)
    (said,) = [n for n in notes if n.startswith("data.validation.repeat")]
    if overrides[:1] == ["worker.rollout.val_n=4"]:
        assert said.endswith("not used: the command line sets worker.rollout.val_n")
    else:
        assert f"takes each validation row 16 times, each sampled {val_n // 16} time(s)" in said
        assert f"read as worker.rollout.val_n={val_n}" in said


def test_a_repeated_validation_set_under_greedy_decoding_is_validated_once(base, caplog):
    """With validation greedy (policy.generation.val_temperature 0), NeMo RL's copies of a row all get the same
    answer and their mean is one copy's: rlstack validates each prompt once (val_n 16 at temperature 0 would be
    refused as 16 identical answers), its batch and bound counting rows as NeMo RL's count the copies."""
    greedy = [
        "++policy.generation.val_temperature=0",
        "++grpo.val_batch_size=32",
        "++grpo.max_val_samples=30",
    ]
    cfg, notes = load_with_notes([base, *AIME_16, *greedy], caplog)
    rollout = cfg.worker.rollout
    assert (rollout.val_temperature, rollout.val_n, rollout.temperature) == (0, 1, 1.0)
    assert (cfg.data.val_batch_size, cfg.data.val_max_samples) == (32, 30)
    (said,) = [n for n in notes if n.startswith("data.validation.repeat")]
    assert "takes each validation row 16 times, but validation is greedy" in said
    assert "worker.rollout.val_n=1" in said


def test_a_repeated_validation_set_of_a_file_without_val_temperature_is_sampled_at_the_training_values(
    tmp_path, caplog, monkeypatch
):
    """The seed's trimmed grpo_math_1B.yaml has no policy.generation.val_temperature: NeMo RL validates at the
    training temperature (1.0), so its 16 copies of each AIME row are 16 samples, not greedy ones."""
    shutil.copy(NEMO / "grpo_math_1B.yaml", tmp_path / "grpo_math_1B.yaml")
    (tmp_path / "examples" / "prompts").mkdir(parents=True)
    shutil.copy(NEMO / "cot.txt", tmp_path / "examples" / "prompts" / "cot.txt")
    monkeypatch.chdir(tmp_path)
    cfg, notes = load_with_notes([f"config={tmp_path / 'grpo_math_1B.yaml'}", *AIME_16], caplog)
    rollout = cfg.worker.rollout
    assert (rollout.val_temperature, rollout.val_n) == (1.0, 16)
    (said,) = [n for n in notes if n.startswith("data.validation.repeat")]
    assert "read as worker.rollout.val_n=16" in said


def test_a_repeated_validation_sets_row_bound_counts_the_copies_and_says_where_it_differs(base, caplog):
    """NeMo RL's grpo.max_val_samples counts the repeated rows (in whole batches of val_batch_size), rlstack's
    data.val_max_samples prompts: the recipe's 480 in batches of 32 is AIME 2024's 30 rows x 16, the same
    samples; the shipped 256 in one batch of 256 covers 16 rows x 16, which is said."""
    recipe = ["++grpo.max_val_samples=480", "++grpo.val_batch_size=32"]
    cfg, notes = load_with_notes([base, *AIME_16, *recipe], caplog)
    # NeMo RL's batches of 32 repeated rows are 2 prompts x 16 samples: the same 32 sequences a call
    assert (cfg.worker.rollout.val_n, cfg.data.val_max_samples, cfg.data.val_batch_size) == (16, 480, 2)
    assert any("read as data.val_batch_size=2 prompts of 16 samples each" in n for n in notes)
    (said,) = [n for n in notes if n.startswith("grpo.max_val_samples=480")]
    assert "validates the first 480 of them" in said and "the same samples where there are at most 30" in said
    caplog.clear()
    _, notes = load_with_notes(
        [base, *AIME_16, "++grpo.val_batch_size=100"], caplog
    )  # the shipped 256 prompts
    (said,) = [n for n in notes if n.startswith("grpo.max_val_samples=256")]
    assert "validates the first 200 of them" in said and "at most 12 validation rows" in said


def test_repeat_is_read_for_the_rows_of_an_aime_class_only(base, caplog):
    """`data.default.repeat` reaches every dataset: the AIME validation rows read it, DeepScaler's class (like
    every class but AIME's) ignores it, as in NeMo RL, which is said."""
    cfg, notes = load_with_notes(
        [base, *DEEPSCALER, "++data.validation.dataset_name=AIME2024", "++data.default.repeat=8"], caplog
    )
    assert cfg.worker.rollout.val_n == 8
    assert any(
        n.startswith("data.default.repeat")
        and "not used for the training rows: NeMo RL's DeepScaler class" in n
        for n in notes
    )
    caplog.clear()
    cfg, notes = load_with_notes(
        [base, *DEEPSCALER, "++data.validation.dataset_name=DAPOMathAIME2024", "++data.validation.repeat=16"],
        caplog,
    )
    assert cfg.worker.rollout.val_n == 1
    assert any(
        "not used for the validation rows: NeMo RL's DAPOMathAIME2024 class reads none" in n for n in notes
    )


NEMO_GYM_ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "Print the number you read."}]},
    "verifier_metadata": {"unit_tests": {"inputs": ["1\n"], "outputs": ["1\n"]}},
}
"""A row of NeMo-Gym's competitive-coding data (rlstack's `nemotron_code` format)."""


def _nemo_gym_layout(tmp_path: Path, train: dict, validation: dict) -> str:
    """`config=` the shipped grpo_math_1B.yaml with the data section of NeMo RL's NeMo-Gym examples
    (examples/nemo_gym/grpo_nanov3.yaml): rows by `data_path`, `dataset_name: NemoGymDataset` under
    `data.default` (which NeMo RL lays under each dataset), and the sections' own keys `train` and
    `validation`; the math environment, which rlstack has. The files hold a NeMo-Gym competitive-coding row."""
    for name in ("train.jsonl", "validation.jsonl"):
        (tmp_path / name).write_text(json.dumps(NEMO_GYM_ROW) + "\n")
    config = yaml.safe_load((NEMO / "shipped" / "grpo_math_1B.yaml").read_text())
    config["data"]["train"] = {"data_path": str(tmp_path / "train.jsonl"), **train}
    config["data"]["validation"] = {"data_path": str(tmp_path / "validation.jsonl"), **validation}
    config["data"]["default"] = {
        "dataset_name": "NemoGymDataset",
        "env_name": "math",
        "prompt_file": None,
        "processor": "nemo_gym_data_processor",
    }
    path = tmp_path / "grpo_nemo_gym.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return f"config={path}"


@pytest.mark.parametrize(
    ("validation", "val_n"),
    [
        ({"repeat": 4}, 4),  # the dataset's name from data.default, as in NeMo RL's NeMo-Gym examples
        ({"dataset_name": "NemoGymDataset", "repeat": 4}, 4),
        (
            {"dataset_name": "NemoGymDataset", "repeat": 1},
            1,
        ),  # examples/nemo_gym/distillation_qwen3_0_6b.yaml
    ],
)
def test_a_repeated_nemo_gym_validation_set_is_as_many_samples_of_each_prompt(
    tmp_path, caplog, validation, val_n
):
    """NeMo RL's NemoGymDataset takes its data_path's rows `repeat` times over, as its AIME classes do
    (nemo_rl/data/datasets/response_datasets/nemogym_dataset.py): validation rows read as val_n samples of each
    prompt, not dropped."""
    cfg, notes = load_with_notes([_nemo_gym_layout(tmp_path, {}, validation)], caplog)
    assert (cfg.data.val_files, cfg.worker.rollout.val_n) == (str(tmp_path / "validation.jsonl"), val_n)
    (said,) = [n for n in notes if n.startswith("data.validation.repeat")]
    if val_n > 1:
        assert "NeMo RL's NemoGymDataset class takes each validation row 4 times" in said
        assert "read as worker.rollout.val_n=4" in said
    else:
        assert said.endswith("NeMo RL's key, 1: each validation row once, as rlstack reads them")


def test_a_repeated_nemo_gym_training_set_is_refused_by_name_with_what_to_set(tmp_path):
    (problem,) = _problems([_nemo_gym_layout(tmp_path, {"repeat": 2}, {})])
    assert problem.startswith(f"data.train.repeat=2 ({tmp_path / 'grpo_nemo_gym.yaml'}, line "), problem
    assert problem.endswith(
        "NeMo RL's NemoGymDataset class takes the training rows 2 times over into one set, shuffled together, "
        "which rlstack has no key for: remove data.train.repeat (or set it to 1) and set trainer.total_epochs "
        "(each epoch one shuffled pass over the rows), or name a file holding the rows 2 times in "
        "data.train.data_path"
    ), problem


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (
            [
                "++data.train.dataset_name=AIME2024",
                "++data.train.split_validation_size=0",
                "++data.train.repeat=4",
            ],
            "data.train.repeat=4 (command-line override 'data.train.repeat=4'): NeMo RL's AIME2024 class takes the "
            "training rows 4 times over into one set, shuffled together, which rlstack has no key for: remove "
            "data.train.repeat (or set it to 1) and set trainer.total_epochs",
        ),
        (
            [*DEEPSCALER, "++data.validation.dataset_name=AIME2024", "++data.validation.repeat=0"],
            "data.validation.repeat=0 (command-line override 'data.validation.repeat=0'): NeMo RL's repeat is how "
            "many times NeMo RL's AIME2024 class takes its rows: a whole number, at least 1",
        ),
    ],
)
def test_repeats_rlstack_cannot_mean_are_refused_by_name(base, overrides, said):
    (problem,) = _problems([base, *overrides])
    assert problem.startswith(said), problem
