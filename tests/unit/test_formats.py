"""Known dataset formats (Nemotron-RL code, GSM8K, geometry3k, veRL/DeepEyes) -> canonical rows."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from rlstack.data.formats import detect_format, gsm8k_final_answer, normalize_row, normalize_rows
from rlstack.data.readers import DataError, read_rows

FIX = Path(__file__).parents[1] / "fixtures" / "formats"
CANONICAL_KEYS = {"problem", "answer", "data_source", "images", "extra"}


def load(name: str, fmt: str | None = "auto") -> tuple[list[dict], list[str]]:
    rows, where = read_rows(str(FIX / name))
    return normalize_rows(rows, where, fmt), where


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def png_size(data: bytes) -> tuple[int, int]:
    return Image.open(io.BytesIO(data)).size


# ------------------------------------------------------------------------------------------- fixtures


@pytest.mark.parametrize("fmt", ["auto", "nemotron_code"])
def test_nemotron_code(fmt):
    rows, _ = load("nemotron_code.jsonl", fmt)
    assert len(rows) == 3
    assert all(set(r) == CANONICAL_KEYS for r in rows)
    assert rows[0] == {
        "problem": [
            {
                "role": "user",
                "content": "You are given two integers a and b. Print a + b.\n\n"
                "Input: one line with a and b.\nOutput: their sum.",
            }
        ],
        "answer": {
            "inputs": ["1 2\n", "-5 5\n", "1000000000 1000000000\n"],
            "outputs": ["3\n", "0\n", "2000000000\n"],
        },
        "data_source": "nemotron_code",
        "images": [],
        "extra": {"hash_id": "a1b2c3", "dataset": "code_contests", "source": "codeforces"},
    }
    assert [m["role"] for m in rows[1]["problem"]] == ["system", "user"]
    assert rows[1]["answer"] == {"inputs": ["0\n", "10\n"], "outputs": ["0\n", "55\n"]}
    assert rows[2]["answer"] == {"inputs": ["abc\n"], "outputs": ["cba\n"]}
    assert rows[2]["extra"]["source"] == "atcoder"


@pytest.mark.parametrize("fmt", ["auto", "gsm8k"])
def test_gsm8k(fmt):
    raw, _ = read_rows(str(FIX / "gsm8k.jsonl"))
    rows, _ = load("gsm8k.jsonl", fmt)
    assert len(rows) == 3
    assert all(set(r) == CANONICAL_KEYS for r in rows)
    assert rows[0] == {
        "problem": raw[0]["question"],
        "answer": "72",
        "data_source": "gsm8k",
        "images": [],
        "extra": {"solution": raw[0]["answer"]},
    }
    assert rows[1]["answer"] == "1234"  # "#### 1,234": thousands separator removed
    assert rows[1]["extra"]["solution"].endswith("#### 1,234")
    assert rows[2]["answer"] == "10"
    assert rows[2]["problem"].startswith("Weng earns $12")


@pytest.mark.parametrize("fmt", ["auto", "geometry3k"])
def test_geometry3k(fmt):
    rows, _ = load("geometry3k.jsonl", fmt)
    assert len(rows) == 2
    assert all(set(r) == CANONICAL_KEYS for r in rows)
    r0, r1 = rows
    assert (r0["problem"], r0["answer"], r0["data_source"], r0["extra"]) == (
        "<image>Find x. Round to the nearest tenth.",
        "5.8",
        "geometry3k",
        {},
    )
    assert (r1["problem"], r1["answer"]) == ("<image>Find the area of the parallelogram.", "48")
    # images are kept as written (a data URL, plain base64) and decode to the fixture PNGs
    assert len(r0["images"]) == 1 and r0["images"][0].startswith("data:image/png;base64,")
    assert png_size(base64.b64decode(r0["images"][0].split(",", 1)[1])) == (8, 8)
    assert len(r1["images"]) == 1 and png_size(base64.b64decode(r1["images"][0])) == (6, 4)


@pytest.mark.parametrize("fmt", ["auto", "verl"])
def test_verl_deepeyes_parquet(fmt):
    rows, where = load("verl_deepeyes.parquet", fmt)
    assert where[0].endswith("verl_deepeyes.parquet[row 0]")
    assert len(rows) == 2
    assert all(set(r) == CANONICAL_KEYS for r in rows)
    r0 = rows[0]
    assert r0["problem"] == [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "<image>\nWhat is the highest bar's value?"},
    ]
    assert r0["answer"] == "42"
    assert r0["data_source"] == "chart"
    assert len(r0["images"]) == 1 and isinstance(r0["images"][0], bytes)  # {"bytes", "path"} unpacked
    assert png_size(r0["images"][0]) == (8, 8)
    assert r0["extra"] == {
        "ability": "vl_chart",
        "env_name": "visual_toolbox_v2",
        "extra_info": {
            "split": "train",
            "index": 0,
            "answer": "42",
            "question": "What is the highest bar's value?",
        },
        "reward_model": {"style": "model"},
    }
    assert (rows[1]["answer"], rows[1]["data_source"]) == ("blue", "vstar")
    assert rows[1]["problem"] == [{"role": "user", "content": "<image>\nWhat color is the umbrella?"}]


# -------------------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    "name, fmt",
    [
        ("nemotron_code.jsonl", "nemotron_code"),
        ("gsm8k.jsonl", "gsm8k"),
        ("geometry3k.jsonl", "geometry3k"),
        ("verl_deepeyes.parquet", "verl"),
    ],
)
def test_detect_format_on_fixtures(name, fmt):
    rows, _ = read_rows(str(FIX / name))
    assert {detect_format(r) for r in rows} == {fmt}


def test_detect_format_leaves_canonical_and_unknown_rows():
    assert detect_format({"problem": "1+2=", "answer": "3"}) is None
    assert (
        detect_format({"problem": "p", "answer": "a", "data_source": "s", "images": [], "extra": {}}) is None
    )
    assert detect_format({"question": "what?", "answer": "plain, no hashes"}) is None  # not GSM8K
    assert detect_format({"text": "hi"}) is None
    # a canonical row passes through auto mode unchanged, and normalizing is idempotent on canonical output
    rows = [{"problem": "1+2=", "answer": "3"}]
    assert normalize_rows(rows, ["x.jsonl:1"], "auto") == rows
    out, _ = load("geometry3k.jsonl")
    assert normalize_rows(out, ["a.jsonl:1", "a.jsonl:2"], "auto") == out


def test_none_format_returns_rows_unchanged():
    raw, where = read_rows(str(FIX / "gsm8k.jsonl"))
    assert normalize_rows(raw, where, None) == raw
    assert normalize_rows(raw, where, "none") == raw


def test_auto_detection_per_file_in_a_directory(tmp_path):
    for name in ("nemotron_code.jsonl", "gsm8k.jsonl"):
        (tmp_path / name).write_bytes((FIX / name).read_bytes())
    rows, where = read_rows(str(tmp_path))
    out = normalize_rows(rows, where, "auto")
    assert [r["data_source"] for r in out] == ["gsm8k"] * 3 + ["nemotron_code"] * 3


def test_auto_decides_per_file_so_a_later_bad_row_is_reported(tmp_path):
    """A GSM8K row without '####' is not detectable alone; the file's other rows decide its format."""
    good = {"question": "q", "answer": "so\n#### 3"}
    bad = {"question": "q2", "answer": "I forgot the final answer"}
    f = write_jsonl(tmp_path / "g.jsonl", [bad, good])
    rows, where = read_rows(str(f))
    with pytest.raises(DataError, match=rf"{f}:1: gsm8k row field 'answer' has no final answer after '####'"):
        normalize_rows(rows, where, "auto")


def test_auto_mixed_formats_in_one_file_is_an_error(tmp_path):
    f = write_jsonl(
        tmp_path / "m.jsonl", [{"question": "q", "answer": "#### 1"}, {"prompt": "p", "reward_model": {}}]
    )
    rows, where = read_rows(str(f))
    with pytest.raises(DataError, match=rf"{f}:2: row looks like format 'verl', but {f}:1 .*'gsm8k'"):
        normalize_rows(rows, where, "auto")


def test_unknown_format_name():
    with pytest.raises(DataError, match="unknown data format 'alpaca'"):
        normalize_rows([{"a": 1}], ["x:1"], "alpaca")


# -------------------------------------------------------------------------------------- malformed


NEMO_OK = {
    "responses_create_params": {"input": [{"role": "user", "content": "p"}]},
    "verifier_metadata": {"unit_tests": {"inputs": ["1\n"], "outputs": ["1\n"]}},
}


@pytest.mark.parametrize(
    "fmt, row, message",
    [
        (
            "nemotron_code",
            {"verifier_metadata": NEMO_OK["verifier_metadata"]},
            "no field 'responses_create_params'",
        ),
        (
            "nemotron_code",
            {"responses_create_params": {"tools": []}, "verifier_metadata": NEMO_OK["verifier_metadata"]},
            "no field 'responses_create_params.input'",
        ),
        (
            "nemotron_code",
            {**NEMO_OK, "verifier_metadata": {"unit_tests": {"inputs": ["1\n"]}}},
            "no field 'verifier_metadata.unit_tests.outputs'",
        ),
        (
            "nemotron_code",
            {**NEMO_OK, "verifier_metadata": {"unit_tests": {"inputs": ["1\n", "2\n"], "outputs": ["1\n"]}}},
            "2 unit-test inputs but 1 outputs",
        ),
        (
            "nemotron_code",
            {**NEMO_OK, "verifier_metadata": {"unit_tests": {"inputs": [], "outputs": []}}},
            "no unit tests",
        ),
        (
            "nemotron_code",
            {**NEMO_OK, "responses_create_params": {"input": [{"content": "no role"}]}},
            r"'responses_create_params.input'\[0\] is not a chat message",
        ),
        ("gsm8k", {"question": "q"}, "no field 'answer'"),
        ("gsm8k", {"answer": "#### 1"}, "no field 'question'"),
        ("gsm8k", {"question": "q", "answer": "42"}, "no final answer after '####'"),
        ("gsm8k", {"question": "q", "answer": "work\n####   "}, "no final answer after '####'"),
        ("geometry3k", {"problem": "p", "answer": "1"}, "no field 'images'"),
        ("geometry3k", {"problem": "p", "images": []}, "no field 'answer'"),
        ("geometry3k", {"problem": "p", "answer": "1", "images": [3]}, r"'images'\[0\] is not an image"),
        ("verl", {"prompt": [{"role": "user", "content": "p"}]}, "no field 'reward_model'"),
        (
            "verl",
            {"prompt": [{"role": "user", "content": "p"}], "reward_model": {"style": "rule"}},
            r"no field 'reward_model.ground_truth' \(fields of 'reward_model': \['style'\]\)",
        ),
        ("verl", {"reward_model": {"ground_truth": "1"}}, "no field 'prompt'"),
        ("verl", {"prompt": [], "reward_model": {"ground_truth": "1"}}, "non-empty list of chat messages"),
    ],
)
def test_malformed_rows_name_file_line_and_key(tmp_path, fmt, row, message):
    f = write_jsonl(tmp_path / "bad.jsonl", [row])
    rows, where = read_rows(str(f))
    with pytest.raises(DataError, match=rf"^{f}:1: .*{message}"):
        normalize_rows(rows, where, fmt)


def test_malformed_row_in_parquet_names_the_row(tmp_path):
    f = tmp_path / "bad.parquet"
    good = {"prompt": [{"role": "user", "content": "p"}], "reward_model": {"ground_truth": "1"}}
    pq.write_table(pa.Table.from_pylist([good, {**good, "reward_model": {"ground_truth": None}}]), f)
    rows, where = read_rows(str(f))
    with pytest.raises(DataError, match=rf"^{f}\[row 1\]: verl row has no field 'reward_model.ground_truth'"):
        normalize_rows(rows, where, "auto")


def test_nemotron_keeps_other_fields_in_extra():
    row = {
        **NEMO_OK,
        "responses_create_params": {"input": "just a string prompt", "temperature": 0.6},
        "verifier_metadata": {
            "unit_tests": {"inputs": ["1"], "outputs": ["1"], "fn_name": "f"},
            "time_limit": 2,
        },
        "data_source": "cf",
    }
    out = normalize_row(row, "nemotron_code")
    assert out["problem"] == "just a string prompt"
    assert out["answer"] == {"inputs": ["1"], "outputs": ["1"]}
    assert out["data_source"] == "cf"
    assert out["extra"] == {
        "responses_create_params": {"temperature": 0.6},
        "verifier_metadata": {"unit_tests": {"fn_name": "f"}, "time_limit": 2},
    }


def test_content_parts_are_joined():
    row = {
        **NEMO_OK,
        "responses_create_params": {
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "ab"}]}]
        },
    }
    assert normalize_row(row, "nemotron_code")["problem"] == [{"role": "user", "content": "ab"}]


# ---------------------------------------------------------------------------------- GSM8K answers


@pytest.mark.parametrize(
    "solution, final",
    [
        ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72"),
        ("... so the total is 1,234.\n#### 1,234", "1234"),
        ("#### 1,234,567", "1234567"),
        ("#### -3,000", "-3000"),
        ("#### 12,345.50", "12345.50"),
        ("####18", "18"),
        ("#### 0.5 ", "0.5"),
        ("#### -7", "-7"),
        ("first #### 5 then revised\n#### 6", "6"),  # the last '####' wins
        ("#### 1,2", "1,2"),  # not a thousands grouping: kept as written
        ("#### 12,34", "12,34"),
        ("#### 3/4", "3/4"),
        ("#### $10", "$10"),  # only separators are normalized; the math checker handles units
        ("no marker here", None),
        ("####", None),
    ],
)
def test_gsm8k_final_answer(solution, final):
    assert gsm8k_final_answer(solution) == final


def test_a_known_formats_own_source_field_can_name_the_data_source(tok):
    """Nemotron rows keep `source` / `dataset` under `extra`; data.data_source_key reads them there, so
    validation reports per contest site (or dataset) instead of one `nemotron_code` bucket."""
    from rlstack.data.dataset import PromptDataset

    path = str(FIX / "nemotron_code.jsonl")
    by_default = PromptDataset(path, tok, max_prompt_length=4096)
    by_site = PromptDataset(path, tok, max_prompt_length=4096, data_source_key="source")
    assert {it["data_source"] for it in by_default.items} == {"nemotron_code"}
    assert [it["data_source"] for it in by_site.items] == [
        r["source"] for r in map(json.loads, Path(path).read_text().splitlines())
    ]
    assert by_site.items[0]["data_source"] == "codeforces"
