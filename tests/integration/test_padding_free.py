"""Padding-free batches and dynamic batch sizes give the padded path's log-probs and gradients.

`packed_response_logits` lays a batch's rows end to end without their padding; the padded layout
(`response_logits`, with its shared prompt passes) is the reference. Dynamic batching cuts a
mini-batch by a token budget instead of a row count; the loss is normalized by the mini-batch, so
the gradient of a whole policy update must not change.
"""

from __future__ import annotations

import pytest
import torch
from test_prefix_sharing import ForwardCalls, grads_of_token_mean, make_batch
from test_vision import encode_rows, images_of, model_positions, sharpened, tiny_qwen2_vl, tiny_qwen3_vl

from rlstack.batch import Batch, token_budget_groups
from rlstack.config import ActorConfig, AlgorithmConfig, CriticConfig, ModelConfig, OptimConfig, RefConfig
from rlstack.models.loading import BUILTIN_VISION_MODEL, load_causal_lm, load_processor, resolve_model_path
from rlstack.models.logprobs import forward_logprobs
from rlstack.rollout.hf import sample
from rlstack.workers.critic import CriticWorker
from rlstack.workers.policy import PolicyWorker, RefWorker
from rlstack.workers.training import MicroBatching

ATOL = 1e-5


def assert_close_grads(grads, ref_grads):
    flat, ref_flat = torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in ref_grads])
    assert ref_flat.norm() > 0
    assert (flat - ref_flat).abs().max().item() < ATOL


def both_layouts(model, inputs: dict, temperature: float = 0.7):
    """(log-probs, entropies, gradients of their token mean) of the padded and the padding-free pass."""
    out = []
    for padding_free in (False, True):
        logp, ent = forward_logprobs(
            model, **inputs, temperature=temperature, with_entropy=True, padding_free=padding_free
        )
        out.append((logp, ent, grads_of_token_mean(model, logp, inputs["response_mask"])))
    return out


def assert_same_on_responses(padded, packed, response_mask):
    """Equal on the response tokens; the padding-free layout computes nothing anywhere else."""
    mask = response_mask.bool()
    for ref, got in zip(padded[:2], packed[:2]):
        torch.testing.assert_close(got[mask], ref[mask], atol=ATOL, rtol=0)
        assert (got[~mask] == 0).all()
    assert_close_grads(packed[2], padded[2])


def test_padding_free_text_batch_equals_the_padded_pass(model):
    model.train()
    # left-padded prompts of different lengths, responses of 1..9 tokens right-padded
    ids, mask, positions, response = make_batch(model.config.vocab_size, [(5, 3), (9, 1), (2, 4)], P=10, R=9)
    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=positions, response_mask=response)
    with ForwardCalls(model) as calls:
        padded, packed = both_layouts(model, inputs)
    # the padding-free pass is one forward over exactly the attended tokens, laid end to end
    assert calls.shapes[-1] == (1, int(mask.sum()))
    assert_same_on_responses(padded, packed, response)


def test_each_packed_row_attends_only_to_itself(model):
    """Row 1 alone and row 1 packed behind row 0 have the same log-probs: no attention crosses rows."""
    model.eval()
    ids, mask, positions, response = make_batch(model.config.vocab_size, [(6, 1), (4, 1)], P=6, R=5, seed=3)
    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=positions, response_mask=response)
    with torch.no_grad():
        both, _ = forward_logprobs(model, **inputs, padding_free=True)
        alone, _ = forward_logprobs(model, **{k: v[1:] for k, v in inputs.items()}, padding_free=True)
    torch.testing.assert_close(both[1:], alone, atol=ATOL, rtol=0)
    assert (both[1] != 0).any()


def vl_batch(model, proc):
    """A sampled multi-image batch (rows with 0, 1 and 2 images) and the forward inputs scoring it."""
    encoded = encode_rows(proc)
    images = images_of(encoded)
    model.eval()
    out = sample(
        model,
        [e.input_ids.tolist() for e in encoded],
        max_new_tokens=8,
        eos_token_id=proc.tokenizer.eos_token_id,
        pad_token_id=proc.tokenizer.pad_token_id,
        temperature=1.0,
        generator=torch.Generator().manual_seed(0),
        **images,
    )
    return {
        "input_ids": out["input_ids"],
        "attention_mask": out["attention_mask"],
        "position_ids": model_positions(model, out, images),
        "response_mask": out["response_mask"],
        **images,
    }


@pytest.mark.parametrize("family", ["qwen2.5-vl", "qwen2-vl", "qwen3-vl"])
def test_padding_free_multi_image_batch_equals_the_padded_pass(family):
    if family == "qwen2.5-vl":  # the built-in vision model
        path = resolve_model_path(BUILTIN_VISION_MODEL)
        model, proc = load_causal_lm(path), load_processor(path)
    else:
        model, proc = tiny_qwen2_vl() if family == "qwen2-vl" else tiny_qwen3_vl()
    model = sharpened(model, proc.tokenizer.eos_token_id)
    inputs = vl_batch(model, proc)
    assert [len(g) for g in inputs["image_grid_thw"]] == [0, 1, 2]
    assert inputs["position_ids"].dim() == 3  # M-RoPE
    model.train()
    padded, packed = both_layouts(model, inputs, temperature=1.0)
    assert_same_on_responses(padded, packed, inputs["response_mask"])


# --------------------------------------------------------------------------------- dynamic batches


def test_token_budget_groups_respect_the_budget_and_cover_every_row():
    lengths = [30, 5, 5, 90, 12, 60, 7, 40, 3, 100]
    groups = token_budget_groups(lengths, 100)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in g) <= 100 for g in groups)
    assert all(g == sorted(g) for g in groups)  # batch order within a group
    assert len(groups) == 4  # 352 tokens: first-fit decreasing fills 4 groups of 100
    # a rank that needs fewer groups than another cuts its fullest ones to match
    more = token_budget_groups(lengths, 100, min_groups=6)
    assert len(more) == 6 and sorted(i for g in more for i in g) == list(range(len(lengths)))
    with pytest.raises(ValueError, match="row 9 has 100 tokens"):
        token_budget_groups(lengths, 99)


def test_micro_batching_by_tokens_puts_results_back_in_row_order():
    mask = torch.zeros(6, 10, dtype=torch.long)
    for row, n in enumerate([9, 2, 8, 3, 1, 10]):
        mask[row, :n] = 1
    batch = Batch({"attention_mask": mask, "row": torch.arange(6)})
    parts = MicroBatching(rows=2, max_tokens=12, section="worker.actor", phase="update").split(batch)
    assert all(int(mb["attention_mask"].sum()) <= 12 for _, mb in parts)
    assert len(parts) < 6
    out = MicroBatching(rows=2, max_tokens=12, section="worker.actor", phase="update").map(
        batch, lambda mb: mb["row"] * 10
    )
    assert out.tolist() == [0, 10, 20, 30, 40, 50]
    with pytest.raises(
        ValueError, match="10 tokens does not fit in worker.actor.max_token_len_per_device_for_update=9"
    ):
        MicroBatching(rows=2, max_tokens=9, section="worker.actor", phase="update").split(batch)


def skewed_batch(tok, rows: int = 16, seed: int = 0) -> Batch:
    """GRPO-shaped rows: groups of 4 samples per prompt; most responses short, a few long."""
    g = torch.Generator().manual_seed(seed)
    P, R = 12, 40
    ids, mask, response = [], [], []
    for r in range(rows):
        if r % 4 == 0:
            plen = int(torch.randint(4, P + 1, (), generator=g))
            prompt = torch.randint(3, len(tok), (plen,), generator=g)
        n = R if r % 7 == 3 else int(torch.randint(2, 8, (), generator=g))
        row, m, resp = (torch.zeros(P + R, dtype=torch.long) for _ in range(3))
        row[P - plen : P], m[P - plen : P] = prompt, 1
        row[P : P + n], m[P : P + n], resp[P : P + n] = torch.randint(3, len(tok), (n,), generator=g), 1, 1
        ids.append(row)
        mask.append(m)
        response.append(resp)
    input_ids, attention_mask, response_mask = torch.stack(ids), torch.stack(mask), torch.stack(response)
    old = -torch.rand(input_ids.shape, generator=g) * response_mask
    advantages = torch.randn(rows // 4, 1, generator=g).repeat_interleave(4, 0).expand(-1, P + R).clone()
    return Batch(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "old_logprobs": old,
            "advantages": advantages * response_mask,
        },
        {"temperature": 0.9},
    )


def recording_gradients(worker) -> list[torch.Tensor]:
    """The flat gradient each optimizer step of `worker` applies (after clipping), recorded as it steps."""
    grads, step = [], worker.optimizer.step

    def recorded(*args, **kwargs):
        grads.append(torch.cat([p.grad.flatten() for p in worker.model.parameters() if p.grad is not None]))
        return step(*args, **kwargs)

    worker.optimizer.step = recorded
    return grads


def updated_weights(tiny_model_dir, batch: Batch, **actor) -> dict[str, torch.Tensor]:
    cfg = ActorConfig(
        model=ModelConfig(model_path=str(tiny_model_dir)),
        global_batch_size=4,
        micro_batch_size_per_device_for_update=2,
        ppo_epochs=1,
        loss_agg_mode="seq-mean-token-mean",
        entropy_coeff=0.01,
        **actor,
    )
    cfg.optim.lr = 1e-3
    temperature = batch.meta["temperature"]  # the rollout's, as the step plan gives it to the policy
    policy = PolicyWorker(
        cfg, AlgorithmConfig(), max_response_length=40, total_steps=5, seed=0, temperature=temperature
    )
    with_logprobs = policy.compute_logprobs(Batch(dict(batch.columns), batch.meta))
    grads = recording_gradients(policy)
    metrics = policy.update(batch, mini_batch_size=len(batch) // 2)
    assert len(grads) == 2
    return {
        "gradient": torch.cat(grads),
        "grad_norm": torch.tensor(metrics["actor/grad_norm"]),
        "old_logprobs": with_logprobs["old_logprobs"] * batch["response_mask"],
        "entropy": with_logprobs["entropy"] * batch["response_mask"],
    }


def test_a_padding_free_dynamically_batched_update_equals_the_padded_update(tiny_model_dir, tok):
    batch = skewed_batch(tok)
    padded = updated_weights(tiny_model_dir, batch)
    lengths = batch["attention_mask"].sum(-1)
    budget = int(lengths.max()) + 10
    assert len(token_budget_groups(lengths.tolist(), budget)) not in (1, len(batch) // 2)  # other cuts
    packed = updated_weights(
        tiny_model_dir,
        batch,
        padding_free=True,
        dynamic_batching=True,
        max_token_len_per_device_for_update=budget,
        max_token_len_per_device_for_experience=budget,
    )
    assert padded["grad_norm"] > 0 and padded["gradient"].abs().max() > 1e-3
    for key in padded:
        torch.testing.assert_close(packed[key], padded[key], atol=ATOL, rtol=0)


def test_reference_worker_follows_the_actors_layout(tiny_model_dir, tok):
    batch = skewed_batch(tok, rows=8)
    actor = ActorConfig(model=ModelConfig(model_path=str(tiny_model_dir)))
    temperature = batch.meta["temperature"]
    padded = RefWorker(
        actor, RefConfig(micro_batch_size_per_device_for_experience=3), temperature=temperature
    )
    actor_pf = ActorConfig(
        model=ModelConfig(model_path=str(tiny_model_dir)), padding_free=True, dynamic_batching=True
    )
    packed = RefWorker(
        actor_pf, RefConfig(max_token_len_per_device_for_experience=60), temperature=temperature
    )
    assert packed.micro_batching.max_tokens == 60 and packed.padding_free
    a = padded.compute_ref_logprobs(Batch(dict(batch.columns), batch.meta))["ref_logprobs"]
    b = packed.compute_ref_logprobs(Batch(dict(batch.columns), batch.meta))["ref_logprobs"]
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(b[mask], a[mask], atol=ATOL, rtol=0)


def critic_after_update(tiny_model_dir, batch: Batch, **critic) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, the gradient of one update) of a critic with a random value head."""
    cfg = CriticConfig(optim=OptimConfig(lr=1e-2), micro_batch_size_per_device_for_update=2, **critic)
    worker = CriticWorker(cfg, str(tiny_model_dir), total_steps=5)
    torch.manual_seed(0)
    with torch.no_grad():
        worker.model.score.weight.normal_()
    values = worker.compute_values(Batch(dict(batch.columns), batch.meta))["values"]
    rows = Batch(dict(batch.columns), batch.meta).update({"values": values, "returns": batch["advantages"]})
    grads = recording_gradients(worker)
    worker.update(rows, mini_batch_size=len(rows))
    return values, grads[0]


def test_a_padding_free_dynamically_batched_critic_equals_the_padded_critic(tiny_model_dir, tok):
    batch = skewed_batch(tok, rows=8)
    values, gradient = critic_after_update(tiny_model_dir, batch)
    packed_values, packed_gradient = critic_after_update(
        tiny_model_dir,
        batch,
        padding_free=True,
        dynamic_batching=True,
        max_token_len_per_device_for_update=60,
        max_token_len_per_device_for_experience=60,
    )
    assert (values != 0).any() and gradient.abs().max() > 1e-3
    torch.testing.assert_close(packed_values, values, atol=ATOL, rtol=0)
    torch.testing.assert_close(packed_gradient, gradient, atol=ATOL, rtol=0)


def test_a_padding_free_dynamically_batched_vlm_update_equals_the_padded_update():
    """The policy worker's update of the built-in Qwen2.5-VL on rows with 0, 1 and 2 images (twice each)."""
    path = resolve_model_path(BUILTIN_VISION_MODEL)
    model, proc = load_causal_lm(path), load_processor(path)
    inputs = vl_batch(model, proc)
    rows = [0, 1, 2, 2, 1, 0]
    g = torch.Generator().manual_seed(0)
    response = inputs["response_mask"][rows]
    batch = Batch(
        {
            "input_ids": inputs["input_ids"][rows],
            "attention_mask": inputs["attention_mask"][rows],
            "response_mask": response,
            "pixel_values": [inputs["pixel_values"][r] for r in rows],
            "image_grid_thw": [inputs["image_grid_thw"][r] for r in rows],
            "old_logprobs": -torch.rand(response.shape, generator=g) * response,
            "advantages": torch.randn(len(rows), 1, generator=g) * response,
        },
        {"temperature": 1.0},
    )
    budget = int(batch["attention_mask"].sum(-1).max()) + 5  # rows of 2 images alone, the others paired
    padded = updated_weights(path, batch)
    packed = updated_weights(
        path,
        batch,
        padding_free=True,
        dynamic_batching=True,
        max_token_len_per_device_for_update=budget,
        max_token_len_per_device_for_experience=budget,
    )
    assert padded["gradient"].abs().max() > 1e-3
    for key in padded:
        torch.testing.assert_close(packed[key], padded[key], atol=ATOL, rtol=0)
