"""NeMo RL's data keys: its registry dataset names read as the Hub datasets rlstack loads, the training and
validation rows and their fields, and `prompt_file` (a `{}` text) as a Jinja template."""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rlstack.config.tree as tree
from rlstack.config.compat.nemo_rl_translation import Translation, setting


@dataclass(frozen=True)
class Dataset:
    """One of NeMo RL's registry datasets, as the Hub dataset rlstack reads and the row fields it needs."""

    files: str
    """data.train_files (or data.val_files, where it is named for validation): `org/name@split`."""
    answer_key: str = "answer"
    """data.answer_key: the row field NeMo RL's class reads the ground truth from."""
    prompt_key: str = "problem"
    """data.prompt_key: the row field it reads the problem from."""
    val_files: str | None = None
    """Validation rows where the config names none (NeMo RL's class brings them): data.val_files."""
    val_split: float = 0.0
    """Or the share of the training rows NeMo RL's class holds out for validation: data.val_split."""


DATASETS = {
    "OpenMathInstruct-2": Dataset("nvidia/OpenMathInstruct-2@train_1M", "expected_answer", val_split=0.05),
    "DeepScaler": Dataset(
        "agentica-org/DeepScaleR-Preview-Dataset@train", val_files="HuggingFaceH4/aime_2024@train"
    ),
    "AIME2024": Dataset("HuggingFaceH4/aime_2024@train"),
    # veRL rows (prompt, reward_model.ground_truth), which data.format=auto reads as problem and answer
    "DAPOMath17K": Dataset("BytedTsinghua-SIA/DAPO-Math-17k@train"),
    "DAPOMathAIME2024": Dataset("BytedTsinghua-SIA/AIME-2024@train"),
}
"""NeMo RL's dataset registry names (`data.train.dataset_name`, `data.validation.dataset_name`, the older
`data.dataset_name`) that have a Hub form, as rlstack reads them: the Hub dataset and split NeMo RL's
class loads, the fields its problem and answer are in, and the validation rows it brings. The others
(gsm8k, whose Hub form needs its config, `openai/gsm8k:main@train`; the SFT, preference and VLM sets)
are a problem saying what to set."""


def _hub_form(name: Any, split: Any) -> tuple[str, Dataset | None] | None:
    """A dataset name as rlstack's `name@split`, and its registry entry: a registry name of `DATASETS`, or a
    Hub dataset `org/name` itself (`split`: NeMo RL's `split` key); None for any other name."""
    if not isinstance(name, str):
        return None
    entry = DATASETS.get(name)
    if entry is None and "/" not in name:
        return None
    files = entry.files if entry else name
    if isinstance(split, str) and split:
        files = f"{files.split('@', 1)[0]}@{split}"
    return files, entry


_OLDER_PATHS = {"train": "data.train_data_path", "validation": "data.val_data_path"}
_ROWS = {"train": "training", "validation": "validation"}


def _rows(t: Translation, which: str, to: str) -> tuple[bool, Dataset | None]:
    """`data.train` or `data.validation` (`which`) rows as rlstack's `to` (data.train_files, data.val_files):
    a `data_path` (or the older `data.train_data_path` / `data.val_data_path`), else a `dataset_name` with a
    Hub form. Returns whether NeMo RL's keys name the rows, and the registry entry they named."""
    if which == "train":
        key, name = setting(t, "dataset_name")
    else:
        key, name = f"data.{which}.dataset_name", t.take(f"data.{which}.dataset_name")
    split = t.take(f"data.{which}.split")
    at_split = f"@{split}" if isinstance(split, str) and split else ""
    for path_key in (f"data.{which}.data_path", _OLDER_PATHS[which]):
        path = t.take(path_key)
        if path not in (tree.MISSING, None):
            if name not in (tree.MISSING, None):
                t.notes.append(f"{key}{t.at(key)}: NeMo RL's loader of {path_key}'s rows, not used")
            t.move(path_key, to, f"{path}{at_split}")
            return True, None
    form = _hub_form(name, split)
    if form is not None:
        files, entry = form
        t.move(key, to, files)
        if entry is not None:
            t.notes.append(f"{key}={name!r}{t.at(key)}: NeMo RL's registry name of the Hub dataset {files}")
        return True, entry
    if t.get(to) is not tree.MISSING:  # rlstack's own key names the rows
        if name is not tree.MISSING:
            t.notes.append(f"{key}{t.at(key)}: NeMo RL's key, not used: {to} is set")
    elif isinstance(name, str) or which == "train":
        if isinstance(name, str):
            what = f"={name!r}, a NeMo RL registry name without a Hub form rlstack reads"
        else:
            what = " is null" if name is None else " is not set"
        t.problems.append(
            f"{key}{what}{t.at(key)}: NeMo RL's config names no {_ROWS[which]} rows rlstack can read; set {key} to a Hub "
            f"dataset (org/name) or one of the registry names rlstack maps ({', '.join(DATASETS)}), "
            f"data.{which}.data_path to a local file, or rlstack's {to} (a file, builtin:<task>, org/name@split or org/name:config@split)"
        )
    return False, None


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
    validation rows NeMo RL's class brings. Training rows named nowhere (`dataset_name: null`) or by a name
    rlstack has no form for are a problem naming the key and what to set; a config that names training rows
    and no validation rows validates on none (`data.val_files=''`), as NeMo RL."""
    train, entry = _rows(t, "train", "data.train_files")
    none = t.get("data.validation") is None  # NeMo RL's `validation: null`: none but rows held out
    if none:
        t.take("data.validation")
        t.notes.append(
            f"data.validation{t.at('data.validation')}: NeMo RL's key, null: no validation rows of their own"
        )
    val, val_entry = _rows(t, "validation", "data.val_files")
    _fields(t, [e for e in (entry, val_entry) if e is not None])
    held_out = t.get("data.train.split_validation_size")
    if val or not train or t.get("data.val_files") is not tree.MISSING:
        return
    if held_out not in (tree.MISSING, None, 0):
        t.move("data.train.split_validation_size", "data.val_files", "")  # the held-out rows validate
    elif entry is not None and (entry.val_files or entry.val_split) and not none:
        tree.set(t.values, "data.val_files", entry.val_files or "")
        if entry.val_split and t.get("data.val_split") is tree.MISSING:
            tree.set(t.values, "data.val_split", entry.val_split)
        rows = entry.val_files or f"{entry.val_split:.0%} of the training rows, held out (data.val_split)"
        t.notes.append(
            f"NeMo RL's dataset brings its validation rows, {rows}: read as data.val_files={entry.val_files or ''!r}"
        )
    else:
        tree.set(t.values, "data.val_files", "")
        t.notes.append("NeMo RL's config names no validation rows: no validation (data.val_files='')")


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
