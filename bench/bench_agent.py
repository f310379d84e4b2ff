"""Agent-loop throughput: trajectories and tool calls per second, and where the time goes.

The tiny Qwen2.5-VL gets a warm start on `builtin:visual_tool_sft` (whole tool-using trajectories,
the visual demo's SFT recipe with the crop task's data and batch, cached in the work folder): it
answers `builtin:visual` questions with a Python cell that crops
the picture, reads the crop back as an image in the next turn, and answers, so its trajectories
really call the sandboxed interpreter. Then `AgentLoop.generate` runs on
held-out rows, `--prompts` x `--n` trajectories per call, `--rounds` calls after one warm-up
call, and reports trajectories/s, tool calls/s, turns and images per trajectory, and the share of
wall time spent generating vs running tools.

Baseline for the tool side, side by side in the same run: the same number of cells run one after
another (`max_tool_workers=1`), to show what the concurrent tool calls buy.

    .venv/bin/python bench/bench_agent.py      # writes bench/results/agent_loop.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from sides import write_result

from rlstack.config import AgentConfig, load_config
from rlstack.demo import CONFIGS
from rlstack.models.loading import load_causal_lm, load_processor
from rlstack.rollout.agent import AgentLoop
from rlstack.rollout.hf import HFEngine
from rlstack.sft import run_sft
from rlstack.tools.registry import build_toolset


def warm_model(workdir: Path, steps: int) -> Path:
    """SFT on the crop trajectories with the visual demo's recipe (`demo_visual_sft.yaml`, batch and
    warm-up as when the figures in bench/README.md were taken), cached in `workdir`."""
    cfg = load_config(
        [
            f"config={CONFIGS / 'demo_visual_sft.yaml'}",
            "data.train_files=builtin:visual_tool_sft@train",
            "data.rollout_batch_size=8",
            "data.max_response_length=128",
            "worker.actor.global_batch_size=8",
            "worker.actor.micro_batch_size_per_device_for_update=8",
            "worker.actor.optim.lr_warmup_steps=10",
            "worker.actor.model.model_path=builtin:tiny-qwen2.5-vl",
            f"trainer.output_dir={workdir}",
            "trainer.experiment_name=bench_agent_sft",
            f"trainer.max_steps={steps}",
            "trainer.logger=[file]",
        ]
    )
    out = cfg.run_dir / "huggingface"
    if not (out / "config.json").is_file():
        run_sft(cfg)
    return out


def measure(model_dir: Path, prompts: int, n: int, rounds: int, workers: int, max_response: int) -> dict:
    from rlstack.data.dataset import PromptDataset

    model, processor = load_causal_lm(str(model_dir)), load_processor(str(model_dir))
    data = load_config(["data.min_pixels=3136", "data.max_pixels=12544", "data.max_prompt_length=256"]).data
    dataset = PromptDataset.from_config("builtin:visual@test", processor.tokenizer, data, -1, processor)
    agent = AgentConfig(
        tools=[{"name": "python", "import_path": "builtin:python"}], max_turns=3, max_tool_workers=workers
    )
    engine = HFEngine(model, processor.tokenizer, seed=0, multimodal=True)
    loop = AgentLoop(engine, processor, build_toolset(agent.tools), agent, max_response, multimodal=True)
    runs = []
    for r in range(rounds + 1):
        batch = dataset.batch(list(range(r * prompts, (r + 1) * prompts)))
        start = time.perf_counter()
        out = loop.generate(batch, n, 1.0)
        wall = time.perf_counter() - start
        if r == 0:
            continue  # warm-up
        runs.append(
            {
                "wall_s": wall,
                "trajectories": len(out),
                "tool_calls": int(out["tool_calls"].sum()),
                "tool_errors": int(out["tool_errors"].sum()),
                "turns": float(out["num_turns"].float().mean()),
                "images": float(out["num_images"].float().mean()),
                "gen_s": out.meta["agent_timing"]["gen"],
                "tools_s": out.meta["agent_timing"]["tools"],
            }
        )
    wall = sum(r["wall_s"] for r in runs)
    return {
        "trajectories_per_s": sum(r["trajectories"] for r in runs) / wall,
        "tool_calls_per_s": sum(r["tool_calls"] for r in runs) / wall,
        "tool_calls_per_trajectory": statistics.mean(r["tool_calls"] / r["trajectories"] for r in runs),
        "tool_success_rate": 1
        - sum(r["tool_errors"] for r in runs) / max(1, sum(r["tool_calls"] for r in runs)),
        "turns_per_trajectory": statistics.mean(r["turns"] for r in runs),
        "images_per_trajectory": statistics.mean(r["images"] for r in runs),
        "share_generation": sum(r["gen_s"] for r in runs) / wall,
        "share_tools": sum(r["tools_s"] for r in runs) / wall,
        "seconds_per_call": wall / len(runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", default="outputs/bench")
    parser.add_argument("--sft-steps", type=int, default=250)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--max-response-length", type=int, default=160)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "agent_loop.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    model_dir = warm_model(Path(args.workdir), args.sft_steps)
    common = (args.prompts, args.n, args.rounds)
    concurrent = measure(model_dir, *common, args.workers, args.max_response_length)
    sequential = measure(model_dir, *common, 1, args.max_response_length)
    result = {
        "concurrent_tools": concurrent,
        "sequential_tools": sequential,
        "tool_calls_per_s_concurrent_vs_sequential": concurrent["tool_calls_per_s"]
        / sequential["tool_calls_per_s"],
    }
    result = write_result(result, args.out, vars(args))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
