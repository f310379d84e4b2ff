"""The lean decoding step (`rlstack.models.decoding`) against the Hugging Face module it stands in for:
the same samples and log-probs from `sample` for every architecture it takes, the same logits in
bfloat16, live weights, and the models it leaves to the module."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import rlstack.rollout.hf_cache as hf_cache
import rlstack.rollout.hf_sampling as hf_sampling
from rlstack.models.decoding import LeanDecoder, lean_decoder, why_not_lean
from rlstack.models.loading import load_causal_lm

SIZES = dict(
    vocab_size=40,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    pad_token_id=0,
    eos_token_id=2,
)


def built(cls, config) -> torch.nn.Module:
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():  # random init is near-uniform: sharpen it so that samples depend on the logits
        for p in model.parameters():
            p.mul_(3.0)
    return model


ARCHITECTURES = {
    "llama": lambda: built(LlamaForCausalLM, LlamaConfig(**SIZES, attention_bias=True, mlp_bias=True)),
    "mistral": lambda: built(MistralForCausalLM, MistralConfig(**SIZES, sliding_window=4096)),
    # Qwen3: a head size that is not hidden / heads, and per-head norms of queries and keys
    "qwen3": lambda: built(Qwen3ForCausalLM, Qwen3Config(**SIZES, head_dim=16, tie_word_embeddings=True)),
}


def prompts(n_rows: int = 4, n: int = 3) -> list[list[int]]:
    """`n_rows` prompts of different lengths (left padding), each repeated `n` times (shared prefills)."""
    gen = torch.Generator().manual_seed(1)
    rows = [torch.randint(3, 40, (length,), generator=gen).tolist() for length in (5, 9, 2, 7)[:n_rows]]
    return [p for p in rows for _ in range(n)]


def sampled(model, through_module: bool, monkeypatch, temperature=1.0, **kw) -> tuple[dict, int]:
    """`sample` over `prompts()`, and how many lean steps it took (forced through the module's
    `forward` with `through_module`)."""
    steps = [0]
    step = LeanDecoder.step

    def counted(self, *args, **kwargs):
        steps[0] += 1
        return step(self, *args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(LeanDecoder, "step", counted)
        if through_module:
            mp.setattr(hf_sampling, "lean_decoder", lambda model, positions: None)
        out = hf_sampling.sample(
            model,
            prompts(),
            max_new_tokens=10,
            eos_token_id=2,
            pad_token_id=0,
            temperature=temperature,
            seeds=torch.arange(12) * 7,
            **kw,
        )
    return out, steps[0]


def assert_same_samples(model, monkeypatch, **kw) -> dict:
    lean, lean_steps = sampled(model, False, monkeypatch, **kw)
    plain, plain_steps = sampled(model, True, monkeypatch, **kw)
    R = lean["input_ids"].shape[1] - max(len(p) for p in prompts())
    assert lean_steps == R - 1 and plain_steps == 0  # every token after the prefill's took one lean step
    for key in ("input_ids", "attention_mask", "response_mask", "truncated"):
        assert torch.equal(lean[key], plain[key]), key
    torch.testing.assert_close(lean["rollout_logprobs"], plain["rollout_logprobs"], atol=1e-5, rtol=0)
    return lean


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_samples_and_logprobs_match_the_module_for_each_architecture(arch, monkeypatch):
    model = ARCHITECTURES[arch]()
    assert why_not_lean(model, 64) is None
    # the device is no condition: on one H200 the step matched the module's samples (bench/gpu_check.py)
    assert why_not_lean(ARCHITECTURES[arch]().to("meta"), 64) is None
    out = assert_same_samples(model, monkeypatch)
    assert out["response_mask"].sum() > 12  # not everything ended at once: the steps were exercised


def test_the_tiny_qwen2_samples_as_through_the_module_with_top_p_and_ended_rows(eos_model, tok, monkeypatch):
    """The default model (tied embeddings, biased q/k/v, an lm head with a bias here), with rows that end
    while others go on: ended rows keep attending, as in the module's path."""
    assert why_not_lean(eos_model, 64) is None
    out = assert_same_samples(eos_model, monkeypatch, top_p=0.9)
    lengths = out["response_mask"].sum(-1)
    assert lengths.min() < lengths.max()


def test_greedy_decoding_matches(eos_model, monkeypatch):
    assert_same_samples(eos_model, monkeypatch, temperature=0.0)


@pytest.mark.parametrize("lora", [False, True])
def test_bfloat16_logits_match_the_module(lora):
    """Step by step over a prefilled cache, the logits of a bfloat16 model are the module's full-pass
    logits at the same columns, within a tolerance of bfloat16's coarse rounding (a loose check: it
    catches a wrong step, not a different rounding order). With LoRA: float32 adapters on the bfloat16
    base, as peft makes them (the input cast to the adapters' dtype, the sum back to bfloat16)."""
    model = ARCHITECTURES["qwen3"]().to(torch.bfloat16)
    if lora:
        model = adapted(model)
        assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    B, P, R = 3, 6, 4
    ids = torch.randint(3, 40, (B, P + R), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded row
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, P:].float()
        cache = hf_cache._preallocated(hf_cache.DynamicCache(config=model.config), P + R)
        model(
            input_ids=ids[:, :P], attention_mask=mask[:, :P], position_ids=pos[:, :P], past_key_values=cache
        )
    decoder = lean_decoder(model, P + R)
    keys = [layer.key_buffer for layer in cache.layers]
    values = [layer.value_buffer for layer in cache.layers]
    blocked = torch.zeros(B, P + R, dtype=torch.bool)
    blocked[:, :P] = mask[:, :P] == 0
    got = torch.stack(
        [decoder.step(ids[:, P + k], pos[:, P + k], keys, values, P + k, blocked).float() for k in range(R)],
        dim=1,
    )
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=0.1, rtol=0.05)
    assert (got - want).abs().mean() < 0.02 * want.abs().mean()


def test_weights_changed_between_steps_are_the_weights_a_step_uses(eos_model, monkeypatch):
    """The step reads the module's parameters, never a copy: a change in place between two steps (where
    in-flight weight updates land) shows in the next step's log-probs as it does through the module."""

    def perturb():
        calls[0] += 1
        if calls[0] == 3:
            with torch.no_grad():
                eos_model.model.layers[0].mlp.up_proj.weight.add_(0.5)

    original = eos_model.model.layers[0].mlp.up_proj.weight.detach().clone()
    results = []
    for through_module in (False, True):
        calls = [0]
        results.append(sampled(eos_model, through_module, monkeypatch, between_steps=perturb)[0])
        with torch.no_grad():
            eos_model.model.layers[0].mlp.up_proj.weight.copy_(original)
    lean, plain = results
    assert torch.equal(lean["input_ids"], plain["input_ids"])
    torch.testing.assert_close(lean["rollout_logprobs"], plain["rollout_logprobs"], atol=1e-5, rtol=0)
    unperturbed, _ = sampled(eos_model, False, monkeypatch)
    assert not torch.allclose(unperturbed["rollout_logprobs"], lean["rollout_logprobs"], atol=1e-3)


def test_models_the_step_does_not_cover_decode_through_the_module(tiny_model_dir, monkeypatch):
    training = ARCHITECTURES["llama"]().train()
    assert "training mode" in why_not_lean(training, 16)

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=32, n_layer=1, n_head=2)).eval()
    assert "GPT2LMHeadModel is not one of" in why_not_lean(gpt2, 16)

    windowed = built(MistralForCausalLM, MistralConfig(**SIZES, sliding_window=8))
    assert "sliding window of 8 positions, shorter than 16" in why_not_lean(windowed, 16)
    assert why_not_lean(windowed, 8) is None
    assert_same_samples(ARCHITECTURES["mistral"](), monkeypatch)

    peft = pytest.importorskip("peft")
    dora = peft.get_peft_model(
        load_causal_lm(str(tiny_model_dir)), peft.LoraConfig(r=2, target_modules=["q_proj"], use_dora=True)
    ).eval()
    assert "layer 0's self_attn.q_proj is its adapter 'default' is a LoRA variant" in why_not_lean(dora, 16)
    assert lean_decoder(dora, 16) is None
    prompt_tuned = peft.get_peft_model(
        load_causal_lm(str(tiny_model_dir)),
        peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2),
    ).eval()
    assert "not LoRA only" in why_not_lean(prompt_tuned, 16)  # its virtual tokens are not in the base model


ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def adapted(arch: str | torch.nn.Module, **lora):
    """`arch` (or a model) with LoRA adapters (peft) whose updates are not zero, in eval mode."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": ALL_LINEAR} | lora)
    model = peft.get_peft_model(ARCHITECTURES[arch]() if isinstance(arch, str) else arch, config)
    torch.manual_seed(3)
    with torch.no_grad():  # lora_B starts at zero: give the adapters an update of their own
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return model.eval()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_lora_adapters_sample_through_the_step_as_through_the_module(arch, monkeypatch):
    """The policy with LoRA adapters (a peft `PeftModel`, as `worker.actor.model.lora.rank > 0` makes it)
    decodes through the lean step; its samples and log-probs are the module's, adapters switched off or
    merged too, and they differ from the base model's."""
    model = adapted(arch, lora_dropout=0.1)  # dropout is no-op in eval mode, as in the module
    assert why_not_lean(model, 64) is None
    out = assert_same_samples(model, monkeypatch)
    with model.disable_adapter():
        base = assert_same_samples(model, monkeypatch)
    assert not torch.allclose(out["rollout_logprobs"], base["rollout_logprobs"], atol=1e-2)
    # the Hugging Face model inside, its layers wrapped in place (as transformers' `load_adapter` leaves them)
    inner = assert_same_samples(model.get_base_model(), monkeypatch)
    assert torch.equal(inner["input_ids"], out["input_ids"])
    model.merge_adapter()
    merged = assert_same_samples(model, monkeypatch)
    torch.testing.assert_close(merged["rollout_logprobs"], out["rollout_logprobs"], atol=1e-3, rtol=0)


def test_float32_adapters_multiply_as_one_merged_weight_made_again_when_they_change():
    """In float32 on CPU the step multiplies by the base weight plus the adapters' update, made once and again
    after an in-place change of any of its tensors, q, k and v (gate and up) as one product; other dtypes,
    and models over the merge budget, compute the adapters apart."""
    model = adapted("llama")
    layer = model.base_model.model.model.layers[0]
    q, k, up = layer.self_attn.q_proj, layer.self_attn.k_proj, layer.mlp.up_proj
    decoder = LeanDecoder(model)
    projection = decoder.projections[0]["q_proj"]
    assert projection.mergeable and set(decoder.fused[0]) == {"q_proj", "gate_proj"}
    merged = projection.weight
    assert projection.weight is merged  # kept while nothing changes
    torch.testing.assert_close(
        merged, q.get_base_layer().weight + q.get_delta_weight("default"), atol=1e-6, rtol=0
    )
    x = torch.randn(5, q.in_features)
    torch.testing.assert_close(projection(x), q(x), atol=1e-5, rtol=0)

    def fused_match():
        fq, fk, _ = decoder.fused[0]["q_proj"](x)
        torch.testing.assert_close(fq, q(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(fk, k(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(decoder.fused[0]["gate_proj"](x)[1], up(x), atol=1e-5, rtol=0)

    fused_match()
    with torch.no_grad():
        q.lora_A["default"].weight.mul_(2.0)
        k.get_base_layer().weight.add_(0.5)
        up.lora_B["default"].weight.mul_(-1.0)
    torch.testing.assert_close(projection(x), q(x), atol=1e-5, rtol=0)
    fused_match()
    adapters = [p for n, p in model.named_parameters() if "lora_" in n]
    for p in adapters:
        p.grad = torch.randn_like(p)
    torch.optim.AdamW(adapters, lr=0.05).step()  # an optimizer's in-place step bumps the versions too
    torch.testing.assert_close(projection(x), q(x), atol=1e-5, rtol=0)
    fused_match()
    halved = adapted(ARCHITECTURES["llama"]().to(torch.bfloat16))
    assert not LeanDecoder(halved).projections[0]["q_proj"].mergeable
    import rlstack.models.decoding as decoding

    budget = decoding.MERGE_BUDGET_BYTES
    try:
        decoding.MERGE_BUDGET_BYTES = 1000
        small = LeanDecoder(model)
        assert not any(p.mergeable for layer in small.projections for p in layer.values())
        assert small.fused == [{}, {}]
    finally:
        decoding.MERGE_BUDGET_BYTES = budget


def test_adapters_changed_between_steps_are_the_adapters_a_step_uses(monkeypatch):
    """The step reads the adapters' weights, never a copy: a change in place between two steps shows in
    the next step as it does through the module (rlstack's in-flight updates go to engines with merged
    copies of their own, so this holds the step to the module's behaviour rather than to a run's)."""
    model = adapted("llama", target_modules=["v_proj", "down_proj"])
    lora_b = model.base_model.model.model.layers[1].mlp.down_proj.lora_B["default"].weight

    def perturb():
        calls[0] += 1
        if calls[0] == 3:
            with torch.no_grad():
                lora_b.add_(1.0)

    original = lora_b.detach().clone()
    results = []
    for through_module in (False, True):
        calls = [0]
        results.append(sampled(model, through_module, monkeypatch, between_steps=perturb)[0])
        with torch.no_grad():
            lora_b.copy_(original)
    lean, plain = results
    assert torch.equal(lean["input_ids"], plain["input_ids"])
    torch.testing.assert_close(lean["rollout_logprobs"], plain["rollout_logprobs"], atol=1e-5, rtol=0)
    unperturbed, _ = sampled(model, False, monkeypatch)
    assert not torch.allclose(unperturbed["rollout_logprobs"], lean["rollout_logprobs"], atol=1e-3)
