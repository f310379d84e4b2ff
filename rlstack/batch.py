"""The Batch: equally long columns, one row per trajectory.

A column is either a tensor whose first dimension is the row, or a plain Python list (ground
truth, images, dicts). Rows sampled from the same prompt share a `uid`. Token-level tensors are
`[B, T]` and aligned with `input_ids`: `old_logprobs[b, t]` is the log-probability of
`input_ids[b, t]` given the tokens before it. Batches with different `T` are right-padded with
`pad_values` (default 0) when concatenated.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Column = torch.Tensor | list


@dataclass(frozen=True)
class ColumnSpec:
    """One column of the batches a run passes between its parts."""

    form: str
    """Its shape and type: `[B, T] int64` (token-level, aligned with `input_ids`), `[B] float32`, `list[str]`."""
    written_by: str
    """The part that adds it."""
    read_by: tuple[str, ...] = ()
    """The worker calls that are sent it (`model`: every forward pass over trajectories; `update`: the policy
    update; `critic`: the critic's update; `reward`: scoring, the columns a remote reward worker is sent).
    Columns read only where the batch already is (the driver) name no call."""
    doc: str = ""


COLUMNS: dict[str, ColumnSpec] = {
    # what a forward pass over trajectories reads (token rows and, for vision models, each row's patches)
    "input_ids": ColumnSpec(
        "[B, T] int64", "rollout", ("model",), "prompt left-padded, response right-padded"
    ),
    "attention_mask": ColumnSpec("[B, T] int64", "rollout", ("model",), "1 on every real token"),
    "response_mask": ColumnSpec(
        "[B, T] int64", "rollout", ("model", "reward"), "1 on sampled response tokens (not tool replies)"
    ),
    "pixel_values": ColumnSpec("list[tensor]", "data, rollout", ("model",), "each row's image patches"),
    "image_grid_thw": ColumnSpec(
        "list[tensor]", "data, rollout", ("model",), "each row's images' patch grids"
    ),
    "position_ids": ColumnSpec("[B, T] int64", "sft data", (), "the supervised rows' positions"),
    # the prompts (data)
    "uid": ColumnSpec("list[str]", "data", (), "one per prompt: its samples share it (GRPO's groups)"),
    "prompt": ColumnSpec("list[str]", "data", ("reward",), "the prompt's text"),
    "prompt_ids": ColumnSpec("list[list[int]]", "data", (), "the prompt's tokens"),
    "prompt_messages": ColumnSpec(
        "list[list[dict]]", "data", ("reward",), "the chat messages, where the data had them"
    ),
    "ground_truth": ColumnSpec("list", "data", ("reward",), "the answer the reward checks against"),
    "data_source": ColumnSpec(
        "list[str]", "data", ("reward",), "the row's source (reward routing, per-source metrics)"
    ),
    "extra": ColumnSpec("list[dict]", "data", ("reward",), "the row's other fields (tests, metadata)"),
    "where": ColumnSpec("list[str]", "data", ("reward",), "file and line of the row, for error messages"),
    "images": ColumnSpec("list[list[Image]]", "data", ("reward",), "the prompt's pictures"),
    "sample_seed": ColumnSpec(
        "[B] int64", "collection", (), "the prompt's sampling seed (seed, round, place)"
    ),
    # what the rollout adds
    "rollout_logprobs": ColumnSpec(
        "[B, T] float32", "rollout", ("update",), "the engine's log-probs of its samples"
    ),
    "truncated": ColumnSpec("[B] bool", "rollout", (), "stopped by the length limit"),
    "weight_version": ColumnSpec("[B] int64", "rollout worker", (), "the weights' version a row began under"),
    "weight_version_last": ColumnSpec(
        "[B] int64", "rollout", (), "the version of its last token (in-flight updates)"
    ),
    "end_reason": ColumnSpec(
        "list[str]", "agent loop", (), "done, max_turns, over_length, tool_error, max_images"
    ),
    "response_text": ColumnSpec("list[str]", "agent loop", ("reward",), "the response decoded"),
    "num_turns": ColumnSpec("[B] int64", "agent loop", (), "assistant turns"),
    "tool_calls": ColumnSpec("[B] int64", "agent loop", ("reward",), "tool calls made"),
    "tool_errors": ColumnSpec("[B] int64", "agent loop", ("reward",), "calls whose reply was an error"),
    "num_images": ColumnSpec("[B] int64", "agent loop", (), "images the tools returned"),
    "turns": ColumnSpec("list[list[dict]]", "agent loop", ("reward",), "each turn's text, call and reply"),
    "tool_images": ColumnSpec(
        "list[list[Image]]", "agent loop", ("reward",), "the images the tools returned"
    ),
    "feedback_turns": ColumnSpec("[B] int64", "agent loop", (), "turns a feedback message followed"),
    # scoring
    "scores": ColumnSpec("[B] float32", "reward", (), "the reward (`overall`)"),
    "reward_components": ColumnSpec("list[dict]", "reward", (), "every number the reward function returned"),
    "reward_info": ColumnSpec("list[dict]", "reward", (), "its non-numbers (reasons, errors)"),
    "baseline_scores": ColumnSpec(
        "[B] float32", "collection", (), "the base model's score of the prompt (VPPO)"
    ),
    # the policy's, the reference's and the critic's passes, and the algorithm between them
    "old_logprobs": ColumnSpec(
        "[B, T] float32", "policy", ("update",), "the policy's log-probs before the update"
    ),
    "entropy": ColumnSpec("[B, T] float32", "policy", (), "the policy's entropies in the same pass"),
    "ref_logprobs": ColumnSpec("[B, T] float32", "reference", ("update",), "the reference model's log-probs"),
    "masked_logprobs": ColumnSpec("[B, T] float32", "policy", (), "log-probs with the images masked (VPPO)"),
    "visual_dependency": ColumnSpec(
        "[B, T] float32", "driver", (), "per-token dependency on the images (VPPO)"
    ),
    "perception_mask": ColumnSpec("[B, T] bool", "driver", ("update",), "the tokens VPPO's loss keeps"),
    "values": ColumnSpec("[B, T] float32", "critic", ("critic",), "the critic's values"),
    "returns": ColumnSpec("[B, T] float32", "driver", ("critic",), "GAE's returns"),
    "advantages": ColumnSpec("[B, T] float32", "driver", ("update",), "the advantage of each response token"),
}
"""Every column a run's batches hold, in the order a step adds them. `columns_read_by` derives the lists
the worker calls declare from it; the tests record every column the code sets and check it is here."""


def columns_read_by(call: str) -> tuple[str, ...]:
    """The columns `call` (`model`, `update`, `critic`, `reward`) is sent, in `COLUMNS`' order."""
    return tuple(name for name, spec in COLUMNS.items() if call in spec.read_by)


class Batch:
    """Columns of equal length; see the module docstring for the layout."""

    def __init__(self, columns: dict[str, Column] | None = None, meta: dict[str, Any] | None = None):
        self.columns: dict[str, Column] = {}
        self.meta: dict[str, Any] = dict(meta or {})
        """Batch-wide values (not per row), e.g. `temperature` or the step."""
        for name, col in (columns or {}).items():
            self[name] = col

    # ------------------------------------------------------------------------------- columns

    def __len__(self) -> int:
        for col in self.columns.values():
            return len(col)
        return 0

    def __contains__(self, name: str) -> bool:
        return name in self.columns

    def __getitem__(self, name: str) -> Column:
        if name not in self.columns:
            raise KeyError(f"Batch has no column {name!r}; columns: {sorted(self.columns)}")
        return self.columns[name]

    def __setitem__(self, name: str, col: Column) -> None:
        if not isinstance(col, (torch.Tensor, list)):
            raise TypeError(f"column {name!r} must be a tensor or a list, got {type(col).__name__}")
        if self.columns and len(col) != len(self):
            raise ValueError(f"column {name!r} has {len(col)} rows, the batch has {len(self)}")
        self.columns[name] = col

    def get(self, name: str, default: Any = None) -> Any:
        return self.columns.get(name, default)

    def keys(self) -> list[str]:
        return list(self.columns)

    def update(self, other: dict[str, Column]) -> Batch:
        for name, col in other.items():
            self[name] = col
        return self

    def __repr__(self) -> str:
        cols = ", ".join(
            f"{k}: {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}"
            if isinstance(v, torch.Tensor)
            else f"{k}: list"
            for k, v in self.columns.items()
        )
        return f"Batch(rows={len(self)}, {cols})"

    # ------------------------------------------------------------------------------ row ops

    def select(self, index: Sequence[int] | torch.Tensor | slice) -> Batch:
        """The rows at `index` (list of ints, bool or long tensor, or slice), in that order."""
        if isinstance(index, slice):
            idx = list(range(len(self)))[index]
        elif isinstance(index, torch.Tensor):
            if index.dtype == torch.bool and len(index) != len(self):
                raise IndexError(f"boolean mask has {len(index)} entries, the batch has {len(self)} rows")
            idx = index.nonzero().flatten().tolist() if index.dtype == torch.bool else index.tolist()
        else:
            idx = list(index)
        t_idx = torch.tensor(idx, dtype=torch.long)
        cols: dict[str, Column] = {}
        for k, v in self.columns.items():
            cols[k] = (
                v.index_select(0, t_idx.to(v.device)) if isinstance(v, torch.Tensor) else [v[i] for i in idx]
            )
        return Batch(cols, self.meta)

    def split(self, size: int) -> list[Batch]:
        """Consecutive chunks of `size` rows (the last may be shorter)."""
        if size < 1:
            raise ValueError(f"split size must be positive, got {size}")
        return [self.select(slice(i, i + size)) for i in range(0, len(self), size)]

    def chunk(self, n: int) -> list[Batch]:
        """`n` consecutive chunks of equal size (the rows must divide evenly)."""
        if len(self) % n:
            raise ValueError(f"cannot cut {len(self)} rows into {n} equal chunks")
        return self.split(len(self) // n)

    def repeat_interleave(self, n: int) -> Batch:
        """Each row repeated `n` times in place: rows a, b -> a, a, b, b (for n = 2)."""
        idx = [i for i in range(len(self)) for _ in range(n)]
        return self.select(idx)

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield {k: v[i] for k, v in self.columns.items()}

    @staticmethod
    def concat(batches: Sequence[Batch], pad_values: dict[str, float | int] | None = None) -> Batch:
        """Rows of all batches, in order; token tensors of different width are right-padded."""
        batches = [b for b in batches if len(b)]
        if not batches:
            return Batch()
        names = batches[0].keys()
        for b in batches[1:]:
            if set(b.keys()) != set(names):
                raise ValueError(
                    f"cannot concatenate batches with columns {sorted(names)} and {sorted(b.keys())}"
                )
        cols: dict[str, Column] = {}
        for k in names:
            parts = [b[k] for b in batches]
            if isinstance(parts[0], torch.Tensor):
                value = (pad_values or {}).get(k, 0)
                cols[k] = torch.cat(pad_to_same_width(parts, value), dim=0)
            else:
                cols[k] = [x for p in parts for x in p]
        return Batch(cols, batches[0].meta)

    def pad_to(self, width: int, pad_values: dict[str, float | int] | None = None) -> Batch:
        """Right-pad every token-level (2-D or more) tensor to `width` columns."""
        out = Batch(dict(self.columns), self.meta)
        for k, v in self.columns.items():
            if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[-1] < width:
                out.columns[k] = pad_right(v, width, (pad_values or {}).get(k, 0))
        return out

    def trimmed(self) -> Batch:
        """The batch without its last columns where no row has a token (`attention_mask` 0 in every row),
        cut from every token-level (2-D or more) tensor: a micro-batch of short rows cut from a batch whose
        longest row is elsewhere computes only its own columns. The same batch where nothing is cut."""
        mask = self.get("attention_mask")
        if mask is None or mask.dim() != 2:
            return self
        width = mask.shape[-1]
        used = mask.any(0).nonzero()
        end = int(used[-1]) + 1 if len(used) else width
        if end == width:
            return self
        cols = {
            k: v[..., :end] if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[-1] == width else v
            for k, v in self.columns.items()
        }
        return Batch(cols, self.meta)

    def to(self, device: torch.device | str) -> Batch:
        cols = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.columns.items()}
        return Batch(cols, self.meta)


def pad_right(t: torch.Tensor, width: int, value: float | int = 0) -> torch.Tensor:
    """Right-pad the last dimension of `t` to `width`."""
    if t.shape[-1] >= width:
        return t
    pad = t.new_full((*t.shape[:-1], width - t.shape[-1]), value)
    return torch.cat([t, pad], dim=-1)


def pad_to_same_width(tensors: Sequence[torch.Tensor], value: float | int = 0) -> list[torch.Tensor]:
    if tensors[0].dim() < 2:
        return list(tensors)
    width = max(t.shape[-1] for t in tensors)
    return [pad_right(t, width, value) for t in tensors]


def token_budget_groups(lengths: Sequence[int], budget: int, min_groups: int = 1) -> list[list[int]]:
    """Row indices in groups whose `lengths` add up to at most `budget` each; every row is in one
    group. Rows are placed longest first into the first group with room (first-fit
    decreasing, so the groups are few and full); each group keeps its rows in their batch order.
    With fewer than `min_groups` groups, the group with the most tokens is cut in two until there
    are `min_groups` (several ranks must run the same number of passes)."""
    if budget < 1:
        raise ValueError(f"token budget must be positive, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = lengths[i]
        if n > budget:
            raise ValueError(f"row {i} has {n} tokens, more than the budget of {budget} per micro-batch")
        g = next((g for g, r in enumerate(room) if r >= n), None)
        if g is None:
            groups.append([])
            room.append(budget)
            g = len(groups) - 1
        groups[g].append(i)
        room[g] -= n
    groups = [sorted(g) for g in groups]
    while len(groups) < min_groups:
        big = max((g for g in groups if len(g) > 1), key=lambda g: sum(lengths[i] for i in g), default=None)
        if big is None:
            raise ValueError(f"cannot cut {len(lengths)} rows into {min_groups} micro-batches")
        groups.remove(big)
        groups += [big[: len(big) // 2], big[len(big) // 2 :]]
    return sorted(groups, key=lambda g: g[0])
