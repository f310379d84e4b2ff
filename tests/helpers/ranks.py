"""Run a function on several ranks of a gloo process group (processes forked from a server that imported
torch once), for the tests of data-parallel training. Each rank's result comes back through a file."""

from __future__ import annotations

import multiprocessing
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

# The ranks fork from one server process that imported torch, transformers and rlstack once: a spawned
# rank would import them again, seconds per rank on a small CPU.
PRELOAD = [
    "torch",
    "torch.distributed",
    "transformers",
    "rlstack.workers.distributed",
    "rlstack.workers.policy",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple, out: Path, env: dict, cwd: str
) -> None:
    import torch.distributed as dist

    # the caller's environment and directory now, not the server's at its start (what torch, transformers
    # and rlstack read when the server imported them stays as it was then)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)

    from rlstack.workers import distributed

    torch.set_num_threads(1)
    distributed.init_process_group(rank, world, "127.0.0.1", port, "cpu")
    try:
        torch.save(fn(*args), out / f"rank{rank}.pt")
        dist.barrier()  # no rank tears the group down while another still talks to it
        (out / f"rank{rank}.done").touch()  # every rank's collectives are over
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, fn: Callable[..., Any], *args: Any, tmp: Path) -> list[Any]:
    """`fn(*args)` on each of `world` ranks (gloo, CPU); their results, by rank. `fn` must be importable.

    A rank that aborts after every rank passed the final barrier (seen once here: gloo's threads
    at teardown, "terminate called without an active exception") has done all its work: its result
    stands. An abort any earlier fails the call."""
    tmp.mkdir(parents=True, exist_ok=True)
    multiprocessing.set_forkserver_preload(PRELOAD)  # read when the server starts: the first call
    try:
        mp.start_processes(
            _rank_main,
            args=(world, free_port(), fn, args, tmp, dict(os.environ), os.getcwd()),
            nprocs=world,
            start_method="forkserver",
        )
    except mp.ProcessExitedException:
        if not all((tmp / f"rank{r}.done").exists() for r in range(world)):
            raise
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(world)]
