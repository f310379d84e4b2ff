"""Side-by-side GRPO step rate: rlstack's `Trainer` against TRL's `GRPOTrainer`, on identical work.

Both systems train the same model on the same prompts, in the same order (no shuffling), with the
same GRPO settings: prompts per step, samples per prompt, maximum response length, temperature,
learning rate, AdamW (betas, weight decay), constant schedule, clip range, token-mean loss, no KL
term, LoRA or not (the same rank, alpha and layers), one optimizer step per generation batch made of
the same micro-batches, the same reward, no validation, no checkpoints, no trackers. The model is
either the randomly initialised tiny Qwen2 (the default: built offline by
`rlstack.models.loading.write_model_dir`, on built-in addition prompts scored by exact match), or
any model rlstack loads (`--model builtin:smollm2-135m-instruct`, a directory, a `.gguf` file: resolved
once, by rlstack, to the directory both sides load), on `--task word_problems` scored by
`builtin:math`. `--fixed-length` makes every response exactly `--max-response-length` tokens on
both sides (rlstack's `worker.rollout.ignore_eos`, TRL's `min_new_tokens`), so that a pretrained
model's answers ending at different lengths cannot make one side's work smaller.

A third side, `torch`, is the raw compute of the same tokens: Hugging Face's `generate` on the same
prompts and sampling settings, then one forward and backward pass per micro-batch of a clipped
policy-gradient loss and the optimizer step, in a plain loop with nothing else (no reward
bookkeeping, no metrics, no checks). It is what a trainer's step is compared with, not a strict
floor: like TRL, it prefills each prompt once per sample and runs every sample's prompt tokens in
the update, where rlstack does both once per prompt, so rlstack's step can be the shorter.
(`--fixed-length` bans EOS until the limit on the TRL and torch sides, `min_new_tokens`; rlstack
samples EOS and goes on: the same token counts, slightly different distributions.)

Each side runs in its own subprocess (one after the other, so all see the same machine; the order
alternates between rounds), with the same number of torch threads. A step is timed from the start
of one step to the start of the next (everything the loop does between two steps counts), after a
few warm-up steps. Each side also reports its process's peak resident memory.

    python bench/bench_trl.py                   # rlstack and TRL on the tiny model: bench/results/trl_grpo.json
    python bench/bench_trl.py --steps 4         # quicker
    python bench/bench_trl.py --model builtin:smollm2-135m-instruct --task word_problems --fixed-length \\
        --prompts 16 --n 4 --max-response-length 128 --micro-batch 16 --lora-rank 32 \\
        --sides rlstack,trl,torch               # the real model: bench/results/trl_grpo_smollm2-135m-instruct_lora32.json
    python bench/bench_trl.py --system trl ...  # one side only (what the main process launches)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "trl_grpo.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", choices=SIDES, help="run one side only (internal)")
    p.add_argument("--model-dir", help="model directory the sides load (internal)")
    p.add_argument(
        "--model",
        default="tiny",
        help="tiny (a random tiny Qwen2, built here) or a model_path rlstack accepts: "
        "builtin:smollm2-135m-instruct, a directory, a .gguf file",
    )
    p.add_argument("--task", choices=sorted(TASKS), default="addition", help="prompts and their reward")
    p.add_argument(
        "--sides", default="rlstack,trl", help=f"comma-separated sides to run, of {', '.join(SIDES)}"
    )
    p.add_argument(
        "--fixed-length",
        action="store_true",
        help="every response runs to --max-response-length tokens on every side (EOS does not end it)",
    )
    p.add_argument(
        "--lora-rank", type=int, default=0, help="LoRA rank on every linear layer (0: full weights)"
    )
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--json-out", help="where a single side writes its result (internal)")
    p.add_argument(
        "--before",
        help="the root of another checkout of rlstack (e.g. `git worktree add /tmp/before <commit>`): its rlstack "
        "side runs too, as `rlstack_before` (list it in --sides to place it; it is added after rlstack otherwise)",
    )
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="responses per prompt")
    p.add_argument("--max-response-length", type=int, default=16, help="tokens per response at most")
    p.add_argument("--micro-batch", type=int, default=64, help="trajectories per forward/backward pass")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--warmup", type=int, default=2, help="steps excluded from the timing")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--rounds", type=int, default=2, help="runs per system, in ABBA order")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads on both sides")
    p.add_argument(
        "--omp-wait-policy",
        default="",
        help="OMP_WAIT_POLICY of both sides (default: unset, the runtime's own policy, as users run); "
        "PASSIVE keeps OpenMP threads from spinning, which makes figures usable on a machine shared with "
        "other CPU work (where spinning threads make steps 10-30x slower) but slows both sides on an idle one",
    )
    p.add_argument(
        "--output",
        help="result JSON (default: bench/results/trl_grpo.json for the tiny model, "
        "trl_grpo_<model>_<lora<rank>|full>.json for another)",
    )
    return p.parse_args(argv)


SIDES = ("rlstack", "rlstack_before", "trl", "torch")
"""`rlstack_before`: rlstack's side run from another checkout (`--before`), the same workload: a change's
before and after, side by side in one run."""
TASKS = {
    # train files, rlstack's reward function (and its kwargs), data.max_prompt_length
    "addition": ("builtin:addition@train", "builtin:exact_match", {}, 512),
    "word_problems": ("builtin:word_problems@train", "builtin:math", {"format_weight": 0.0}, 160),
}


def build_rows(task: str) -> list[dict]:
    from rlstack.data.tasks import builtin_rows

    return builtin_rows(TASKS[task][0])


def chat(row: dict) -> list[dict]:
    """A row's prompt as chat messages, as rlstack's data loader builds it from `problem`."""
    problem = row["problem"]
    return problem if isinstance(problem, list) else [{"role": "user", "content": problem}]


def reward_fn(task: str):
    """The task's reward on (completion texts, ground truths), the same function rlstack's side uses."""
    if task == "addition":
        return lambda texts, answers: [float(t.strip() == str(g).strip()) for t, g in zip(texts, answers)]
    from rlstack.rewards.math import compute_score

    kwargs = TASKS[task][2]
    return lambda texts, answers: [
        s["overall"]
        for s in compute_score([{"response": t, "ground_truth": g} for t, g in zip(texts, answers)], **kwargs)
    ]


def peak_rss_gb() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def summarize(stamps: list[float], warmup: int, steps: int) -> dict:
    """`stamps[i]` is the start of step i+1; steady-state steps are warmup+1 .. warmup+steps."""
    durations = [b - a for a, b in zip(stamps, stamps[1:])][warmup : warmup + steps]
    assert len(durations) == steps, (len(stamps), warmup, steps)
    total = sum(durations)
    return {
        "timed_steps": steps,
        "timed_s": total,
        "steps_per_s": steps / total,
        "step_s_mean": statistics.mean(durations),
        "step_s_median": statistics.median(durations),
        "step_s_min": min(durations),
        "step_s_max": max(durations),
        "step_s": durations,
    }


def _mean(xs: list[float]) -> float:
    return float(statistics.mean(xs)) if xs else float("nan")


# ---------------------------------------------------------------------------------------- rlstack


def rlstack_overrides(a: argparse.Namespace, model_dir: str, steps: int, out: str) -> list[str]:
    """The rlstack side's config: the benchmark's workload for `steps` steps, run directory under `out`."""
    train_files, reward, reward_kwargs, max_prompt_length = TASKS[a.task]
    lora = (
        [f"worker.actor.model.lora.rank={a.lora_rank}", f"worker.actor.model.lora.alpha={2 * a.lora_rank}"]
        if a.lora_rank
        else []
    )
    return [
        f"worker.actor.model.model_path={model_dir}",
        *lora,
        f"data.train_files={train_files}",
        "data.val_files=''",
        "data.shuffle=false",
        "data.filter_overlong_prompts=false",  # every side walks the same prompts (a longer one is an error)
        f"data.rollout_batch_size={a.prompts}",
        f"data.max_prompt_length={max_prompt_length}",
        f"data.max_response_length={a.max_response_length}",
        f"worker.actor.global_batch_size={a.prompts}",
        f"worker.actor.micro_batch_size_per_device_for_update={a.micro_batch}",
        f"worker.actor.micro_batch_size_per_device_for_experience={a.micro_batch}",
        f"worker.actor.optim.lr={a.lr}",
        "worker.actor.optim.weight_decay=0.01",
        "worker.actor.clip_ratio_low=0.2",
        "worker.actor.clip_ratio_high=0.28",
        "worker.actor.max_grad_norm=1.0",
        f"worker.rollout.n={a.n}",
        f"worker.rollout.temperature={a.temperature}",
        "worker.rollout.top_p=1.0",
        "worker.rollout.top_k=-1",
        f"worker.rollout.ignore_eos={str(a.fixed_length).lower()}",
        f"worker.reward.reward_function={reward}",
        *[f"worker.reward.reward_function_kwargs.{k}={v}" for k, v in reward_kwargs.items()],
        "algorithm.use_kl_loss=false",
        "algorithm.norm_adv_by_std_in_grpo=true",
        "trainer.logger=[file]",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        "trainer.save_model_only=true",
        "trainer.train_generations_to_log=0",
        f"trainer.max_steps={steps}",
        f"trainer.num_threads={a.threads}",
        f"trainer.output_dir={out}",
        "trainer.experiment_name=bench",
    ]


def run_rlstack(a: argparse.Namespace) -> dict:
    import torch

    import rlstack
    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    torch.set_num_threads(a.threads)
    total = a.warmup + a.steps + 1  # one more step: its start closes the last timed step
    with tempfile.TemporaryDirectory(prefix="rlstack-bench-") as out:
        cfg = load_config(rlstack_overrides(a, a.model_dir, total, out))
        assert cfg.data.val_files == "", cfg.data.val_files

        stamps: list[float] = []

        class TimedTrainer(Trainer):
            def train_step(self):
                stamps.append(time.perf_counter())
                return super().train_step()

        t0 = time.perf_counter()
        trainer = TimedTrainer(cfg)
        setup_s = time.perf_counter() - t0
        assert not trainer.plan.old_logprobs, "one mini-batch and one epoch: no separate old-log-prob pass"
        trainer.fit()
        rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if a.warmup < r["step"] <= a.warmup + a.steps]
    result = summarize(stamps, a.warmup, a.steps)
    result.update(
        rlstack_path=str(Path(rlstack.__file__).parent),  # which checkout ran (`--before`)
        setup_s=setup_s,
        peak_rss_gb=peak_rss_gb(),
        response_length_mean=_mean([r["response_length/mean"] for r in timed]),
        prompt_length_mean=_mean([r["prompt_length/mean"] for r in timed]),
        trajectories_per_step=a.prompts * a.n,
        reward_mean=_mean([r["critic/score/mean"] for r in timed]),
        phases_s=rlstack_phases(timed, result["step_s_mean"]),
    )
    return result


PHASE_NAMES = {"gen": "generate", "reward": "reward", "adv": "advantages", "update_actor": "update"}
"""rlstack's `timing_s/<phase>` metrics under the names the other sides' phases have."""


def rlstack_phases(timed: list[dict], step_s_mean: float) -> dict[str, float]:
    """The mean seconds of every phase the step plan timed (`timing_s/<phase>`: generation, old log-probs
    when they run, the reference, reward, advantages, the update, the weight sync, ...), the step's time in
    the loop (`in_loop_step`), what the loop spends between its phases (`between_phases`), and between two
    steps outside the loop (`outside_step`: the start-to-start step less the loop's)."""
    keys = sorted({k for r in timed for k in r if k.startswith("timing_s/")} - {"timing_s/step"})
    phases = {PHASE_NAMES.get(k[9:], k[9:]): _mean([r.get(k, 0.0) for r in timed]) for k in keys}
    in_loop = _mean([r["timing_s/step"] for r in timed])
    top_level = [v for k, v in phases.items() if not k.startswith("agent_")]  # agent_*: inside generation
    return phases | {
        "in_loop_step": in_loop,
        "between_phases": in_loop - sum(top_level),
        "outside_step": step_s_mean - in_loop,
    }


# -------------------------------------------------------------------------------------------- TRL


def run_trl(a: argparse.Namespace) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlstack.models.loading import load_tokenizer

    torch.set_num_threads(a.threads)
    total = a.warmup + a.steps + 1
    trajectories = a.prompts * a.n
    if trajectories % a.micro_batch:
        raise SystemExit(
            f"--prompts * --n ({trajectories}) must be divisible by --micro-batch ({a.micro_batch})"
        )
    accum = trajectories // a.micro_batch

    dataset = Dataset.from_list([{"prompt": chat(r), "answer": r["answer"]} for r in build_rows(a.task)])
    score = reward_fn(a.task)

    def reward(completions, answer, **kwargs):
        return score([c[0]["content"] for c in completions], answer)

    stamps: list[float] = []
    lengths: list[float] = []
    prompt_lengths: list[float] = []
    rollout_s: list[float] = []

    class StepStart(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    class TimedGRPO(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            t = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            rollout_s.append(time.perf_counter() - t)
            lengths.append(float(out["completion_mask"].sum(-1).float().mean()))
            prompt_lengths.append(float(out["prompt_mask"].sum(-1).float().mean()))
            return out

    with tempfile.TemporaryDirectory(prefix="trl-bench-") as out:
        args = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            fp16=False,
            activation_checkpointing=False,  # TRL's GRPO default is True; rlstack does not checkpoint
            per_device_train_batch_size=a.micro_batch,  # trajectories per forward/backward
            gradient_accumulation_steps=accum,
            steps_per_generation=accum,  # one generation batch of prompts*n = one optimizer step
            num_generations=a.n,
            num_iterations=1,
            max_completion_length=a.max_response_length,
            temperature=a.temperature,
            top_p=1.0,
            top_k=0,
            generation_kwargs={"min_new_tokens": a.max_response_length} if a.fixed_length else None,
            learning_rate=a.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.01,
            adam_beta1=0.9,
            adam_beta2=0.999,
            max_grad_norm=1.0,
            beta=0.0,
            epsilon=0.2,
            epsilon_high=0.28,
            loss_type="dapo",  # token mean over the whole accumulated batch, as rlstack's token-mean
            scale_rewards="group",
            shuffle_dataset=False,
            max_steps=total,
            seed=1,
            report_to="none",
            logging_strategy="no",
            save_strategy="no",
            eval_strategy="no",
            disable_tqdm=True,
            log_completions=False,
            dataloader_num_workers=0,
        )
        assert args.generation_batch_size == trajectories, args.generation_batch_size
        tokenizer = load_tokenizer(a.model_dir)
        t0 = time.perf_counter()
        # As TRL users load a model: Hugging Face's own SDPA attention (rlstack's loader would give TRL its
        # small-query attention path, rlstack.models.attention).
        model = AutoModelForCausalLM.from_pretrained(
            a.model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
        trainer = TimedGRPO(
            model=model,
            reward_funcs=reward,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepStart()],
            peft_config=peft_lora(a.lora_rank),
        )
        setup_s = time.perf_counter() - t0
        assert not trainer.model.is_activation_checkpointing, "activation checkpointing must be off"
        trainer.train()
        optimizer_steps = trainer.state.global_step
    assert optimizer_steps == total, (optimizer_steps, total)
    assert len(rollout_s) == total, f"expected one generation per optimizer step, got {len(rollout_s)}"
    return side_result(a, stamps, setup_s, lengths, prompt_lengths, "generate_and_score", rollout_s)


def peft_lora(rank: int):
    """peft's LoRA as rlstack builds it from `worker.actor.model.lora` (alpha = 2 x rank, every linear layer
    but the output head, no dropout); None for full weights."""
    if not rank:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules="all-linear",
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


# ------------------------------------------------------------------------------------ raw torch


def run_torch(a: argparse.Namespace) -> dict:
    """The same tokens through plain torch: `generate`, then forward/backward and one optimizer step."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from rlstack.models.loading import load_tokenizer
    from rlstack.rollout.engine import end_token_ids

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    total = a.warmup + a.steps  # a final time stamp closes the last step
    tokenizer = load_tokenizer(a.model_dir)
    tokenizer.padding_side = "left"
    rows = build_rows(a.task)
    score = reward_fn(a.task)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    # the EOS ids rlstack's engines and TRL stop at: the tokenizer's and the generation config's
    eos = torch.tensor(sorted(end_token_ids(tokenizer.eos_token_id, model.generation_config.eos_token_id)))
    # every sampling setting spelled out: nothing inherited from the model's generation_config
    # (an instruct model's repetition_penalty, top_k, ...)
    sampling = GenerationConfig(
        do_sample=True,
        temperature=a.temperature,
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        max_new_tokens=a.max_response_length,
        min_new_tokens=a.max_response_length if a.fixed_length else 0,
        eos_token_id=eos.tolist(),
        pad_token_id=tokenizer.pad_token_id,
    )
    if a.lora_rank:
        from peft import get_peft_model

        model = get_peft_model(model, peft_lora(a.lora_rank))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), weight_decay=0.01)
    setup_s = time.perf_counter() - t0
    stamps: list[float] = []
    gen_s: list[float] = []
    lengths: list[float] = []
    prompt_lengths: list[float] = []
    for step in range(total):
        stamps.append(time.perf_counter())
        batch = rows[step * a.prompts : (step + 1) * a.prompts]
        texts = [
            tokenizer.apply_chat_template(chat(r), add_generation_prompt=True, tokenize=False) for r in batch
        ]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        prompt_ids = enc["input_ids"].repeat_interleave(a.n, 0)
        prompt_mask = enc["attention_mask"].repeat_interleave(a.n, 0)
        P = prompt_ids.shape[1]
        prompt_lengths.append(float(enc["attention_mask"].sum(-1).float().mean()))
        t = time.perf_counter()
        model.eval()
        with torch.no_grad():
            seq = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=sampling)
        gen_s.append(time.perf_counter() - t)
        response = seq[:, P:]
        # a response ends at its first EOS (kept); everything after it is padding
        is_eos = torch.isin(response, eos).long()
        after_eos = is_eos.cumsum(-1) - is_eos
        response_mask = (after_eos == 0).long() if not a.fixed_length else torch.ones_like(response)
        lengths.append(float(response_mask.sum(-1).float().mean()))
        rewards = torch.tensor(
            score(
                tokenizer.batch_decode(
                    response.masked_fill(response_mask == 0, tokenizer.pad_token_id), skip_special_tokens=True
                ),
                [r["answer"] for r in batch for _ in range(a.n)],
            )
        ).view(-1, a.n)
        advantages = (
            (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-6)
        ).view(-1)
        mask = torch.cat([prompt_mask, response_mask], dim=-1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        model.train()
        plain_update(
            model, params, optimizer, seq, mask, positions, response, response_mask, advantages, a.micro_batch
        )
    stamps.append(time.perf_counter())
    return side_result(a, stamps, setup_s, lengths, prompt_lengths, "generate", gen_s)


def plain_update(
    model, params, optimizer, ids, mask, positions, labels, scored, advantages, micro_batch, temperature=1.0
) -> None:
    """One optimizer step of the plain loop: per micro-batch of whole rows, a forward pass keeping the logits of
    the last `labels.shape[1]` columns, the clipped policy-gradient loss over the `scored` tokens (their sum
    over the batch's scored tokens), backward; then gradient clipping and the optimizer's step."""
    import torch

    tokens = scored.sum()
    for m in range(0, len(ids), micro_batch):
        sl = slice(m, m + micro_batch)
        logits = model(
            input_ids=ids[sl],
            attention_mask=mask[sl],
            position_ids=positions[sl],
            logits_to_keep=labels.shape[1] + 1,
        ).logits[:, :-1]
        logp = torch.log_softmax(logits.float() / temperature, -1).gather(-1, labels[sl, :, None]).squeeze(-1)
        ratio = torch.exp(logp - logp.detach())
        loss = -(torch.clamp(ratio, 0.8, 1.28) * advantages[sl, None] * scored[sl]).sum() / tokens
        loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def side_result(
    a: argparse.Namespace,
    stamps: list[float],
    setup_s: float,
    lengths: list[float],
    prompt_lengths: list[float],
    generate_phase: str,
    generate_s: list[float],
) -> dict:
    """A side's timed steps (after the warm-up), its token counts, and its step split into the timed
    generation phase and the rest (the update)."""
    sl = slice(a.warmup, a.warmup + a.steps)
    result = summarize(stamps, a.warmup, a.steps)
    result.update(
        setup_s=setup_s,
        peak_rss_gb=peak_rss_gb(),
        response_length_mean=_mean(lengths[sl]),
        prompt_length_mean=_mean(prompt_lengths[sl]),
        trajectories_per_step=a.prompts * a.n,
        phases_s={generate_phase: _mean(generate_s[sl])},
    )
    result["phases_s"]["update"] = result["step_s_mean"] - result["phases_s"][generate_phase]
    return result


# ------------------------------------------------------------------------------------------- main


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("rlstack", "trl", "transformers", "torch", "accelerate", "datasets", "peft"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    try:
        out["rlstack_git"] = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "rlstack"], capture_output=True, text=True
        ).stdout.strip()
        out["rlstack_git"] += "+dirty" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        out["rlstack_git"] = None
    return out


def _git_head(root: Path) -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "gpu": False,
    }


def run_side(system: str, a: argparse.Namespace, model_dir: str, tmp: str, index: int) -> dict:
    out = Path(tmp) / f"{index}-{system}.json"
    cmd = [
        sys.executable,
        __file__,
        "--system",
        system,
        "--model-dir",
        model_dir,
        "--json-out",
        str(out),
        "--prompts",
        str(a.prompts),
        "--n",
        str(a.n),
        "--max-response-length",
        str(a.max_response_length),
        "--micro-batch",
        str(a.micro_batch),
        "--lr",
        str(a.lr),
        "--task",
        a.task,
        "--lora-rank",
        str(a.lora_rank),
        "--temperature",
        str(a.temperature),
        *(["--fixed-length"] if a.fixed_length else []),
        "--warmup",
        str(a.warmup),
        "--steps",
        str(a.steps),
        "--threads",
        str(a.threads),
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    if system == "rlstack_before":  # the other checkout's package first on the path
        cmd[cmd.index("--system") + 1] = "rlstack"
        env["PYTHONPATH"] = os.pathsep.join([str(Path(a.before).resolve()), env.get("PYTHONPATH", "")])
    env.pop("OMP_WAIT_POLICY", None)
    if a.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = a.omp_wait_policy
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    print(f"[bench] running {system} ({a.warmup} warm-up + {a.steps} timed steps) ...", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"[bench] {system} failed with exit code {proc.returncode}")
    result = json.loads(out.read_text())
    result["process_wall_s"] = wall
    print(
        f"[bench]   {system}: {result['steps_per_s']:.3f} steps/s over {a.steps} steps ({wall:.0f} s, "
        f"peak memory {result['peak_rss_gb']:.2f} GB)",
        flush=True,
    )
    return result


def combine(runs: list[dict]) -> dict:
    """Pool the timed steps of every run of one system; the headline rate uses the median step time."""
    steps = [d for r in runs for d in r["step_s"]]
    phase_keys = runs[0]["phases_s"].keys()
    return {
        "steps_per_s": 1.0 / statistics.median(steps),
        "steps_per_s_from_mean": len(steps) / sum(steps),
        "step_s_median": statistics.median(steps),
        "step_s_mean": statistics.mean(steps),
        "step_s_min": min(steps),
        "step_s_max": max(steps),
        "timed_steps": len(steps),
        "peak_rss_gb": max(r["peak_rss_gb"] for r in runs),
        "response_length_mean": _mean([r["response_length_mean"] for r in runs]),
        "prompt_length_mean": _mean([r["prompt_length_mean"] for r in runs]),
        "trajectories_per_step": runs[0]["trajectories_per_step"],
        "phases_s": {k: _mean([r["phases_s"][k] for r in runs]) for k in phase_keys},
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.system:
        result = {"rlstack": run_rlstack, "trl": run_trl, "torch": run_torch}[a.system](a)
        Path(a.json_out).write_text(json.dumps(result))
        return
    sides_run = [s.strip() for s in a.sides.split(",") if s.strip()]
    if a.before and "rlstack_before" not in sides_run:
        sides_run.insert(sides_run.index("rlstack") + 1 if "rlstack" in sides_run else 0, "rlstack_before")
    if "rlstack_before" in sides_run and not a.before:
        raise SystemExit("--sides rlstack_before needs --before: the root of the other checkout")
    unknown = [s for s in sides_run if s not in SIDES]
    if unknown or not sides_run or len(set(sides_run)) != len(sides_run):
        raise SystemExit(f"--sides {a.sides!r}: give distinct sides of {', '.join(SIDES)}, comma-separated")
    if a.output is None:
        name = (
            "trl_grpo"
            if a.model == "tiny"
            else f"trl_grpo_{_slug(a.model)}_{f'lora{a.lora_rank}' if a.lora_rank else 'full'}"
        )
        a.output = str(RESULTS.parent / f"{name}.json")

    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {s: [] for s in sides_run}
    # the order reverses every round (A B C, C B A, ...) so a drift in machine load hits every side alike
    order = [s for i in range(a.rounds) for s in (sides_run if i % 2 == 0 else sides_run[::-1])]
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        model_dir = resolve_model(a.model, Path(tmp))
        for i, system in enumerate(order):
            runs[system].append(run_side(system, a, model_dir, tmp, i))
    load_after = os.getloadavg()
    sides = {name: combine(rs) for name, rs in runs.items()}

    ratios = {}
    if "rlstack" in sides and "trl" in sides:
        ratios["rlstack_over_trl_steps_per_s"] = sides["rlstack"]["steps_per_s"] / sides["trl"]["steps_per_s"]
    if "rlstack" in sides and "rlstack_before" in sides:
        ratios["rlstack_over_before_steps_per_s"] = (
            sides["rlstack"]["steps_per_s"] / sides["rlstack_before"]["steps_per_s"]
        )
    if "rlstack_before" in sides and "trl" in sides:
        ratios["before_over_trl_steps_per_s"] = (
            sides["rlstack_before"]["steps_per_s"] / sides["trl"]["steps_per_s"]
        )
    if "rlstack" in sides and "torch" in sides:
        # how much longer rlstack's step takes than the raw compute of the same tokens
        ratios["rlstack_step_over_torch_step"] = (
            sides["rlstack"]["step_s_median"] / sides["torch"]["step_s_median"]
        )
    print()
    print(
        f"GRPO steady-state step rate: {a.model} model, {a.task}, {a.prompts} prompts x {a.n} samples, "
        f"{'exactly' if a.fixed_length else '<='} {a.max_response_length} new tokens, "
        f"{f'LoRA rank {a.lora_rank}' if a.lora_rank else 'full weights'}, {a.threads} torch threads, "
        f"{a.rounds} run(s) x {a.steps} timed steps per side"
    )
    print(
        f"{'side':<16}{'steps/s':>10}{'s/step':>10}{'min s':>8}{'max s':>8}{'resp len':>10}{'prompt len':>12}"
        f"{'peak GB':>9}"
    )
    for name, s in sides.items():
        print(
            f"{name:<16}{s['steps_per_s']:>10.3f}{s['step_s_median']:>10.3f}{s['step_s_min']:>8.3f}"
            f"{s['step_s_max']:>8.3f}{s['response_length_mean']:>10.2f}{s['prompt_length_mean']:>12.2f}"
            f"{s['peak_rss_gb']:>9.2f}"
        )
    if "rlstack_over_trl_steps_per_s" in ratios:
        print(f"ratio rlstack/TRL (steps/s, median step time): {ratios['rlstack_over_trl_steps_per_s']:.2f}x")
    if "rlstack_step_over_torch_step" in ratios:
        print(f"rlstack step / raw torch step (median): {ratios['rlstack_step_over_torch_step']:.2f}x")
    if "rlstack_over_before_steps_per_s" in ratios:
        print(f"ratio rlstack/rlstack_before (steps/s): {ratios['rlstack_over_before_steps_per_s']:.2f}x")
    for name, s in sides.items():
        print(f"{name} phases (s/step, mean): {_fmt(s['phases_s'])}")
    print(
        f"load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f} (nproc {machine()['nproc']})"
    )

    train_files, reward, reward_kwargs, _ = TASKS[a.task]
    result = {
        "benchmark": "GRPO steady-state step rate, rlstack Trainer vs TRL GRPOTrainer (and raw torch)",
        "command": " ".join(["python bench/bench_trl.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **(
            {"ratio_steps_per_s_rlstack_over_trl": round(ratios["rlstack_over_trl_steps_per_s"], 3)}
            if "rlstack_over_trl_steps_per_s" in ratios
            else {}
        ),
        "ratios": _rounded(ratios),
        "settings": {
            "model": "tiny Qwen2 (write_model_dir defaults: hidden 128, 3 layers), random init, float32"
            if a.model == "tiny"
            else f"{a.model} (float32)",
            "task": f"{train_files}, chat messages, no shuffle",
            "reward": f"{reward} {reward_kwargs}" if reward_kwargs else reward,
            "lora_rank": a.lora_rank,
            "fixed_length": a.fixed_length,
            "prompts_per_step": a.prompts,
            "n": a.n,
            "trajectories_per_step": a.prompts * a.n,
            "max_response_length": a.max_response_length,
            "micro_batch": a.micro_batch,
            "optimizer_steps_per_generation": 1,
            "temperature": a.temperature,
            "lr": a.lr,
            "kl": False,
            "warmup_steps": a.warmup,
            "timed_steps_per_run": a.steps,
            "runs_per_system": a.rounds,
            "torch_threads": a.threads,
            "omp_wait_policy": a.omp_wait_policy or None,
            "steps_per_s": "1 / median step time over all timed steps of all runs (robust to load bursts)",
            "peak_rss_gb": "the side's process peak resident memory (model loading included)",
        },
        "results": {name: _rounded(s) for name, s in sides.items()},
        "versions": versions(),
        **(
            {"before": {"root": str(Path(a.before).resolve()), "git": _git_head(Path(a.before))}}
            if a.before
            else {}
        ),
        "machine": {**machine(), "loadavg_1min_before": load_before[0], "loadavg_1min_after": load_after[0]},
    }
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


def resolve_model(model: str, tmp: Path) -> str:
    """The directory every side loads: the tiny Qwen2 built in `tmp`, or what rlstack makes of `model`
    (a `builtin:` model fetched, a GGUF file dequantized once into its cache)."""
    if model == "tiny":
        from rlstack.models.loading import write_model_dir

        return str(write_model_dir(tmp / "tiny-qwen2"))
    from rlstack.config import ModelConfig
    from rlstack.models.loading import model_dir

    return str(model_dir(ModelConfig(model_path=model)))


def _slug(model: str) -> str:
    name = model.removeprefix("builtin:").rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf")
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)


def _fmt(phases: dict) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in phases.items())


def _rounded(x):
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


if __name__ == "__main__":
    main()
