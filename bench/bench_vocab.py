"""Log-probs and entropies over a 152k vocabulary through autograd in one pass (`log_softmax` over every
position) against rlstack's blocks of positions with a written-out backward (`rlstack.models.vocab`): peak
memory and time, side by side.

Each side runs in its own process (order A, B, B, A): bfloat16 logits of `--rows` x `--positions` x
`--vocab` (as the policy's forward pass leaves them, requiring a gradient), then the update's use of them:
log-probs of the labels and entropies (`ResponseLogits.logprobs(with_entropy=True, entropy_grad=...)` on the
blocks side), a loss over both, and its backward.
Reported: the process's peak resident memory above what it held with the logits made (on CPU every
tensor lives there; on a GPU the same tensors take device memory), and the time of the pass and its
backward (median of `--repeats`).

    python bench/bench_vocab.py            # writes bench/results/vocab_blocks.json
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "vocab_blocks.json"
SIDES = ("one_pass", "blocks")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=SIDES, help="run one side only (internal)")
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--positions", type=int, default=1024, help="scored positions per row")
    p.add_argument("--vocab", type=int, default=152064, help="Qwen2.5's vocabulary")
    p.add_argument("--entropy-grad", action="store_true", help="an entropy bonus in the loss")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", default=str(RESULTS))
    return p.parse_args(argv)


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def one_side(args: argparse.Namespace) -> dict:
    import torch
    import torch.nn.functional as F

    from rlstack.models import logprobs as lp
    from rlstack.models import vocab

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    shape = (args.rows, args.positions)
    logits = torch.randn(*shape, args.vocab, generator=g, dtype=torch.bfloat16).requires_grad_()
    labels = torch.randint(0, args.vocab, shape, generator=g)
    scored = lp.ResponseLogits(logits, labels, 0, None, shape)

    def one_pass():
        ls = F.log_softmax(logits.float(), dim=-1)
        kept = ls if args.entropy_grad else ls.detach()
        return ls.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(kept.exp() * kept).sum(-1)

    def blocks():
        return scored.logprobs(with_entropy=True, entropy_grad=args.entropy_grad)

    run = one_pass if args.side == "one_pass" else blocks
    base = peak_gb()
    times = []
    for _ in range(args.repeats):
        logits.grad = None
        start = time.perf_counter()
        logp, ent = run()
        (logp.mean() + 0.01 * ent.mean()).backward()
        times.append(time.perf_counter() - start)
    positions = args.rows * args.positions
    return {
        "blocks": 1 if args.side == "one_pass" else -(-positions // vocab.block_rows(logits)),
        "logits_gb": logits.numel() * 2 / 2**30,
        "peak_above_logits_gb": peak_gb() - base,
        "seconds": statistics.median(times),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.side:
        print(json.dumps(one_side(args)))
        return
    runs: dict[str, list[dict]] = {s: [] for s in SIDES}
    for side in (*SIDES, *reversed(SIDES)):
        cmd = [sys.executable, __file__, "--side", side, *(argv if argv is not None else sys.argv[1:])]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        runs[side].append(json.loads(out.strip().splitlines()[-1]))
    summary = {
        side: {
            "blocks": r[0]["blocks"],
            "peak_above_logits_gb": max(x["peak_above_logits_gb"] for x in r),
            "seconds": statistics.median(x["seconds"] for x in r),
        }
        for side, r in runs.items()
    }
    result = {
        "benchmark": "log-probs + entropies over the vocabulary: one pass vs blocks of positions",
        "command": "python bench/bench_vocab.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": platform.processor() or platform.machine(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("side", "output")},
        "logits_gb": runs["blocks"][0]["logits_gb"],
        "results": summary,
        "runs": runs,
        "memory_ratio_one_pass_over_blocks": summary["one_pass"]["peak_above_logits_gb"]
        / max(summary["blocks"]["peak_above_logits_gb"], 1e-9),
        "time_ratio_blocks_over_one_pass": summary["blocks"]["seconds"] / summary["one_pass"]["seconds"],
    }
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    for side, s in summary.items():
        print(
            f"{side:9s} blocks {s['blocks']:3d}  peak above logits {s['peak_above_logits_gb']:.2f} GB  {s['seconds']:.2f} s"
        )


if __name__ == "__main__":
    main()
