"""The `rlstack` command.

rlstack train config=path.yaml a.b=c ... [--print-config [--machine-checks=warn]]
rlstack sft   config=path.yaml a.b=c ... [--print-config [--machine-checks=warn]]
rlstack eval  config=path.yaml a.b=c ... [--data SPEC ...] [--checkpoint DIR] [--n N --k K ... --temperature T]
rlstack init-model OUT_DIR [--vision] [--hidden-size 128 --num-layers 3 ...]
rlstack demo [--task addition|visual|code|real|real-tool|real-code|real-no-tool] [--workdir outputs/demo] [--seed S] [--num-threads N]
rlstack merge CHECKPOINT --out DIR
rlstack board RUN_DIR|FOLDER [...] [--port 6007]
rlstack config-keys
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

DEMO_TASKS = ("addition", "visual", "code", "real", "real-tool", "real-code", "real-no-tool")
"""`rlstack demo --task` (the recipes are `rlstack.demo.TASKS`; not imported here, to keep `--help` fast)."""


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    parser = argparse.ArgumentParser(prog="rlstack", description="RL post-training for language models.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in (
        ("train", "run RL training (GRPO)"),
        ("sft", "supervised fine-tuning on (prompt, answer) rows"),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument("overrides", nargs="*", help="config=file.yaml and key=value overrides")
        _config_option(p)
        p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
        p.add_argument(
            "--machine-checks",
            choices=["error", "warn"],
            default="error",
            help="with --print-config, warn: what this machine cannot run (no GPU, vLLM not installed, ...) is "
            "said as warnings, to check on a laptop a config meant for a GPU node (default: error)",
        )
    p = sub.add_parser(
        "eval", help="evaluate a model or checkpoint on datasets with the run's rewards: greedy, pass@k"
    )
    p.add_argument(
        "overrides", nargs="*", help="config=file.yaml and key=value overrides (a training config)"
    )
    _config_option(p)
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="SPEC",
        help="a dataset, in any form data.val_files takes (repeatable; default: data.val_files)",
    )
    p.add_argument(
        "--checkpoint", default=None, help="an rlstack checkpoint directory (checkpoints/global_step_N)"
    )
    p.add_argument(
        "--n", type=int, default=1, help="samples per prompt of the sampled pass (default 1: greedy only)"
    )
    p.add_argument(
        "--k", type=int, nargs="+", default=[], help="the k of pass@k (default: 1, 2, 4, ... up to n, and n)"
    )
    p.add_argument(
        "--temperature", type=float, default=1.0, help="temperature of the sampled pass (default 1.0)"
    )
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p = sub.add_parser("init-model", help="build a tiny Qwen2 (or Qwen2.5-VL) model and tokenizer offline")
    p.add_argument("out_dir")
    p.add_argument(
        "--vision",
        action="store_true",
        help="a tiny Qwen2.5-VL with its image processor; the size options apply to its language model",
    )
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--num-layers", type=int, default=3)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser(
        "demo",
        help="model -> warm start -> GRPO (addition, a visual tool agent, code, or SmolLM2 on word problems, with or without the Python tool), before/after",
    )
    p.add_argument("--task", choices=DEMO_TASKS, default="addition")
    p.add_argument(
        "--workdir", default=None, help="default: outputs/demo (addition), outputs/demo_<task> (others)"
    )
    p.add_argument("--grpo-steps", type=int, default=None, help="override the number of GRPO steps")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the data order, sampling and torch in every run (default: the recipes', 1)",
    )
    p.add_argument(
        "--num-threads", type=int, default=None, help="torch CPU threads in every run (default: torch's)"
    )
    p.add_argument(
        "--sft-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override of the warm start (repeatable)",
    )
    p.add_argument(
        "--grpo-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override of GRPO and the evaluations (repeatable)",
    )
    p = sub.add_parser("merge", help="write a checkpoint's policy (sharded or not) as a Hugging Face model")
    p.add_argument("checkpoint", help="a run's checkpoints/global_step_N directory")
    p.add_argument("--out", required=True, help="the Hugging Face model directory to write")
    p = sub.add_parser("board", help="a local web page over run directories: curves, rollouts, config (live)")
    p.add_argument(
        "run_dirs",
        nargs="+",
        type=Path,
        help="run directories (the folders with metrics.jsonl), or folders above runs (every run below is shown)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=6007)
    p = sub.add_parser(
        "config-keys", help="list the config keys with their defaults, choices, ranges and descriptions"
    )
    p.add_argument(
        "pattern",
        nargs="?",
        help="only the keys containing this text (lr, rollout.n), or matching this glob ('worker.actor.optim.*')",
    )
    p.add_argument("--resumable", action="store_true", help="only the keys a resumed run may change")
    args, rest = parser.parse_known_args(argv)
    # key=value overrides after an option (`--print-config trainer.max_steps=3`) are overrides too
    extra = [a for a in rest if not a.startswith("-") and ("=" in a or a.startswith("~"))]
    if extra and hasattr(args, "overrides"):
        args.overrides += extra
        rest = [a for a in rest if a not in extra]
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if getattr(args, "config", None):  # `--config F` is `config=F`, before the overrides (NeMo RL's form)
        args.overrides = [f"config={f}" for f in args.config] + args.overrides

    from rlstack.config import ConfigError
    from rlstack.errors import RLStackError
    from rlstack.stops import RunStopped, Stopped

    try:
        return _run(args)
    except RunStopped as e:  # a signal, then a clean stop at the end of a step
        print(f"rlstack: {e}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt as e:  # a second signal, or Ctrl-C before training began
        signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
        print(
            f"rlstack: stopped at once by {signal.Signals(signum).name}; what the last checkpoint holds is kept",
            file=sys.stderr,
        )
        return 128 + signum
    except ConfigError as e:
        print(f"rlstack: {e}", file=sys.stderr)
        return 2
    except RLStackError as e:
        print(f"rlstack: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        action="append",
        metavar="FILE",
        help="a config file, the same as config=FILE (NeMo RL's form; repeatable, later files win)",
    )


def _run(args: argparse.Namespace) -> int:
    if args.command in ("train", "sft"):
        from rlstack.config import ConfigError, load_config, to_yaml

        if args.machine_checks == "warn" and not args.print_config:
            raise ConfigError(
                [
                    "--machine-checks=warn only checks a config (with --print-config): a run needs what it asks for"
                ]
            )
        cfg = load_config(args.overrides, machine_checks=args.machine_checks, rewards=args.command == "train")
        if args.print_config:
            print(to_yaml(cfg), end="")
            return 0
        if args.command == "sft":
            from rlstack.sft import run_sft

            print(f"model written to {run_sft(cfg)}")
            return 0
        from rlstack.trainer import Trainer

        Trainer(cfg).fit()
        print(f"run directory: {cfg.run_dir}")
        return 0
    if args.command == "eval":
        from rlstack.config import load_config, to_yaml
        from rlstack.evaluate import EvalSettings, Evaluator, eval_run_config

        cfg = load_config(args.overrides, trains=False)
        if args.print_config:
            print(to_yaml(eval_run_config(cfg)), end="")
            return 0
        settings = EvalSettings(args.data, args.n, tuple(args.k), args.temperature, args.checkpoint)
        Evaluator(cfg, settings).run()
        return 0
    if args.command == "board":
        from rlstack.board import Board

        board = Board(args.run_dirs, args.host, args.port)
        print(f"rlstack board on {board.url} over {len(board.run_dirs)} run(s); Ctrl-C stops it", flush=True)
        board.serve()
        return 0
    if args.command == "init-model":
        from rlstack.models.loading import write_model_dir

        out = write_model_dir(
            Path(args.out_dir),
            vision=args.vision,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads,
            seed=args.seed,
        )
        what = (
            "Qwen2.5-VL model, tokenizer and image processor" if args.vision else "Qwen2 model and tokenizer"
        )
        print(f"tiny {what} written to {out}")
        return 0
    if args.command == "demo":
        from rlstack.demo import run_demo

        workdir = args.workdir or ("outputs/demo" if args.task == "addition" else f"outputs/demo_{args.task}")
        run_demo(
            Path(workdir),
            grpo_steps=args.grpo_steps,
            task=args.task,
            seed=args.seed,
            num_threads=args.num_threads,
            sft_overrides=args.sft_override,
            grpo_overrides=args.grpo_override,
        )
        return 0
    if args.command == "merge":
        from rlstack.merge import merge_checkpoint

        print(f"model written to {merge_checkpoint(Path(args.checkpoint), Path(args.out))}")
        return 0
    if args.command == "config-keys":
        return _config_keys(args.pattern, args.resumable)
    raise AssertionError(args.command)


def _config_keys(pattern: str | None, resumable: bool) -> int:
    """`rlstack config-keys [PATTERN] [--resumable]`: one line a key, `key (type, default D; rules): doc`."""
    import difflib
    import fnmatch

    from rlstack.config import Config, describe
    from rlstack.config.fields import resumable_keys
    from rlstack.config.schema import key_rules

    rows, rules = describe(), key_rules()
    if pattern:
        glob = any(c in pattern for c in "*?[")
        rows = [
            r
            for r in rows
            if (fnmatch.fnmatchcase(r[0], pattern) if glob else pattern.lower() in r[0].lower())
        ]
    if resumable:
        free = resumable_keys(Config)
        rows = [r for r in rows if r[0] in free]
    if not rows:
        close = difflib.get_close_matches(pattern or "", [r[0] for r in describe()], n=3, cutoff=0.5)
        hint = f"; closest: {', '.join(close)}" if close else "; `rlstack config-keys` lists them all"
        print(f"rlstack: no config key matches {pattern!r}{hint}", file=sys.stderr)
        return 2
    for key, tp, default, doc in rows:
        rule = f"; {rules[key]}" if key in rules else ""
        print(f"{key} ({tp}, default {default!r}{rule}): {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
