"""The CPU paths that make a GRPO step faster, each against what it replaced, side by side in one process.

1. `step`: whole GRPO steps of the trainer (bench_trl's rlstack side and workload: 16 prompts x 8,
   16 new tokens, the tiny model), alternating every 3 steps between the model's attention implementations:
   `rlstack_sdpa` (`rlstack.models.attention`) and Hugging Face's plain `sdpa`. The first of each 3 is
   left out (the switch); step, generation and update times are medians.
2. `attention`: one attention call per shape, Hugging Face's `sdpa_attention_forward` against
   `small_query_attention`, forward (no grad) and forward + backward.
3. `sampling`: one token per row drawn with `torch.multinomial` against the sampler's inverse CDF
   (`_draw` + `_inverse_cdf`), for the tiny model's vocabulary and a 152k one.
4. `adamw`: clip + AdamW step on the tiny model's parameters, the default implementation against the
   fused kernel.
5. `decoding`: the HF engine's `sample` on the step's generation (16 prompts x 8 rows, 16 new tokens,
   temperature 1), its decoding steps taken by the lean step (`rlstack.models.decoding`) against the
   module's `forward`, alternating call by call; median milliseconds per call.

    python bench/bench_cpu_paths.py     # writes bench/results/cpu_paths.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import bench_trl
import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "cpu_paths.json"


def timed_us(fn, n: int, *args) -> float:
    """Mean microseconds of `fn(*args)` over `n` calls, after 5 untimed ones."""
    for _ in range(5):
        fn(*args)
    t = time.perf_counter()
    for _ in range(n):
        fn(*args)
    return (time.perf_counter() - t) / n * 1e6


def _forward_backward(fn, grad: torch.Tensor, *args) -> None:
    fn(*args)[0].backward(grad)


def step_ab(model_dir: Path, rounds: int) -> dict:
    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="rlstack-bench-") as out:
        cfg = load_config(
            bench_trl.rlstack_overrides(bench_trl.parse_args([]), str(model_dir), 6 * rounds + 2, out)
        )
        sides = ("rlstack_sdpa", "sdpa")
        schedule = [sides[(i // 3 + i // 6) % 2] for i in range(6 * rounds)]  # AB BA AB ... in blocks of 3
        model = None
        times: dict[str, dict[str, list[float]]] = {s: {"step": [], "gen": [], "update": []} for s in sides}

        class Alternating(Trainer):
            def train_step(self):
                i = self.step - 3  # steps 1-2 warm up with the first side
                side = schedule[max(i, 0)] if i < len(schedule) else sides[0]
                model.set_attn_implementation(side)
                t = time.perf_counter()
                metrics = super().train_step()
                if 0 <= i < len(schedule) and i % 3:
                    times[side]["step"].append(time.perf_counter() - t)
                    times[side]["gen"].append(metrics["timing_s/gen"])
                    times[side]["update"].append(metrics["timing_s/update_actor"])
                return metrics

        trainer = Alternating(cfg)
        model = trainer.groups["rollout"].worker.engine.model  # the policy's own module (embedded default)
        trainer.fit()
    return {
        s: {k: statistics.median(v) for k, v in t.items()} | {"steps": len(t["step"])}
        for s, t in times.items()
    }


class _Grouped(torch.nn.Module):
    num_key_value_groups = 2
    is_causal = True


def attention_calls() -> list[dict]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from rlstack.models.attention import small_query_attention

    rows = []
    for B, Q, L in [(128, 1, 40), (128, 1, 512), (8, 1, 2048), (64, 15, 39), (16, 16, 256), (8, 16, 1024)]:
        q = torch.randn(B, 4, Q, 32, requires_grad=True)
        k = torch.randn(B, 2, L, 32, requires_grad=True)
        v = torch.randn(B, 2, L, 32, requires_grad=True)
        mask = torch.ones(B, 1, Q, L, dtype=torch.bool).tril(L - Q)
        grad = torch.randn(B, Q, 4, 32)
        m = _Grouped()
        row = {"rows": B, "queries": Q, "keys": L}
        for name, fn in (("sdpa", sdpa_attention_forward), ("small_query", small_query_attention)):
            with torch.no_grad():
                row[f"{name}_forward_us"] = timed_us(fn, 50, m, q, k, v, mask)
            row[f"{name}_forward_backward_us"] = timed_us(_forward_backward, 30, fn, grad, m, q, k, v, mask)
        row["forward_speedup"] = row["sdpa_forward_us"] / row["small_query_forward_us"]
        row["forward_backward_speedup"] = (
            row["sdpa_forward_backward_us"] / row["small_query_forward_backward_us"]
        )
        rows.append(row)
    return rows


def _multinomial(probs: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return torch.multinomial(probs, 1, generator=g)


def _inverse(probs: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    from rlstack.rollout.hf_sampling import _draw, _inverse_cdf

    return _inverse_cdf(probs, _draw(len(probs), g, probs.device))


def sampling() -> list[dict]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for B, V in ((128, 101), (16, 151_936)):
        probs = torch.softmax(torch.randn(B, V), -1)
        n = 200 if V < 1000 else 30
        multinomial = timed_us(_multinomial, n, probs, g)
        inverse_cdf = timed_us(_inverse, n, probs, g)

        rows.append({"rows": B, "vocab": V, "multinomial_us": multinomial, "inverse_cdf_us": inverse_cdf})
    return rows


def adamw(model_dir: Path) -> dict:
    from rlstack.models.loading import load_causal_lm

    model = load_causal_lm(str(model_dir))
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    out = {}
    for name, fused in (("default", None), ("fused", True)):
        opt = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.01, fused=fused)

        def step(opt=opt):
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()

        out[f"{name}_us"] = timed_us(step, 100)
    return out


def decoding(model_dir: Path, calls: int = 20) -> dict:
    import rlstack.rollout.hf_sampling as hf_sampling
    from rlstack.data.tasks import builtin_rows
    from rlstack.models.loading import load_causal_lm, load_tokenizer

    model = load_causal_lm(str(model_dir)).eval()
    tok = load_tokenizer(str(model_dir))
    messages = [
        [{"role": "user", "content": r["problem"]}] for r in builtin_rows("builtin:addition@train")[:16]
    ]
    texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts for _ in range(8)]
    lean_decoder = hf_sampling.lean_decoder
    sides = {"lean": lean_decoder, "module": lambda model, positions: None}
    times: dict[str, list[float]] = {name: [] for name in sides}
    g = torch.Generator().manual_seed(0)
    for i in range(calls + 2):
        for name, decoder in sides.items():
            hf_sampling.lean_decoder = decoder
            t = time.perf_counter()
            hf_sampling.sample(model, prompts, 16, tok.eos_token_id, tok.pad_token_id, 1.0, generator=g)
            if i >= 2:
                times[name].append(time.perf_counter() - t)
    hf_sampling.lean_decoder = lean_decoder
    out = {f"{name}_ms": statistics.median(t) * 1e3 for name, t in times.items()}
    return out | {"rows": len(prompts), "new_tokens": 16, "calls": calls}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10, help="blocks of 3 steps per side in `step`")
    p.add_argument("--output", default=str(RESULTS))
    a = p.parse_args()
    from rlstack.models.loading import write_model_dir

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="rlstack-bench-") as tmp:
        model_dir = write_model_dir(Path(tmp) / "tiny")
        result = {
            "command": "python bench/bench_cpu_paths.py",
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "torch": torch.__version__,
            "threads": 2,
            "step": step_ab(model_dir, a.rounds),
            "attention": attention_calls(),
            "sampling": sampling(),
            "adamw": adamw(model_dir),
            "decoding": decoding(model_dir),
        }
    Path(a.output).write_text(json.dumps(result, indent=1) + "\n")
    s = result["step"]
    print(
        "GRPO step (median s): rlstack_sdpa {step:.3f} (gen {gen:.3f}, update {update:.3f})".format(
            **s["rlstack_sdpa"]
        )
        + ", sdpa {step:.3f} (gen {gen:.3f}, update {update:.3f})".format(**s["sdpa"])
    )
    for r in result["attention"]:
        print(
            f"attention {r['rows']} x {r['queries']} x {r['keys']}: forward {r['forward_speedup']:.2f}x, "
            f"forward + backward {r['forward_backward_speedup']:.2f}x"
        )
    for r in result["sampling"]:
        print(
            f"sampling {r['rows']} x {r['vocab']}: multinomial {r['multinomial_us']:.0f} us, inverse CDF {r['inverse_cdf_us']:.0f} us"
        )
    print("clip + AdamW: default {default_us:.0f} us, fused {fused_us:.0f} us".format(**result["adamw"]))
    d = result["decoding"]
    print(
        f"sample {d['rows']} rows x {d['new_tokens']} tokens: lean step {d['lean_ms']:.1f} ms, "
        f"module forward {d['module_ms']:.1f} ms ({d['module_ms'] / d['lean_ms']:.2f}x)"
    )
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
