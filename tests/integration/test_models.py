"""Model and tokenizer loading, `rlstack init-model`, and the errors for paths that are not models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlstack.cli import main
from rlstack.models.loading import ModelLoadError, load_causal_lm, load_tokenizer


def test_init_model_builds_a_loadable_model_of_the_requested_size(tmp_path: Path, capsys):
    out = tmp_path / "m"
    assert main(["init-model", str(out), "--hidden-size", "64", "--num-layers", "2", "--num-heads", "2"]) == 0
    assert "written to" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.model_type == "qwen2"
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (64, 2)
    tok = load_tokenizer(str(out))
    assert tok.padding_side == "left" and tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template(
        [{"role": "user", "content": "12+3="}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\n12+3=<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(" a b\n7", add_special_tokens=False)["input_ids"]
    assert len(ids) == 6 and tok.decode(ids) == " a b\n7"  # one token per character, round trip


def test_dtype_option(tiny_model_dir: Path):
    assert next(load_causal_lm(str(tiny_model_dir), "bfloat16").parameters()).dtype == torch.bfloat16


def test_a_folder_that_is_not_a_model_is_a_clear_error(tmp_path: Path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_causal_lm(str(tmp_path))
    with pytest.raises(ModelLoadError, match="init-model"):
        load_causal_lm(str(tmp_path / "missing"))


def test_train_with_a_folder_that_is_not_a_model_exits_with_a_message(tmp_path: Path, capsys):
    code = main(["train", f"worker.actor.model.model_path={tmp_path}", f"trainer.output_dir={tmp_path}/out"])
    err = capsys.readouterr().err
    assert code == 1 and "ModelLoadError" in err and "config.json" in err


def test_a_hub_name_loads_from_the_hub_cache_and_a_missing_one_is_a_clear_error(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch
):
    """`model_path: org/name` (EasyR1's and every seed recipe's form) resolves to the model's snapshot in the
    Hugging Face cache, downloading it where the Hub is reachable (offline here: a cache laid out as the Hub
    client writes it)."""
    import shutil

    import huggingface_hub.constants as hub

    from rlstack.models.loading import resolve_model_path

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--tiny-qwen2"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)

    assert resolve_model_path("acme/tiny-qwen2") == str(repo / "snapshots" / revision)
    assert (
        load_causal_lm("acme/tiny-qwen2").config.hidden_size
        == load_causal_lm(str(tiny_model_dir)).config.hidden_size
    )
    assert len(load_tokenizer("acme/tiny-qwen2")) == len(load_tokenizer(str(tiny_model_dir)))
    assert resolve_model_path(str(tiny_model_dir)) == str(tiny_model_dir)  # local paths pass through
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError) as info:  # a Hub name may also have been meant as a local folder
        load_causal_lm("acme/missing")
    assert str(info.value).startswith(
        f"'acme/missing' is not a local directory (no {tmp_path}/acme/missing under the working directory "
        f"{tmp_path}), and fetching it from the Hugging Face Hub failed: "
    )
    assert "huggingface-cli download acme/missing" in str(info.value)
    for local in ("./acme/missing", "hub/missing"):  # local paths, never fetched (hub/ exists here)
        with pytest.raises(ModelLoadError) as info:
            load_causal_lm(local)
        assert str(info.value).startswith(
            f"model path {local!r} does not exist ({tmp_path / local.removeprefix('./')}; relative paths start "
            f"at the working directory {tmp_path})"
        ), info.value


@pytest.mark.parametrize(("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_written_model_directories_get_the_modes_of_a_plain_open(
    tiny_model_dir: Path, tmp_path: Path, umask: int, file_mode: int, dir_mode: int
):
    """safetensors writes through 0600 temporary files and `mkdtemp` makes 0700 folders: every model
    directory rlstack writes (`init-model`, the final model, a checkpoint, `rlstack merge`) gets 0666/0777
    less the umask instead, so that another user (a server) can read it."""
    import os
    import stat

    from rlstack.checkpoint import save_atomically
    from rlstack.config import ActorConfig, AlgorithmConfig, ModelConfig
    from rlstack.merge import merge_checkpoint
    from rlstack.workers.policy import PolicyWorker

    def modes(root: Path) -> dict[str, int]:
        return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}

    def expected(root: Path) -> dict[str, int]:
        return {k: dir_mode if (root / k).is_dir() else file_mode for k in modes(root)}

    old = os.umask(umask)
    try:
        assert main(["init-model", str(tmp_path / "init"), "--hidden-size", "32", "--num-layers", "1"]) == 0
        worker = PolicyWorker(
            ActorConfig(model=ModelConfig(model_path=str(tiny_model_dir))), AlgorithmConfig(), 8, 1, seed=0
        )
        (tmp_path / "run").mkdir()
        worker.save_model(tmp_path / "run" / "huggingface")
        checkpoint = save_atomically(tmp_path / "run" / "checkpoints", 1, worker.save_checkpoint, keep=1)
        (checkpoint / "trainer_state.pt").write_bytes(b"")  # what merge looks for
        merge_checkpoint(checkpoint, tmp_path / "merged")
    finally:
        os.umask(old)
    for root in (tmp_path / "init", tmp_path / "run" / "huggingface", checkpoint, tmp_path / "merged"):
        assert (root / "model.safetensors").is_file() or (root / "model" / "model.safetensors").is_file()
        assert modes(root) == expected(root), root
