"""NeMo RL checkpoints (`<checkpoint_dir>/step_N/policy/weights`) as ordinary model directories.

`worker.actor.model.model_path` may name a NeMo RL step directory (`results/sft/step_10`, holding
`config.yaml` and `policy/weights`) or its `policy/weights` folder: what a NeMo RL SFT run hands to the RL
run after it. NeMo RL's DTensor policy saves its weights as a Torch distributed checkpoint (`.metadata`
and `*.distcp`; DTensor v2 in `weights/model/`, v1 wrapping the state dict under `model`), under the base
model's Hugging Face names; the architecture is that of `policy.model_name` in the step's `config.yaml`,
the tokenizer in `policy/tokenizer` (NeMo RL's own `convert_dcp_to_hf.py` reads the same). rlstack writes
the result once into a cached Hugging Face directory under `$RLSTACK_CACHE/models/nemo_rl/`, keyed by the
checkpoint's path and the modification time of its metadata, as for GGUF files (`rlstack.models.gguf`).
Megatron checkpoints (`weights/iter_*`) are refused with NeMo RL's converter named.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from rlstack.checkpoint import model_dir_once, write_dir_atomically
from rlstack.errors import RLStackError


class NemoCheckpointError(RLStackError, RuntimeError):
    """A NeMo RL checkpoint that cannot be read, with what to do about it."""


def nemo_weights(model_path: str) -> Path | None:
    """The `policy/weights` folder a model setting names (a step directory, or the folder itself), or None."""
    path = Path(os.path.expanduser(model_path))
    if (path / "policy" / "weights").is_dir():
        return path / "policy" / "weights"
    if path.name == "weights" and path.parent.name == "policy" and path.is_dir():
        return path
    return None


def resolve_nemo_checkpoint(weights: Path, cache: Path, resolve_base) -> str:
    """The converted model directory of NeMo RL `weights` (written on first use, under a lock).
    `resolve_base` turns the step's `policy.model_name` into a local directory (Hub names included)."""
    dcp = _dcp_dir(weights)
    stamp = os.stat(dcp / ".metadata").st_mtime_ns
    key = f"{weights.resolve()}\0{stamp}"
    step = weights.parent.parent
    out = cache / "models" / "nemo_rl" / f"{step.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def make() -> None:
        _convert(weights, dcp, out, resolve_base)
        note = f"[rlstack] {step}: NeMo RL checkpoint written as a Hugging Face model in {out} (once; reused)"
        print(note, file=sys.stderr)

    return model_dir_once(out, make)


def _dcp_dir(weights: Path) -> Path:
    for candidate in (weights / "model", weights):  # DTensor v2, then v1
        if (candidate / ".metadata").is_file():
            return candidate
    if any(weights.glob("iter_*")):
        raise NemoCheckpointError(
            f"{weights} holds a Megatron checkpoint (iter_*): convert it with NeMo RL's "
            "examples/converters/convert_megatron_to_hf.py and point worker.actor.model.model_path at the result"
        )
    raise NemoCheckpointError(
        f"{weights} is not a NeMo RL DTensor checkpoint: no .metadata in it or in its model/ folder (a NeMo RL "
        "checkpoint saved with model_save_format=safetensors and save_consolidated=true is a Hugging Face folder: "
        "point worker.actor.model.model_path at it)"
    )


def _base_model(weights: Path) -> str:
    """`policy.model_name` of the step's config.yaml: the architecture the weights belong to."""
    config = weights.parent.parent / "config.yaml"
    try:
        name = yaml.safe_load(config.read_text())["policy"]["model_name"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        raise NemoCheckpointError(
            f"{config}: NeMo RL writes the run's config beside its checkpoint, and rlstack reads its "
            f"policy.model_name for the model's architecture; it could not ({type(e).__name__}: {e})"
        ) from e
    if not isinstance(name, str):
        raise NemoCheckpointError(f"{config}: policy.model_name is {name!r}, not a model name or path")
    return name


def _state_dict(dcp: Path) -> dict:
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        flat = Path(tmp) / "weights.pt"
        dcp_to_torch_save(str(dcp), str(flat))
        state = torch.load(flat, map_location="cpu", weights_only=True)
    if set(state) == {"model"}:  # DTensor v1 saved {"model": state_dict}
        state = state["model"]
    return {k: v.contiguous() for k, v in state.items() if isinstance(v, torch.Tensor)}


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json", ".distcp")


def _convert(weights: Path, dcp: Path, out: Path, resolve_base) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from rlstack.models.vision import is_vision_model

    base = Path(resolve_base(_base_model(weights)))
    config = AutoConfig.from_pretrained(base)
    auto_class = AutoModelForImageTextToText if is_vision_model(str(base)) else AutoModelForCausalLM
    state = _state_dict(dcp)
    with torch.device("meta"):
        expected = set(auto_class.from_config(config).state_dict())
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing, unexpected = expected - set(state) - tied, set(state) - expected
    if missing or unexpected:
        raise NemoCheckpointError(
            f"{dcp}: its tensors do not fit the architecture of {base} (policy.model_name of its config.yaml): "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    state = {k: v for k, v in state.items() if k not in tied}
    tokenizer = weights.parent / "tokenizer"

    def write(tmp: Path) -> None:
        # the base model's folder without its weights (config, tokenizer, processor, chat template, generation
        # config), then the tokenizer the run saved (NeMo RL may change it), then the trained weights
        for source in (base, tokenizer):
            for f in source.iterdir() if source.is_dir() else ():
                if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):
                    shutil.copy(f, tmp / f.name)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})

    write_dir_atomically(out, write)
