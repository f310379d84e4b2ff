"""`worker.rollout.*`: sampling, the generation engine, and the multi-turn agent loop (`agent.*`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from rlstack.config.fields import field
from rlstack.config.paths import function_file_problem, path_problems

if TYPE_CHECKING:
    from rlstack.config.schema import Config

ToolContractName = Literal["rlstack", "pyvision", "deepeyes", "codev"]

CONTRACT_CALL_FORMATS: dict[str, Literal["code", "hermes"] | None] = {
    "rlstack": None,
    "pyvision": "code",
    "deepeyes": "hermes",
    "codev": "code",
}
"""The call format each tool contract writes (`tools/contract.py`); None: either, tool_call_format picks."""

_CALL_TAGS = {"code": "<code>```python ...```</code>", "hermes": "<tool_call>{json}</tool_call>"}


@dataclass
class AgentConfig:
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Tools the policy may call, each {import_path (builtin:python, builtin:zoom, pkg.mod:Class or file.py:Class), name, kwargs, schema}; empty: single-turn generation."""
    tool_contract: ToolContractName = "rlstack"
    """Whose tool conventions the policy was trained on: input image names in the Python tool, call tags and how replies are wrapped, set together (rlstack; pyvision: image_clue_0, <interpreter>; deepeyes: <tool_call>, <tool_response>; codev: image_filename, <sandbox_output>)."""
    tool_call_format: Literal["code", "hermes"] | None = None
    """How calls are written: `code` = <code>```python ...```</code> (CodeV / PyVision), `hermes` = <tool_call>{json}</tool_call> (veRL / DeepEyes); unset: the tool_contract's (code for rlstack)."""
    max_turns: int = field(4, ge=1)
    """Assistant turns per trajectory; a trajectory still calling tools after this many ends with end_reason max_turns."""
    end_on_evaluation: bool = False
    """End a trajectory after a tool call whose code ended with an expression that ran without error (NeMo RL's code environment's terminate_on_evaluation); false: it goes on until the model stops calling or max_turns."""
    max_images: int = field(8, ge=1)
    """Images per trajectory (input images included): a data row with more is refused at load; a tool result that would exceed it ends the trajectory (max_images)."""
    system_prompt: str | None = None
    """File holding the system prompt (Hermes format: the tools' JSON schemas are appended in a <tools> block)."""
    max_tool_workers: int = field(8, ge=1)
    """Tool calls run at once across the trajectories of a batch (threads; each Python tool runs in its own sandbox)."""
    tool_timeout_s: float | None = field(None, gt=0, why="null: the tools decide")
    """Wall-clock limit of one turn's tool calls: a trajectory whose call has not returned ends (end_reason timeout, its tools closed) and the trainer drops its group; unset: the tools' own limits."""
    feedback: str | None = None
    """An environment's reply to an answer (`file.py:fn` or `pkg.mod:fn`, NeMo RL's multi-turn environments): called with {prompt, last_turn (that turn's text; also under its old name answer), response, ground_truth, data_source, extra, turn} after a turn that ends with EOS; a string it returns is the next user turn (not trained on) and the model answers again, up to max_turns; None accepts the answer."""

    @property
    def call_format(self) -> Literal["code", "hermes"]:
        """`tool_call_format`, or where it is unset the tool contract's (code for rlstack)."""
        return self.tool_call_format or CONTRACT_CALL_FORMATS[self.tool_contract] or "code"


@dataclass
class RolloutConfig:
    n: int = field(8, ge=1)
    """Responses sampled per prompt."""
    temperature: float = field(
        1.0, gt=0, why="greedy decoding is for validation only: worker.rollout.val_temperature=0"
    )
    """Sampling temperature (the actor takes its log-probs at the same temperature)."""
    top_p: float = field(1.0, gt=0, le=1)
    """Nucleus sampling mass."""
    top_k: int = field(-1, ge=-1, why="-1 or 0: all tokens")
    """Sample among the k most likely tokens (-1: all)."""
    val_temperature: float = field(0.0, ge=0, why="0: greedy", resume=True)
    """Temperature for validation (0: greedy)."""
    val_top_p: float = field(1.0, gt=0, le=1, resume=True)
    """Top-p for validation."""
    val_top_k: int = field(-1, ge=-1, why="-1 or 0: all tokens", resume=True)
    """Top-k for validation."""
    val_n: int = field(1, ge=1, resume=True)
    """Responses per validation prompt."""
    ignore_eos: bool = False
    """Sample past end-of-sequence tokens: every response (validation too) runs to data.max_response_length, as veRL's/vLLM's ignore_eos; for benchmarks that need fixed work; single-turn only."""
    seed: int = field(1, ge=0, lt=2**32, why="numpy takes seeds of 32 bits")
    """Seed of the sampling generator (saved and restored with checkpoints)."""
    name: Literal["auto", "hf", "vllm"] = field("auto", resume=True)
    """Generation engine: hf (the policy's own module, in process), vllm (pip install 'rlstack[vllm]'; weights pushed after each update), or auto: vllm when it is installed and the run is on CUDA, else hf (resolved at load and recorded in config.yaml; the run says which and why when it starts)."""
    auto_reason: ClassVar[str] = ""
    """Not a key: why `name=auto` picked the engine it did (set at load; said when a run starts)."""
    gpu_memory_utilization: float = field(0.6, gt=0, le=1, resume=True)
    """vllm: share of the GPU's memory vLLM may take (weights + KV cache)."""
    tensor_parallel_size: int = field(1, ge=1, resume=True)
    """vllm: GPUs one engine's model is split over."""
    enforce_eager: bool = field(False, resume=True)
    """vllm: no CUDA graphs (always eager on CPU)."""
    enable_prefix_caching: bool = field(True, resume=True)
    """vllm: reuse the KV cache of shared prefixes (a prompt's n samples, a trajectory's earlier turns); hf: prefill once the prefix every prompt of a call shares (a system prompt, a worked example)."""
    max_num_batched_tokens: int = field(8192, ge=1, resume=True)
    """vllm: tokens one scheduler step may process."""
    max_model_len: int | None = field(None, ge=1, resume=True)
    """vllm: longest sequence the engine accepts (default: data.max_prompt_length + data.max_response_length)."""
    free_cache_engine: bool | None = field(None, resume=True)
    """vllm: sleep (free weights and KV cache) between rollouts; default true on CUDA, where vLLM's sleep mode exists."""
    colocated: bool = field(True, resume=True)
    """Rollout engines live in the policy's ranks (EasyR1's hybrid engine); false (`trainer.backend=ray`): in `num_ranks` Ray actors of their own, sent the policy's weights after every update."""
    num_ranks: int = field(1, ge=1, resume=True)
    """Rollout actors when `colocated=false` (one GPU each, or one CPU on machines without GPUs)."""
    check_weight_sync: bool = field(False, resume=True)
    """After each weight sync, compare the engine's and the policy's log-probs of a fixed text probe; fail past weight_sync_tolerance (catches stale weights)."""
    weight_sync_tolerance: float = field(1.0e-2, gt=0, resume=True)
    """Largest allowed |engine log-prob - policy log-prob| on the probe's tokens."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """The multi-turn agent loop (tools); off while `tools` is empty."""


def tensor_parallel_rules(cfg: Config, p: list[str]) -> None:
    """A vLLM engine split over `tensor_parallel_size` ranks: the ranks of one node, colocated with the
    policy, generating in step (whatever machine the config is checked on)."""
    t, r = cfg.trainer, cfg.worker.rollout
    size, per_node = r.tensor_parallel_size, t.n_gpus_per_node
    if r.name not in ("vllm", "auto") or size <= 1:  # auto is left unresolved where it cannot pick vLLM
        return
    key = f"worker.rollout.tensor_parallel_size = {size}"
    if per_node % size:
        p.append(
            f"{key}, but trainer.n_gpus_per_node = {per_node}: an engine is split over {size} ranks (GPUs, or "
            f"processes on a CPU) of one node, so n_gpus_per_node must be a multiple of it (set it to {size}, "
            "or lower tensor_parallel_size)"
        )
        return
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


def rollout_rules(cfg: Config, p: list[str]) -> None:
    """Sampling settings that contradict other keys, the agent's tools and files, the engine's settings."""
    tensor_parallel_rules(cfg, p)
    r, d = cfg.worker.rollout, cfg.data
    ag = r.agent
    if r.ignore_eos and (ag.tools or ag.feedback):
        p.append(
            "worker.rollout.ignore_eos=true cannot be used with worker.rollout.agent.tools or "
            "worker.rollout.agent.feedback: a multi-turn trajectory's turn ends at its end-of-sequence token"
        )
    if r.ignore_eos and cfg.algorithm.mask_truncated_responses:
        p.append(
            "worker.rollout.ignore_eos=true runs every response to data.max_response_length, and "
            "algorithm.mask_truncated_responses=true gives responses cut there no loss: nothing would train; "
            "turn one of them off"
        )
    overlong = cfg.worker.reward.overlong_buffer_length
    if r.ignore_eos and overlong:
        p.append(
            "worker.rollout.ignore_eos=true runs every response to data.max_response_length, where "
            f"worker.reward.overlong_buffer_length={overlong} gives every sample the full overlong "
            "penalty; set overlong_buffer_length=0"
        )
    if r.val_n > 1 and r.val_temperature == 0:
        p.append(
            f"worker.rollout.val_n = {r.val_n} with worker.rollout.val_temperature = 0: greedy decoding gives "
            f"{r.val_n} identical answers per prompt (and pass@k = pass@1); sample them (e.g. "
            "worker.rollout.val_temperature=0.8) or set val_n=1"
        )
    for i, spec in enumerate(ag.tools):
        if not spec.get("import_path"):
            p.append(
                f"worker.rollout.agent.tools[{i}] has no import_path: give builtin:python, builtin:zoom, "
                "package.module:Class or path/to/file.py:Class (name is optional: the class's own name by default)"
            )
    fixed = CONTRACT_CALL_FORMATS[ag.tool_contract]
    if fixed and ag.tool_call_format not in (None, fixed):
        p.append(
            f"worker.rollout.agent.tool_contract={ag.tool_contract} writes calls as {fixed} ({_CALL_TAGS[fixed]}), "
            f"but worker.rollout.agent.tool_call_format={ag.tool_call_format}: leave tool_call_format unset (the "
            f"contract sets it), or use tool_contract=rlstack to write {ag.tool_call_format} calls"
        )
    if ag.tool_contract != "rlstack" and not ag.tools:
        p.append(
            f"worker.rollout.agent.tool_contract={ag.tool_contract} sets how tools are called and how they "
            "answer, but worker.rollout.agent.tools is empty: add the tools (e.g. builtin:python) or leave "
            "tool_contract at rlstack"
        )
    path_problems(p, ("worker.rollout.agent.system_prompt", ag.system_prompt))
    if problem := function_file_problem("worker.rollout.agent.feedback", ag.feedback or ""):
        p.append(problem)
    if r.name == "hf" and r.tensor_parallel_size != 1:
        p.append(
            f"worker.rollout.tensor_parallel_size = {r.tensor_parallel_size} with worker.rollout.name = {r.name}: "
            "only the vLLM engine is split over ranks; use worker.rollout.name=vllm, or leave it at 1"
        )
    if r.name != "vllm":
        if r.free_cache_engine is not None:
            p.append(
                f"worker.rollout.free_cache_engine is a vLLM setting, but worker.rollout.name = {r.name}: set "
                "worker.rollout.name=vllm or leave it unset"
            )
        return
    longest = d.max_prompt_length + d.max_response_length
    if r.max_model_len is not None and 1 <= r.max_model_len < longest:
        p.append(
            f"worker.rollout.max_model_len = {r.max_model_len} is less than data.max_prompt_length + "
            f"data.max_response_length = {longest}: responses would be cut short by the engine's context "
            f"rather than by max_response_length; raise it to at least {longest} (or leave it unset)"
        )
    truncated = [f"top_p = {r.top_p}"] * (r.top_p < 1) + [f"top_k = {r.top_k}"] * (r.top_k > 0)
    correction = cfg.worker.actor.rollout_correction
    if correction and truncated:
        p.append(
            f"worker.actor.rollout_correction = {correction} with worker.rollout.name = "
            f"vllm and worker.rollout.{' and '.join(truncated)}: vLLM reports the behaviour log-probs of the "
            "truncated distribution (renormalised over the kept tokens), while the policy's log-probs are "
            "over the whole one, so the correction would see a mismatch where there is none; sample with top_p=1.0 and "
            "top_k=-1, or use worker.rollout.name=hf"
        )
