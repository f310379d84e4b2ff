"""The vLLM engine as the lane's tests build it."""

from __future__ import annotations

from pathlib import Path


def make_engine(model_dir: Path, multimodal: bool, max_model_len: int, image_limit: int = 1):
    """A float32 vLLM engine on the CPU, as the tests use it."""
    from rlstack.rollout.vllm import VLLMEngine, VLLMSettings

    return VLLMEngine(
        VLLMSettings(
            str(model_dir),
            None,
            "float32",
            0,
            multimodal=multimodal,
            max_model_len=max_model_len,
            gpu_memory_utilization=0.5,
            tensor_parallel_size=1,
            enforce_eager=True,
            enable_prefix_caching=True,
            max_num_batched_tokens=2048,
            free_cache_engine=False,
            image_limit=image_limit,
        )
    )
