"""Reading rows, rendering and tokenizing prompts, and the seeded, resumable prompt loader."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlstack.data.dataset import PromptDataset, PromptLoader, sft_batch
from rlstack.data.readers import DataError, read_rows
from rlstack.data.tasks import builtin_rows
from rlstack.models.tiny import build_char_tokenizer

ROWS = [
    {"problem": "1+2=", "answer": "3", "level": "easy"},
    {"problem": "10+20=", "answer": "30", "level": "hard"},
    {"problem": "7+8=", "answer": "15", "level": "easy"},
]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def chat(text: str) -> str:
    """What the tiny tokenizer's chat template makes of one user message."""
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


# ---------------------------------------------------------------------------------------- readers


def test_read_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n")
    rows, where = read_rows(str(path))
    assert rows == ROWS[:2]
    assert where == [f"{path}:1", f"{path}:3"]  # the blank line is skipped but still counted


def test_read_json_list(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(ROWS))
    rows, where = read_rows(str(path))
    assert rows == ROWS
    assert where == [f"{path}[0]", f"{path}[1]", f"{path}[2]"]


def test_read_json_wrapped_list(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"data": ROWS}))
    rows, _ = read_rows(str(path))
    assert rows == ROWS


def test_read_json_column_oriented(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"problem": ["1+2=", "3+4="], "answer": ["3", "7"]}))
    rows, where = read_rows(str(path))
    assert rows == [{"problem": "1+2=", "answer": "3"}, {"problem": "3+4=", "answer": "7"}]
    assert where == [f"{path}[0]", f"{path}[1]"]


def test_read_parquet(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    rows, where = read_rows(str(path))
    assert rows == ROWS
    assert where == [f"{path}[row 0]", f"{path}[row 1]", f"{path}[row 2]"]


def test_read_directory_of_mixed_files_in_sorted_order(tmp_path):
    d = tmp_path / "data"
    (d / "sub").mkdir(parents=True)
    write_jsonl(d / "a.jsonl", ROWS[:1])
    (d / "b.json").write_text(json.dumps(ROWS[1:2]))
    pq.write_table(pa.Table.from_pylist(ROWS[2:]), d / "sub" / "c.parquet")
    (d / "notes.txt").write_text("ignored")
    rows, where = read_rows(str(d))
    assert rows == ROWS
    assert where == [f"{d}/a.jsonl:1", f"{d}/b.json[0]", f"{d}/sub/c.parquet[row 0]"]


def test_empty_directory_is_an_error(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="holds no .jsonl, .jsonl.gz, .json or .parquet files"):
        read_rows(str(tmp_path))


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_rows(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="does not exist"):
        read_rows("./missing_dir_for_rlstack_tests")


def test_a_missing_local_data_path_names_where_it_was_looked_for(tmp_path, monkeypatch):
    """A path whose first folder exists here is local, not a Hub dataset `org/name`: missing, the message
    gives the absolute path and the working directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    with pytest.raises(DataError) as info:
        read_rows("data/train@test")
    assert str(info.value).startswith(
        f"data file: 'data/train@test' does not exist (looked for {tmp_path}/data/train; relative paths start at "
        f"the working directory {tmp_path}); it is read as a local path"
    ), info.value


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n" + '{"problem": "1+1=", \n')
    with pytest.raises(DataError) as info:
        read_rows(str(path))
    assert str(info.value).startswith(f"{path}:3: not valid JSON")


def test_a_jsonl_line_cut_short_is_named_at_its_line_and_column(tmp_path):
    """A line cut at column 33 is reported where it breaks (its end), not at column 1 of a next line; in a
    JSONL file, a JSON file and a local dataset folder read through `datasets` (`folder@split`)."""
    whole = json.dumps({"problem": "1+1=", "answer": "2", "level": 1})
    cut = whole[:33]  # '{"problem": "1+1=", "answer": "2"' then nothing
    (tmp_path / "set").mkdir()
    for name, text, line, column in (
        ("train.jsonl", f"{whole}\n{cut}\n{whole}\n", 2, 34),
        ("train.json", f"[\n  {whole},\n  {cut}", 3, 36),  # indented by 2
        ("set/train.jsonl", f"{whole}\n{whole}\n{cut}\n", 3, 34),
    ):
        (tmp_path / name).write_text(text)
        spec = str(tmp_path / name) if name.startswith("train") else f"{tmp_path / 'set'}@train"
        with pytest.raises(DataError) as info:
            read_rows(spec)
        assert str(info.value).startswith(f"{tmp_path / name}:{line}: not valid JSON at column {column} "), (
            info.value
        )
        assert "the line ends there: was it cut short?" in str(info.value)
    (tmp_path / "quoted.jsonl").write_text(whole[:32] + "\n")  # cut inside a string: its start is named too
    with pytest.raises(DataError) as info:
        read_rows(str(tmp_path / "quoted.jsonl"))
    assert (
        "quoted.jsonl:1: not valid JSON at column 33 (a string that starts at column 31 is not closed"
        in str(info.value)
    )


def test_jsonl_line_that_is_not_an_object(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n[1, 2]\n")
    with pytest.raises(DataError, match=rf"{path}:2: expected a JSON object per line, got list"):
        read_rows(str(path))


def test_malformed_json_file_names_the_line(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('[\n  {"problem": "1+1="},\n  {oops}\n]\n')
    with pytest.raises(DataError, match=rf"{path}:3: not valid JSON"):
        read_rows(str(path))


def test_json_that_is_not_a_list_of_objects(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(DataError, match="expected a JSON list of objects"):
        read_rows(str(path))


def test_unreadable_parquet(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_text("not parquet")
    with pytest.raises(DataError, match="not a readable parquet file"):
        read_rows(str(path))


def test_hub_name_with_split_goes_through_load_dataset(monkeypatch):
    """`name@split` is not a local path, so it is read with datasets.load_dataset(name, split=split)."""
    import datasets

    calls = []

    def fake_load_dataset(name, split):
        calls.append((name, split))
        return datasets.Dataset.from_list(ROWS[:2])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    rows, where = read_rows("someorg/somedata@test")
    assert calls == [("someorg/somedata", "test")]
    assert rows == ROWS[:2]
    assert where == ["someorg/somedata@test[0]", "someorg/somedata@test[1]"]
    read_rows("someorg/somedata")
    assert calls[-1] == ("someorg/somedata", "train")


def test_hub_dataset_that_cannot_be_loaded_offline():
    with pytest.raises(DataError) as info:
        read_rows("rlstack-tests/no-such-dataset@test")
    msg = str(info.value)
    assert "could not load Hugging Face dataset 'rlstack-tests/no-such-dataset' (split 'test')" in msg
    assert "Use a local .jsonl/.json/.parquet file or directory" in msg


def test_builtin_addition_splits_are_disjoint_and_cover_all_problems():
    train, where = read_rows("builtin:addition@train")
    test, _ = read_rows("builtin:addition@test")
    assert where[0] == "builtin:addition@train[0]"
    assert len(train) + len(test) == 100 * 100
    # the fixed hash split; changing it silently would change every reported result
    assert (len(train), len(test)) == (8982, 1018)
    train_problems = {r["problem"] for r in train}
    test_problems = {r["problem"] for r in test}
    assert not train_problems & test_problems
    assert len(train_problems | test_problems) == 10000
    row = next(r for r in test + train if r["problem"] == "37+58=")
    assert row == {"problem": "37+58=", "answer": "95", "data_source": "addition"}
    assert builtin_rows("builtin:addition") == train  # the default split is train


def test_builtin_unknown_task_or_split():
    with pytest.raises(DataError, match="unknown built-in task 'nope'"):
        read_rows("builtin:nope@train")
    with pytest.raises(DataError, match="unknown split 'dev'"):
        read_rows("builtin:addition@dev")


# ----------------------------------------------------------------------------------- PromptDataset


def test_prompt_dataset_items(tmp_path, tok):
    path = write_jsonl(tmp_path / "arith.jsonl", [{**ROWS[0], "data_source": "mine"}, ROWS[1]])
    ds = PromptDataset(str(path), tok, apply_chat_template=False)
    assert len(ds) == 2
    first, second = ds.items
    assert first["prompt"] == "1+2="
    assert first["prompt_ids"] == tok("1+2=", add_special_tokens=False)["input_ids"]
    assert len(first["prompt_ids"]) == 4
    assert first["ground_truth"] == "3"
    assert first["data_source"] == "mine"
    assert second["data_source"] == "arith"  # the file's stem when the row names none
    assert first["extra"] == {"level": "easy"}
    assert first["where"] == f"{path}:1"


def test_chat_template_applied(tmp_path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS[:1])
    ds = PromptDataset(str(path), tok)
    (item,) = ds.items
    assert item["prompt"] == chat("1+2=")
    expected = tok.apply_chat_template(
        [{"role": "user", "content": "1+2="}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert item["prompt_ids"] == list(expected)
    assert item["prompt_ids"][0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert len(item["prompt_ids"]) == 23


def test_chat_message_list_prompt(tmp_path, tok):
    messages = [{"role": "system", "content": "add"}, {"role": "user", "content": "1+2="}]
    path = write_jsonl(tmp_path / "train.jsonl", [{"problem": messages, "answer": "3"}])
    (item,) = PromptDataset(str(path), tok).items
    assert item["prompt"] == "<|im_start|>system\nadd<|im_end|>\n" + chat("1+2=")


def test_bad_prompt_values(tmp_path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", [ROWS[0], {"problem": 5, "answer": "5"}])
    with pytest.raises(
        DataError, match=rf"{path}:2: prompt must be a string or a list of chat messages, got int"
    ):
        PromptDataset(str(path), tok)
    path = write_jsonl(tmp_path / "msgs.jsonl", [{"problem": [{"text": "hi"}], "answer": "5"}])
    with pytest.raises(DataError, match=rf"{path}:1: a list prompt must hold chat messages"):
        PromptDataset(str(path), tok)


def test_format_prompt_renders_row_fields(tmp_path, tok):
    template = tmp_path / "prompt.jinja"
    template.write_text("Solve ({{ level }}): {{ content }}")
    path = write_jsonl(tmp_path / "train.jsonl", ROWS[:2])
    ds = PromptDataset(str(path), tok, format_prompt=str(template), apply_chat_template=False)
    assert [it["prompt"] for it in ds.items] == ["Solve (easy): 1+2=", "Solve (hard): 10+20="]
    ds = PromptDataset(str(path), tok, format_prompt=str(template))
    assert ds.items[0]["prompt"] == chat("Solve (easy): 1+2=")


def test_format_prompt_reads_the_prompt_as_prompt_too_unless_the_row_has_that_field(tmp_path, tok):
    template = tmp_path / "prompt.jinja"
    template.write_text("Q: {{ prompt }}")
    path = write_jsonl(tmp_path / "train.jsonl", [ROWS[0], {**ROWS[1], "prompt": "its own field"}])
    ds = PromptDataset(str(path), tok, format_prompt=str(template), apply_chat_template=False)
    assert [it["prompt"] for it in ds.items] == ["Q: 1+2=", "Q: its own field"]


EASYR1_TEMPLATE = """<|im_start|>system
You are a helpful assistant.
<|im_end|>
<|im_start|>user
{{ prompt }}
{% for image in images %}
<image>{{ image }}</image>
{% endfor %}
<|im_end|>
<|im_start|>assistant
"""
"""The Jinja template of the EasyR1 seed (seeds/easyr1-guide.md, "Prompt Templates"), as it is there."""


def test_the_easyr1_seed_template_renders_text_rows_with_no_images(tmp_path, tok):
    template = tmp_path / "easyr1.jinja"
    template.write_text(EASYR1_TEMPLATE)
    path = write_jsonl(tmp_path / "train.jsonl", [{"problem": "What is 2+2?", "answer": "4"}])
    ds = PromptDataset(str(path), tok, format_prompt=str(template), apply_chat_template=False)
    text = ds.items[0]["prompt"]
    assert "<|im_start|>user\nWhat is 2+2?\n" in text and "<image>" not in text
    # a row with images: the loop sees the row's list as written
    rows = [{"problem": "Compare", "images": ["a.png", "b.png"], "answer": "x"}]
    template.write_text("{{ prompt }}{% for image in images %} [{{ image }}]{% endfor %}")
    path = write_jsonl(tmp_path / "images.jsonl", rows)
    (tmp_path / "a.png").write_bytes(_png())
    (tmp_path / "b.png").write_bytes(_png())
    ds = PromptDataset(str(path), tok, format_prompt=str(template), apply_chat_template=False)
    assert ds.items[0]["prompt"] == "Compare [a.png] [b.png]"


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, format="PNG")
    return buf.getvalue()


def test_format_prompt_field_missing_names_the_row(tmp_path, tok):
    template = tmp_path / "prompt.jinja"
    template.write_text("{{ content }} [{{ hint }}]")
    path = write_jsonl(tmp_path / "train.jsonl", [{**ROWS[0], "hint": "add"}, ROWS[1]])
    with pytest.raises(DataError) as info:
        PromptDataset(str(path), tok, format_prompt=str(template))
    msg = str(info.value)
    assert msg.startswith(f"{path}:2: data.format_prompt")
    assert "uses a field the row lacks" in msg
    assert "hint" in msg


def test_format_prompt_file_problems(tmp_path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS[:1])
    with pytest.raises(DataError, match="data.format_prompt"):
        PromptDataset(str(path), tok, format_prompt=str(tmp_path / "missing.jinja"))
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if %}")
    with pytest.raises(DataError, match="data.format_prompt"):
        PromptDataset(str(path), tok, format_prompt=str(bad))


def test_missing_prompt_key_names_row_and_config_key(tmp_path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", [ROWS[0], {"question": "1+1=", "answer": "2"}])
    with pytest.raises(DataError) as info:
        PromptDataset(str(path), tok)
    msg = str(info.value)
    assert msg.startswith(f"{path}:2: row has no field 'problem' (data.prompt_key)")
    assert "['answer', 'question']" in msg
    assert "Set data.prompt_key" in msg


def test_missing_answer_key_names_row_and_config_key(tmp_path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", [{"problem": "1+1=", "solution": "2"}])
    with pytest.raises(DataError, match=rf"{path}:1: row has no field 'answer' \(data.answer_key\)"):
        PromptDataset(str(path), tok)
    ds = PromptDataset(str(path), tok, answer_key="solution")
    assert ds.items[0]["ground_truth"] == "2"


def test_filter_overlong_prompts_drops_long_rows(tmp_path, tok):
    rows = [{"problem": "1+2=", "answer": "3"}, {"problem": "123456789+1=", "answer": "x"}, ROWS[2]]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    ds = PromptDataset(str(path), tok, apply_chat_template=False, max_prompt_length=4)
    assert [it["prompt"] for it in ds.items] == ["1+2=", "7+8="]
    assert ds.num_filtered == 1
    assert [it["where"] for it in ds.items] == [f"{path}:1", f"{path}:3"]


def test_overlong_prompt_without_filtering_names_the_row(tmp_path, tok):
    rows = [{"problem": "1+2=", "answer": "3"}, {"problem": "123456789+1=", "answer": "x"}]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataError) as info:
        PromptDataset(
            str(path), tok, apply_chat_template=False, max_prompt_length=4, filter_overlong_prompts=False
        )
    msg = str(info.value)
    assert msg.startswith(f"{path}:2: prompt has 12 tokens, more than data.max_prompt_length=4")
    assert "data.filter_overlong_prompts=true" in msg


def test_every_prompt_overlong_is_an_error(tmp_path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(DataError, match="every one of 3 prompts is longer than data.max_prompt_length=2"):
        PromptDataset(str(path), tok, max_prompt_length=2)


def test_max_samples_and_batch(tmp_path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS)
    ds = PromptDataset(str(path), tok, apply_chat_template=False, max_samples=2)
    assert len(ds) == 2
    b = ds.batch([1, 0], uid_prefix="e0-")
    assert b["uid"] == ["e0-1", "e0-0"]
    assert b["prompt"] == ["10+20=", "1+2="]
    assert b["ground_truth"] == ["30", "3"]
    assert set(b.keys()) == {
        "prompt_ids",
        "prompt",
        "prompt_messages",
        "ground_truth",
        "data_source",
        "extra",
        "images",
        "where",
        "uid",
    }
    # the chat messages before any template, for reward models that read them in their own
    assert b["prompt_messages"] == [
        [{"role": "user", "content": "10+20="}],
        [{"role": "user", "content": "1+2="}],
    ]


def test_sft_batch_masks_answer_and_eos(tmp_path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS[:2])
    ds = PromptDataset(str(path), tok, apply_chat_template=False)
    b = sft_batch(ds, [0, 1], tok)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    # row 0: "1+2=" + "3" + EOS (6 tokens), padded to row 1's "10+20=" + "30" + EOS (9 tokens)
    assert b["input_ids"][0].tolist() == tok("1+2=3", add_special_tokens=False)["input_ids"] + [
        eos,
        pad,
        pad,
        pad,
    ]
    assert b["attention_mask"][0].tolist() == [1] * 6 + [0] * 3
    assert b["response_mask"][0].tolist() == [0, 0, 0, 0, 1, 1, 0, 0, 0]
    assert b["response_mask"][1].tolist() == [0] * 6 + [1, 1, 1]
    assert b["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 5, 5, 5, 5]


# ------------------------------------------------------------------------------------ PromptLoader


@pytest.fixture(scope="module")
def ten_rows(tmp_path_factory, tok) -> PromptDataset:
    path = write_jsonl(
        tmp_path_factory.mktemp("loader") / "train.jsonl",
        [{"problem": f"{i}+0=", "answer": str(i)} for i in range(10)],
    )
    return PromptDataset(str(path), tok, apply_chat_template=False)


def take(loader: PromptLoader, k: int) -> list[list[int]]:
    return [loader.next_indices() for _ in range(k)]


def test_loader_without_shuffle_walks_in_order_and_drops_the_last_partial_batch(ten_rows):
    loader = PromptLoader(ten_rows, batch_size=3, shuffle=False, seed=1)
    assert len(loader) == 3
    assert take(loader, 4) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 2]]
    assert loader.state_dict() == {"epoch": 1, "index": 1}


def test_loader_shuffling_is_seeded(ten_rows):
    a = take(PromptLoader(ten_rows, 3, shuffle=True, seed=1), 6)
    b = take(PromptLoader(ten_rows, 3, shuffle=True, seed=1), 6)
    c = take(PromptLoader(ten_rows, 3, shuffle=True, seed=2), 6)
    assert a == b
    assert a != c
    assert a[:3] != [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_loader_epochs_roll_over_with_a_new_order(ten_rows):
    loader = PromptLoader(ten_rows, 3, shuffle=True, seed=1)
    epoch0, epoch1 = take(loader, 3), take(loader, 3)
    for epoch in (epoch0, epoch1):
        flat = [i for batch in epoch for i in batch]
        assert len(set(flat)) == 9  # no row twice within an epoch
        assert set(flat) <= set(range(10))
    assert epoch0 != epoch1
    assert loader.epoch == 1
    batch = loader.next_batch()
    assert loader.epoch == 2
    assert all(u.startswith("e2-") for u in batch["uid"])


def test_loader_resumes_to_the_same_next_batches(ten_rows):
    reference = PromptLoader(ten_rows, 3, shuffle=True, seed=5)
    take(reference, 2)
    state = reference.state_dict()
    expected = [reference.next_batch() for _ in range(4)]  # crosses into epoch 1

    resumed = PromptLoader(ten_rows, 3, shuffle=True, seed=5)
    resumed.load_state_dict(dict(state))
    got = [resumed.next_batch() for _ in range(4)]
    assert [b["uid"] for b in got] == [b["uid"] for b in expected]
    assert [b["prompt"] for b in got] == [b["prompt"] for b in expected]
    assert resumed.state_dict() == reference.state_dict()


def test_loader_needs_one_full_batch(ten_rows):
    with pytest.raises(
        DataError, match="has 10 prompts .* fewer than one batch of data.rollout_batch_size=11"
    ):
        PromptLoader(ten_rows, 11, shuffle=True, seed=1)


def test_local_dataset_folder_with_split_loads_only_that_split(tmp_path):
    """`folder@test` is a dataset laid out by split: `datasets` picks test.jsonl, offline."""
    folder = tmp_path / "mini"
    folder.mkdir()
    (folder / "train.jsonl").write_text(
        '{"problem": "1+1=", "answer": "2"}\n{"problem": "2+2=", "answer": "4"}\n'
    )
    (folder / "test.jsonl").write_text('{"problem": "3+3=", "answer": "6"}\n')
    rows, where = read_rows(f"{folder}@test")
    assert rows == [{"problem": "3+3=", "answer": "6"}]
    assert where == [f"{folder}@test[0]"]
    rows, _ = read_rows(f"{folder}@train")
    assert [r["answer"] for r in rows] == ["2", "4"]


def test_a_hub_config_is_named_after_a_colon(tmp_path, monkeypatch):
    """`name:config@split` (openai/gsm8k:main@train): the dataset's config, here a local folder whose README
    names two (as the Hub's dataset cards do), offline; a config it lacks is an error naming it."""
    folder = tmp_path / "gsm"
    for config, answer in (("main", "#### 2"), ("socratic", "How much? ** 1+1=2 #### 2")):
        (folder / config).mkdir(parents=True)
        (folder / config / "train.jsonl").write_text(
            json.dumps({"question": "1+1?", "answer": answer}) + "\n"
        )
    (folder / "README.md").write_text(
        "---\nconfigs:\n"
        + "".join(
            f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train.jsonl\n"
            for c in ("main", "socratic")
        )
        + "---\n"
    )
    rows, where = read_rows(f"{folder}:socratic@train")
    assert rows == [{"question": "1+1?", "answer": "How much? ** 1+1=2 #### 2"}]
    assert where == [f"{folder}:socratic@train[0]"]
    assert read_rows(f"{folder}:main@train")[0] == [{"question": "1+1?", "answer": "#### 2"}]
    with pytest.raises(
        DataError,
        match=r"(?s)config 'nope', split 'train'.*Available: \['main', 'socratic'\].*name:config@split",
    ):
        read_rows(f"{folder}:nope@train")
    # a Hub name: the config goes to load_dataset as its second argument
    import datasets

    calls = []
    monkeypatch.setattr(
        datasets, "load_dataset", lambda *a, **k: calls.append((a, k)) or datasets.Dataset.from_list(ROWS[:1])
    )
    assert read_rows("openai/gsm8k:main@test")[1] == ["openai/gsm8k:main@test[0]"]
    assert calls == [(("openai/gsm8k", "main"), {"split": "test"})]


def test_val_split_holds_out_training_rows_for_validation(tmp_path):
    """data.val_split (NeMo RL's split_validation_size) moves a seeded fraction of the training rows into the
    validation set: disjoint, the same rows for the same seed (a resumed run trains on the same rows)."""
    from rlstack.config import ConfigError, load_config
    from rlstack.trainer import Trainer

    def sets(seed: int):
        cfg = load_config(
            [
                "data.val_files=",
                "data.val_split=0.25",
                f"data.seed={seed}",
                f"trainer.output_dir={tmp_path}",
                "trainer.logger=[file]",
            ]
        )
        trainer = Trainer(cfg)
        return [it["prompt"] for it in trainer.train_set.items], [
            it["prompt"] for it in trainer.val_set.items
        ]

    train, val = sets(1)
    whole = train + val
    assert len(val) == round(0.25 * len(whole)) and not set(train) & set(val)
    assert sets(1) == (train, val)
    assert sets(2)[1] != val
    with pytest.raises(
        ConfigError, match="data.val_files = 'builtin:addition@test' names validation rows already"
    ):
        load_config(["data.val_split=0.1"])
    with pytest.raises(ConfigError, match=r"data.val_split = 1.0: must be in \[0, 1\)"):
        load_config(["data.val_files=", "data.val_split=1.0"])


def test_a_hub_config_loads_in_the_config_as_in_the_reader(tmp_path):
    """`org/name:config@split` and a local folder with a config are data sources at load, not missing paths."""
    from config_files import OWN_ROWS

    from rlstack.config import ConfigError, load_config

    cfg = load_config(
        ["data.train_files=openai/gsm8k:main@train", "data.val_files=openai/gsm8k:main@test", *OWN_ROWS]
    )
    assert cfg.data.train_files == "openai/gsm8k:main@train"
    (tmp_path / "set").mkdir()
    assert load_config(
        [f"data.train_files={tmp_path / 'set'}:main@train", *OWN_ROWS]
    ).data.train_files.endswith(":main@train")
    with pytest.raises(ConfigError, match="does not exist"):  # a missing local folder stays a missing path
        load_config([f"data.train_files={tmp_path / 'nope'}:main@train", *OWN_ROWS])
