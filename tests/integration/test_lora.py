"""LoRA policies: only the adapters train and are checkpointed, the base with the adapters off is the
reference, and the merged weights (rollout engines, the final model, `rlstack merge`) score as the
adapter model does."""

from __future__ import annotations

import io
import json
import types
from pathlib import Path

import pytest
import torch
from test_padding_free import skewed_batch

from rlstack.batch import Batch
from rlstack.config import ActorConfig, AlgorithmConfig, LoraConfig, ModelConfig, RefConfig, load_config
from rlstack.errors import RLStackError
from rlstack.merge import merge_checkpoint
from rlstack.models.loading import load_causal_lm
from rlstack.models.logprobs import forward_logprobs
from rlstack.models.vision import position_ids
from rlstack.workers.policy import PolicyWorker, RefWorker

ATOL = 1e-5


def lora_worker(model_dir, **actor) -> PolicyWorker:
    cfg = ActorConfig(
        model=ModelConfig(model_path=str(model_dir), lora=LoraConfig(rank=4, alpha=8)),
        micro_batch_size_per_device_for_update=4,
        loss_agg_mode="token-mean",
        **actor,
    )
    cfg.optim.lr = 5e-2  # adapters start at zero: a large step makes their effect plain
    # the temperature of the test batches (`skewed_batch`), as the step plan would give it
    return PolicyWorker(
        cfg, AlgorithmConfig(), max_response_length=40, total_steps=10, seed=0, temperature=0.9
    )


def logprobs_of(model, batch: Batch) -> torch.Tensor:
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        logp, _ = forward_logprobs(model, ids, mask, position_ids(model, ids, mask), batch["response_mask"])
    return logp * batch["response_mask"]


def trained(tiny_model_dir, tok, **actor) -> tuple[PolicyWorker, Batch]:
    worker = lora_worker(tiny_model_dir, **actor)
    batch = skewed_batch(tok, rows=8)
    worker.update(Batch(dict(batch.columns), batch.meta), mini_batch_size=8)
    return worker, batch


def test_only_the_adapters_train(tiny_model_dir, tok):
    worker = lora_worker(tiny_model_dir)
    trainable = {n for n, p in worker.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    in_optimizer = {id(p) for g in worker.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in worker.model.parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    batch = skewed_batch(tok, rows=8)
    worker.update(batch, mini_batch_size=8)
    moved = {n for n, p in worker.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and moved <= trainable


@pytest.mark.parametrize("alpha,dropout", [(8, 0.0), (6, 0.3)])
def test_adapted_layers_compute_what_peft_computes(tiny_model_dir, alpha, dropout):
    """The adapted layers' own forward (`lora._fused_forward`: the scaling on the rank-r activations, the sum
    inside the last product) gives peft's outputs and gradients, with dropout the same draws; switched off
    or merged adapters take peft's path."""
    from peft.tuners.lora import Linear

    from rlstack.models.lora import add_lora

    model = add_lora(load_causal_lm(str(tiny_model_dir)), LoraConfig(rank=4, alpha=alpha, dropout=dropout))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    assert layers and all(type(m).__name__ == "FusedLoraLinear" for m in layers)
    ids = torch.randint(3, model.config.vocab_size, (3, 9))

    def run(peft_path: bool):
        for m in layers:  # peft's own forward on the instance, or the class's (the fused one)
            if peft_path:
                vars(m)["forward"] = types.MethodType(Linear.forward, m)
            else:
                vars(m).pop("forward", None)
        model.train()
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        out = model(input_ids=ids).logits
        out.square().mean().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]

    ours, ours_grads = run(False)
    theirs, their_grads = run(True)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    for g, ref in zip(ours_grads, their_grads):
        torch.testing.assert_close(g, ref, atol=1e-6, rtol=1e-4)
    assert any(g.abs().max() > 0 for g in ours_grads)
    run(False)
    model.eval()
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            base = model(input_ids=ids).logits
        plain = load_causal_lm(str(tiny_model_dir)).eval()(input_ids=ids).logits
        model.merge_adapter()
        merged = model(input_ids=ids).logits
    torch.testing.assert_close(base, plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=0)
    assert (adapted - plain).abs().max() > 1e-3
    buffer = io.BytesIO()  # a whole model saved with torch.save loads back (the class is found by name)
    torch.save(model, buffer)
    buffer.seek(0)
    again = torch.load(buffer, weights_only=False)
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids).logits, merged, atol=1e-5, rtol=0)


def test_the_reference_is_the_base_with_the_adapters_off(tiny_model_dir, tok):
    worker, batch = trained(tiny_model_dir, tok)
    ref = worker.compute_ref_logprobs(Batch(dict(batch.columns), batch.meta))["ref_logprobs"]
    base = RefWorker(
        ActorConfig(model=ModelConfig(model_path=str(tiny_model_dir))), RefConfig(), temperature=0.9
    )
    expected = base.compute_ref_logprobs(Batch(dict(batch.columns), batch.meta))["ref_logprobs"]
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(ref[mask], expected[mask], atol=ATOL, rtol=0)
    policy = worker.compute_logprobs(Batch(dict(batch.columns), batch.meta))["old_logprobs"]
    assert (policy[mask] - ref[mask]).abs().max() > 1e-3  # the adapters changed the policy
    assert worker.model.training  # switched back after scoring


def test_merged_weights_score_as_the_adapter_model(tiny_model_dir, tok):
    """What a rollout engine with its own copy loads (Hugging Face names) gives the policy's log-probs."""
    worker, batch = trained(tiny_model_dir, tok)
    plain = load_causal_lm(str(tiny_model_dir))
    weights = dict(worker.named_weights())
    assert weights.keys() == plain.state_dict().keys()
    plain.load_state_dict(weights)
    worker.model.eval()
    ours, theirs = logprobs_of(worker.model, batch), logprobs_of(plain.eval(), batch)
    torch.testing.assert_close(theirs, ours, atol=ATOL, rtol=0)
    assert (ours - logprobs_of(load_causal_lm(str(tiny_model_dir)).eval(), batch)).abs().max() > 1e-3


def test_log_probs_are_computed_without_dropout(tiny_model_dir, tok):
    """Old log-probs and the reference's come from the model in eval mode: with LoRA dropout they would
    otherwise be random (and the update's importance ratios with them)."""
    cfg = ActorConfig(
        model=ModelConfig(model_path=str(tiny_model_dir), lora=LoraConfig(rank=4, alpha=8, dropout=0.5)),
        micro_batch_size_per_device_for_update=4,
        loss_agg_mode="token-mean",
    )
    cfg.optim.lr = 5e-2  # adapters start at zero, where dropout before them changes nothing
    worker = PolicyWorker(cfg, AlgorithmConfig(), max_response_length=40, total_steps=10, seed=0)
    batch = skewed_batch(tok, rows=8)
    worker.update(Batch(dict(batch.columns), batch.meta), mini_batch_size=8)
    assert any(isinstance(m, torch.nn.Dropout) and m.p == 0.5 for m in worker.model.modules())
    worker.model.train()
    first = worker.compute_logprobs(batch)["old_logprobs"]
    again = worker.compute_logprobs(batch)["old_logprobs"]
    assert torch.equal(first, again) and worker.model.training  # deterministic, and the mode restored


def test_adapter_only_checkpoints_resume_and_merge(tiny_model_dir, tok, tmp_path: Path):
    worker, batch = trained(tiny_model_dir, tok)
    ckpt = tmp_path / "global_step_1"
    (ckpt / "model").mkdir(parents=True)
    worker.save_checkpoint(ckpt)
    torch.save({}, ckpt / "trainer_state.pt")  # what the trainer adds; `rlstack merge` checks for it
    files = {f.name for f in (ckpt / "model").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "config.json"} <= files
    assert not any(f.startswith("model") and f.endswith(".safetensors") for f in files)  # no base weights
    adapter_bytes = (ckpt / "model" / "adapter_model.safetensors").stat().st_size
    base_bytes = sum(p.numel() * 4 for p in load_causal_lm(str(tiny_model_dir)).parameters())
    assert adapter_bytes < base_bytes / 5

    resumed = lora_worker(tiny_model_dir)
    resumed.load_checkpoint(ckpt)
    for (name, a), b in zip(worker.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert resumed.optimizer.state_dict()["state"].keys() == worker.optimizer.state_dict()["state"].keys()
    # the same next step from the resumed worker as from the one that kept going
    worker.update(Batch(dict(batch.columns), batch.meta), mini_batch_size=8)
    resumed.update(Batch(dict(batch.columns), batch.meta), mini_batch_size=8)
    for a, b in zip(worker.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)

    merged_dir = merge_checkpoint(ckpt, tmp_path / "merged")
    merged = load_causal_lm(str(merged_dir)).eval()
    worker.load_checkpoint(ckpt)  # back to the checkpoint's adapters
    worker.model.eval()
    torch.testing.assert_close(
        logprobs_of(merged, batch), logprobs_of(worker.model, batch), atol=ATOL, rtol=0
    )
    assert (merged_dir / "tokenizer.json").is_file() and not (merged_dir / "adapter_config.json").exists()


def test_a_checkpoint_with_adapters_does_not_resume_without_them(tiny_model_dir, tok, tmp_path: Path):
    worker, _ = trained(tiny_model_dir, tok)
    worker.save_checkpoint(tmp_path)
    full = PolicyWorker(
        ActorConfig(model=ModelConfig(model_path=str(tiny_model_dir))), AlgorithmConfig(), 40, 10, seed=0
    )
    with pytest.raises(RLStackError, match="with LoRA adapters"):
        full.load_checkpoint(tmp_path)


def test_final_model_is_merged_with_the_adapters_beside_it(tiny_model_dir, tok, tmp_path: Path):
    worker, batch = trained(tiny_model_dir, tok)
    worker.save_model(tmp_path / "hf")
    merged = load_causal_lm(str(tmp_path / "hf")).eval()
    worker.model.eval()
    torch.testing.assert_close(
        logprobs_of(merged, batch), logprobs_of(worker.model, batch), atol=ATOL, rtol=0
    )
    config = json.loads((tmp_path / "hf" / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8


def test_lora_settings_are_checked():
    from rlstack.config import ConfigError

    with pytest.raises(ConfigError, match=r"lora: rank = -1"):
        load_config(["worker.actor.model.lora.rank=-1"])
    with pytest.raises(ConfigError, match="LoRA is built for one policy rank"):
        load_config(["worker.actor.model.lora.rank=8", "trainer.backend=ray", "trainer.n_gpus_per_node=2"])


def test_exclude_modules_leaves_out_what_it_matches_and_is_checked(tiny_model_dir):
    from rlstack.config import ConfigError
    from rlstack.models.loading import BUILTIN_VISION_MODEL

    def adapted(path: str, exclude: str | None, freeze: bool = False) -> list[str]:
        lora = LoraConfig(rank=4, exclude_modules=exclude)
        cfg = ActorConfig(model=ModelConfig(model_path=path, lora=lora), freeze_vision_tower=freeze)
        worker = PolicyWorker(cfg, AlgorithmConfig(), max_response_length=8, total_steps=1, seed=0)
        return [n for n, p in worker.model.named_parameters() if p.requires_grad]

    mlp_free = adapted(str(tiny_model_dir), r".*\.mlp\..*")
    assert mlp_free and not any(".mlp." in n for n in mlp_free) and any(".self_attn." in n for n in mlp_free)
    assert any(".mlp." in n for n in adapted(str(tiny_model_dir), None))
    # EasyR1's shipped value, beside freeze_vision_tower: the language model alone gets adapters
    for exclude, freeze in ((".*visual.*", False), (r".*\.mlp\..*", True)):
        names = adapted(BUILTIN_VISION_MODEL, exclude, freeze)
        assert names and not any(".visual." in n for n in names)
    with pytest.raises(ConfigError, match=r"lora.exclude_modules = '\(visual' is not a regular expression"):
        load_config(["worker.actor.model.lora.exclude_modules=(visual"])


@pytest.mark.parametrize("freeze", [True, False])
def test_vision_tower_gets_adapters_unless_frozen(freeze: bool):
    from rlstack.models.loading import BUILTIN_VISION_MODEL

    cfg = ActorConfig(
        model=ModelConfig(model_path=BUILTIN_VISION_MODEL, lora=LoraConfig(rank=4)),
        freeze_vision_tower=freeze,
    )
    worker = PolicyWorker(cfg, AlgorithmConfig(), max_response_length=8, total_steps=1, seed=0)
    trainable = [n for n, p in worker.model.named_parameters() if p.requires_grad]
    in_vision = [n for n in trainable if ".visual." in n]
    assert any(".language_model." in n for n in trainable)
    assert bool(in_vision) != freeze
    assert all(".lora_" in n for n in trainable)
    # the merged weights of a VLM load into the plain model under its own names
    plain = load_causal_lm(worker.path)
    assert dict(worker.named_weights()).keys() == plain.state_dict().keys()
