"""The agent loop's tokens/s against one-turn generation of the same length, on the real model.

The tool demo's model (SmolLM2-135M-Instruct after its warm start, `rlstack/configs/demo_real_tool_sft.yaml`,
built once in the work folder unless `--model` names one) answers `builtin:big_word_problems@test` rows
with a call of the Python tool, reads the value and boxes it: two turns per trajectory. Side by side in
one run, on the same prompts with the same seeds (`--prompts` x `--n` per call, `--rounds` rounds after a
warm-up; in each round every side in turn, the order rotating, each side sampling the same tokens):

- `agent`: `AgentLoop.generate` with the sandboxed Python tool (`builtin:python`);
- `one_turn`: the same prompts generated in one turn with EOS ignored, exactly as many new tokens per
  trajectory as the agent's trajectories sampled on average (`SamplingSettings.ignore_eos`);
- each with three settings of the HF engine: `kept_turns` (the default, `enable_prefix_caching`): the
  prefix every prompt of a call shares (the system turn and the worked example) prefilled once per call,
  and each trajectory's KV cache kept between its turns, so that a second turn prefills only the first
  turn's last token and the tool's reply; `shared_prefix`: the shared prefix only, every later turn
  prefilling the trajectory's whole context again less that prefix (the engine before kept caches);
  `neither`: every turn prefills every trajectory's whole context.

Reported per side: sampled tokens per second of wall time (the agent's tool time included, and
without it), the prompt tokens the engine's prefills computed and those it read from kept caches, and
the seconds of each call.

    .venv/bin/python bench/bench_agent_turns.py     # writes bench/results/agent_turns.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from sides import write_result

from rlstack.config import AgentConfig, load_config
from rlstack.data.dataset import PromptDataset
from rlstack.demo import CONFIGS
from rlstack.models.loading import load_causal_lm, load_tokenizer
from rlstack.models.vision import VisionProcessor
from rlstack.rollout.agent import AgentLoop
from rlstack.rollout.hf import HFEngine
from rlstack.sft import run_sft
from rlstack.tools.registry import build_toolset


def warm_model(workdir: Path) -> Path:
    """The tool demo's warm start (its SFT recipe as shipped), cached in `workdir`."""
    cfg = load_config([f"config={CONFIGS / 'demo_real_tool_sft.yaml'}", f"trainer.output_dir={workdir}"])
    out = cfg.run_dir / "huggingface"
    return out if (out / "config.json").is_file() else run_sft(cfg)


SIDES = {"kept_turns": (True, True), "shared_prefix": (True, False), "neither": (False, False)}
"""Side name: (`share_prefix`, `keep_turns`) of the HF engine."""


def one_round(model, processor, batch, r: int, share_prefix: bool, keep_turns: bool, args) -> dict:
    """One agent call and one one-turn call of the same length, on a fresh engine seeded with the round."""
    agent = AgentConfig(
        tools=[{"name": "python", "import_path": "builtin:python"}], tool_call_format="code", max_turns=3
    )
    engine = HFEngine(
        model, processor.tokenizer, seed=r, multimodal=False, share_prefix=share_prefix, keep_turns=keep_turns
    )
    loop = AgentLoop(engine, processor, build_toolset(agent.tools), agent, args.max_response_length, False)
    start = time.perf_counter()
    out = loop.generate(batch, args.n, 1.0)
    agent_s = time.perf_counter() - start
    prefilled, reused = engine.prefilled_tokens, engine.reused_tokens
    sampled = int(out["response_mask"].sum())
    length = round(sampled / len(out))  # the agent's mean sampled tokens per trajectory
    plain = AgentLoop(engine, processor, None, agent, length, False, ignore_eos=True)
    start = time.perf_counter()
    single = plain.generate(batch, args.n, 1.0)
    return {
        "agent_s": agent_s,
        "agent_tools_s": out.meta["agent_timing"]["tools"],
        "agent_sampled_tokens": sampled,
        "tool_calls_per_trajectory": float(out["tool_calls"].float().mean()),
        "agent_prefilled_tokens": prefilled,
        "agent_reused_tokens": reused,
        "one_turn_s": time.perf_counter() - start,
        "one_turn_sampled_tokens": int(single["response_mask"].sum()),
    }


def summary(runs: list[dict]) -> dict:
    agent_tokens = sum(r["agent_sampled_tokens"] for r in runs)
    agent_s = sum(r["agent_s"] for r in runs)
    tools_s = sum(r["agent_tools_s"] for r in runs)
    one_tokens = sum(r["one_turn_sampled_tokens"] for r in runs)
    one_s = sum(r["one_turn_s"] for r in runs)
    return {
        "agent_tokens_per_s": agent_tokens / agent_s,
        "agent_tokens_per_s_without_tools": agent_tokens / (agent_s - tools_s),
        "one_turn_tokens_per_s": one_tokens / one_s,
        "agent_vs_one_turn": (agent_tokens / agent_s) / (one_tokens / one_s),
        "agent_without_tools_vs_one_turn": (agent_tokens / (agent_s - tools_s)) / (one_tokens / one_s),
        "agent_prefilled_tokens_per_call": sum(r["agent_prefilled_tokens"] for r in runs) / len(runs),
        "agent_reused_tokens_per_call": sum(r["agent_reused_tokens"] for r in runs) / len(runs),
        "runs": runs,
    }


def measure(model_dir: Path, args: argparse.Namespace) -> dict[str, dict]:
    """Every side on each round's prompts in turn (the order rotating by round), after a warm-up round."""
    model, processor = load_causal_lm(str(model_dir)), VisionProcessor(load_tokenizer(str(model_dir)), None)
    data = load_config(["data.max_prompt_length=256"]).data
    dataset = PromptDataset.from_config("builtin:big_word_problems@test", processor.tokenizer, data, -1)
    runs: dict[str, list[dict]] = {name: [] for name in SIDES}
    names = list(SIDES)
    for r in range(args.rounds + 1):
        batch = dataset.batch(list(range(r * args.prompts, (r + 1) * args.prompts)))
        for name in names[r % len(names) :] + names[: r % len(names)]:
            run = one_round(model, processor, batch, r, *SIDES[name], args)
            if r > 0:  # round 0 warms up
                runs[name].append(run)
    return {name: summary(side) for name, side in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default=None, help="default: the tool demo's warm start, built in --workdir"
    )
    parser.add_argument("--workdir", default="outputs/bench_agent_turns")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-response-length", type=int, default=96)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "agent_turns.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    model_dir = Path(args.model) if args.model else warm_model(Path(args.workdir))
    sides = measure(model_dir, args)
    result = sides | {
        "agent_speedup_from_kept_turns": sides["kept_turns"]["agent_tokens_per_s_without_tools"]
        / sides["shared_prefix"]["agent_tokens_per_s_without_tools"],
        "agent_speedup_from_shared_prefix": sides["shared_prefix"]["agent_tokens_per_s_without_tools"]
        / sides["neither"]["agent_tokens_per_s_without_tools"],
    }
    result = write_result(result, args.out, vars(args) | {"model": str(model_dir)})
    print(json.dumps({k: v for k, v in result.items() if k not in sides}, indent=2))
    for name in sides:
        print(name, {k: round(v, 3) for k, v in result[name].items() if k != "runs"})


if __name__ == "__main__":
    main()
