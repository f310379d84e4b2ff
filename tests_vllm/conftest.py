"""The vLLM lane (`make test-vllm`): vLLM's CPU build with tiny models built offline.

vLLM's engine core runs in the test process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, which the engine
sets itself), with a small KV cache.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# helpers shared with the main suite (tests/helpers/visual_agent.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))


@pytest.fixture(scope="session", autouse=True)
def rlstack_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("rlstack_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLSTACK_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 with head size 32 (the smallest vLLM's CPU attention takes)."""
    from rlstack.models.loading import write_model_dir

    return write_model_dir(
        tmp_path_factory.mktemp("models") / "tiny", hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1
    )
