"""Peak memory of this process since the last reading: the GPU's allocator (CUDA) and the resident set.

`peaks_since_last()` reads the peaks, in GiB, and starts a new stretch: `max_memory_allocated_gb` and
`max_memory_reserved_gb` when CUDA is in use, and always `max_rss_gb`, the process's peak resident
memory (Linux's `VmHWM`, reset through `/proc/self/clear_refs`; where that cannot be reset, as on
macOS, the peak counts from the start of the process).
"""

from __future__ import annotations

import contextlib
import resource
import sys
from pathlib import Path

import torch

GIB = 2**30


def peaks_since_last() -> dict[str, float]:
    peaks = {}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peaks["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / GIB
        peaks["max_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / GIB
        torch.cuda.reset_peak_memory_stats()
    peaks["max_rss_gb"] = _peak_rss_bytes() / GIB
    with contextlib.suppress(OSError):  # 5: the peak resident set becomes the current one
        Path("/proc/self/clear_refs").write_text("5")
    return peaks


def _peak_rss_bytes() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # since the process started
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, kB elsewhere


def device_memory_in_use() -> str:
    """`, with X of Y GiB in use on cuda:N` where a GPU is in use (for out-of-memory messages), else nothing."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return ""
    device = torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(device)
    return f", with {(total - free) / GIB:.1f} of {total / GIB:.1f} GiB in use on cuda:{device}"
