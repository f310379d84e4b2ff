"""Data-parallel training: FSDP2 over 2 gloo ranks on CPU gives the one-process step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ranks import run_ranks

from rlstack.batch import Batch
from rlstack.config import ActorConfig, AlgorithmConfig, FSDPConfig, OptimConfig
from rlstack.workers.group import gather_rows, split_mini_batches, split_rows

ROWS, PROMPT, RESPONSE = 8, 6, 8


def uneven_batch(vocab: int, second_half_shares: bool = True) -> Batch:
    """4 prompts x 2 samples, left-padded prompts of 3-6 tokens; the first half of the rows (rank 0's
    share with 2 ranks) has long responses, the second half 1-2 tokens. Without `second_half_shares` the
    rows of the second half have prompts of their own."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (ROWS, PROMPT + RESPONSE), generator=g)
    attn = torch.zeros(ROWS, PROMPT + RESPONSE, dtype=torch.long)
    resp = torch.zeros_like(attn)
    lengths = [8, 7, 8, 6, 1, 2, 1, 2]
    for i in range(ROWS):
        p = 3 + (i // 2) % 4
        shares = i % 2 and (second_half_shares or i < ROWS // 2)
        ids[i] = ids[i - 1] if shares else ids[i]  # the two samples of a prompt share it ...
        attn[i, PROMPT - p : PROMPT + lengths[i]] = 1
        resp[i, PROMPT : PROMPT + lengths[i]] = 1
    ids[1::2, PROMPT:] = torch.randint(3, vocab, (ROWS // 2, RESPONSE), generator=g)  # ... not the response
    ids = torch.where(attn.bool(), ids, 0)
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": attn,
            "response_mask": resp,
            "advantages": torch.randn(ROWS, 1, generator=g).expand(-1, PROMPT + RESPONSE) * resp,
            "old_logprobs": -2.0 - torch.rand(ROWS, PROMPT + RESPONSE, generator=g) * resp,
        }
    )


def one_update(model_dir: str, agg_mode: str, batch: Batch, mini_batch_size: int, **layout) -> dict:
    """One optimizer step of a fresh policy worker on `batch`: its metrics and whole updated weights."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # as the ranks run (tests/helpers/ranks.py): the same rounding alone or in the suite
    try:
        return _one_update(model_dir, agg_mode, batch, mini_batch_size, **layout)
    finally:
        torch.set_num_threads(threads)


def _one_update(model_dir: str, agg_mode: str, batch: Batch, mini_batch_size: int, **layout) -> dict:
    from rlstack.workers import distributed
    from rlstack.workers.policy import PolicyWorker

    actor = ActorConfig(micro_batch_size_per_device_for_update=2, loss_agg_mode=agg_mode, **layout)
    actor.model.model_path = model_dir
    # Adam's first step moves every weight by about lr, 50x the tolerance; a larger lr magnifies the
    # float noise of gradients near Adam's eps (g ~ 1e-9) past it.
    actor.optim.lr = 5e-4
    worker = PolicyWorker(actor, AlgorithmConfig(), RESPONSE, total_steps=1, seed=1)
    metrics = worker.update(batch, mini_batch_size)
    weights = {k: v.clone() for k, v in distributed.full_state_dict(worker.model)}
    offloaded = distributed.sharded() and all(
        type(m._get_fsdp_state()._fsdp_param_group.offload_policy).__name__ == "CPUOffloadPolicy"
        for m in worker.model.modules()
        if hasattr(m, "_get_fsdp_state") and m._get_fsdp_state()._fsdp_param_group is not None
    )
    fused = bool(worker.optimizer.param_groups[0].get("fused"))
    return {
        "metrics": metrics,
        "weights": weights,
        "sharded": distributed.sharded(),
        "offloaded": offloaded,
        "fused": fused,
        "moments": {str(s["exp_avg"].dtype) for s in worker.optimizer.state.values()},
    }


def ranks_update(model_dir: str, agg_mode: str, parts: list[Batch], mini_per_rank: int, layout: dict) -> dict:
    from rlstack.workers import distributed

    return one_update(model_dir, agg_mode, parts[distributed.current().rank], mini_per_rank, **layout)


PACKED = {"padding_free": True, "dynamic_batching": True, "max_token_len_per_device_for_update": 14}
"""Rank 0's long rows (10-12 tokens) take a pass each, rank 1's short ones (6-8) fit two to a pass: rank 1
must cut its passes to rank 0's count, or FSDP2's collectives hang."""


@pytest.mark.parametrize(
    ("agg_mode", "layout"),
    [
        ("token-mean", {}),
        ("seq-mean-token-mean", {}),
        ("seq-mean-token-sum-norm", {}),
        ("token-mean", PACKED),
        ("token-mean", {"fsdp": FSDPConfig(offload_params=True)}),
        # EasyR1's adamw_bf16 on the shards: its first step is AdamW's (the moments are rounded when kept)
        ("token-mean", {"optim": OptimConfig(strategy="adamw_bf16")}),
    ],
    ids=[
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
        "padding-free-dynamic",
        "cpu-offload",
        "adamw-bf16-moments",
    ],
)
@pytest.mark.timeout(180)
def test_two_rank_fsdp2_step_equals_one_process(
    tiny_model_dir: Path, tok, tmp_path: Path, agg_mode: str, layout: dict
):
    batch = uneven_batch(len(tok))
    single = one_update(str(tiny_model_dir), agg_mode, batch, ROWS)  # padded, one process: the reference
    assert not single["sharded"]
    assert single["fused"]  # one process: AdamW's fused kernel; sharded parameters take the default one

    parts, mini_per_rank = split_mini_batches(batch, ROWS, world_size=2)
    assert [p["response_mask"].sum().item() for p in parts] == [29, 6]  # uneven on purpose
    ranks = run_ranks(
        2, ranks_update, str(tiny_model_dir), agg_mode, parts, mini_per_rank, layout, tmp=tmp_path
    )

    assert all(r["sharded"] and not r["fused"] for r in ranks)
    assert all(r["offloaded"] == ("fsdp" in layout) for r in ranks)
    moments = "torch.bfloat16" if "optim" in layout else "torch.float32"
    assert all(r["moments"] == {moments} for r in ranks) and single["moments"] == {"torch.float32"}
    for r in ranks:
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/pg_clipfrac"):
            assert r["metrics"][key] == pytest.approx(single["metrics"][key], abs=1e-5), key
        assert r["weights"].keys() == single["weights"].keys()
        moved = 0.0
        for name, w in single["weights"].items():
            torch.testing.assert_close(r["weights"][name], w, atol=1e-5, rtol=0)
            moved = max(moved, float((w - load_initial(tiny_model_dir)[name]).abs().max()))
        assert moved > 2.5e-4  # the step changed the weights by far more than the tolerance


@pytest.mark.timeout(180)
def test_ranks_make_the_same_passes_when_only_one_has_prompts_to_share(
    tiny_model_dir: Path, tok, tmp_path: Path
):
    """Rank 0's micro-batches hold two samples of one prompt, rank 1's two prompts: rank 1 runs the prompt
    and response passes too (FSDP2 gathers weights in every pass: a rank making fewer would hang the step)."""
    batch = uneven_batch(len(tok), second_half_shares=False)
    single = one_update(str(tiny_model_dir), "token-mean", batch, ROWS)
    parts, mini_per_rank = split_mini_batches(batch, ROWS, world_size=2)
    ranks = run_ranks(
        2, ranks_update, str(tiny_model_dir), "token-mean", parts, mini_per_rank, {}, tmp=tmp_path
    )
    for r in ranks:
        assert r["metrics"]["actor/pg_loss"] == pytest.approx(single["metrics"]["actor/pg_loss"], abs=1e-5)
        assert r["metrics"]["actor/grad_norm"] == pytest.approx(
            single["metrics"]["actor/grad_norm"], abs=1e-5
        )
        for name, w in single["weights"].items():
            torch.testing.assert_close(r["weights"][name], w, atol=1e-5, rtol=0)


_INITIAL: dict[str, dict[str, torch.Tensor]] = {}


def load_initial(model_dir: Path) -> dict[str, torch.Tensor]:
    from rlstack.models.loading import load_causal_lm

    if str(model_dir) not in _INITIAL:
        _INITIAL[str(model_dir)] = load_causal_lm(str(model_dir)).state_dict()
    return _INITIAL[str(model_dir)]


def test_split_rows_pads_and_gathers_in_order():
    b = Batch({"x": torch.arange(5)})
    parts, padding = split_rows(b, 2)
    assert [p["x"].tolist() for p in parts] == [[0, 1, 2], [3, 4, 4]] and padding == 1
    assert gather_rows(parts, padding, 6)["x"].tolist() == [0, 1, 2, 3, 4]
    # a method that returns 2 rows per input row (generation with n=2) drops 2 per padding row
    doubled = [p.repeat_interleave(2) for p in parts]
    assert gather_rows(doubled, padding, 6)["x"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_split_mini_batches_gives_each_rank_its_part_of_every_mini_batch():
    b = Batch({"x": torch.arange(10), "response_mask": torch.ones(10, 3, dtype=torch.long)})
    parts, per_rank = split_mini_batches(b, 4, 2)  # mini-batches [0..3], [4..7], [8, 9]
    assert per_rank == 2
    assert [p["x"].tolist() for p in parts] == [[0, 1, 4, 5, 8], [2, 3, 6, 7, 9]]
    parts, per_rank = split_mini_batches(b, 5, 3)  # 5 rows in 3 parts of 2: one padding row each
    assert per_rank == 2
    assert [p["x"].tolist() for p in parts] == [[0, 1, 5, 6], [2, 3, 7, 8], [4, 4, 9, 9]]
    assert parts[2]["response_mask"].sum(-1).tolist() == [3, 0, 3, 0]  # padding adds no tokens


def ranks_diverge(model_dir: str, parts: list[Batch], mini_per_rank: int) -> str:
    from rlstack.errors import TrainingDiverged
    from rlstack.workers import distributed

    try:
        one_update(model_dir, "token-mean", parts[distributed.current().rank], mini_per_rank)
    except TrainingDiverged as e:
        return str(e)
    return "no error"


@pytest.mark.timeout(120)
def test_a_non_finite_loss_on_one_rank_stops_every_rank_without_a_hang(
    tiny_model_dir: Path, tok, tmp_path: Path
):
    batch = uneven_batch(len(tok))
    batch["advantages"][6, PROMPT] = float("nan")  # a row of rank 1's share
    parts, mini_per_rank = split_mini_batches(batch, ROWS, world_size=2)
    messages = run_ranks(2, ranks_diverge, str(tiny_model_dir), parts, mini_per_rank, tmp=tmp_path)
    for m in messages:
        assert "the actor loss became nan at step 1 (on rank 1 of 2)" in m


def ranks_gather(bucket_bytes: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from rlstack.workers import distributed

    torch.manual_seed(0)  # the same weights on every rank before sharding
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 5), torch.nn.Linear(5, 3), torch.nn.Linear(3, 1, bias=False)
    )
    whole = {k: v.clone() for k, v in model.state_dict().items()}
    model.half_ = torch.nn.Linear(2, 7).to(torch.float64)  # another dtype: its own bucket
    whole |= {f"half_.{k}": v.clone() for k, v in model.half_.state_dict().items()}
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    return {"whole": whole, "gathered": dict(distributed.full_state_dict(model, bucket_bytes))}


@pytest.mark.parametrize("bucket_bytes", [1, 2**20])  # a bucket per tensor; one bucket per dtype
def test_bucketed_gather_gives_the_whole_tensors(tmp_path: Path, bucket_bytes: int):
    for r in run_ranks(2, ranks_gather, bucket_bytes, tmp=tmp_path):
        assert r["gathered"].keys() == r["whole"].keys()
        for name, w in r["whole"].items():  # rows 5, 3, 1, 7: uneven and empty shards on rank 1
            assert torch.equal(r["gathered"][name], w), name


def vision_batch(vl_dir: str) -> Batch:
    """4 rows of the tiny Qwen2.5-VL: two prompts with an image (rank 0's half with 2 ranks), then two
    without (rank 1's), each with a 4-token response."""
    from PIL import Image

    from rlstack.models.loading import load_processor
    from rlstack.models.vision import encode_prompt

    proc = load_processor(vl_dir)
    g = torch.Generator().manual_seed(0)
    image = Image.fromarray(torch.randint(0, 256, (56, 56, 3), generator=g, dtype=torch.uint8).numpy())
    prompts = [
        encode_prompt(proc, [{"role": "user", "content": "<image>What is 1+1?"}], [image], "row 0"),
        encode_prompt(proc, [{"role": "user", "content": "<image>What is 2+2?"}], [image], "row 1"),
        encode_prompt(proc, [{"role": "user", "content": "What is 3+3?"}], [], "row 2"),
        encode_prompt(proc, [{"role": "user", "content": "What is 4+4?"}], [], "row 3"),
    ]
    P, R = max(len(p.input_ids) for p in prompts), 4
    ids = torch.full((4, P + R), proc.tokenizer.pad_token_id)
    attn = torch.zeros(4, P + R, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p.input_ids) : P] = p.input_ids
        ids[i, P:] = torch.randint(3, 40, (R,), generator=g)  # characters: never a vision token
        attn[i, P - len(p.input_ids) :] = 1
    resp = torch.zeros_like(attn)
    resp[:, P:] = 1
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": attn,
            "response_mask": resp,
            "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * resp,
            "old_logprobs": -4.0 * resp.float(),
            "pixel_values": [p.pixel_values for p in prompts],
            "image_grid_thw": [p.image_grid_thw for p in prompts],
        }
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("rows", [[0, 1, 2, 3], [2, 3, 3, 2]], ids=["images-on-rank-0", "no-images"])
def test_a_rank_without_images_runs_the_vision_tower_with_the_others(tmp_path: Path, rows: list[int]):
    """Rank 0's rows have images, rank 1's none: FSDP2 gathers and reduces the vision blocks' weights in
    each pass, so rank 1 runs the tower too (on a blank image, adding nothing); the step is the
    one-process step (without this, rank 1's collectives paired with the wrong blocks'). With no image on
    any rank the tower is left alone, as in one process (its blank-image gradients would still let
    AdamW's weight decay move it)."""
    from rlstack.models.loading import BUILTIN_VISION_MODEL, resolve_model_path

    vl_dir = str(resolve_model_path(BUILTIN_VISION_MODEL))
    batch = vision_batch(vl_dir).select(rows)
    single = one_update(vl_dir, "token-mean", batch, 4)
    parts, mini_per_rank = split_mini_batches(batch, 4, world_size=2)
    images = [sum(len(g) for g in p["image_grid_thw"]) for p in parts]
    assert images == ([2, 0] if rows[0] == 0 else [0, 0])
    ranks = run_ranks(2, ranks_update, vl_dir, "token-mean", parts, mini_per_rank, {}, tmp=tmp_path)
    for r in ranks:
        assert r["sharded"]
        assert r["metrics"]["actor/pg_loss"] == pytest.approx(single["metrics"]["actor/pg_loss"], abs=1e-5)
        for name, w in single["weights"].items():
            torch.testing.assert_close(r["weights"][name], w, atol=1e-5, rtol=0, msg=name)
    initial = load_initial(Path(vl_dir))
    visual = [n for n in single["weights"] if ".visual." in n]
    trained = [n for n in visual if not torch.equal(single["weights"][n], initial[n])]
    assert visual and (trained if images[0] else not trained)  # images train the tower, else it stays
    if not images[0]:
        assert all(torch.equal(r["weights"][n], initial[n]) for r in ranks for n in visual)


def bf16_update(model_dir: str, parts: list[Batch] | None, batch: Batch | None, mini_batch_size: int) -> dict:
    """One step at lr 1e-6 of a policy loaded in bfloat16 (this rank's part, or the whole `batch` in one
    process): its metrics, parameter dtypes and how many weights the step changed."""
    from rlstack.workers import distributed
    from rlstack.workers.policy import PolicyWorker

    torch.manual_seed(0)
    actor = ActorConfig(micro_batch_size_per_device_for_update=2, loss_agg_mode="token-mean")
    actor.model.model_path = model_dir
    actor.model.dtype = "bfloat16"
    actor.optim.lr = 1e-6
    worker = PolicyWorker(actor, AlgorithmConfig(), RESPONSE, total_steps=1, seed=1)
    # one process: the float32 masters of MasterAdamW; several ranks: FSDP2's float32 shards
    masters = getattr(worker.optimizer, "masters", None)
    weights = masters if masters is not None else [distributed.local(p) for p in worker.model.parameters()]
    before = [w.detach().clone() for w in weights]
    own = parts[distributed.current().rank] if parts is not None else batch
    metrics = worker.update(own, mini_batch_size)
    moved = distributed.all_reduce_sum(
        torch.tensor([sum(int((w != b).sum()) for w, b in zip(weights, before))])
    )
    total = distributed.all_reduce_sum(torch.tensor([sum(w.numel() for w in weights)]))
    return {
        "metrics": metrics,
        "dtypes": {str(w.dtype) for w in weights} | {str(p.dtype) for p in worker.model.parameters()},
        "moved": int(moved),
        "weights": int(total),
    }


@pytest.mark.timeout(180)
def test_a_bfloat16_policy_on_two_ranks_keeps_float32_shards_and_takes_small_steps(
    tiny_model_dir: Path, tok, tmp_path: Path
):
    """FSDP2 shards a model loaded in bfloat16 in float32 and computes in bfloat16: a step at lr 1e-6 (far
    below bfloat16's spacing) moves the shards, as MasterAdamW's float32 masters in one process, with the
    one-process loss (both compute in bfloat16)."""
    batch = uneven_batch(len(tok))
    single = bf16_update(str(tiny_model_dir), None, batch, ROWS)
    parts, mini_per_rank = split_mini_batches(batch, ROWS, world_size=2)
    ranks = run_ranks(2, bf16_update, str(tiny_model_dir), parts, None, mini_per_rank, tmp=tmp_path)
    assert single["dtypes"] == {"torch.bfloat16", "torch.float32"}  # parameters, masters
    for r in ranks + [single]:
        assert r["moved"] > 0.99 * r["weights"], (r["moved"], r["weights"])
    for r in ranks:
        assert r["dtypes"] == {"torch.float32"}  # the shards; FSDP2 casts them to bfloat16 for compute
        assert r["metrics"]["actor/pg_loss"] == pytest.approx(single["metrics"]["actor/pg_loss"], abs=1e-3)
        assert r["metrics"]["actor/grad_norm"] == pytest.approx(
            single["metrics"]["actor/grad_norm"], rel=2e-2
        )


@pytest.mark.parametrize("layout", [{}, PACKED], ids=["padded", "padding-free-dynamic"])
@pytest.mark.timeout(180)
def test_two_ranks_skipping_zero_advantage_rows_step_as_one_process_with_every_row(
    tiny_model_dir: Path, tok, tmp_path: Path, layout: dict
):
    """worker.actor.skip_zero_advantage over FSDP2: rank 1's rows all have advantage 0 and rank 0 keeps
    three of its four. The ranks must still make the same passes (rank 1 runs filler rows) and the step
    is the one process's over every row."""
    batch = uneven_batch(len(tok))
    zeroed = torch.tensor([1, 0, 0, 0, 1, 1, 1, 1], dtype=torch.bool)
    batch = Batch({**batch.columns, "advantages": batch["advantages"] * ~zeroed[:, None]})
    single = one_update(str(tiny_model_dir), "token-mean", batch, ROWS)
    parts, mini_per_rank = split_mini_batches(batch, ROWS, world_size=2)
    assert [int(p["advantages"].ne(0).any(-1).sum()) for p in parts] == [3, 0]
    skip = {**layout, "skip_zero_advantage": True}
    ranks = run_ranks(
        2, ranks_update, str(tiny_model_dir), "token-mean", parts, mini_per_rank, skip, tmp=tmp_path
    )
    for r in ranks:
        assert r["metrics"]["actor/skipped_tokens"] > 0
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert r["metrics"][key] == pytest.approx(single["metrics"][key], abs=1e-5), key
        for name, w in single["weights"].items():
            torch.testing.assert_close(r["weights"][name], w, atol=1e-5, rtol=0)
