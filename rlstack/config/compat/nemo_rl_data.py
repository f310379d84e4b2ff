"""NeMo RL's data keys: its registry dataset names read as the Hub datasets rlstack loads, the training and
validation rows and their fields, the keys only some of its dataset classes read (`repeat`, row filters), and
`prompt_file` (a `{}` text) as a Jinja template."""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rlstack.config.tree as tree
from rlstack.config.compat.nemo_rl_translation import Translation, setting
from rlstack.config.paths import hub_config


@dataclass(frozen=True)
class Dataset:
    """One of NeMo RL's registry datasets, as the Hub dataset rlstack reads and the row fields it needs."""

    files: str
    """data.train_files (or data.val_files, where it is named for validation): `org/name@split`, or
    `org/name:config@split` for a class that loads a Hub config (NeMo RL's `subset` replaces it); empty for a
    class of `FILE_DATASETS`, whose rows are its `data_path`'s."""
    answer_key: str = "answer"
    """data.answer_key: the row field NeMo RL's class reads the ground truth from."""
    prompt_key: str = "problem"
    """data.prompt_key: the row field it reads the problem from."""
    older_val_files: str | None = None
    """Validation rows the class brought in NeMo RL's older layout (`data.dataset_name`, before NeMo RL #1649
    split the training and validation datasets): data.val_files there, where the config names none. Under
    `data.train`, today's, NeMo RL's classes bring none (its recipes name `data.validation`)."""
    holds_out: bool = False
    """NeMo RL's class holds out `split_validation_size` of its rows for validation (data.val_split); else it
    holds out none whatever the key says (NeMo RL warns that it ignores the key)."""
    val_split: float = 0.0
    """The share it holds out where the config does not say (its default `split_validation_size`)."""
    extract_answer: bool = False
    """NeMo RL's class takes `extract_answer` (gsm8k's; true by default: the answer is the text after
    `####` of the worked solution, as rlstack's `gsm8k` rows read it, `data.format=auto`)."""
    repeats: bool = False
    """NeMo RL's class takes `repeat` (its AIME classes'): its rows that many times over (`_repeat`)."""
    filters: tuple[tuple[str, str], ...] = ()
    """(key, the rows it drops) of each row filter of NeMo RL's class, all on by default. rlstack reads every
    row of a Hub split, so the rows are the same only with each of them false (`_filters`)."""


GSM8K = Dataset("openai/gsm8k:main@train", extract_answer=True)
"""NeMo RL's GSM8KDataset: `openai/gsm8k`, config `main` (its `subset`, `socratic` the other), the problem
in `question`, the answer after `####` of `answer`; rlstack's `data.format=auto` reads those rows as its
`gsm8k` format (problem and answer in `problem` and `answer`)."""

DATASETS = {
    "OpenMathInstruct-2": Dataset(
        "nvidia/OpenMathInstruct-2@train_1M", "expected_answer", holds_out=True, val_split=0.05
    ),
    "DeepScaler": Dataset(
        "agentica-org/DeepScaleR-Preview-Dataset@train", older_val_files="HuggingFaceH4/aime_2024@train"
    ),
    "AIME2024": Dataset("HuggingFaceH4/aime_2024@train", repeats=True),
    "AIME2026": Dataset("MathArena/aime_2026@train", repeats=True),  # its answers are numbers: read as text
    "NuminaMath-1.5": Dataset(
        "AI-MO/NuminaMath-1.5@train",
        holds_out=True,
        filters=(
            (
                "verifiable_only",
                "rows without a checkable answer (answer empty, 'proof' or 'notfound', or question_type 'proof')",
            ),
            ("require_valid", "rows whose problem_is_valid or solution_is_valid is not 'Yes'"),
        ),
    ),
    "OpenR1-Math-220k": Dataset("open-r1/OpenR1-Math-220k:default@train", holds_out=True),
    # veRL rows (prompt, reward_model.ground_truth), which data.format=auto reads as problem and answer
    "DAPOMath17K": Dataset("BytedTsinghua-SIA/DAPO-Math-17k@train"),
    "DAPOMathAIME2024": Dataset("BytedTsinghua-SIA/AIME-2024@train"),
    "gsm8k": GSM8K,
    "GSM8K": GSM8K,
}
"""NeMo RL's dataset registry names (`data.train.dataset_name`, `data.validation.dataset_name`, the older
`data.dataset_name`) that have a Hub form, as rlstack reads them: the Hub dataset, config and split NeMo
RL's class loads, the fields its problem and answer are in, and the validation rows it brings. The others
(the SFT, preference and VLM sets, and `WITHOUT_HUB_FORM`'s) are a problem saying what to set."""

FILE_DATASETS = {"NemoGymDataset": Dataset("", repeats=True)}
"""NeMo RL's registry classes that read their rows from `data_path` alone (no Hub form), by the keys only some
classes read: NemoGymDataset (nemo_rl/data/datasets/response_datasets/nemogym_dataset.py) takes a JSONL file of
NeMo-Gym rows `repeat` times over, as the AIME classes take theirs, and holds out none. rlstack reads the file as
any other (data.format: NeMo-Gym's competitive-coding rows are its `nemotron_code` rows)."""

WITHOUT_HUB_FORM = {
    "AIME2025": (
        "NeMo RL's AIME2025 class joins the rows of two Hub configs of opencompass/AIME2025, AIME2025-I and "
        "AIME2025-II (split test, the problem in question), and rlstack reads one Hub config per data.train_files "
        "or data.val_files",
        "write both configs' rows into one JSONL file, the problem under problem and the answer under answer, and "
        "name it in data.{which}.data_path (with data.default.input_key: problem and output_key: answer, which "
        "NeMo RL reads it with too)",
    ),
}
"""NeMo RL's math registry names whose rows rlstack's `name[:config]@split` cannot name exactly: why, and
what to set instead (`{which}`: train or validation)."""

LOCAL_SUFFIXES = (".arrow", ".csv", ".json", ".jsonl", ".parquet", ".txt")
"""Files NeMo RL's `load_dataset_from_path` reads as local files, which have no Hub config (`subset`)."""


def _hub_form(name: Any, split: Any, subset: str | None) -> tuple[str, Dataset | None] | None:
    """A dataset name as rlstack's `name[:config]@split`, and its registry entry: a registry name of
    `DATASETS`, or a Hub dataset `org/name` itself (`split`, `subset`: NeMo RL's keys; a registry class that
    loads no Hub config takes no subset); None for any other name."""
    if not isinstance(name, str):
        return None
    entry = DATASETS.get(name)
    if entry is None and "/" not in name:
        return None
    files, _, at = (entry.files if entry else name).partition("@")
    if subset and _takes_subset(entry):
        files = f"{hub_config(files)[0]}:{subset}"
    at = split if isinstance(split, str) and split else at
    return (f"{files}@{at}" if at else files), entry


def _name(entry: Dataset) -> str:
    """The registry name of `entry` (the first, where several name it)."""
    return next(name for name, e in (*DATASETS.items(), *FILE_DATASETS.items()) if e is entry)


def _takes_subset(entry: Dataset | None) -> bool:
    """Whether NeMo RL's class for these rows loads the Hub config `subset` names: a Hub dataset's or local
    folder's (`ResponseDataset`), or a registry class that loads a config (gsm8k's `main`)."""
    return entry is None or hub_config(entry.files.split("@", 1)[0])[1] is not None


def _subset(t: Translation, which: str) -> tuple[str, str | None]:
    """NeMo RL's `subset` of the `which` rows (`data.train.subset`, `data.default.subset` or `data.subset`;
    `data.validation.subset`), read out: its key, and the Hub config it names; None where it names none
    (unset; null, the dataset's default config, noted; a value that is no name, a problem)."""
    if which == "train":
        key, value = setting(t, "subset")
    else:
        key, value = f"data.{which}.subset", t.take(f"data.{which}.subset")
    if value in (None, ""):
        t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, null: the dataset's default config")
    elif isinstance(value, str):
        return key, value
    elif value is not tree.MISSING:
        t.problems.append(
            f"{key}={value!r}{t.at(key)}: NeMo RL's subset is the name of a Hub dataset's config"
        )
    return key, None


_OLDER_PATHS = {"train": "data.train_data_path", "validation": "data.val_data_path"}
_ROWS = {"train": "training", "validation": "validation"}


def _rows(t: Translation, which: str, to: str) -> tuple[bool, Dataset | None, str]:
    """`data.train` or `data.validation` (`which`) rows as rlstack's `to` (data.train_files, data.val_files):
    a `data_path` (or the older `data.train_data_path` / `data.val_data_path`), else a `dataset_name` with a
    Hub form; `subset` is the Hub config (`name:config@split`). The validation rows' dataset name is
    `data.default.dataset_name` where `data.validation` names none, as NeMo RL lays data.default under each
    dataset (nemo_rl/data/utils.py, `update_single_dataset_config`). Returns whether NeMo RL's keys name the rows,
    the registry entry they named, and the key of the dataset's name (`data.train.dataset_name`, or the
    older layout's `data.dataset_name`)."""
    if which == "train":
        key, name = setting(t, "dataset_name")
    else:
        key, name = f"data.{which}.dataset_name", t.take(f"data.{which}.dataset_name")
        default = "data.default.dataset_name"  # NeMo RL lays data.default under data.validation too
        given = tree.get(t.original, default)
        if name is tree.MISSING and isinstance(t.get(f"data.{which}"), dict) and given is not tree.MISSING:
            key, name = default, given
    split = t.take(f"data.{which}.split")
    at_split = f"@{split}" if isinstance(split, str) and split else ""
    subset_key, subset = _subset(t, which)
    for path_key in (f"data.{which}.data_path", _OLDER_PATHS[which]):
        path = t.take(path_key)
        if path in (tree.MISSING, None):
            continue
        entry = FILE_DATASETS.get(name) if isinstance(name, str) else None
        if entry is not None:
            t.notes.append(
                f"{key}={name!r}{t.at(key)}: NeMo RL's class for {path_key}'s rows, read by rlstack as the file it "
                "is (data.format); the class's repeat as NeMo RL's"
            )
        elif name not in (tree.MISSING, None):
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's loader of {path_key}'s rows, not used")
        if subset and (str(path).endswith(LOCAL_SUFFIXES) or str(path).startswith("builtin:")):
            t.problems.append(
                f"{subset_key}={subset!r}{t.at(subset_key)}: NeMo RL's subset is a Hub dataset's config, and "
                f"{path_key}={path!r} is a file, which has none (NeMo RL stops there too): remove {subset_key}"
            )
            return True, None, key
        t.move(path_key, to, f"{path}{':' + subset if subset else ''}{at_split}")
        if subset:
            t.notes.append(
                f"{subset_key}={subset!r}{t.at(subset_key)}: NeMo RL's key, the Hub config of {path_key}"
            )
        return True, entry, key
    form = _hub_form(name, split, subset)
    if form is not None:
        files, entry = form
        t.move(key, to, files)
        if entry is not None:
            rows = (
                " (read by data.format=auto as gsm8k rows: the problem from question, the answer the text after "
                "'####' of answer, as NeMo RL's extract_answer)"
                if entry.extract_answer
                else ""
            )
            t.notes.append(
                f"{key}={name!r}{t.at(key)}: NeMo RL's registry name of the Hub dataset {files}{rows}"
            )
        if subset and _takes_subset(entry):
            t.notes.append(
                f"{subset_key}={subset!r}{t.at(subset_key)}: NeMo RL's key, the Hub config of {to}"
            )
        elif subset:
            t.notes.append(
                f"{subset_key}={subset!r}{t.at(subset_key)}: NeMo RL's key, not used: NeMo RL's {name} class loads "
                "no Hub config (it ignores the key)"
            )
        return True, entry, key
    if subset:
        t.notes.append(
            f"{subset_key}={subset!r}{t.at(subset_key)}: NeMo RL's key, not used: no dataset named here"
        )
    if t.get(to) is not tree.MISSING:  # rlstack's own key names the rows
        if name is not tree.MISSING:
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, not used: {to} is set")
    elif isinstance(name, str) and name in WITHOUT_HUB_FORM:
        why, instead = WITHOUT_HUB_FORM[name]
        t.problems.append(f"{key}={name!r}{t.at(key)}: {why}: {instead.format(which=which)}")
    elif isinstance(name, str) or which == "train":
        if isinstance(name, str):
            what = f"={name!r}, a NeMo RL registry name without a Hub form rlstack reads"
        else:
            what = " is null" if name is None else " is not set"
        t.problems.append(
            f"{key}{what}{t.at(key)}: NeMo RL's config names no {_ROWS[which]} rows rlstack can read; set {key} to a Hub "
            f"dataset (org/name, its Hub config in data.{which}.subset) or one of the registry names rlstack maps "
            f"({', '.join(DATASETS)}), data.{which}.data_path to a local file, or rlstack's {to} (a file, "
            "builtin:<task>, org/name@split or org/name:config@split)"
        )
    return False, None, key


def _extract_answer(t: Translation, key: str, value: Any, entry: Dataset | None) -> None:
    """NeMo RL's `extract_answer` (`key`, its `value`) of the rows `entry` names: gsm8k's answer after `####`
    (true, its default) is how rlstack reads those rows; the whole worked solution (false) is a problem
    saying what to write; another class ignores the key, as in NeMo RL."""
    if value is tree.MISSING:
        return
    if entry is None or not entry.extract_answer:
        t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, not used: only its gsm8k class reads it")
    elif value is True:
        t.notes.append(
            f"{key}{t.at(key)}: NeMo RL's key: the answer is the text after '####', as rlstack reads "
            "openai/gsm8k's rows (data.format=auto, the gsm8k format)"
        )
    else:
        t.problems.append(
            f"{key}={value!r}{t.at(key)}: NeMo RL's gsm8k rows with the whole worked solution as the answer; rlstack "
            "reads openai/gsm8k's answer after '####': for the whole solution set data.format=none "
            "data.prompt_key=question data.answer_key=answer (and data.train_files=openai/gsm8k:main@train), "
            "else remove the key"
        )


_DEFAULT_FIELDS = {"prompt_key": "problem", "answer_key": "answer"}


def _fields(t: Translation, entries: list[Dataset]) -> None:
    """The row fields of the problem and the answer: NeMo RL's `input_key` / `output_key`, else those of the
    registry datasets named (`entries`), which must agree: rlstack reads one field for train and validation."""
    for name, field in (("input_key", "prompt_key"), ("output_key", "answer_key")):
        key, value = setting(t, name)
        to = f"data.{field}"
        if value not in (tree.MISSING, None):
            t.move(key, to, value)
            continue
        fields = sorted({getattr(e, field) for e in entries})
        if len(fields) > 1:
            t.problems.append(
                f"data.validation.dataset_name{t.at('data.validation.dataset_name')}: NeMo RL's training and "
                f"validation datasets keep the {field.split('_')[0]} in different fields ({' and '.join(fields)}), "
                f"rlstack reads one {to} for both: name validation rows that keep it where the training rows do"
            )
        elif fields and fields[0] != _DEFAULT_FIELDS[field] and t.get(to) is tree.MISSING:
            tree.set(t.values, to, fields[0])
            t.notes.append(
                f"NeMo RL's dataset keeps the {field.split('_')[0]} in {fields[0]!r}: read as {to}={fields[0]}"
            )


def datasets_rule(t: Translation) -> None:
    """The training and validation rows, and the fields their problem and answer are in. NeMo RL names rows
    by path (`data_path`) or dataset (`dataset_name`): a Hub dataset (`org/name`) is read from the Hub, a
    registry name of `DATASETS` as its Hub form, with its fields and, where the config names none, the
    validation rows NeMo RL's class brings (held out of the training rows; in the older layout, DeepScaler's
    AIME 2024). Training rows named nowhere (`dataset_name: null`) or by a name
    rlstack has no form for are a problem naming the key and what to set; a config that names no validation
    rows validates on none (`data.val_files=''`), as NeMo RL, whether or not its training rows could be read
    (a problem with those is not made worse by the demo's validation rows)."""
    train, entry, name_key = _rows(t, "train", "data.train_files")
    _extract_answer(t, *setting(t, "extract_answer"), entry)
    none = t.get("data.validation") is None  # NeMo RL's `validation: null`: none but rows held out
    if none:
        t.take("data.validation")
        t.notes.append(
            f"data.validation{t.at('data.validation')}: NeMo RL's key, null: no validation rows of their own"
        )
    val, val_entry, val_key = _rows(t, "validation", "data.val_files")
    key = "data.validation.extract_answer"
    _extract_answer(t, key, t.take(key), val_entry)
    _fields(t, [e for e in (entry, val_entry) if e is not None and e.files])  # a file's rows: data.format's
    _class_keys(t, {"train": (entry, name_key, True), "validation": (val_entry, val_key, val)})
    key = "data.train.split_validation_size"
    held_out = t.get(key)
    if entry is not None and not entry.holds_out and held_out is not tree.MISSING:
        t.take(key)
        t.notes.append(
            f"{key}{t.at(key)}: NeMo RL's key, not used: NeMo RL's {_name(entry)} class holds out no rows (NeMo RL "
            "warns that it ignores the key), nor does rlstack"
        )
        held_out = tree.MISSING
    if val or t.get("data.val_files") is not tree.MISSING:
        return
    older = entry.older_val_files if entry is not None and name_key == "data.dataset_name" else None
    if held_out not in (tree.MISSING, None, 0):
        t.move("data.train.split_validation_size", "data.val_files", "")  # the held-out rows validate
    elif entry is not None and (older or entry.val_split) and not none:
        tree.set(t.values, "data.val_files", older or "")
        if entry.val_split and t.get("data.val_split") is tree.MISSING:
            tree.set(t.values, "data.val_split", entry.val_split)
        rows = older or f"{entry.val_split:.0%} of the training rows, held out (data.val_split)"
        t.notes.append(
            f"NeMo RL's dataset brings its validation rows, {rows}: read as data.val_files={older or ''!r}"
        )
    else:
        tree.set(t.values, "data.val_files", "")
        t.notes.append("NeMo RL's config names no validation rows: no validation (data.val_files='')")


def _class_keys(t: Translation, rows: dict[str, tuple[Dataset | None, str, bool]]) -> None:
    """The keys only some of NeMo RL's dataset classes read (`repeat`, and the row filters of
    `Dataset.filters`), for the training and the validation rows (`rows`: which -> the registry entry, the key
    naming the dataset, whether rows are named): `data.<which>.<key>`, else `data.default.<key>`, which NeMo RL
    gives every dataset that leaves the key out. Each is read out; where the class does not read it, noted (NeMo
    RL ignores it too)."""
    names = ("repeat", *sorted({k for e in DATASETS.values() for k, _ in e.filters}))
    defaults = {name: t.take(f"data.default.{name}") for name in names}
    for which, (entry, name_key, named) in rows.items():
        settings = {}
        for name in names:
            key, value = f"data.{which}.{name}", t.take(f"data.{which}.{name}")
            if value is tree.MISSING and named:
                key, value = f"data.default.{name}", defaults[name]
            settings[name] = (key, value)
        if not named:
            for key, value in settings.values():
                if value is not tree.MISSING:
                    t.notes.append(
                        f"{key}{t.at(key)}: NeMo RL's key, not used: no {_ROWS[which]} rows are named"
                    )
            continue
        _repeat(t, which, *settings.pop("repeat"), entry)
        _filters(t, which, settings, entry, name_key)


def _class(entry: Dataset | None) -> str:
    return (
        f"NeMo RL's {_name(entry)} class" if entry else "NeMo RL's class for a Hub dataset's or a file's rows"
    )


def _repeat(t: Translation, which: str, key: str, value: Any, entry: Dataset | None) -> None:
    """NeMo RL's `repeat` (`key`: its AIME classes and NemoGymDataset take their rows `value` times over):
    validation rows as several samples of each prompt (`worker.rollout.val_n`); training rows a problem saying
    what to set."""
    if value is tree.MISSING:
        return
    rows = _ROWS[which]
    if entry is None or not entry.repeats:
        t.notes.append(
            f"{key}{t.at(key)}: NeMo RL's key, not used for the {rows} rows: {_class(entry)} reads none"
        )
    elif not tree.is_count(value):
        t.problems.append(
            f"{key}={value!r}{t.at(key)}: NeMo RL's repeat is how many times {_class(entry)} takes its rows: a "
            "whole number, at least 1"
        )
    elif value == 1:
        t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, 1: each {rows} row once, as rlstack reads them")
    elif which == "train":
        t.problems.append(
            f"{key}={value}{t.at(key)}: {_class(entry)} takes the training rows {value} times over into one set, "
            f"shuffled together, which rlstack has no key for: remove {key} (or set it to 1) and set "
            f"trainer.total_epochs (each epoch one shuffled pass over the rows), or name a file holding the rows "
            f"{value} times in data.train.data_path"
        )
    else:
        _validation_repeat(t, key, value, entry)


def _validation_repeat(t: Translation, key: str, repeat: int, entry: Dataset) -> None:
    """NeMo RL validates each of its `repeat` copies of a row with grpo.val_num_generations_per_prompt samples
    (read by then as worker.rollout.val_n) and reports the mean reward over all of them as its accuracy:
    rlstack's worker.rollout.val_n samples of each prompt, whose mean is val/<source>/accuracy."""
    n_key = "worker.rollout.val_n"
    if t.sources.get(n_key, "").startswith("command-line"):
        t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, not used: the command line sets {n_key}")
        return
    per_copy = t.get(n_key)
    per_copy = 1 if per_copy is tree.MISSING else per_copy
    if not tree.is_count(per_copy):
        return  # worker.rollout.val_n's own problem
    # policy.generation.val_temperature, or the training temperature where the file leaves it out, read by now
    # (validation_sampling runs before the data rules): only a greedy validation makes the copies one
    temperature = t.get("worker.rollout.val_temperature")
    if isinstance(temperature, (int, float)) and temperature == 0:  # the file's own greedy validation
        t.notes.append(
            f"{key}{t.at(key)}: NeMo RL's key: {_class(entry)} takes each validation row {repeat} times, but "
            "validation is greedy (policy.generation.val_temperature=0), so every copy gets the same answer and "
            f"the mean over whole copies is one copy's: each prompt validated as NeMo RL validates one copy "
            f"(worker.rollout.val_n={per_copy}); grpo.max_val_samples and grpo.val_batch_size are read as "
            "rlstack's data.val_max_samples and data.val_batch_size, which count rows where NeMo RL counts the "
            "copies (all the rows' first copies first): a bound past the rows validates some rows twice there, "
            "once here"
        )
        return
    n = repeat * per_copy
    tree.set(t.values, n_key, n)
    t.notes.append(
        f"{key}{t.at(key)}: NeMo RL's key: {_class(entry)} takes each validation row {repeat} times, each sampled "
        f"{per_copy} time(s) (grpo.val_num_generations_per_prompt), its accuracy the mean reward over them all: "
        f"read as {n_key}={n}, val/<source>/accuracy the mean over each prompt's {n} samples (rlstack's "
        "pass@k metrics are estimated over all of them, NeMo RL's pass_k over each copy's)"
    )
    most, batch_key = t.get("grpo.max_val_samples"), "grpo.val_batch_size"
    batch = t.get(batch_key)
    if tree.is_count(batch) and t.get("data.val_batch_size") is tree.MISSING:
        t.take(batch_key)
        prompts = max(1, batch // repeat)
        tree.set(t.values, "data.val_batch_size", prompts)
        t.notes.append(
            f"{batch_key}={batch}{t.at(batch_key)}: NeMo RL's key, counting its repeated validation rows ({repeat} "
            f"copies of each): read as data.val_batch_size={prompts} prompts of {n} samples each ({prompts * n} "
            f"sequences a generation call, NeMo RL's {batch * per_copy})"
        )
    if tree.is_count(most):
        rows = most // batch * batch if tree.is_count(batch) else most
        t.notes.append(
            f"grpo.max_val_samples={most}{t.at('grpo.max_val_samples')} counts NeMo RL's repeated validation rows: "
            f"it validates the first {rows} of them (whole batches of grpo.val_batch_size, all the rows' first "
            f"copies first), rlstack each of the first {most} prompts {n} times (data.val_max_samples): the same "
            f"samples where there are at most {rows // repeat} validation rows; with more, NeMo RL stops part-way "
            f"through the copies, sampling its later rows fewer times, where rlstack samples each prompt {n} times"
        )


def _filters(
    t: Translation, which: str, settings: dict[str, tuple[str, Any]], entry: Dataset | None, name_key: str
) -> None:
    """The row filters of NeMo RL's class (`Dataset.filters`, `settings`: each filter's key and value): with any
    on (the default), NeMo RL's rows are not the Hub split rlstack reads, a problem saying what to set; all
    false, noted. Set for a class without them, noted."""
    own = dict(entry.filters) if entry is not None else {}
    for name, (key, value) in settings.items():
        if value is not tree.MISSING and name not in own:
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, not used: {_class(entry)} reads none")
    if not own:
        return
    on = []
    for name, what in own.items():
        key, value = settings[name]
        if value is tree.MISSING:
            on.append(f"{what} ({name}, on by default)")
        elif value:  # NeMo RL tests the value's truth
            on.append(f"{what} ({key}={value!r}{t.at(key)})")
    if on:
        off = " and ".join(f"data.{which}.{name}: false" for name in own)
        t.problems.append(
            f"{name_key}={_name(entry)!r}{t.at(name_key)}: {_class(entry)} drops {'; and '.join(on)}, where rlstack "
            f"reads every row of {entry.files} and drops none: write the rows it keeps into a file and name it in "
            f"data.{which}.data_path (with data.default.input_key: {entry.prompt_key} and output_key: "
            f"{entry.answer_key}, which NeMo RL reads it with too), or set {off} "
            "for every row, as NeMo RL then reads them"
        )
        return
    for name in own:
        key = settings[name][0]
        t.notes.append(
            f"{key}{t.at(key)}: NeMo RL's key, false: {_class(entry)} keeps every row, as rlstack reads them"
        )


def prompt_files_rule(t: Translation) -> None:
    """NeMo RL's `prompt_file` (a text whose `{}` the problem fills, by Python's `str.format`) as rlstack's
    `data.format_prompt`, and its `system_prompt_file` as `worker.rollout.agent.system_prompt`."""
    key, path = setting(t, "system_prompt_file")
    if path not in (tree.MISSING, None):
        t.move(key, "worker.rollout.agent.system_prompt", path)
    elif path is None:
        t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, null: no system prompt")
    key, path = setting(t, "prompt_file")
    if path in (tree.MISSING, None):
        return
    if t.get("data.format_prompt") is not tree.MISSING:
        t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, not used: data.format_prompt is set")
        return
    try:
        template = jinja_of_format(Path(path).expanduser().read_text(encoding="utf-8"))
    except OSError as e:
        t.problems.append(
            f"{key}={path!r}{t.at(key)}: NeMo RL's prompt file cannot be read ({e.strerror or e}; relative paths "
            f"start at the working directory, as in NeMo RL: {Path.cwd()}): copy it there (NeMo RL's are in its "
            "examples/prompts/) or fix the path"
        )
        return
    except ValueError as e:
        t.problems.append(f"{key}={path!r}{t.at(key)}: {e}")
        return
    tree.set(t.values, "data.format_prompt", template)
    t.notes.append(
        f"{key}={path!r}{t.at(key)}: NeMo RL's prompt file, read as data.format_prompt (the same text as a Jinja "
        "template, {{ content }} where its {} is)"
    )


def jinja_of_format(text: str) -> str:
    """A NeMo RL prompt file's `text` as a `data.format_prompt` template that renders what NeMo RL's
    `text.format(problem)` gives, character for character: each `{}` (or `{0}`) becomes `{{ content }}`
    and each stretch of text between them (its `{{` and `}}` read as `{` and `}`) a `{% raw %}` block, whose
    text Jinja neither interprets nor trims (a last newline included). A text that `str.format` cannot fill
    with the problem alone is a ValueError saying why."""
    try:
        pieces = list(string.Formatter().parse(text))
        text.format("")
    except (ValueError, IndexError, KeyError) as e:
        raise ValueError(
            f"NeMo RL fills the prompt file with prompt_file.format(problem), which fails on it "
            f"({type(e).__name__}: {e}); write the problem's place as {{}} and a literal brace as {{{{ or }}}}"
        ) from e
    template, stretch = "", ""
    for literal, field, spec, conversion in pieces:  # the text is cut at each field and at each {{ or }}
        stretch += literal
        if field is None:
            continue
        if field not in ("", "0") or spec or conversion:
            raise ValueError(
                f"the prompt file's field {{{field}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}} is more than the problem as it is, which is all rlstack puts "
                "there ({}): write a data.format_prompt Jinja file for the rest"
            )
        template += _raw(stretch) + "{{ content }}"
        stretch = ""
    return template + _raw(stretch)


def _raw(text: str) -> str:
    return "{% raw %}" + text + "{% endraw %}" if text else ""
