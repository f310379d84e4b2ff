"""Reading rows from JSONL, JSON, parquet, a directory of them, a Hugging Face dataset, or a built-in task.

Every row carries where it came from (`file:line` or `dataset[index]`) so that a problem found
later can name it.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from rlstack.config.paths import hub_config, local_reason, missing_path
from rlstack.data.tasks import builtin_rows
from rlstack.errors import RLStackError

SUFFIXES = {".jsonl", ".json", ".parquet"}
"""File kinds read (a `.jsonl.gz` is read as JSONL too: `_is_jsonl_gz`)."""


class DataError(RLStackError, ValueError):
    """A data file or row that cannot be used, naming it and saying how to fix it."""


def read_rows(spec: str) -> tuple[list[dict], list[str]]:
    """All rows of `spec` and, for each, where it came from."""
    if spec.startswith("builtin:"):
        try:
            rows = builtin_rows(spec)
        except ValueError as e:
            raise DataError(str(e)) from e
        return rows, [f"{spec}[{i}]" for i in range(len(rows))]
    name, config = hub_config(spec.split("@", 1)[0])
    path = Path(name).expanduser()
    if path.is_dir() and ("@" in spec or config):
        return _read_hf_dataset(spec)  # a local dataset folder: `datasets` finds the split's files
    if path.is_dir():
        files = sorted(f for f in path.rglob("*") if f.suffix in SUFFIXES or _is_jsonl_gz(f))
        if not files:
            raise DataError(f"directory {path} holds no .jsonl, .jsonl.gz, .json or .parquet files")
        rows, where = [], []
        for f in files:
            r, w = _read_file(f)
            rows += r
            where += w
        return rows, where
    if path.is_file():
        return _read_file(path)
    if path.suffix in SUFFIXES or _is_jsonl_gz(path) or name.startswith((".", "/", "~")):
        raise DataError(missing_path("data file", spec))
    if "/" in name and (reason := local_reason(name)):  # `org/name` is a Hub dataset; other paths are local
        raise DataError(missing_path("data file", spec, reason))
    return _read_hf_dataset(spec)


def _is_jsonl_gz(path: Path) -> bool:
    """A gzip-compressed JSONL file (HumanEval ships `HumanEval.jsonl.gz`)."""
    return path.suffixes[-2:] == [".jsonl", ".gz"]


def _read_file(path: Path) -> tuple[list[dict], list[str]]:
    if path.suffix == ".jsonl" or _is_jsonl_gz(path):
        try:
            return _read_jsonl(path)
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise DataError(f"{path}: not a readable JSONL file ({type(e).__name__}: {e})") from e
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise _not_json(path, e, e.lineno) from e
        if isinstance(data, dict):  # {"data": [...]} or column-oriented {"col": [...]}
            lists = [v for v in data.values() if isinstance(v, list)]
            if len(data) == 1 and lists:
                data = lists[0]
            elif lists and len(lists) == len(data) and len({len(v) for v in lists}) == 1:
                data = [dict(zip(data, vals)) for vals in zip(*data.values())]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise DataError(f"{path}: expected a JSON list of objects (one per row)")
        return data, [f"{path}[{i}]" for i in range(len(data))]
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:
        raise DataError(f"{path}: not a readable parquet file ({e})") from e
    rows = table.to_pylist()
    return rows, [f"{path}[row {i}]" for i in range(len(rows))]


def _read_jsonl(path: Path) -> tuple[list[dict], list[str]]:
    rows, where = [], []
    with gzip.open(path, "rt", encoding="utf-8") if _is_jsonl_gz(path) else path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                # without its newline: an error at the line's end is on it (not at line 2, column 1)
                row = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as e:
                raise _not_json(path, e, lineno) from e
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object per line, got {type(row).__name__}")
            rows.append(row)
            where.append(f"{path}:{lineno}")
    return rows, where


def _not_json(path: Path, e: json.JSONDecodeError, lineno: int) -> DataError:
    """A JSON error in `path` at its line `lineno` of the file and its column there; where the text ends
    before the value does (a line cut short), at the line's end, saying so."""
    text = e.doc.splitlines()[e.lineno - 1] if e.doc.strip() else ""
    unclosed = e.msg.startswith("Unterminated string")  # JSON names where the string starts
    column = len(text) + 1 if unclosed else e.colno
    what = f"a string that starts at column {e.colno} is not closed" if unclosed else e.msg
    cut = "; the line ends there: was it cut short?" if unclosed or not e.doc[e.pos :].strip() else ""
    return DataError(
        f"{path}:{lineno}: not valid JSON at column {column} ({what}{cut}); fix or remove the line"
    )


def _read_hf_dataset(spec: str) -> tuple[list[dict], list[str]]:
    """`name@split`, `name:config@split` (a Hub config, as `openai/gsm8k:main@train`; `name` alone for
    the train split), through `datasets.load_dataset`.

    `name` is a hub dataset or a local folder laid out as one (e.g. `train.jsonl` and
    `test.jsonl`, or the configs its README names), which loads offline.
    """
    import datasets

    name, _, split = spec.partition("@")
    name, config = hub_config(name)
    try:
        by_config = (config,) if config else ()
        ds = datasets.load_dataset(name, *by_config, split=split or "train")
    except Exception as e:
        folder = Path(name).expanduser()
        for f in sorted(folder.rglob("*.json*")) if folder.is_dir() else []:
            if f.suffix in SUFFIXES or _is_jsonl_gz(f):
                _read_file(f)  # a line that is not JSON: named with its file, line and column
        which = f"config {config!r}, " if config else ""
        raise DataError(
            f"could not load Hugging Face dataset {name!r} ({which}split {split or 'train'!r}): {e}\n"
            "Use a local .jsonl/.json/.parquet file or directory, or a dataset available offline; a Hub "
            "dataset with configs is name:config@split (openai/gsm8k:main@train)."
        ) from e
    name = f"{name}:{config}" if config else name
    return list(ds), [f"{name}@{split or 'train'}[{i}]" for i in range(len(ds))]
