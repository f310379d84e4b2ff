"""GGUF checkpoints as `worker.actor.model.model_path`: converted once into a cached Hugging Face directory
that plain `from_pretrained` loads, checked at config load, clear errors, and a short training run."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from gguf_writer import CHAT_TEMPLATE, write_tiny_gguf
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from rlstack.config import ConfigError, ModelConfig, load_config
from rlstack.errors import RLStackError
from rlstack.models.gguf import SOURCE_FILE, GGUFError
from rlstack.models.loading import model_dir, resolve_model_path

# A fixed input over the whole vocabulary: plain bytes, merged tokens and the three special tokens.
INPUT_IDS = torch.tensor(
    [[265, 117, 115, 101, 114, 10, 116, 257, 261, 263, 32, 49, 43, 51, 266, 10, 264, 200, 3]]
)
# Q8_0 keeps 8 bits per weight (one scale per 32): on this model's logits (std ~1.2) the largest
# difference from the float source measured 0.13-0.26 over seeds 0-2; the converted model matches the
# Q8_0 round trip of the source (`q8_0_round_trip`) exactly (measured difference 0.0).
Q8_0_ATOL = 0.5


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test converts into its own RLSTACK_CACHE."""
    out = tmp_path / "rlstack_cache"
    monkeypatch.setenv("RLSTACK_CACHE", str(out))
    return out


def notes(text: str) -> list[str]:
    """The conversion's notes (not the run's progress lines)."""
    return [line for line in text.splitlines() if line.startswith("[rlstack]") and "gguf" in line]


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(INPUT_IDS).logits


def q8_0_round_trip(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """`model` with every weight matrix replaced by what Q8_0 blocks of it dequantize to (norms untouched).
    Blocks run along rows, so llama.cpp's row permutation of q/k does not change what a row rounds to."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for _, param in out.named_parameters():
            if param.ndim == 2:
                blocks = quantize(param.numpy(), GGMLQuantizationType.Q8_0)
                param.copy_(
                    torch.from_numpy(dequantize(blocks, GGMLQuantizationType.Q8_0).reshape(param.shape))
                )
    return out


@pytest.mark.parametrize("quantized", [True, False], ids=["q8_0", "f32"])
def test_gguf_file_converts_once_into_a_plain_hugging_face_directory(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture, quantized: bool
):
    file = tmp_path / "models" / "tiny.gguf"
    source = write_tiny_gguf(file, quantize=quantized)
    capsys.readouterr()

    out = Path(resolve_model_path(str(file)))
    assert out.parent == cache / "models" / "gguf" and out.name.startswith("tiny-")
    what = "Q8_0-quantized weights dequantized" if quantized else "weights converted"
    err = capsys.readouterr().err
    assert notes(err) == [f"[rlstack] tiny.gguf: {what} to float32 safetensors in {out} (once; reused)"]
    assert "Converting" not in err and "Writing" not in err  # one line, no progress bars

    # an ordinary directory: float32 safetensors, a config with no trace of the GGUF quantization
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.float32}
    source_info = json.loads((out / SOURCE_FILE).read_text())
    assert source_info["gguf_file"] == str(file.resolve())
    assert source_info["weight_types"] == ({"Q8_0": 15, "F32": 5} if quantized else {"F32": 20})

    model = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(model, LlamaForCausalLM)
    assert getattr(model.config, "quantization_config", None) is None
    got = logits(model)
    if quantized:
        assert torch.allclose(got, logits(q8_0_round_trip(source)), atol=1e-5)
        diff = (got - logits(source)).abs().max().item()
        assert 1e-3 < diff < Q8_0_ATOL  # really quantized, and close to the float model
    else:
        assert torch.allclose(got, logits(source), atol=1e-5)

    tok = AutoTokenizer.from_pretrained(out)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.chat_template == CHAT_TEMPLATE
    text = tok.apply_chat_template(
        [{"role": "user", "content": "the sum"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nthe sum<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and tok.decode(ids) == text

    # the second time: the same directory, no note, no conversion
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(str(file)) == str(out)
    assert notes(capsys.readouterr().err) == []
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp

    # a new file at the same path is a new model: converted again, not served from the old copy
    other = write_tiny_gguf(file, quantize=quantized, seed=1)
    again = Path(resolve_model_path(str(file)))
    assert again != out and len(notes(capsys.readouterr().err)) == 1
    assert not out.exists()  # the copy of the file as it was is gone, not left to fill the cache
    expected = q8_0_round_trip(other) if quantized else other
    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(again)), logits(expected), atol=1e-5)


def test_folder_and_gguf_file_give_the_same_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    folder = tmp_path / "models"
    write_tiny_gguf(folder / "tiny-Q8_0.gguf")
    by_folder = resolve_model_path(str(folder), gguf_file="tiny-Q8_0.gguf")
    assert len(notes(capsys.readouterr().err)) == 1
    assert Path(by_folder, "config.json").is_file()

    assert resolve_model_path(str(folder / "tiny-Q8_0.gguf")) == by_folder
    assert model_dir(ModelConfig(model_path=str(folder), gguf_file="tiny-Q8_0.gguf")) == by_folder
    assert model_dir(ModelConfig(model_path=str(folder / "tiny-Q8_0.gguf"))) == by_folder
    monkeypatch.chdir(folder)
    assert resolve_model_path("tiny-Q8_0.gguf") == by_folder
    assert resolve_model_path(".", gguf_file="tiny-Q8_0.gguf") == by_folder
    assert notes(capsys.readouterr().err) == []  # converted once for all of them

    # the folder's Hugging Face files, if any, are not what a gguf_file setting loads
    assert model_dir(ModelConfig(model_path=str(folder))) == str(folder)


def test_config_load_reports_a_missing_gguf_file(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        load_config(["worker.actor.model.model_path=/nonexistent/x.gguf"])
    assert any(
        p.startswith("worker.actor.model.model_path") and "/nonexistent/x.gguf" in p
        for p in info.value.problems
    )

    folder = tmp_path / "models"
    write_tiny_gguf(folder / "tiny.gguf")
    with pytest.raises(ConfigError) as info:
        load_config([f"worker.actor.model.model_path={folder}", "worker.actor.model.gguf_file=missing.gguf"])
    [problem] = info.value.problems
    assert problem.startswith("worker.actor.model.gguf_file") and str(folder / "missing.gguf") in problem

    # the files that are there pass, in both forms (and nothing is converted at config load)
    cfg = load_config([f"worker.actor.model.model_path={folder}", "worker.actor.model.gguf_file=tiny.gguf"])
    assert cfg.worker.actor.model.gguf_file == "tiny.gguf"
    cfg = load_config([f"worker.actor.model.model_path={folder / 'tiny.gguf'}"])
    assert cfg.worker.actor.model.model_path == str(folder / "tiny.gguf")


def test_corrupt_gguf_is_a_clear_error(tmp_path: Path, cache: Path):
    bad = tmp_path / "broken-model.gguf"
    bad.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(GGUFError) as info:
        resolve_model_path(str(bad))
    assert isinstance(info.value, RLStackError)
    assert "broken-model.gguf" in str(info.value)
    # nothing half-written is left where the next try would take it for a converted model
    assert not list((cache / "models" / "gguf").glob("*/config.json"))


def test_truncated_gguf_is_a_clear_error(tmp_path: Path):
    whole = tmp_path / "whole.gguf"
    write_tiny_gguf(whole)
    cut = tmp_path / "cut-off.gguf"
    cut.write_bytes(whole.read_bytes()[:200])  # ends inside the metadata (the token list)
    with pytest.raises(GGUFError, match="cut-off.gguf.*is the file whole"):
        resolve_model_path(str(cut))


def test_one_step_grpo_run_on_a_gguf_saves_a_plain_hugging_face_model(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture
):
    from rlstack.trainer import Trainer

    folder = tmp_path / "models"  # the folder form: every worker must pass gguf_file along to find the model
    write_tiny_gguf(folder / "tiny.gguf")
    cfg = load_config(
        [
            f"worker.actor.model.model_path={folder}",
            "worker.actor.model.gguf_file=tiny.gguf",
            f"trainer.output_dir={tmp_path / 'out'}",
            "trainer.experiment_name=gguf",
            "data.train_files=builtin:addition@train",
            "data.val_files=",
            "data.rollout_batch_size=2",
            "data.max_response_length=4",
            "worker.rollout.n=2",
            "worker.actor.global_batch_size=2",
            "worker.actor.micro_batch_size_per_device_for_update=4",
            "worker.reward.reward_function=builtin:exact_match",
            "trainer.max_steps=1",
            "trainer.save_freq=-1",
            "trainer.logger=[file]",
            "trainer.num_threads=1",
        ]
    )
    metrics = Trainer(cfg).fit()
    assert "actor/pg_loss" in metrics
    [converted] = (cache / "models" / "gguf").glob("tiny-*/config.json")
    assert len(notes(capsys.readouterr().err)) == 1  # policy, reference and rollout share one conversion

    saved = cfg.run_dir / "huggingface"
    assert not list(saved.glob("*.gguf"))
    assert "quantization_config" not in json.loads((saved / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(saved)
    tok = AutoTokenizer.from_pretrained(saved)
    assert isinstance(model, LlamaForCausalLM) and model.config.num_hidden_layers == 2
    assert len(tok) == model.config.vocab_size
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "1+2"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
