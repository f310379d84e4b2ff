"""Padding-free, dynamically batched micro-batches against padded ones (throughput), and LoRA against full
training (peak memory), side by side.

1. `padded` vs `packed`: one training step's model work on a batch with skewed response lengths, as
   GRPO makes them: 8 prompts x 8 samples, prompts of 24-64 tokens, most responses 8-48 tokens and one
   in eight 384 tokens. Each round computes the old log-probs and entropies (`compute_logprobs`, no
   gradient) and runs one optimizer step over the whole batch (`update`), on the trainer's policy
   worker, on the tiny Qwen2 (hidden 128, 3 layers).
   - `padded`: micro-batches of a row count (16 rows for log-probs, 8 for the update), every row at
     the batch's full width, prompts shared between a prompt's samples;
   - `packed`: `worker.actor.padding_free=true`, `worker.actor.dynamic_batching=true`: micro-batches
     of at most `--max-tokens` attended tokens, laid end to end without padding. On CPU, SDPA attends
     over a packed micro-batch with a dense tokens x tokens mask, so its attention grows with the
     square of the budget: 1024 (two of the longest rows) is the default here.
   Tokens/s counts attended (prompt and response) tokens, the work both sides must do.
2. `full` vs `lora` vs `checkpointing`: the same rounds on a bigger random Qwen2 (hidden 768, 8
   layers, about 60M parameters) and a smaller batch (4 prompts x 4 samples, responses of 8-48
   tokens): every weight trained; LoRA adapters of rank 16 on every linear layer
   (`worker.actor.model.lora.rank=16`); every weight trained with activation checkpointing
   (`worker.actor.model.enable_gradient_checkpointing=true`). Reported: the peak resident memory of
   the process over the timed rounds (`perf/max_rss_gb`: on CPU, weights, gradients and AdamW's two
   moments all live there) and the time of a round.

Each side runs in its own process (order A, B, B, A; A, B, C, C, B, A) with `--threads` torch threads;
1 warm-up round, then `--rounds` timed rounds per process.

    python bench/bench_memory.py               # writes bench/results/memory.json
    python bench/bench_memory.py --only packing
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from sides import run_sides

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "memory.json"
PARTS = {"packing": ("padded", "packed"), "memory": ("full", "lora", "checkpointing")}
SIDES = tuple(side for sides in PARTS.values() for side in sides)
BIG = {"hidden_size": 768, "num_layers": 8, "num_heads": 12, "num_kv_heads": 4}
"""The model of the LoRA comparison: about 60M parameters, so that weights and optimizer state show."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=SIDES, help="run one side only (internal)")
    p.add_argument("--only", choices=sorted(PARTS), help="one part only: packing or memory")
    p.add_argument("--model-dir", help="tiny model directory (internal)")
    p.add_argument("--json-out", help="where a single side writes its result (internal)")
    p.add_argument("--rounds", type=int, default=4, help="timed rounds per process")
    p.add_argument("--max-tokens", type=int, default=1024, help="token budget of a packed micro-batch")
    p.add_argument("--long", type=int, default=384, help="length of the long responses")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--output", default=str(RESULTS))
    return p.parse_args(argv)


def skewed_batch(vocab: int, long: int | None, prompts: int = 8, n: int = 8, seed: int = 0):
    """Left-padded prompts, right-padded responses: most short, every eighth `long` tokens (none: all short)."""
    import torch

    from rlstack.batch import Batch

    g = torch.Generator().manual_seed(seed)
    P = 64
    rows = []
    for p in range(prompts):
        plen = int(torch.randint(24, P + 1, (), generator=g))
        prompt = torch.randint(3, vocab, (plen,), generator=g)
        for s in range(n):
            r = long if long and (p * n + s) % 8 == 3 else int(torch.randint(8, 49, (), generator=g))
            rows.append((prompt, torch.randint(3, vocab, (r,), generator=g)))
    T = P + max(len(r) for _, r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    attention, response = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (prompt, resp) in enumerate(rows):
        ids[i, P - len(prompt) : P], attention[i, P - len(prompt) : P] = prompt, 1
        ids[i, P : P + len(resp)], attention[i, P : P + len(resp)], response[i, P : P + len(resp)] = (
            resp,
            1,
            1,
        )
    advantages = torch.randn(prompts, 1, generator=g).repeat_interleave(n, 0) * response
    return Batch(
        {"input_ids": ids, "attention_mask": attention, "response_mask": response, "advantages": advantages},
        {"temperature": 1.0},
    )


def run_side(a: argparse.Namespace) -> dict:
    import torch

    from rlstack.batch import Batch
    from rlstack.config import ActorConfig, AlgorithmConfig, LoraConfig, ModelConfig
    from rlstack.workers.memory import peaks_since_last
    from rlstack.workers.policy import PolicyWorker

    torch.set_num_threads(a.threads)
    packed = a.side == "packed"
    lora = LoraConfig(rank=16, alpha=32) if a.side == "lora" else LoraConfig()
    checkpointing = a.side == "checkpointing"
    actor = ActorConfig(
        model=ModelConfig(model_path=a.model_dir, lora=lora, enable_gradient_checkpointing=checkpointing),
        micro_batch_size_per_device_for_experience=16,
        micro_batch_size_per_device_for_update=8,
        loss_agg_mode="token-mean",
        padding_free=packed,
        dynamic_batching=packed,
        max_token_len_per_device_for_update=a.max_tokens,
        max_token_len_per_device_for_experience=a.max_tokens,
    )
    worker = PolicyWorker(
        actor, AlgorithmConfig(), max_response_length=a.long, total_steps=a.rounds + 1, seed=0
    )
    if a.side in PARTS["packing"]:
        batch = skewed_batch(worker.model.config.vocab_size, a.long)
    else:
        batch = skewed_batch(worker.model.config.vocab_size, None, prompts=4, n=4)
    tokens = int(batch["attention_mask"].sum())
    timings: dict[str, list[float]] = {"logprobs": [], "update": []}
    for i in range(a.rounds + 1):
        if i == 1:
            peaks_since_last()
        t0 = time.perf_counter()
        scored = worker.compute_logprobs(Batch(dict(batch.columns), batch.meta))
        t1 = time.perf_counter()
        worker.update(scored, mini_batch_size=len(scored))
        t2 = time.perf_counter()
        if i:  # the first round warms up
            timings["logprobs"].append(t1 - t0)
            timings["update"].append(t2 - t1)
    return {
        "tokens": tokens,
        "padded_tokens": int(batch["attention_mask"].numel()),
        "micro_batches_update": len(worker.update_micro_batching.split(batch)),
        "trainable_parameters": sum(p.numel() for p in worker.model.parameters() if p.requires_grad),
        "max_rss_gb": peaks_since_last()["max_rss_gb"],
        **timings,
    }


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.side:
        Path(a.json_out).write_text(json.dumps(run_side(a)))
        return
    common = ["--rounds", str(a.rounds), "--max-tokens", str(a.max_tokens), "--long", str(a.long)]
    common += ["--threads", str(a.threads)]
    result: dict = {
        "settings": vars(a),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    for part, sides in PARTS.items():
        if a.only and part != a.only:
            continue
        sizes = BIG if part == "memory" else {}
        runs = run_sides(__file__, [*sides, *reversed(sides)], common, **sizes)
        for side, rs in runs.items():
            logprobs = statistics.median(x for r in rs for x in r["logprobs"])
            update = statistics.median(x for r in rs for x in r["update"])
            result[side] = {
                "logprobs_s_median": logprobs,
                "update_s_median": update,
                "tokens_per_s": rs[0]["tokens"] / (logprobs + update),
                "max_rss_gb": max(r["max_rss_gb"] for r in rs),
                "runs": rs,
            }
        _print_part(part, sides, runs, result)
    out = Path(a.output)
    if a.only and out.is_file():  # keep the other part's figures
        result = json.loads(out.read_text()) | result
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {a.output}")


def _print_part(part: str, sides: tuple[str, ...], runs: dict, result: dict) -> None:
    first, second = sides[:2]
    r0 = runs[first][0]
    if part == "packing":
        result["packing_speedup"] = result[second]["tokens_per_s"] / result[first]["tokens_per_s"]
        print(
            f"batch: {r0['tokens']} attended tokens in {r0['padded_tokens']} padded slots; update micro-batches: "
            f"{r0['micro_batches_update']} padded, {runs[second][0]['micro_batches_update']} packed"
        )
        print("| side | tokens/s | log-probs (s) | update (s) | peak RSS (GB) | speed-up |")
        print("| --- | --- | --- | --- | --- | --- |")
        for side in (first, second):
            r = result[side]
            up = result["packing_speedup"] if side == second else 1.0
            print(
                f"| {side} | {r['tokens_per_s']:.0f} | {r['logprobs_s_median']:.3f} | {r['update_s_median']:.3f} "
                f"| {r['max_rss_gb']:.2f} | {up:.2f}x |"
            )
    else:
        for side in sides[1:]:
            result[f"{side}_memory_saved_gb"] = result[first]["max_rss_gb"] - result[side]["max_rss_gb"]
        print(f"batch: {r0['tokens']} attended tokens")
        print("| side | trainable parameters | peak RSS (GB) | log-probs (s) | update (s) |")
        print("| --- | --- | --- | --- | --- |")
        for side in sides:
            r = result[side]
            print(
                f"| {side} | {runs[side][0]['trainable_parameters']:,} | {r['max_rss_gb']:.2f} | "
                f"{r['logprobs_s_median']:.3f} | {r['update_s_median']:.3f} |"
            )


if __name__ == "__main__":
    main()
