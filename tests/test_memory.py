"""Peak memory readings: a stretch's peak shows a buffer that was freed, and the next stretch starts over."""

from __future__ import annotations

import os

import pytest
import torch

from rlstack.workers.memory import peaks_since_last


@pytest.mark.skipif(
    not os.access("/proc/self/clear_refs", os.W_OK),
    reason="the peak resident set cannot be reset here (not Linux)",
)
def test_a_freed_buffer_shows_in_its_stretch_only():
    peaks_since_last()
    buffer = torch.ones(2**27)  # 512 MiB, touched
    buffer.add_(1)
    del buffer
    during = peaks_since_last()["max_rss_gb"]
    after = peaks_since_last()["max_rss_gb"]
    assert during - after > 0.4
