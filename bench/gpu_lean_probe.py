"""Where a GRPO step's generation goes on the GPU, with the lean decoding step and without, on one machine.

Runs `gpu_check`'s `grpo_smollm2_135m` (a SmolLM2-135M-shaped model, bfloat16, 8 prompts x 4 x 128 tokens)
three times, lean / forward / lean, and prints each run's figure and each `sample` call of its rollouts:
rows, tokens, seconds, and whether the lean step decoded it. On the lent machine, after the bundle's
`run.sh` has installed rlstack (`make gpu-bundle`, then there `python3 bench/gpu_lean_probe.py`);
`--cpu` is the dry run with tiny shapes.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

import rlstack.rollout.hf as hf
import rlstack.rollout.hf_sampling as hf_sampling

sys.path.insert(0, str(Path(__file__).parent))
import gpu_check  # noqa: E402

CPU = "--cpu" in sys.argv
calls: list[dict] = []
lean_on = {"value": True}
real_lean, real_sample = hf_sampling.lean_decoder, hf_sampling.sample


def _sync() -> None:
    if not CPU:
        torch.cuda.synchronize()


def lean_decoder(model, positions):
    decoder = real_lean(model, positions) if lean_on["value"] else None
    calls[-1]["lean"] = decoder is not None
    return decoder


def sample(model, prompts, max_new_tokens, *args, **kwargs):
    calls.append({"rows": len(prompts), "max_new": max_new_tokens})
    _sync()
    start = time.perf_counter()
    out = real_sample(model, prompts, max_new_tokens, *args, **kwargs)
    _sync()
    calls[-1] |= {"s": round(time.perf_counter() - start, 3), "tokens": int(out["response_mask"].sum())}
    return out


def main() -> None:
    hf_sampling.lean_decoder, hf.sample = lean_decoder, sample
    for lean in (True, False, True):
        lean_on["value"], calls[:] = lean, []
        with tempfile.TemporaryDirectory() as tmp:
            work = gpu_check.CPU_WORK if CPU else gpu_check.GPU_WORK
            ctx = gpu_check.Context(
                "cpu" if CPU else "cuda", Path(tmp), work, "float32" if CPU else "bfloat16"
            )
            figure, _ = gpu_check.check_grpo(ctx, "smollm2-135m")
        print(f"lean={lean}: {figure}", flush=True)
        for c in calls:
            print("   ", c, flush=True)


if __name__ == "__main__":
    main()
