"""Rollout speed, side by side in one run on one machine.

1. `sampler`: the HF engine (`rlstack.rollout.hf.HFEngine.generate`) against a minimal
   shared-prompt decode loop in plain torch doing the same work: each distinct prompt prefilled
   once and its KV cache copied to its `n` samples, one model call per further token, sampling at
   temperature 1 with the sampled token's log-prob kept, stopping when every row has ended. The
   minimal loop has none of the engine's checks (finite logits, stop strings, warpers, vision
   inputs) and calls the module's `forward` for every token, where the engine's decoding steps take
   the lean step (`rlstack.models.decoding`) for the models it covers.
2. `engines` (when vLLM is installed: `pip install 'rlstack[vllm]'`): the HF engine against the
   vLLM engine on the same requests, for the tiny model and for a Qwen2-0.5B-shaped model with
   random weights (built from a config; nothing is downloaded). With `--model` (any model_path
   rlstack loads, e.g. `builtin:smollm2-135m-instruct`), the two engines on that model instead, on
   `builtin:word_problems` chat prompts, every sample exactly `--max-tokens` long (`ignore_eos`: a
   pretrained model's answers end early, and the two engines would not sample the same lengths).

Rounds alternate between the sides (ABBA), after one warm-up call each; tokens/s counts the
sampled tokens (EOS included). Random weights rarely sample EOS, so rows run to `--max-tokens`.

    python bench/bench_rollout.py                      # writes bench/results/rollout.json
    python bench/bench_rollout.py --only sampler       # the HF engine vs the minimal loop only
    .venv-vllm/bin/python bench/bench_rollout.py --only engines --model builtin:smollm2-135m-instruct \\
        --prompts 16 --n 4 --max-tokens 128 --rounds 2    # bench/results/rollout_smollm2-135m-instruct.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import DynamicCache

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "rollout.json"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["sampler", "engines"], help="one part only")
    p.add_argument("--prompts", type=int, default=16, help="distinct prompts per call")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens per sample at most")
    p.add_argument("--rounds", type=int, default=6, help="timed calls per side")
    p.add_argument("--big-prompts", type=int, default=4, help="distinct prompts per call, Qwen2-0.5B shape")
    p.add_argument("--big-n", type=int, default=4, help="samples per prompt, Qwen2-0.5B shape")
    p.add_argument("--big-rounds", type=int, default=2, help="timed calls per side, Qwen2-0.5B shape")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--model", help="the engines part on this model only (a model_path rlstack loads)")
    p.add_argument("--output", help="result JSON (default: bench/results/rollout.json, rollout_<model>.json)")
    return p.parse_args()


def addition_prompts(tokenizer, count: int) -> list[list[int]]:
    from rlstack.data.tasks import builtin_rows

    rows = builtin_rows("builtin:addition@train")[:count]
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": r["problem"]}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        for r in rows
    ]


@torch.inference_mode()
def minimal_loop(model, prompts: list[list[int]], n: int, max_tokens: int, eos: int, pad: int, generator):
    """The least a shared-prompt sampler can do (see module docstring). Returns sampled tokens."""
    B, P = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, P), pad, dtype=torch.long)
    mask = torch.zeros((B, P), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :] = torch.tensor(p)
        mask[i, P - len(p) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, logits_to_keep=1
    )
    rows = torch.arange(B).repeat_interleave(n)
    cache.reorder_cache(rows)
    logits, mask, next_pos = out.logits[rows, -1], mask[rows], positions[rows, -1] + 1
    done = torch.zeros(B * n, dtype=torch.bool)
    tokens, logps = [], []
    for step in range(max_tokens):
        logp = torch.log_softmax(logits.float(), dim=-1)
        tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        tok = torch.where(done, pad, tok)
        tokens.append(tok)
        logps.append(logp.gather(-1, tok[:, None]))
        done |= tok == eos
        if bool(done.all()) or step == max_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        logits = model(
            input_ids=tok[:, None],
            attention_mask=mask,
            position_ids=(next_pos + step)[:, None],
            past_key_values=cache,
        ).logits[:, -1]
    return torch.stack(tokens, 1)


def timed(fn) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - start, tokens


def sampler_part(a: argparse.Namespace, model_dir: Path) -> dict:
    from rlstack.models.loading import load_causal_lm, load_tokenizer
    from rlstack.rollout.engine import Request, SamplingSettings, mix_seed
    from rlstack.rollout.hf import HFEngine

    tok = load_tokenizer(str(model_dir))
    model = load_causal_lm(str(model_dir)).eval()
    prompts = addition_prompts(tok, a.prompts)
    engine = HFEngine(model, tok, seed=0, multimodal=False)
    # seeded per request, as the trainer's rollouts are
    requests = [Request(p, seed=mix_seed(0, i, j)) for i, p in enumerate(prompts) for j in range(a.n)]
    settings = SamplingSettings(max_tokens=a.max_tokens)
    generator = torch.Generator().manual_seed(0)

    def run_engine() -> int:
        return sum(len(c.token_ids) for c in engine.generate(requests, settings))

    def run_minimal() -> int:
        out = minimal_loop(model, prompts, a.n, a.max_tokens, tok.eos_token_id, tok.pad_token_id, generator)
        ended = (out == tok.eos_token_id).cumsum(-1)
        return int(((ended == 0) | ((ended == 1) & (out == tok.eos_token_id))).sum())

    sides = {"hf_engine": run_engine, "minimal_loop": run_minimal}
    for fn in sides.values():
        fn()  # warm-up
    seconds: dict[str, list[float]] = {k: [] for k in sides}
    tokens: dict[str, int] = dict.fromkeys(sides, 0)
    order = ["hf_engine", "minimal_loop", "minimal_loop", "hf_engine"]
    for r in range(a.rounds):
        name = order[r % 4]
        for side in (name, "minimal_loop" if name == "hf_engine" else "hf_engine"):
            s, t = timed(sides[side])
            seconds[side].append(s)
            tokens[side] += t
    result = {
        side: {
            "tokens_per_s": tokens[side] / sum(seconds[side]),
            "call_s_median": statistics.median(seconds[side]),
        }
        for side in sides
    }
    result["engine_time_over_minimal"] = (
        result["minimal_loop"]["tokens_per_s"] / result["hf_engine"]["tokens_per_s"]
    )
    return result


def qwen2_0_5b_shaped(out: Path) -> Path:
    """Qwen2-0.5B's shape (24 layers, hidden 896, 14 heads, 2 KV heads, MLP 4864, vocabulary 151936, tied
    embeddings) with random weights and rlstack's character tokenizer; nothing is downloaded."""
    from rlstack.models.loading import mark_generic_tokenizer
    from rlstack.models.tiny import build_char_tokenizer, build_tiny_qwen2

    tok = build_char_tokenizer()
    model = build_tiny_qwen2(
        vocab_size=151936,
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        intermediate_size=4864,
        max_position_embeddings=4096,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model.save_pretrained(out)
    tok.save_pretrained(out)
    mark_generic_tokenizer(out)
    return out


def word_problem_prompts(tokenizer, count: int) -> list[list[int]]:
    from rlstack.data.tasks import builtin_rows

    rows = builtin_rows("builtin:word_problems@train")[:count]
    return [
        list(
            tokenizer.apply_chat_template(
                r["problem"], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for r in rows
    ]


def engines_part(
    model_dir: Path, prompts_per_call: int, n: int, max_tokens: int, rounds: int, real: bool = False
) -> dict:
    """The HF engine and the vLLM engine on the same requests, alternating (ABBA); `real`: word-problem
    prompts, every sample `max_tokens` long."""
    from rlstack.models.loading import load_causal_lm, load_tokenizer
    from rlstack.rollout.engine import Request, SamplingSettings
    from rlstack.rollout.hf import HFEngine
    from rlstack.rollout.vllm import VLLMEngine, VLLMSettings

    tok = load_tokenizer(str(model_dir))
    prompts = (word_problem_prompts if real else addition_prompts)(tok, prompts_per_call)
    requests = [Request(p) for p in prompts for _ in range(n)]
    settings = SamplingSettings(max_tokens=max_tokens, ignore_eos=real)
    longest = max(len(r.prompt_ids) for r in requests) + max_tokens
    start = time.perf_counter()
    vllm = VLLMEngine(
        VLLMSettings(
            str(model_dir),
            None,
            "float32",
            seed=0,
            multimodal=False,
            max_model_len=longest + 8,
            gpu_memory_utilization=0.5,
            tensor_parallel_size=1,
            enforce_eager=True,
            enable_prefix_caching=True,
            max_num_batched_tokens=4096,
            free_cache_engine=False,
        )
    )
    vllm_start_s = time.perf_counter() - start
    hf = HFEngine(load_causal_lm(str(model_dir)).eval(), tok, seed=0, multimodal=False)
    sides = {"hf": hf, "vllm": vllm}
    for engine in sides.values():
        engine.generate(requests, settings)  # warm-up
    seconds: dict[str, list[float]] = {k: [] for k in sides}
    tokens: dict[str, int] = dict.fromkeys(sides, 0)
    for r in range(rounds):
        for side in ("hf", "vllm") if r % 2 == 0 else ("vllm", "hf"):
            began = time.perf_counter()
            completions = sides[side].generate(requests, settings)
            seconds[side].append(time.perf_counter() - began)
            tokens[side] += sum(len(c.token_ids) for c in completions)
    result = {side: {"tokens_per_s": tokens[side] / sum(seconds[side])} for side in sides}
    result["vllm_over_hf"] = result["vllm"]["tokens_per_s"] / result["hf"]["tokens_per_s"]
    result["vllm_start_s"] = vllm_start_s
    result["requests"] = len(requests)
    result["prompt_tokens_mean"] = statistics.mean(len(r.prompt_ids) for r in requests)
    result["max_tokens"] = max_tokens
    result["fixed_length"] = real
    del vllm
    return result


def main() -> None:
    a = parse_args()
    torch.set_num_threads(a.threads)
    from rlstack.models.loading import write_model_dir

    results: dict = {
        "machine": {"cpu_count": __import__("os").cpu_count(), "platform": platform.platform()},
        "torch": torch.__version__,
        "threads": a.threads,
        "settings": {"prompts": a.prompts, "n": a.n, "max_tokens": a.max_tokens, "rounds": a.rounds},
    }
    if a.model:
        return real_model_engines(a, results)
    a.output = a.output or str(RESULTS)
    with tempfile.TemporaryDirectory(prefix="rlstack-bench-rollout-") as tmp:
        tiny = write_model_dir(Path(tmp) / "tiny")
        if a.only in (None, "sampler"):
            results["sampler"] = sampler_part(a, tiny)
            s = results["sampler"]
            print(
                f"sampler, tiny model: HF engine {s['hf_engine']['tokens_per_s']:.0f} tok/s, minimal loop "
                f"{s['minimal_loop']['tokens_per_s']:.0f} tok/s: engine takes "
                f"{s['engine_time_over_minimal']:.2f}x the minimal loop's time"
            )
        if a.only in (None, "engines"):
            try:
                import vllm  # noqa: F401
            except ImportError:
                print(
                    "engines: vLLM is not installed (pip install 'rlstack[vllm]', or run in .venv-vllm); skipped"
                )
            else:
                results["engines_tiny"] = engines_part(tiny, a.prompts, a.n, a.max_tokens, a.rounds)
                big = qwen2_0_5b_shaped(Path(tmp) / "qwen2-0.5b-shaped")
                results["engines_qwen2_0_5b_shaped"] = engines_part(
                    big, a.big_prompts, a.big_n, a.max_tokens, a.big_rounds
                )
                for name in ("engines_tiny", "engines_qwen2_0_5b_shaped"):
                    e = results[name]
                    print(
                        f"{name}: HF {e['hf']['tokens_per_s']:.0f} tok/s, vLLM {e['vllm']['tokens_per_s']:.0f} "
                        f"tok/s ({e['vllm_over_hf']:.2f}x), {e['requests']} requests per call"
                    )
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


def real_model_engines(a: argparse.Namespace, results: dict) -> None:
    """`--model`: the HF engine against vLLM's on one real model (see module docstring)."""
    import vllm

    from rlstack.config import ModelConfig
    from rlstack.models.loading import model_dir

    path = Path(model_dir(ModelConfig(model_path=a.model)))
    name = "".join(
        c if c.isalnum() or c in "-_." else "-" for c in a.model.removeprefix("builtin:").rsplit("/", 1)[-1]
    )
    results["model"] = a.model
    results["vllm"] = vllm.__version__
    results["engines"] = e = engines_part(path, a.prompts, a.n, a.max_tokens, a.rounds, real=True)
    print(
        f"engines, {a.model}: HF {e['hf']['tokens_per_s']:.0f} tok/s, vLLM {e['vllm']['tokens_per_s']:.0f} tok/s "
        f"({e['vllm_over_hf']:.2f}x), {e['requests']} requests of exactly {a.max_tokens} tokens per call, "
        f"vLLM start {e['vllm_start_s']:.0f} s"
    )
    out = Path(a.output or RESULTS.parent / f"rollout_{name.removesuffix('.gguf')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
