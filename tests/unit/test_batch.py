"""Batch: equally long tensor and list columns that move together through every row operation."""

from __future__ import annotations

import pickle

import pytest
import torch

from rlstack.batch import Batch, pad_right, pad_to_same_width


def make_batch(rows: int = 4, width: int = 3) -> Batch:
    """Row i has input_ids i*10 + [0..width), scores i, uid 'u{i}' and extra {'i': i}."""
    ids = torch.arange(width)[None, :] + 10 * torch.arange(rows)[:, None]
    return Batch(
        {
            "input_ids": ids,
            "scores": torch.arange(rows, dtype=torch.float32),
            "uid": [f"u{i}" for i in range(rows)],
            "extra": [{"i": i} for i in range(rows)],
        },
        meta={"temperature": 0.7},
    )


def assert_consistent(b: Batch) -> None:
    """Each row's list columns still describe the same row as its tensor columns."""
    for row in b.iter_rows():
        i = int(row["scores"])
        assert row["uid"] == f"u{i}"
        assert row["extra"] == {"i": i}
        assert row["input_ids"][0].item() == 10 * i


def uids(b: Batch) -> list[str]:
    return b["uid"]


# ---------------------------------------------------------------------------------------- columns


def test_len_keys_contains_and_getitem():
    b = make_batch()
    assert len(b) == 4
    assert b.keys() == ["input_ids", "scores", "uid", "extra"]
    assert "uid" in b and "nope" not in b
    assert len(Batch()) == 0
    with pytest.raises(KeyError, match="no column 'nope'"):
        b["nope"]
    assert b.get("nope", 5) == 5


def test_mismatched_column_length_raises():
    b = make_batch(rows=4)
    with pytest.raises(ValueError, match="column 'bad' has 3 rows, the batch has 4"):
        b["bad"] = torch.zeros(3)
    with pytest.raises(ValueError, match="column 'bad' has 5 rows"):
        b["bad"] = [0] * 5
    with pytest.raises(ValueError):
        Batch({"a": torch.zeros(2), "b": [1, 2, 3]})
    assert "bad" not in b


def test_column_must_be_tensor_or_list():
    with pytest.raises(TypeError, match="must be a tensor or a list, got tuple"):
        Batch({"a": (1, 2)})


def test_update_adds_columns_and_returns_self():
    b = make_batch(rows=2)
    out = b.update({"advantages": torch.ones(2, 3), "tag": ["x", "y"]})
    assert out is b
    assert b["tag"] == ["x", "y"]


# ---------------------------------------------------------------------------------------- row ops


def test_select_with_list_keeps_order_and_repeats():
    b = make_batch().select([3, 1, 1])
    assert uids(b) == ["u3", "u1", "u1"]
    assert b["scores"].tolist() == [3.0, 1.0, 1.0]
    assert b["input_ids"].tolist() == [[30, 31, 32], [10, 11, 12], [10, 11, 12]]
    assert b.meta == {"temperature": 0.7}
    assert_consistent(b)


def test_select_with_bool_tensor():
    b = make_batch().select(torch.tensor([True, False, False, True]))
    assert uids(b) == ["u0", "u3"]
    assert b["scores"].tolist() == [0.0, 3.0]
    assert_consistent(b)


def test_select_with_bool_mask_of_wrong_length_raises():
    with pytest.raises((IndexError, ValueError)):
        make_batch(rows=4).select(torch.tensor([True, False]))


def test_select_with_long_tensor():
    b = make_batch().select(torch.tensor([2, 0]))
    assert uids(b) == ["u2", "u0"]
    assert_consistent(b)


def test_select_with_slice():
    b = make_batch(rows=6).select(slice(1, 6, 2))
    assert uids(b) == ["u1", "u3", "u5"]
    assert b["input_ids"][:, 0].tolist() == [10, 30, 50]
    assert_consistent(b)


def test_select_does_not_alias_list_columns():
    b = make_batch()
    sub = b.select([0, 1])
    sub["uid"][0] = "changed"
    assert b["uid"][0] == "u0"


def test_split_last_chunk_shorter():
    parts = make_batch(rows=5).split(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert [uids(p) for p in parts] == [["u0", "u1"], ["u2", "u3"], ["u4"]]
    assert parts[2]["input_ids"].tolist() == [[40, 41, 42]]
    for p in parts:
        assert_consistent(p)
    with pytest.raises(ValueError, match="positive"):
        make_batch().split(0)


def test_chunk_equal_parts():
    parts = make_batch(rows=6).chunk(3)
    assert [uids(p) for p in parts] == [["u0", "u1"], ["u2", "u3"], ["u4", "u5"]]
    assert parts[1]["scores"].tolist() == [2.0, 3.0]
    with pytest.raises(ValueError, match="cannot cut 6 rows into 4 equal chunks"):
        make_batch(rows=6).chunk(4)


def test_repeat_interleave_order():
    b = make_batch(rows=2).repeat_interleave(2)
    assert uids(b) == ["u0", "u0", "u1", "u1"]
    assert b["scores"].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert b["input_ids"][:, 0].tolist() == [0, 0, 10, 10]
    assert b["extra"] == [{"i": 0}, {"i": 0}, {"i": 1}, {"i": 1}]
    assert len(make_batch(rows=3).repeat_interleave(3)) == 9


def test_iter_rows():
    rows = list(make_batch(rows=2).iter_rows())
    assert len(rows) == 2
    assert rows[1]["uid"] == "u1"
    assert rows[1]["input_ids"].tolist() == [10, 11, 12]
    assert rows[1]["scores"].item() == 1.0
    assert rows[1]["extra"] == {"i": 1}


def test_concat_right_pads_different_widths():
    a = Batch({"input_ids": torch.tensor([[1, 2]]), "mask": torch.tensor([[1, 1]]), "uid": ["a"]})
    b = Batch(
        {
            "input_ids": torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]]),
            "mask": torch.ones(2, 4, dtype=torch.long),
            "uid": ["b", "c"],
        }
    )
    out = Batch.concat([a, b], pad_values={"input_ids": 99})
    assert out["input_ids"].tolist() == [[1, 2, 99, 99], [3, 4, 5, 6], [7, 8, 9, 10]]
    assert out["mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]  # default pad value 0
    assert out["uid"] == ["a", "b", "c"]


def test_concat_keeps_order_meta_and_1d_columns():
    parts = make_batch(rows=5).split(2)
    out = Batch.concat(parts)
    assert uids(out) == ["u0", "u1", "u2", "u3", "u4"]
    assert out["scores"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert out.meta == {"temperature": 0.7}
    assert_consistent(out)


def test_concat_skips_empty_and_rejects_different_columns():
    assert len(Batch.concat([])) == 0
    b = make_batch(rows=2)
    assert uids(Batch.concat([Batch(), b])) == ["u0", "u1"]
    with pytest.raises(ValueError, match="cannot concatenate"):
        Batch.concat([b, Batch({"uid": ["x"]})])


def test_concat_float_pad_value():
    a = Batch({"logp": torch.tensor([[-1.0]])})
    b = Batch({"logp": torch.tensor([[-2.0, -3.0]])})
    out = Batch.concat([a, b], pad_values={"logp": -0.5})
    assert out["logp"].tolist() == [[-1.0, -0.5], [-2.0, -3.0]]


def test_pad_to_pads_only_token_level_tensors():
    b = make_batch(rows=2, width=2)
    out = b.pad_to(4, pad_values={"input_ids": 7})
    assert out["input_ids"].tolist() == [[0, 1, 7, 7], [10, 11, 7, 7]]
    assert out["scores"].tolist() == [0.0, 1.0]  # 1-D: unchanged
    assert out["uid"] == ["u0", "u1"]
    assert b["input_ids"].shape == (2, 2)  # the original is unchanged
    assert out.pad_to(3)["input_ids"].shape == (2, 4)  # never narrows


def test_trimmed_cuts_the_last_columns_no_row_attends_from_token_level_tensors():
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 0]])
    b = Batch(
        {
            "input_ids": torch.arange(10).view(2, 5),
            "attention_mask": mask,
            "pair": torch.ones(2, 2, 5),  # [B, 2, T]: cut too
            "other": torch.ones(2, 3),  # not token-level (another width): kept whole
            "scores": torch.tensor([0.5, 1.0]),
            "uid": ["a", "b"],
        }
    )
    out = b.trimmed()
    assert out["input_ids"].tolist() == [
        [0, 1, 2, 3],
        [5, 6, 7, 8],
    ]  # the first column is kept (row 0 has it)
    assert out["attention_mask"].shape == (2, 4) and out["pair"].shape == (2, 2, 4)
    assert (
        out["other"].shape == (2, 3) and out["uid"] == ["a", "b"] and torch.equal(out["scores"], b["scores"])
    )
    assert b["input_ids"].shape == (2, 5)  # the original is unchanged
    assert out.trimmed() is out  # nothing left to cut
    assert Batch({"scores": torch.ones(2)}).trimmed()["scores"].shape == (2,)


def test_pad_right_3d_and_same_width():
    t = torch.ones(2, 3, 2)
    assert pad_right(t, 4, -1).shape == (2, 3, 4)
    assert pad_right(t, 4, -1)[0, 0].tolist() == [1.0, 1.0, -1.0, -1.0]
    a, b = pad_to_same_width([torch.zeros(1, 2), torch.zeros(1, 5)], 3)
    assert a.tolist() == [[0.0, 0.0, 3.0, 3.0, 3.0]]
    assert b.shape == (1, 5)


def test_list_columns_follow_tensor_columns_through_every_op():
    b = make_batch(rows=6)
    b = b.select([5, 0, 3, 2, 1, 4])
    b = b.repeat_interleave(2)
    parts = b.split(5)
    b = Batch.concat([parts[2], parts[0], parts[1]])
    b = b.select(torch.tensor([i % 3 != 0 for i in range(len(b))]))
    b = b.pad_to(6)
    assert len(b) == 8
    assert_consistent(b)
    assert uids(b) == ["u4", "u5", "u0", "u0", "u3", "u2", "u1", "u1"]


def test_batch_pickles():
    b = make_batch()
    back = pickle.loads(pickle.dumps(b))
    assert back.keys() == b.keys()
    assert torch.equal(back["input_ids"], b["input_ids"])
    assert back["extra"] == b["extra"]
    assert back.meta == b.meta


def test_to_moves_tensors_only():
    b = make_batch().to("cpu")
    assert b["input_ids"].device.type == "cpu"
    assert b["uid"] == ["u0", "u1", "u2", "u3"]
