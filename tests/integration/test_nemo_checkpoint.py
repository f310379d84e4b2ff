"""NeMo RL checkpoints (`step_N/policy/weights`) load as the model they hold, in each layout NeMo RL's DTensor
policy writes, written here as it writes them, beside the run's `config.yaml` and `policy/tokenizer`:
safetensors shards (its default: nemo_automodel's `Checkpointer.save_model` through DCP's Hugging Face storage
writer, one file per rank), the same with their consolidation (`save_consolidated: true`), and a Torch
distributed checkpoint (v1: the state dict under `model`; v2: flat, in `weights/model/`)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import yaml
from ranks import run_ranks

from rlstack.config import load_config
from rlstack.models.loading import load_causal_lm, resolve_model_path
from rlstack.models.nemo_checkpoint import NemoCheckpointError


def trained_state(base: str) -> dict[str, torch.Tensor]:
    """`base`'s weights moved as training would move them."""
    model = load_causal_lm(base)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    return {k: v.clone() for k, v in model.state_dict().items()}


def write_step(step: Path, base: Path) -> None:
    """What NeMo RL writes beside the weights: the run's config and the tokenizer (`policy/tokenizer`)."""
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(base).save_pretrained(step / "policy" / "tokenizer")
    (step / "config.yaml").write_text(yaml.safe_dump({"policy": {"model_name": str(base)}}))


def write_nemo_checkpoint(step: Path, base: Path, layout: str) -> dict[str, torch.Tensor]:
    """A NeMo RL step directory of `base`'s model with its weights moved, as a Torch distributed checkpoint in
    `layout` (v1 or v2); the weights it holds."""
    state = trained_state(str(base))
    weights = step / "policy" / "weights"
    if layout == "v1":
        dcp.save({"model": state}, checkpoint_id=str(weights))
    else:
        dcp.save(state, checkpoint_id=str(weights / "model"))
    write_step(step, base)
    return state


def save_like_automodel(base: str, model_dir: str, consolidate: bool) -> None:
    """On each rank: what nemo_automodel's `Checkpointer.save_model` writes for NeMo RL's DTensor policy v2 with
    `model_save_format: safetensors` (nemo_automodel/components/checkpoint/checkpointing.py and addons.py):
    the model's state dict as FSDP2 holds it (each tensor split over the ranks along dim 0; `lm_head.weight`
    left out when tied), saved by DCP's Hugging Face writer with one file per rank; `config.json` and
    `generation_config.json` in `model/.hf_metadata`, moved into `model/consolidated` with the tensors put back
    together there (2 files) when `save_consolidated` is true."""
    import torch.distributed as dist
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files_on_every_rank,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    model = load_causal_lm(base)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    state = {
        k: distribute_tensor(v, mesh, [Shard(0)])
        for k, v in trained_state(base).items()
        if not (k == "lm_head.weight" and model.config.tie_word_embeddings)
    }
    path = Path(model_dir)
    meta, consolidated = path / ".hf_metadata", path / "consolidated"
    if dist.get_rank() == 0:
        meta.mkdir(parents=True)
        (meta / "config.json").write_text(model.config.to_json_string(use_diff=False))
        (meta / "generation_config.json").write_text(model.generation_config.to_json_string())
    names = sorted(state)
    mapping = {k: 1 + 2 * i // len(names) for i, k in enumerate(names)}  # the base model's index: 2 files
    if dist.get_rank() == 0:
        (meta / "fqn_to_file_index_mapping.json").write_text(json.dumps(mapping))
        if consolidate:
            consolidated.mkdir()
    dist.barrier()
    dcp.save(state, storage_writer=dcp.HuggingFaceStorageWriter(model_dir, save_distributed=True))
    if consolidate:
        consolidate_safetensors_files_on_every_rank(model_dir, str(consolidated), mapping)
        dist.barrier()
        if dist.get_rank() == 0:
            for f in meta.iterdir():
                if f.name != "fqn_to_file_index_mapping.json":
                    shutil.move(f, consolidated / f.name)
            shutil.rmtree(meta)


def assert_loads(paths: list[Path], state: dict[str, torch.Tensor]) -> None:
    for path in paths:
        loaded = load_causal_lm(resolve_model_path(str(path))).state_dict()
        for k, v in state.items():
            assert torch.equal(loaded[k], v), (path, k)


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_a_step_directory_or_its_weights_folder_loads_as_the_trained_model(tiny_model_dir, tmp_path, layout):
    step = tmp_path / "results" / "sft" / "step_10"
    state = write_nemo_checkpoint(step, tiny_model_dir, layout)
    assert_loads([step, step / "policy" / "weights"], state)
    written = Path(resolve_model_path(str(step))) / "model.safetensors"
    stamp = written.stat().st_mtime_ns
    assert Path(resolve_model_path(str(step / "policy" / "weights"))) / "model.safetensors" == written
    assert written.stat().st_mtime_ns == stamp  # converted once, reused
    cfg = load_config([f"worker.actor.model.model_path={step}"])  # the config check takes it as a model
    assert cfg.worker.actor.model.model_path == str(step)


@pytest.mark.parametrize("ranks", [1, 2])
def test_safetensors_shards_nemo_rls_default_load_as_the_trained_model(tiny_model_dir, tmp_path, ranks):
    step = tmp_path / "results" / "grpo" / "step_10"
    model_dir = step / "policy" / "weights" / "model"
    write_step(step, tiny_model_dir)
    run_ranks(ranks, save_like_automodel, str(tiny_model_dir), str(model_dir), False, tmp=tmp_path / "ranks")
    shards = [f"shard-{r:05d}-model-00001-of-00001.safetensors" for r in range(1, ranks + 1)]
    assert sorted(f.name for f in model_dir.iterdir()) == [".hf_metadata", *shards]  # no .metadata
    assert_loads([step, step / "policy" / "weights", model_dir], trained_state(str(tiny_model_dir)))


def test_consolidated_safetensors_load_as_the_trained_model(tiny_model_dir, tmp_path):
    step = tmp_path / "results" / "grpo" / "step_20"
    model_dir = step / "policy" / "weights" / "model"
    write_step(step, tiny_model_dir)
    run_ranks(2, save_like_automodel, str(tiny_model_dir), str(model_dir), True, tmp=tmp_path / "ranks")
    consolidated = model_dir / "consolidated"
    assert sorted(f.name for f in consolidated.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
    state = trained_state(str(tiny_model_dir))
    assert_loads([step, consolidated], state)
    alone = tmp_path / "step_21"  # the shards deleted to save space: the consolidated folder alone loads
    shutil.copytree(step, alone)
    for f in (alone / "policy" / "weights" / "model").glob("shard-*.safetensors"):
        f.unlink()
    assert_loads([alone], state)


def test_names_without_the_base_models_prefix_map_onto_the_models(tiny_model_dir, tmp_path):
    step = tmp_path / "step_5"
    write_step(step, tiny_model_dir)
    state = trained_state(str(tiny_model_dir))
    bare = {k.removeprefix("model."): v for k, v in state.items()}  # `layers.0...`, `lm_head.weight`
    consolidated = step / "policy" / "weights" / "model" / "consolidated"
    dcp.save(bare, storage_writer=dcp.HuggingFaceStorageWriter(str(consolidated)), no_dist=True)
    assert_loads([step], state)


def test_a_checkpoint_of_another_architecture_or_without_weights_says_so(tiny_model_dir, tmp_path):
    step = tmp_path / "step_1"
    write_nemo_checkpoint(step, tiny_model_dir, "v2")
    from rlstack.models.loading import BUILTIN_VISION_MODEL

    (step / "config.yaml").write_text(
        yaml.safe_dump({"policy": {"model_name": resolve_model_path(BUILTIN_VISION_MODEL)}})
    )
    with pytest.raises(NemoCheckpointError, match="do not fit .* architecture"):
        resolve_model_path(str(step))
    megatron = tmp_path / "step_2" / "policy" / "weights"
    (megatron / "iter_0000010").mkdir(parents=True)
    with pytest.raises(NemoCheckpointError, match="Megatron checkpoint .*convert_megatron_to_hf.py"):
        resolve_model_path(str(megatron.parent.parent))
    empty = tmp_path / "step_3" / "policy" / "weights"
    (empty / "model" / ".hf_metadata").mkdir(parents=True)
    layouts = ".*".join(
        map(re.escape, ["shard-*.safetensors", "model/consolidated/", ".metadata", "*.distcp"])
    )
    with pytest.raises(NemoCheckpointError, match=f"{re.escape(str(empty))} holds none of .*{layouts}"):
        resolve_model_path(str(empty.parent.parent))
