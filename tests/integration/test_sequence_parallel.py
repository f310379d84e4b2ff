"""Sequence parallelism (Ulysses, `worker.actor.ulysses_size`): 2 gloo ranks that split each packed
sequence give the one-process log-probs, entropies, gradients and optimizer step."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from prefix_batches import make_batch
from ranks import run_ranks

from rlstack.batch import Batch
from rlstack.models.loading import load_causal_lm, write_model_dir
from rlstack.models.logprobs import forward_logprobs
from rlstack.workers.group import Dispatch, invoke, remote
from rlstack.workers.ray_group import RayRoleGroup

ATOL = 1e-5
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def sp_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 whose 4 query and 2 key/value heads split over 2 ranks."""
    return write_model_dir(
        tmp_path_factory.mktemp("models") / "sp", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2
    )


def text_inputs(vocab: int) -> dict[str, torch.Tensor]:
    """Left-padded prompts shared by some rows, responses of 2..7 tokens: 51 attended tokens, which 2 ranks
    split only after one token of padding."""
    ids, mask, positions, response = make_batch(vocab, [(5, 2), (9, 1), (3, 2)], P=9, R=7, seed=1)
    assert int(mask.sum()) % 2 == 1
    return dict(input_ids=ids, attention_mask=mask, position_ids=positions, response_mask=response)


def logprobs_and_grads(
    model_dir: str, inputs: dict, sequence_parallel: bool, checkpointing: bool = False
) -> dict:
    """Log-probs, entropies and the gradient of a loss of both (token mean of log-probs plus an entropy term)
    in a padding-free pass, split across the process group's ranks with `sequence_parallel`; `checkpointing`:
    the layers recompute their activations in the backward pass (which must split the sequence again)."""
    from rlstack.workers import distributed

    group = distributed.sequence_group(distributed.current().world_size) if sequence_parallel else None
    model = load_causal_lm(model_dir, sequence_parallel=sequence_parallel)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    seen = []  # the tokens each decoder layer works on
    model.get_decoder().layers[0].register_forward_hook(lambda m, args, out: seen.append(args[0].shape[1]))
    logp, ent = forward_logprobs(
        model,
        **inputs,
        temperature=TEMPERATURE,
        with_entropy=True,
        entropy_grad=True,
        padding_free=True,
        sequence_group=group,
    )
    mask = inputs["response_mask"].float()
    ((logp * mask).sum() / mask.sum() + 0.1 * (ent * mask).sum() / mask.sum()).backward()
    return {
        "logp": logp.detach(),
        "ent": ent.detach(),
        "grads": {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
        "layer_tokens": seen,
    }


@pytest.mark.parametrize(
    "checkpointing",
    [False, True],
    ids=["plain", "gradient-checkpointing"],
)
@pytest.mark.timeout(180)
def test_two_sequence_parallel_ranks_give_one_process_logprobs_and_gradients(
    sp_model_dir, tmp_path, checkpointing
):
    inputs = text_inputs(load_causal_lm(str(sp_model_dir)).config.vocab_size)
    single = logprobs_and_grads(str(sp_model_dir), inputs, sequence_parallel=False)
    ranks = run_ranks(2, logprobs_and_grads, str(sp_model_dir), inputs, True, checkpointing, tmp=tmp_path)

    mask = inputs["response_mask"].bool()
    for r in ranks:  # every rank of the group holds every row's values
        torch.testing.assert_close(r["logp"], single["logp"], atol=ATOL, rtol=0)
        torch.testing.assert_close(r["ent"], single["ent"], atol=ATOL, rtol=0)
        assert (r["logp"][~mask] == 0).all()
    for name, g in single["grads"].items():  # each rank's gradient is that of its slice: they add up
        assert g.abs().max() > 0, name
        torch.testing.assert_close(ranks[0]["grads"][name] + ranks[1]["grads"][name], g, atol=ATOL, rtol=0)
    assert single["layer_tokens"] == [51]
    assert [r["layer_tokens"] for r in ranks] == [[26], [26]]  # 51 tokens and one of padding, in halves
    q = "model.layers.0.self_attn.q_proj.weight"
    assert all(
        (r["grads"][q] - single["grads"][q]).abs().max() > 0.1 * single["grads"][q].abs().max() for r in ranks
    )


@pytest.mark.timeout(240)
def test_m_rope_rows_with_images_split_across_ranks(tmp_path):
    """A Qwen2.5-VL batch (rows with 0, 1 and 2 images, M-RoPE positions): the ranks embed the whole sequence
    with its images and M-RoPE positions, then split it; the log-probs and gradients are the one process's."""
    from test_padding_free import vl_batch

    from rlstack.models.loading import BUILTIN_VISION_MODEL, load_processor, resolve_model_path

    path = resolve_model_path(BUILTIN_VISION_MODEL)
    inputs = vl_batch(load_causal_lm(path), load_processor(path))
    assert inputs["position_ids"].dim() == 3 and sum(len(g) for g in inputs["image_grid_thw"]) == 3
    single = logprobs_and_grads(path, inputs, sequence_parallel=False)
    ranks = run_ranks(2, logprobs_and_grads, path, inputs, True, tmp=tmp_path)

    tokens = int(inputs["attention_mask"].sum())
    assert [r["layer_tokens"] for r in ranks] == [[-(-tokens // 2)]] * 2
    for r in ranks:
        torch.testing.assert_close(r["logp"], single["logp"], atol=ATOL, rtol=0)
        torch.testing.assert_close(r["ent"], single["ent"], atol=ATOL, rtol=0)
    for name, g in single["grads"].items():  # the vision tower's included
        if g is None:
            continue
        torch.testing.assert_close(ranks[0]["grads"][name] + ranks[1]["grads"][name], g, atol=ATOL, rtol=0)
    assert any(name.startswith("model.visual") and g.abs().max() > 0 for name, g in single["grads"].items())


def sequence_parallel_update(model_dir: str, agg_mode: str, batch, mini_batch_size: int) -> dict:
    """`one_update` with the policy's sequence split over every rank (FSDP2-sharded over them too)."""
    from test_distributed import one_update

    return one_update(model_dir, agg_mode, batch, mini_batch_size, padding_free=True, ulysses_size=2)


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.timeout(180)
def test_two_sequence_parallel_ranks_make_the_one_process_step(sp_model_dir, tmp_path, agg_mode):
    """Both ranks hold every row (one data-parallel group of 2): the token and sequence counts the loss is
    divided by are counted once, not once per rank, and the metrics too."""
    from test_distributed import ROWS, load_initial, one_update, uneven_batch

    batch = uneven_batch(load_causal_lm(str(sp_model_dir)).config.vocab_size)
    single = one_update(str(sp_model_dir), agg_mode, batch, ROWS)  # padded, one process: the reference
    ranks = run_ranks(2, sequence_parallel_update, str(sp_model_dir), agg_mode, batch, ROWS, tmp=tmp_path)

    assert all(r["sharded"] for r in ranks)
    for r in ranks:
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/pg_clipfrac"):
            assert r["metrics"][key] == pytest.approx(single["metrics"][key], abs=ATOL), key
        moved = 0.0
        for name, w in single["weights"].items():
            torch.testing.assert_close(r["weights"][name], w, atol=ATOL, rtol=0)
            moved = max(moved, float((w - load_initial(sp_model_dir)[name]).abs().max()))
        assert moved > 2.5e-4  # the step changed the weights by far more than the tolerance


class RowsSeen:
    """A worker that says which rows it was given."""

    def __init__(self, rank: int):
        self.rank = rank

    @remote(Dispatch.ROWS)
    def mark(self, batch: Batch) -> Batch:
        return batch.update({"rank": torch.full((len(batch),), self.rank)})

    @remote(Dispatch.MINI_BATCHES)
    def update(self, batch: Batch, mini_batch_size: int) -> dict:
        return {"rows": batch["x"].tolist(), "mini_batch_size": mini_batch_size, "rank": self.rank}


class InProcessHost:
    """A rank actor's `call.remote`, run at once in this process."""

    def __init__(self, worker, log: list):
        self.call = SimpleNamespace(
            remote=lambda role, method, *a, **kw: log.append(invoke(worker, method, a, kw)) or log[-1]
        )


def test_ray_dispatch_gives_each_sequence_group_the_same_rows():
    """4 ranks in sequence groups of 2: the rows split over the 2 groups, both ranks of a group get them, and
    the first rank of each answers."""
    log: list = []
    hosts = [InProcessHost(RowsSeen(r), log) for r in range(4)]
    cluster = SimpleNamespace(get=lambda refs, who: refs)
    group = RayRoleGroup(cluster, "actor", RowsSeen, hosts, replicas=2)
    batch = Batch({"x": torch.arange(6), "response_mask": torch.ones(6, 2)})
    assert group.call("mark", batch)["rank"].tolist() == [0, 0, 0, 2, 2, 2]
    assert [list(e) for e in log] == [["rank"]] * 4  # every rank ran it on its group's rows
    assert group.call("update", batch, 4)["rows"] == [0, 1, 4]  # rank 0's part of each mini-batch
    assert [e["rows"] for e in log[4:]] == [[0, 1, 4], [0, 1, 4], [2, 3, 5], [2, 3, 5]]


def critic_steps(model_dir: str, batch, ulysses_size: int) -> dict:
    """A fresh critic's values of `batch` before and after an update of two optimizer steps (the first moves
    only the new value head, which starts at zero; the second the whole model), its metrics and weights."""
    from rlstack.config import CriticConfig, OptimConfig
    from rlstack.workers import distributed
    from rlstack.workers.critic import CriticWorker

    torch.manual_seed(0)
    cfg = CriticConfig(
        optim=OptimConfig(lr=5e-4), micro_batch_size_per_device_for_update=2, padding_free=ulysses_size > 1
    )
    critic = CriticWorker(cfg, model_dir, total_steps=1, ulysses_size=ulysses_size)
    seen = []  # the tokens each pass's first decoder layer works on
    critic.model.get_decoder().layers[0].register_forward_hook(lambda m, a, out: seen.append(a[0].shape[1]))
    before = critic.compute_values(Batch(dict(batch.columns)))["values"]
    metrics = critic.update(batch.update({"values": before}), 4)
    after = critic.compute_values(Batch(dict(batch.columns)))["values"]
    weights = {k: v.clone() for k, v in distributed.full_state_dict(critic.model)}
    return {"before": before, "after": after, "metrics": metrics, "weights": weights, "layer_tokens": seen}


@pytest.mark.timeout(180)
def test_two_sequence_parallel_ranks_give_the_one_process_critic(sp_model_dir, tmp_path):
    from test_distributed import uneven_batch

    batch = uneven_batch(load_causal_lm(str(sp_model_dir)).config.vocab_size)
    g = torch.Generator().manual_seed(5)
    batch["returns"] = torch.randn(batch["response_mask"].shape, generator=g) * batch["response_mask"]
    single = critic_steps(str(sp_model_dir), batch, 1)  # padded, one process
    ranks = run_ranks(2, critic_steps, str(sp_model_dir), batch, 2, tmp=tmp_path)

    tokens = int(batch["attention_mask"].sum())  # the value pass takes every row in one pass
    assert [r["layer_tokens"][0] for r in ranks] == [-(-tokens // 2)] * 2
    for r in ranks:
        torch.testing.assert_close(r["before"], single["before"], atol=ATOL, rtol=0)
        torch.testing.assert_close(r["after"], single["after"], atol=ATOL, rtol=0)
        for key in ("critic/vf_loss", "critic/grad_norm", "critic/vf_clipfrac"):
            assert r["metrics"][key] == pytest.approx(single["metrics"][key], abs=ATOL), key
        for name, w in single["weights"].items():
            torch.testing.assert_close(r["weights"][name], w, atol=ATOL, rtol=0)
    assert (single["after"] - single["before"]).abs().max() > 1e-3  # the update moved the values
