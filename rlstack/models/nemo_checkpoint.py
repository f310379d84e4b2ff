"""NeMo RL checkpoints (`<checkpoint_dir>/step_N/policy/weights`) as ordinary model directories.

`worker.actor.model.model_path` may name a NeMo RL step directory (`results/sft/step_10`, holding
`config.yaml` and `policy/weights`), its `policy/weights` folder or a folder in it (`weights/model`,
`weights/model/consolidated`): what a NeMo RL SFT run hands to the RL run after it. NeMo RL's DTensor policy
saves the weights in one of three layouts, every one under the model's Hugging Face state-dict names
(`model.layers.0...`; `lm_head.weight` left out when it is tied to the embeddings):

- safetensors shards, NeMo RL's default (DTensor v2, `checkpointing.model_save_format: safetensors`,
  `save_consolidated: false`): nemo_automodel's `Checkpointer.save_model` has each rank write its part of
  every tensor to `weights/model/shard-<rank+1:05d>-model-00001-of-00001.safetensors` through DCP's Hugging
  Face storage writer, each part's offsets in the file's metadata (`DCP_SHARDING_INFO`), and no `.metadata`;
- the same shards plus their consolidation (`save_consolidated: true`): whole tensors in
  `weights/model/consolidated/model-0000k-of-0000N.safetensors` with `model.safetensors.index.json`,
  `config.json` and `generation_config.json`;
- a Torch distributed checkpoint (`.metadata` and `*.distcp`): `weights/model/` with
  `model_save_format: torch_save`, `weights/` itself from DTensor v1, which wraps the state dict under `model`.

torch's own readers put the tensors together (`HuggingFaceStorageReader` for safetensors, `FileSystemReader`
for DCP); a name with one `model.` too many or too few (v1's wrapping) is given the model's own. The
architecture is that of `policy.model_name` in the step's `config.yaml`, the tokenizer in `policy/tokenizer`
(NeMo RL's own `convert_dcp_to_hf.py` reads the same). rlstack writes the result once into a cached Hugging
Face directory under `$RLSTACK_CACHE/models/nemo_rl/`, keyed by the checkpoint's path and the newest
modification time of the files it reads, as for GGUF files (`rlstack.models.gguf`). Megatron checkpoints
(`weights/iter_*`) are refused with NeMo RL's converter named.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import yaml

from rlstack.checkpoint import model_dir_once, write_dir_atomically
from rlstack.errors import RLStackError


class NemoCheckpointError(RLStackError, RuntimeError):
    """A NeMo RL checkpoint that cannot be read, with what to do about it."""


def nemo_weights(model_path: str) -> Path | None:
    """The `policy/weights` folder a model setting names (a step directory, the folder itself, its `model/` or
    `model/consolidated/`), or None."""
    path = Path(os.path.expanduser(model_path))
    if (path / "policy" / "weights").is_dir():
        return path / "policy" / "weights"
    for weights, below in ((path, ""), (path.parent, "model"), (path.parent.parent, "model/consolidated")):
        if weights.name == "weights" and weights.parent.name == "policy" and path == weights / below:
            return weights if path.is_dir() else None
    return None


def resolve_nemo_checkpoint(weights: Path, cache: Path, resolve_base) -> str:
    """The converted model directory of NeMo RL `weights` (written on first use, under a lock).
    `resolve_base` turns the step's `policy.model_name` into a local directory (Hub names included)."""
    folder = _tensors_dir(weights)
    stamp = max(f.stat().st_mtime_ns for f in folder.iterdir() if f.is_file())
    key = f"{weights.resolve()}\0{stamp}"
    step = weights.parent.parent
    out = cache / "models" / "nemo_rl" / f"{step.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def make() -> None:
        _convert(weights, folder, out, resolve_base)
        note = f"[rlstack] {step}: NeMo RL checkpoint written as a Hugging Face model in {out} (once; reused)"
        print(note, file=sys.stderr)

    return model_dir_once(out, make)


LAYOUTS = (
    "safetensors shards in model/ (shard-*.safetensors: model_save_format: safetensors, NeMo RL's default)",
    "consolidated safetensors in model/consolidated/ (save_consolidated: true)",
    "a Torch distributed checkpoint (.metadata, *.distcp) in model/ (model_save_format: torch_save) or in the "
    "folder itself (DTensor policy v1)",
)


def _tensors_dir(weights: Path) -> Path:
    """The folder of `weights` whose files hold the tensors, first found of: DCP (v2, v1), consolidated
    safetensors (whole tensors), safetensors shards (written with or without a consolidation beside them)."""
    model = weights / "model"
    for folder, pattern in (
        (model, ".metadata"),
        (weights, ".metadata"),
        (model / "consolidated", "*.safetensors"),
        (model, "shard-*.safetensors"),
    ):
        if any(f.is_file() for f in folder.glob(pattern)):
            return folder
    if any(weights.glob("iter_*")):
        raise NemoCheckpointError(
            f"{weights} holds a Megatron checkpoint (iter_*): convert it with NeMo RL's "
            "examples/converters/convert_megatron_to_hf.py and point worker.actor.model.model_path at the result"
        )
    raise NemoCheckpointError(
        f"{weights} holds none of the NeMo RL DTensor checkpoint layouts rlstack reads: " + "; ".join(LAYOUTS)
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


def _read_tensors(folder: Path) -> dict:
    """Every tensor saved in `folder`, whole, read in this process by torch's readers: `FileSystemReader` for a
    distributed checkpoint, `HuggingFaceStorageReader` for safetensors (it puts the ranks' shards together from
    the offsets each file records). Names as saved: v1's wrapping gives `model.` before each."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if (folder / ".metadata").is_file():
        reader = dcp.FileSystemReader(str(folder))
    elif hasattr(dcp, "HuggingFaceStorageReader"):
        reader = dcp.HuggingFaceStorageReader(str(folder))
    else:
        raise NemoCheckpointError(
            f"{folder}: safetensors saved through torch.distributed.checkpoint are read by its "
            f"HuggingFaceStorageReader, which torch {torch.__version__} does not have: upgrade torch"
        )
    saved = reader.read_metadata().state_dict_metadata
    tensors = {
        k: torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in saved.items()
        if isinstance(m, TensorStorageMetadata)
    }
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(tensors, storage_reader=reader, no_dist=True)  # one rank converts while the others wait
    return tensors


def _model_names(tensors: dict, expected: set[str], prefix: str) -> dict:
    """`tensors` under the model's state-dict names: a name the model lacks that, with the base model's prefix
    (`model.`) taken off or put on, is one of the model's, becomes that name, as transformers does on load."""
    named = {}
    for name, tensor in tensors.items():
        if name not in expected and prefix:
            if name.startswith(f"{prefix}.") and name[len(prefix) + 1 :] in expected:
                name = name[len(prefix) + 1 :]
            elif f"{prefix}.{name}" in expected:
                name = f"{prefix}.{name}"
        named[name] = tensor
    return named


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json", ".distcp")


def _convert(weights: Path, folder: Path, out: Path, resolve_base) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from rlstack.models.vision import is_vision_model

    base = Path(resolve_base(_base_model(weights)))
    config = AutoConfig.from_pretrained(base)
    auto_class = AutoModelForImageTextToText if is_vision_model(str(base)) else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto_class.from_config(config)
    expected = set(model.state_dict())
    state = _model_names(_read_tensors(folder), expected, model.base_model_prefix)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing, unexpected = expected - set(state) - tied, set(state) - expected
    if missing or unexpected:
        raise NemoCheckpointError(
            f"{folder}: its tensors do not fit the architecture of {base} (policy.model_name of its config.yaml): "
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
