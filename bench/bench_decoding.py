"""Two ways of decoding the real model, side by side on the same calls: the same seeds, tokens/s of each.

SmolLM2-135M-Instruct (untouched) answers the real-model demo's word problems (`demo_real_grpo.yaml`:
chat prompts, answers ending at EOS) through the agent loop and the HF engine, as a training rollout does
(`--prompts` x `--n` at temperature 0.7, `--max-tokens`) and as its held-out evaluation does (greedy,
`--val-prompts`, one each). Each call runs once per side in turn (the order alternating by round).

`--compare ended-rows` (`bench/results/ended_rows.json`): ended rows leaving the decoding batch once they
are half of it (`hf_sampling.ENDED_SHARE_TO_LEAVE` 0.5, the default) against decoding every row to the end
of the call (2.0); the same computation, so the script checks that the sides sample the same tokens.

`--compare lora` (`bench/results/lora_decoding.json`): the policy as the demo trains it, with LoRA adapters
(`worker.actor.model.lora`, rank 32; their updates made non-zero, as after some training), decoded
through the lean step (`rlstack.models.decoding.Projection`) against the module's own forward (what
every LoRA policy used before); the two round differently, so the share of rows sampled alike is
reported rather than asserted.

`--compare merged-lora` (`bench/results/merged_lora_decoding.json`): the same LoRA policy through the lean
step with its float32 adapters merged into one weight per layer (`decoding.MERGE_ADAPTERS`, the default)
against computed apart as peft does; also rounding differently.

    .venv/bin/python bench/bench_decoding.py --compare ended-rows   # about 10 min
    .venv/bin/python bench/bench_decoding.py --compare lora         # about 12 min
    .venv/bin/python bench/bench_decoding.py --compare merged-lora  # about 6 min
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from sides import write_result

import rlstack.models.decoding as decoding
import rlstack.rollout.hf_sampling as hf_sampling
from rlstack.config import AgentConfig, load_config
from rlstack.data.dataset import PromptDataset
from rlstack.demo import CONFIGS
from rlstack.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from rlstack.models.lora import add_lora
from rlstack.models.vision import VisionProcessor
from rlstack.rollout.agent import AgentLoop
from rlstack.rollout.hf import HFEngine

LEAN = hf_sampling.lean_decoder
COMPARISONS = {
    "ended-rows": {
        "leave": lambda: setattr(hf_sampling, "ENDED_SHARE_TO_LEAVE", 0.5),
        "stay": lambda: setattr(hf_sampling, "ENDED_SHARE_TO_LEAVE", 2.0),
    },
    "lora": {
        "lean": lambda: setattr(hf_sampling, "lean_decoder", LEAN),
        "forward": lambda: setattr(hf_sampling, "lean_decoder", lambda model, positions: None),
    },
    "merged-lora": {
        "merged": lambda: setattr(decoding, "MERGE_ADAPTERS", True),
        "apart": lambda: setattr(decoding, "MERGE_ADAPTERS", False),
    },
}
"""Each comparison's two sides, first the new way: what each sets before its call."""
RESULTS = {
    "ended-rows": "ended_rows.json",
    "lora": "lora_decoding.json",
    "merged-lora": "merged_lora_decoding.json",
}


def lora_policy(model, cfg):
    """`model` with the demo's LoRA adapters, their updates not zero (lora_B starts at zero)."""
    model = add_lora(model, cfg.worker.actor.model.lora)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.002)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--val-prompts", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="ended-rows")
    parser.add_argument("--out", help="default: bench/results/<comparison>.json (see above)")
    args = parser.parse_args()
    args.out = args.out or str(Path(__file__).parent / "results" / RESULTS[args.compare])
    SIDES = COMPARISONS[args.compare]
    cfg = load_config([f"config={CONFIGS / 'demo_real_grpo.yaml'}"])
    path = str(resolve_model_path(cfg.worker.actor.model.model_path))
    model = load_causal_lm(path).eval()
    if args.compare in ("lora", "merged-lora"):
        model = lora_policy(model, cfg)
    processor = VisionProcessor(load_tokenizer(path), None)
    dataset = PromptDataset.from_config(cfg.data.val_files, processor.tokenizer, cfg.data, -1)
    calls = {"rollout": (args.prompts, args.n, 0.7), "validation": (args.val_prompts, 1, 0.0)}
    runs: dict[str, dict[str, list[dict]]] = {call: {side: [] for side in SIDES} for call in calls}
    alike: dict[str, list[float]] = {call: [] for call in calls}
    """Per call and round, the share of rows whose tokens the two sides sampled alike."""
    for r in range(args.rounds + 1):  # round 0 warms up
        for call, (prompts, n, temperature) in calls.items():
            batch = dataset.batch(list(range(r * prompts, (r + 1) * prompts)))
            tokens = {}
            for side in list(SIDES)[:: 1 if r % 2 else -1]:
                SIDES[side]()
                engine = HFEngine(model, processor.tokenizer, seed=r, multimodal=False)
                loop = AgentLoop(engine, processor, None, AgentConfig(), args.max_tokens, False)
                start = time.perf_counter()
                out = loop.generate(batch, n, temperature)
                seconds = time.perf_counter() - start
                tokens[side] = out["input_ids"]
                lengths = out["response_mask"].sum(-1).float()
                if r > 0:
                    runs[call][side].append(
                        {"s": seconds, "sampled": int(lengths.sum()), "longest": int(lengths.max())}
                    )
            new, old = (tokens[side] for side in SIDES)
            if r > 0:
                alike[call].append(
                    float((new == old).all(-1).float().mean()) if new.shape == old.shape else 0.0
                )
            if args.compare == "ended-rows":
                assert torch.equal(new, old), f"{call}, round {r}: the sides sampled differently"
    result = {
        call: {
            side: {
                "tokens_per_s": sum(x["sampled"] for x in rs) / sum(x["s"] for x in rs),
                "mean_length": sum(x["sampled"] for x in rs) / (len(rs) * calls[call][0] * calls[call][1]),
                "runs": rs,
            }
            for side, rs in sides.items()
        }
        for call, sides in runs.items()
    }
    new, old = SIDES
    for call in calls:
        result[call]["speedup"] = result[call][new]["tokens_per_s"] / result[call][old]["tokens_per_s"]
        result[call]["rows_alike"] = sum(alike[call]) / len(alike[call])
    result = write_result(result, args.out, vars(args) | {"model": path})
    for call in calls:
        print(
            call,
            {
                k: round(v["tokens_per_s"], 1) if isinstance(v, dict) else round(v, 3)
                for k, v in result[call].items()
            },
        )


if __name__ == "__main__":
    main()
