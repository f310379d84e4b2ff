"""Phase timers of the training step (`timing_s/<phase>`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def timer(timing: dict[str, float], name: str) -> Iterator[None]:
    """Adds the phase's wall time to `timing[name]`; on a GPU after the work it queued has run (else it
    would be counted in whichever phase waits for it next)."""
    gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
    if gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    yield
    if gpu:
        torch.cuda.synchronize()
    timing[name] += time.perf_counter() - start
