"""Typed worker handles: every remote method declares its dispatch once, both backends read that
declaration, an undeclared or misspelled method is refused, only the declared columns cross the border,
and every call the driver's modules make resolves to a declared method."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from rlstack.batch import Batch
from rlstack.workers.critic import CriticWorker
from rlstack.workers.group import (
    Dispatch,
    LocalWorkerGroup,
    NotRemote,
    declaration,
    handle,
    invoke,
    remote,
)
from rlstack.workers.policy import PolicyWorker, RefWorker
from rlstack.workers.rollout import RolloutWorker

ROOT = Path(__file__).resolve().parents[2] / "rlstack"


class Recorder:
    """A worker whose calls record what they were given."""

    def __init__(self):
        self.seen: list[list[str]] = []

    @remote(Dispatch.ROWS, reads=("input_ids", "response_mask"))
    def double(self, batch: Batch) -> Batch:
        self.seen.append(sorted(batch.keys()))
        return batch.update({"doubled": batch["input_ids"] * 2})

    @remote(Dispatch.EACH)
    def hello(self, name: str) -> str:
        return f"hello {name}"

    def helper(self) -> str:  # not declared: the driver cannot call it
        return "internal"


def test_a_method_without_a_declaration_cannot_be_called_remotely():
    group = LocalWorkerGroup(Recorder())
    with pytest.raises(
        NotRemote, match=r"Recorder does not declare the remote method 'helper'.*double, hello"
    ):
        group.call("helper")
    with pytest.raises(NotRemote, match="Recorder has no method 'halo'"):
        group.call("halo")
    typed = handle(group, Recorder)
    with pytest.raises(NotRemote, match="'helper'"):
        typed.helper()  # refused when asked for, before anything runs
    with pytest.raises(NotRemote):
        invoke(Recorder(), "helper", (), {})  # and on the worker's side (what a Ray rank runs)


def test_the_ray_group_reads_the_same_declaration():
    pytest.importorskip("ray")
    from rlstack.workers.ray_group import RayRoleGroup

    group = RayRoleGroup(None, "actor", Recorder, hosts=[])  # refused before any actor is reached
    with pytest.raises(NotRemote, match="'helper'"):
        group.call("helper")
    with pytest.raises(NotRemote, match="named_weights"):
        RayRoleGroup(None, "actor", PolicyWorker, hosts=[]).call("named_weights")


def test_only_the_declared_columns_cross_and_added_columns_come_back():
    worker = Recorder()
    typed = handle(LocalWorkerGroup(worker), Recorder)
    batch = Batch(
        {
            "input_ids": torch.tensor([[1, 2], [3, 4]]),
            "response_mask": torch.ones(2, 2),
            "images": [["a big image"], ["another"]],
            "response_text": ["x", "y"],
        }
    )
    out = typed.double(batch)
    assert worker.seen == [["input_ids", "response_mask"]]  # no images, no texts
    assert out is batch and batch["doubled"].tolist() == [[2, 4], [6, 8]]
    assert batch["images"] == [["a big image"], ["another"]]  # the driver's own columns stay
    assert typed.hello("you") == ["hello you"]  # EACH: one result per rank


def test_handles_check_the_worker_class():
    with pytest.raises(TypeError, match="Recorder, not PolicyWorker"):
        handle(LocalWorkerGroup(Recorder()), PolicyWorker)


def test_every_remote_method_of_the_workers_declares_its_dispatch():
    called = {
        PolicyWorker: [
            "compute_logprobs",
            "compute_ref_logprobs",
            "compute_masked_image_logprobs",
            "update",
            "probe_logprobs",
            "gathered_weights",
            "save_model",
            "save_checkpoint",
            "load_checkpoint",
        ],
        RefWorker: ["compute_ref_logprobs"],
        CriticWorker: ["compute_values", "update", "save_checkpoint", "load_checkpoint"],
        RolloutWorker: [
            "capabilities",
            "generate",
            "generate_greedy",
            "update_weights",
            "sync_weights",
            "probe_logprobs",
            "save_checkpoint",
            "load_checkpoint",
        ],
    }
    for cls, methods in called.items():
        for m in methods:
            declaration(cls, m)
    assert declaration(PolicyWorker, "update").dispatch is Dispatch.MINI_BATCHES
    assert "images" not in declaration(PolicyWorker, "compute_logprobs").reads
    assert declaration(PolicyWorker, "gathered_weights").stays_remote
    assert declaration(RolloutWorker, "generate").reads is None  # prompts: every column


# The driver's modules and, in each, the expressions that are worker handles, with their classes.
HANDLES = {
    "trainer.py": {
        "self.policy": [PolicyWorker],
        "self.rollout": [RolloutWorker],
        "self.ref": [PolicyWorker, RefWorker],
        "self.critic": [CriticWorker],
    },
    "collection.py": {"self.rollout_workers": [RolloutWorker]},
    "weight_sync.py": {
        "self.policy": [PolicyWorker],
        "self.rollout": [RolloutWorker],
        "policy": [PolicyWorker],
        "rollout": [RolloutWorker],
    },
    "validation.py": {"rollout": [RolloutWorker]},
    "sft.py": {"self.policy": [PolicyWorker], "self.rollout": [RolloutWorker]},
    "evaluate.py": {"self.policy": [PolicyWorker], "self.rollout": [RolloutWorker]},
}


def handle_calls(source: str, handles: dict[str, list[type]]) -> list[tuple[int, str, str, str | None]]:
    """(line, handle, method, problem or None) of every method call on a handle in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if owner in handles:
                problem = None
                for cls in handles[owner]:
                    try:
                        declaration(cls, node.func.attr)
                    except NotRemote as e:
                        problem = str(e)
                found.append((node.lineno, owner, node.func.attr, problem))
    return found


def test_every_call_the_driver_makes_on_a_worker_is_a_declared_remote_method():
    calls = []
    for name, handles in HANDLES.items():
        source = (ROOT / name).read_text()
        assert '.call("' not in source, f"{name} calls a worker method by its name"
        calls += [(name, *c) for c in handle_calls(source, handles)]
    problems = [c for c in calls if c[-1] is not None]
    assert not problems, problems
    methods = {c[3] for c in calls}
    assert {
        "compute_logprobs",
        "update",
        "generate",
        "probe_logprobs",
        "sync_weights",
        "save_checkpoint",
    } <= methods
    # the walker itself sees a misspelling
    [(_, _, _, problem)] = handle_calls("self.policy.compute_logprob(batch)", HANDLES["trainer.py"])
    assert "has no method 'compute_logprob'" in problem
