"""Where the policy update's time goes, op by op: rlstack's update against a plain forward/backward loop
over the same tokens, in one process, one after the other.

rlstack's `Trainer` runs `bench_trl.py`'s rlstack workload (the same config: `--prompts` x `--n` responses of
exactly `--max-response-length` tokens with `--fixed-length`, LoRA rank `--lora-rank` or full weights, one
optimizer step of `--micro-batch`-row passes) for two steps: the first update warms up, the second runs
under `torch.profiler`. The second step's batch is kept, and its rows go through the plain loop of
`bench_trl.py`'s torch side on a fresh copy of the same model (peft's LoRA where rlstack has LoRA): each
micro-batch of whole rows forward with `logits_to_keep` over the response columns, log-softmax, the clipped
loss, backward; gradient clipping and one fused AdamW step (rlstack's optimizer on CPU); once to warm up,
once under the profiler. Both sides read the same tokens and advantages at the same temperature; the plain
loop computes no entropy (rlstack logs it, without a gradient) and none of rlstack's metrics.

Written per side: the wall time of the profiled update, response and attended tokens per second, and the
ops with the most self CPU time (and what share of the total each has), and the self CPU time by kind of op
(matrix products, attention, softmax and log-softmax, copies and layout, element-wise, optimizer, autograd):

    python bench/profile_update.py              # SmolLM2-135M-Instruct, LoRA 32: bench/results/profile_update_<model>_lora32.json
    python bench/profile_update.py --lora-rank 0    # full weights
    python bench/profile_update.py --model tiny --max-response-length 16 --n 8  # the tiny model, in seconds
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_trl  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

MATRIX = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear"}
LAYOUT = {
    "copy",
    "to_copy",
    "to",
    "cat",
    "index_select",
    "index",
    "index_put",
    "index_add",
    "gather",
    "scatter",
    "scatter_add",
    "clone",
    "contiguous",
    "expand",
    "narrow",
    "select",
    "slice",
    "view",
    "reshape",
    "reshape_alias",
    "transpose",
    "t",
    "permute",
    "split",
    "split_with_sizes",
    "fill",
    "zero",
    "zeros",
    "empty",
    "empty_like",
    "empty_strided",
    "new_zeros",
    "new_empty",
    "stack",
    "constant_pad_nd",
    "masked_fill",
    "as_strided",
    "unsqueeze",
    "squeeze",
    "unbind",
    "repeat",
    "repeat_interleave",
    "embedding",
    "embedding_dense_backward",
    "unsafe_view",
    "detach",
    "alias",
    "resize",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="as bench_trl.py's --model")
    p.add_argument("--task", choices=sorted(bench_trl.TASKS), default="word_problems")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-response-length", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--lora-rank", type=int, default=32, help="0: full weights")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=25, help="ops listed per side")
    p.add_argument("--output", help="default: bench/results/profile_update_<model>_<lora<rank>|full>.json")
    a = p.parse_args(argv)
    # what bench_trl.rlstack_overrides reads beyond these
    a.fixed_length, a.temperature, a.lr = True, 0.7, 1e-5
    return a


def kind_of(key: str) -> str:
    """The kind of the op `key` (`aten::addmm`, `autograd::engine::evaluate_function: MmBackward0`, ...)."""
    if key.startswith("autograd::"):
        return "autograd engine"
    if key.startswith("Optimizer."):
        return "optimizer and gradient norm"
    name = key.split("::")[-1].strip("_").lower()
    if "attention" in name:
        return "attention"
    if "softmax" in name:
        return "softmax / log-softmax"
    if name in MATRIX:
        return "matrix products"
    if name.startswith("foreach") or "adam" in name or name == "linalg_vector_norm":
        return "optimizer and gradient norm"
    if name in LAYOUT:
        return "copies and layout"
    return "element-wise and other"


def summary(prof, wall_s: float, tokens: dict[str, int], top: int) -> dict:
    """What a profiled update spent its time on: top ops by self CPU time, time by kind of op."""
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total_us = sum(e.self_cpu_time_total for e in events) or 1
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    by_kind: dict[str, float] = {}
    for e in events:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + e.self_cpu_time_total
    return {
        "wall_s": round(wall_s, 3),
        "profiled_self_cpu_s": round(total_us / 1e6, 3),
        "response_tokens_per_s": round(tokens["response"] / wall_s, 1),
        "attended_tokens_per_s": round(tokens["attended"] / wall_s, 1),
        "by_kind_s": {k: round(v / 1e6, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top_ops": [
            {
                "op": e.key,
                "self_cpu_s": round(e.self_cpu_time_total / 1e6, 3),
                "share": round(e.self_cpu_time_total / total_us, 4),
                "calls": e.count,
            }
            for e in events[:top]
        ],
    }


def profile_rlstack(a: argparse.Namespace, model_dir: str, out: str):
    """rlstack's second update under the profiler, and that update's batch (on CPU, detached)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    cfg = load_config(bench_trl.rlstack_overrides(a, model_dir, 2, out))
    trainer = Trainer(cfg)
    assert not trainer.plan.old_logprobs, "one mini-batch, one epoch: the update is the only pass"
    kept: dict = {}

    class Profiled:
        """The policy handle, its second `update` under the profiler."""

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def update(self, batch, mini_batch_size):
            columns = ("input_ids", "attention_mask", "response_mask", "advantages")
            if "calls" in kept:
                kept["batch"] = {k: batch[k].detach().clone() for k in columns}
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    start = time.perf_counter()
                    metrics = self.inner.update(batch, mini_batch_size)
                    kept["wall_s"] = time.perf_counter() - start
                kept["prof"] = prof
                return metrics
            kept["calls"] = 1
            return self.inner.update(batch, mini_batch_size)

    trainer.policy = Profiled(trainer.policy)
    torch.manual_seed(1)
    trainer.fit()
    if "prof" not in kept:
        raise SystemExit(f"rlstack's run made {kept.get('calls', 0)} update(s), not 2: nothing was profiled")
    return kept["prof"], kept["wall_s"], kept["batch"]


def profile_plain(a: argparse.Namespace, model_dir: str, batch: dict):
    """The plain loop over `batch`'s rows: a warm-up pass, then one under the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from rlstack.models.logprobs import first_scored_column

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    if a.lora_rank:
        from peft import get_peft_model

        model = get_peft_model(model, bench_trl.peft_lora(a.lora_rank))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    # fused, as rlstack's own AdamW on CPU (the default there is the one-tensor-at-a-time loop)
    optimizer = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), weight_decay=0.01, fused=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as rlstack's policy computes them for a text model
    response_mask, advantages = batch["response_mask"], batch["advantages"]
    start = first_scored_column(response_mask)
    labels, scored = ids[:, start:], response_mask[:, start:].float()
    # one advantage per row: GRPO's is the same at every response token
    row_advantage = (advantages * response_mask).sum(-1) / response_mask.sum(-1).clamp(min=1)

    def update():
        bench_trl.plain_update(
            model,
            params,
            optimizer,
            ids,
            mask,
            positions,
            labels,
            scored,
            row_advantage,
            a.micro_batch,
            a.temperature,
        )

    update()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        update()
        wall = time.perf_counter() - t
    return prof, wall


def main(argv: list[str] | None = None) -> None:
    import torch

    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    name = f"profile_update_{bench_trl._slug(a.model)}_{f'lora{a.lora_rank}' if a.lora_rank else 'full'}"
    output = Path(a.output) if a.output else RESULTS / f"{name}.json"
    with tempfile.TemporaryDirectory(prefix="profile-update-") as tmp:
        model_dir = bench_trl.resolve_model(a.model, Path(tmp))
        a.model_dir = model_dir
        prof, wall, batch = profile_rlstack(a, model_dir, str(Path(tmp) / "runs"))
        tokens = {
            "response": int(batch["response_mask"].sum()),
            "attended": int(batch["attention_mask"].sum()),
        }
        sides = {"rlstack": summary(prof, wall, tokens, a.top)}
        del prof
        prof, wall = profile_plain(a, model_dir, batch)
        sides["plain_loop"] = summary(prof, wall, tokens, a.top)
    r, p = sides["rlstack"], sides["plain_loop"]
    result = {
        "benchmark": "the policy update of one GRPO step, op by op: rlstack's against a plain loop, same tokens",
        "command": " ".join(
            ["python bench/profile_update.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {
            "model": a.model,
            "lora_rank": a.lora_rank,
            "rows": a.prompts * a.n,
            "prompts": a.prompts,
            "response_length": a.max_response_length,
            "micro_batch": a.micro_batch,
            "torch_threads": a.threads,
            "tokens": tokens,
            "batch_width": int(batch["input_ids"].shape[1]),
        },
        "rlstack_update_over_plain_update": round(r["wall_s"] / p["wall_s"], 3),
        "sides": sides,
        "versions": bench_trl.versions(),
        "machine": bench_trl.machine(),
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    for side, s in sides.items():
        kinds = ", ".join(f"{k} {v:.1f} s" for k, v in s["by_kind_s"].items())
        print(f"{side}: {s['wall_s']:.1f} s, {s['response_tokens_per_s']:.0f} response tokens/s; {kinds}")
        for op in s["top_ops"][:8]:
            print(f"    {op['op']:<40} {op['self_cpu_s']:>8.2f} s  {100 * op['share']:5.1f}%  x{op['calls']}")
    print(f"rlstack's update / the plain loop's: {result['rlstack_update_over_plain_update']:.2f}x")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
