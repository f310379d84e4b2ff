"""The rollout worker builds its engine from `ENGINES`, which holds a builder for every engine
`worker.rollout.name` names; the vLLM builder hands vLLM the config's settings (vLLM itself is not needed)."""

from __future__ import annotations

import typing

from rlstack.config import load_config
from rlstack.config.rollout import RolloutConfig
from rlstack.workers.rollout import ENGINES, EngineInputs, vllm_engine


def test_every_engine_the_config_names_has_a_builder():
    names = set(typing.get_args(typing.get_type_hints(RolloutConfig)["name"])) - {"auto"}  # resolved at load
    assert sorted(ENGINES) == sorted(names)


def test_the_vllm_builder_passes_the_config_to_the_engine(monkeypatch, tmp_path):
    import rlstack.rollout.vllm as vllm_module

    monkeypatch.setattr(vllm_module, "VLLMEngine", lambda settings: settings)
    cfg = load_config(
        [
            "worker.rollout.name=vllm",
            "worker.rollout.seed=7",
            "worker.rollout.gpu_memory_utilization=0.3",
            "worker.rollout.max_num_batched_tokens=1024",
            "worker.rollout.enable_prefix_caching=false",
            "worker.rollout.agent.max_images=3",
            "worker.actor.model.dtype=float32",
        ],
        machine_checks="warn",  # vLLM is not installed here
    )
    settings = vllm_engine(
        EngineInputs(
            cfg.worker.rollout, cfg.worker.actor.model, str(tmp_path), None, True, "cpu", None, False
        )
    )
    assert settings == vllm_module.VLLMSettings(
        model_path=str(tmp_path),
        tokenizer_path=None,
        dtype="float32",
        seed=7,
        multimodal=True,
        max_model_len=80,  # data.max_prompt_length + data.max_response_length
        gpu_memory_utilization=0.3,
        tensor_parallel_size=1,
        enforce_eager=False,
        enable_prefix_caching=False,
        max_num_batched_tokens=1024,
        free_cache_engine=False,  # no sleep mode without CUDA
        trust_remote_code=False,
        image_limit=3,
    )
