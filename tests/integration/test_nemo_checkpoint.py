"""NeMo RL checkpoints (`step_N/policy/weights`, a Torch distributed checkpoint) load as the model they hold:
written here the way NeMo RL's DTensor policy writes them (v1: the state dict under `model`; v2: flat, in
`weights/model/`), beside the run's `config.yaml` and `policy/tokenizer`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import yaml

from rlstack.config import load_config
from rlstack.models.loading import load_causal_lm, resolve_model_path
from rlstack.models.nemo_checkpoint import NemoCheckpointError


def write_nemo_checkpoint(step: Path, base: Path, layout: str) -> dict[str, torch.Tensor]:
    """A NeMo RL step directory of `base`'s model with its weights moved (as training would), in `layout`
    (v1 or v2); the weights it holds."""
    model = load_causal_lm(str(base))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    weights = step / "policy" / "weights"
    if layout == "v1":
        dcp.save({"model": state}, checkpoint_id=str(weights))
    else:
        dcp.save(state, checkpoint_id=str(weights / "model"))
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(base).save_pretrained(step / "policy" / "tokenizer")
    (step / "config.yaml").write_text(yaml.safe_dump({"policy": {"model_name": str(base)}}))
    return state


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_a_step_directory_or_its_weights_folder_loads_as_the_trained_model(tiny_model_dir, tmp_path, layout):
    step = tmp_path / "results" / "sft" / "step_10"
    state = write_nemo_checkpoint(step, tiny_model_dir, layout)
    for path in (step, step / "policy" / "weights"):
        model = load_causal_lm(resolve_model_path(str(path)))
        loaded = model.state_dict()
        for k, v in state.items():
            assert torch.equal(loaded[k], v), k
    written = Path(resolve_model_path(str(step))) / "model.safetensors"
    stamp = written.stat().st_mtime_ns
    assert Path(resolve_model_path(str(step / "policy" / "weights"))) / "model.safetensors" == written
    assert written.stat().st_mtime_ns == stamp  # converted once, reused
    cfg = load_config([f"worker.actor.model.model_path={step}"])  # the config check takes it as a model
    assert cfg.worker.actor.model.model_path == str(step)


def test_a_checkpoint_of_another_architecture_or_without_weights_says_so(tiny_model_dir, tmp_path):
    step = tmp_path / "step_1"
    write_nemo_checkpoint(step, tiny_model_dir, "v2")
    from rlstack.models.loading import BUILTIN_VISION_MODEL

    (step / "config.yaml").write_text(
        yaml.safe_dump({"policy": {"model_name": resolve_model_path(BUILTIN_VISION_MODEL)}})
    )
    with pytest.raises(NemoCheckpointError, match="do not fit .* architecture"):
        resolve_model_path(str(step))
    empty = tmp_path / "step_2" / "policy" / "weights"
    (empty / "iter_0000010").mkdir(parents=True)
    with pytest.raises(NemoCheckpointError, match="Megatron checkpoint .*convert_megatron_to_hf.py"):
        resolve_model_path(str(empty.parent.parent))
