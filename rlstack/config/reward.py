"""`worker.reward.*`: the reward functions, their built-ins' settings, the judge and the reward model."""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import ipaddress
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from rlstack.config.fields import field
from rlstack.config.paths import function_file_problem, missing_path, path_problems

if TYPE_CHECKING:
    from rlstack.config.schema import Config


@dataclass
class JudgeConfig:
    base_url: str = field("", resume=True)
    """OpenAI-compatible endpoint, e.g. http://host:18901/v1; empty: env LLM_AS_A_JUDGE_BASE."""
    api_key: str = field("", resume=True)
    """API key; empty: OPENAI_API_KEY from the environment, else "EMPTY" (what `vllm serve` accepts)."""
    model: str = ""
    """Served model name; empty: the first model the endpoint lists at GET /models."""
    template: str = "consistency"
    """Judge prompt: a built-in (`consistency`: DeepEyes' two-answer judge; `verifier`: TRUE/FALSE; `rubric`: a 0-1 grade against a rubric given as the reference), or a Jinja file's path, rendered with `question`, `reference`, `response` as the user message."""
    parser: str = ""
    """How the judge's reply is read as a score: empty: the built-in template's own; `judgement_0_1`, `true_false`, `yes_no`, `score_0_1`, `score_0_10` (divided by 10), or `path/to/file.py:fn` (reply text -> float; raise or return None when it holds no verdict)."""
    max_concurrency: int = field(16, ge=1, resume=True)
    """Judge requests in flight at once."""
    timeout: float = field(60.0, gt=0, resume=True)
    """Seconds one request may take before it counts as a failed attempt."""
    max_attempts: int = field(4, ge=1, resume=True)
    """Attempts per sample (the first call plus retries) before `on_error` applies."""
    backoff_base: float = field(1.0, ge=0, resume=True)
    """Seconds before the first retry; doubles each retry, with jitter in [50%, 100%] of the delay."""
    backoff_max: float = field(30.0, ge=0, resume=True)
    """Longest wait between two attempts, in seconds."""
    on_error: Literal["raise", "score"] = "raise"
    """When every attempt failed: `raise` (stop the run, naming the sample), or `score` with error_score, counted in reward/judge_errors."""
    error_score: float = 0.0
    """Score given to a sample whose judging failed, with on_error=score."""
    max_tokens: int = field(512, ge=1)
    """Longest judge reply, in tokens."""
    seed: int = 0
    """Seed of the backoff jitter."""
    send_images: bool = False
    """Send each row's images with its judge request (a vision-language judge, e.g. Qwen2.5-VL under `vllm serve`)."""
    check_at_start: bool = field(True, resume=True)
    """Before training, ask the judge once from where rewards are scored (GET /models, a one-token completion) and stop, naming the URL and what failed, when it does not answer."""


JUDGE_TEMPLATES = ("consistency", "verifier", "rubric")
"""The built-in judge templates (`rewards.judge.TEMPLATES`)."""
JUDGE_PARSERS = ("judgement_0_1", "true_false", "yes_no", "score_0_1", "score_0_10")
"""The named parsers of a judge's reply (`rewards.judge.PARSERS`)."""


def judge_endpoint(judge: JudgeConfig) -> JudgeConfig:
    """`judge` with its base_url and api_key as this process reads them: the configured ones, else the
    LLM_AS_A_JUDGE_BASE and OPENAI_API_KEY environment variables. What the driver sends reward actors, whose
    environment is their node's, not the driver's."""
    return dataclasses.replace(
        judge,
        base_url=judge.base_url or os.environ.get("LLM_AS_A_JUDGE_BASE", ""),
        api_key=judge.api_key or os.environ.get("OPENAI_API_KEY", ""),
    )


def judge_rules(judge: JudgeConfig, p: list[str]) -> None:
    """The template is a built-in or a file; a file's verdict needs a parser; the parser is named or a file."""
    builtin, file = judge.template in JUDGE_TEMPLATES, os.path.isfile(judge.template)
    if not (builtin or file):
        p.append(
            f"worker.reward.judge.template={judge.template!r}: neither a built-in ({', '.join(JUDGE_TEMPLATES)}) "
            f"nor a file (looked for {os.path.abspath(judge.template)}): name a built-in, or a Jinja file rendered "
            "with question, reference and response"
        )
    parsers = f"{', '.join(JUDGE_PARSERS)}, or path/to/file.py:fn"
    if file and not builtin and not judge.parser:
        p.append(
            f"worker.reward.judge.template={judge.template!r} is a file: name how the judge's reply is read as a "
            f"score with worker.reward.judge.parser ({parsers})"
        )
    if judge.parser and judge.parser not in JUDGE_PARSERS and ":" not in judge.parser:
        p.append(f"worker.reward.judge.parser={judge.parser!r}: must be one of {parsers}")
    if problem := function_file_problem("worker.reward.judge.parser", judge.parser):
        p.append(problem)


ALWAYS_JUDGED = ("builtin:judge", "builtin:pyvision", "builtin:codev")
"""The built-ins that ask the judge about every response."""


def judge_in_use(rw: RewardConfig) -> str | None:
    """What asks the judge, as the config says it (a user's function that takes `judge` is known only once
    loaded): a built-in of `ALWAYS_JUDGED`, or a built-in's judge_fallback key; None: nothing."""
    if asker := next((f for f in ALWAYS_JUDGED if f in functions_in_use(rw)), None):
        return asker
    keys = (
        ("math.judge_fallback", rw.math.judge_fallback),
        ("agent.judge_fallback", rw.agent.judge_fallback),
        ("agent.judge_always", rw.agent.judge_always),
    )
    return next((f"worker.reward.{key}=true" for key, on in keys if on), None)


def local_judge_note(cfg: Config) -> str | None:
    """A line when reward actors may run on other nodes (trainer.backend=ray, nnodes > 1) but the judge's URL
    is this machine's loopback address, which on another node is that node."""
    rw, t = cfg.worker.reward, cfg.trainer
    url = judge_endpoint(rw.judge).base_url
    if t.backend != "ray" or t.nnodes < 2 or rw.num_workers < 1 or not url:
        return None
    try:
        host = urlsplit(url).hostname or ""
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return None
    key = "worker.reward.judge.base_url" if rw.judge.base_url else "LLM_AS_A_JUDGE_BASE"
    return (
        f"{key}={url} is this machine, but with trainer.nnodes={t.nnodes} the reward actors "
        f"(worker.reward.num_workers={rw.num_workers}) may run on other nodes, where {host} is that node: give "
        f"the judge's host by a name or address every node reaches (e.g. {url.replace(host, socket.gethostname(), 1)})"
    )


@dataclass
class MathRewardConfig:
    format_weight: float = field(0.1, ge=0, le=1)
    """`builtin:math`: overall = (1 - format_weight) * accuracy + format_weight * format."""
    judge_fallback: bool = False
    """Ask the judge (`worker.reward.judge`) about answers math-verify cannot parse (free text, words)."""
    timeout_s: int = field(5, ge=0)
    """math-verify's own parse/verify timeout per sample, in seconds (main thread only)."""
    max_answer_chars: int = field(1000, ge=1)
    """Longer extracted answers score 0 without being parsed."""
    numeric_answers: bool = False
    """Where the ground truth is a number, the answer must be one too (units after it allowed): an expression equal to it (`\\boxed{29 * 12 - 295}`) scores 0. math-verify evaluates such expressions (EasyR1's mathruler grader does not), so a model trained on arithmetic word problems can learn to box the expression and have the grader do the arithmetic."""


@dataclass
class CodeRewardConfig:
    mode: Literal["fraction", "all_or_nothing"] = "fraction"
    """`builtin:code` score: the fraction of tests passed, or 1 only when every test passes."""
    stop_at_first_failure: bool = False
    """Stop a response's tests at its first failure; tests not run count as failed."""
    stop_at_first_timeout: bool = True
    """Stop a response's tests at the first that runs out of time (a hanging program costs one test_time_s, not one per test; NeMo RL / veRL's option); tests not run count as failed."""
    test_time_s: float = field(5.0, gt=0)
    """Wall-clock and CPU seconds allowed per test."""
    total_time_s: float = field(60.0, gt=0)
    """Seconds allowed for all the tests of one response; tests not started by then count as failed."""
    memory_mb: int = field(1024, ge=1)
    """Memory of one test's run in MiB: all its processes and memfd/shm/file pages (a cgroup), and each process's address space."""
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
    max_answer_chars: int = field(200, ge=1)
    """Longest answer the format check accepts."""
    judge_fallback: bool = False
    """Ask the judge (`worker.reward.judge`) about answers the rule cannot decide."""
    judge_always: bool = False
    """Ask the judge about every answer, the rule not consulted (as DeepEyes' vl_agent reward does; CodeV's and PyVision's own rewards are `builtin:codev` and `builtin:pyvision`)."""


CODEV_RUBRICS = ("search", "calculation", "counting")
"""The tool-use rubrics of `builtin:codev` (`rewards.codev.RUBRICS`)."""


@dataclass
class CodevRewardConfig:
    rubric_by_source: dict[str, str] = field(default_factory=dict)
    """`builtin:codev`: the rubric the judge grades a data source's tool use by (`search`: a crop shows what the question asks about; `counting`: systematic counting code; `calculation`: reasoning and computation), by data_source name or glob pattern (exact names first, then patterns in order), before CodeV's own (vstar, chart, high_res: search; IconQA: counting; any other: calculation)."""


def codev_rules(rw: RewardConfig, p: list[str]) -> None:
    """Each rubric that `codev.rubric_by_source` names is one of `CODEV_RUBRICS`."""
    for source, rubric in rw.codev.rubric_by_source.items():
        if rubric not in CODEV_RUBRICS:
            p.append(
                f"worker.reward.codev.rubric_by_source.{source}={rubric!r}: must be one of "
                f"{', '.join(CODEV_RUBRICS)} (CodeV's tool-use rubrics)"
            )


@dataclass
class RewardModelConfig:
    model_path: str = ""
    """`builtin:reward_model`: a Hugging Face sequence-classification model with one output (num_labels=1)."""
    micro_batch_size: int = field(8, ge=1)
    """Texts scored per forward pass."""
    max_length: int = field(4096, ge=1)
    """Most tokens of one scored text (the row's chat with the response, in the reward model's template)."""
    truncation: Literal["left", "error"] = "left"
    """A longer text: `left` keeps its last max_length tokens (counted in reward/rm_truncated), `error` stops naming the row."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The reward model's parameter dtype."""
    device: str = "auto"
    """Where it runs: auto (CUDA when available), cpu, cuda, cuda:1, ..."""
    trust_remote_code: bool = False
    """Allow the model's own code from its directory."""
    num_gpus: float = field(0, ge=0)
    """With trainer.backend=ray: GPUs each reward actor takes, where it loads the model; 0: it runs on the actor's CPU. NeMo RL's env.reward_model.resources (N GPUs of its own) is N reward actors of 1 GPU each."""


@dataclass
class RewardConfig:
    reward_function: str = "builtin:exact_match"
    """`path/to/file.py:fn`, `package.module:fn`, or a built-in (`builtin:exact_match`, `math`, `code`, `agent`, `pyvision`, `codev`, `judge`, `reward_model`). A `path/to/file.py` without `:fn` means its `main`, as in EasyR1, or else its `compute_score` (the name EasyR1's and VPPO's reward files define, which EasyR1 itself would not find); the config check stops when the file defines neither."""
    reward_function_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to the reward function (over a built-in's settings from its section)."""
    reward_function_by_source: dict[str, str] = field(default_factory=dict)
    """Reward function per data source, in place of reward_function for its rows: keys are data_source values or glob patterns (`code_*`; exact names first, then patterns in order); other rows keep reward_function."""
    extra_reward_functions: list[str] = field(default_factory=list)
    """More reward functions; overall = the weighted sum of every function's overall."""
    reward_weights: list[float] = field(default_factory=list)
    """One weight per function (reward_function first, then the extra ones); empty: all 1."""
    num_workers: int = field(1, ge=0, resume=True)
    """Reward calls run at once, in threads (sequential functions: one sample per call; batch functions: a chunk); with trainer.backend=ray, reward actors off the training ranks (a CPU each, or a share of what the ranks leave; 0, or no CPU left: the driver scores)."""
    timeout_s: float | None = field(None, gt=0, why="null: no limit")
    """Seconds allowed per sample (None: no limit); a call past it follows on_error."""
    on_error: Literal["raise", "score"] = "raise"
    """A reward call that raises or times out: `raise` (stop, naming the sample) or `score` with error_score, counted in reward/errors."""
    error_score: float = 0.0
    """Score of a sample whose reward call failed, with on_error=score."""
    overlong_buffer_length: int = 0
    """DAPO soft overlong punishment: the last this many tokens before max_response_length are penalized (0: off)."""
    overlong_penalty_factor: float = field(1.0, ge=0)
    """Penalty at max_response_length; it grows linearly from 0 across the buffer (logged as reward/overlong)."""
    math: MathRewardConfig = field(default_factory=MathRewardConfig)
    """Settings of `builtin:math`."""
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)
    """Settings of `builtin:code`."""
    agent: AgentRewardConfig = field(default_factory=AgentRewardConfig)
    """Settings of `builtin:agent`."""
    codev: CodevRewardConfig = field(default_factory=CodevRewardConfig)
    """Settings of `builtin:codev`."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """The LLM judge: `builtin:judge`, the built-ins' judge_fallback, and reward functions that take a `judge` parameter."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Settings of `builtin:reward_model` (a reward model scoring in the trainer's process)."""


DEFAULT_FUNCTIONS = ("main", "compute_score")
"""The function a reward file named without `:function` is read for: `main`, as EasyR1 calls it, else
`compute_score`, the name EasyR1's and VPPO's reward files define (where EasyR1 itself would fail for want
of `main`). `RewardConfig.reward_function`; `rewards/loader.py` reads it."""


def top_level_names(path: str) -> tuple[list[str], list[str]]:
    """The names a Python file defines at its top level (defs, classes, assignments, imports), and its
    functions among them; read, not imported. Raises OSError, SyntaxError, UnicodeDecodeError or ValueError
    where it cannot be read."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names: list[str] = []
    functions: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
            functions += [] if isinstance(node, ast.ClassDef) else [node.name]
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names += [(a.asname or a.name).split(".")[0] for a in node.names]
    return names, functions


def names_a_file_alone(ref: str) -> bool:
    """Whether `ref` names a `.py` reward file without its function."""
    return not ref.startswith("builtin:") and ":" not in ref and ref.endswith(".py")


def default_function(names: list[str]) -> str | None:
    """Which of `DEFAULT_FUNCTIONS` a file defining `names` is called for, or None."""
    return next((n for n in DEFAULT_FUNCTIONS if n in names), None)


def no_default_function(key: str, file: str, functions: list[str]) -> str:
    """The message for a reward file named without `:function` that defines neither `main` nor
    `compute_score`."""
    there = f"functions there: {', '.join(functions)}" if functions else "it defines no function"
    return (
        f"{key}={file!r} names a file without its function, so rlstack calls main (as EasyR1 does) or else "
        f"compute_score (the name EasyR1's reward files use), and {file} defines neither ({there}): write "
        f"{key}={file}:function_name"
    )


def default_function_problem(key: str, ref: str) -> str | None:
    """A reward file named without `:function` that is not there, or whose source defines neither a
    top-level `main` nor `compute_score` (a def, an assignment or an import of that name)."""
    if not names_a_file_alone(ref):
        return None
    if not os.path.isfile(ref):
        return missing_path(key, ref, form="path/to/file.py:function_name")
    try:
        names, functions = top_level_names(ref)
    except (SyntaxError, UnicodeDecodeError, ValueError) as e:
        return f"{key}={ref!r}: the file cannot be read as Python ({e})"
    if default_function(names):
        return None
    return no_default_function(key, ref, [n for n in functions if not n.startswith("_")])


def route_of(source: str, patterns: list[str]) -> int | None:
    """The index of the pattern that takes data source `source` (the keys of `reward_function_by_source`,
    `codev.rubric_by_source`): an exact name first, then the first glob pattern that matches; None: none does."""
    if source in patterns:
        return patterns.index(source)
    return next((k for k, p in enumerate(patterns) if fnmatch.fnmatchcase(source, p)), None)


def functions_in_use(rw: RewardConfig) -> list[str]:
    """Every reward function the run may call: the main one, the extra ones, those per data source."""
    return [rw.reward_function, *rw.extra_reward_functions, *rw.reward_function_by_source.values()]


def reward_rules(cfg: Config, p: list[str]) -> None:
    """The overlong buffer, the weights, and what each function in use needs (a file, a server, a model)."""
    rw, max_response = cfg.worker.reward, cfg.data.max_response_length
    if rw.overlong_buffer_length < 0 or rw.overlong_buffer_length > max_response:
        p.append(
            f"worker.reward.overlong_buffer_length = {rw.overlong_buffer_length}: must be between 0 (off) and "
            f"data.max_response_length ({max_response})"
        )
    functions = [rw.reward_function, *rw.extra_reward_functions]
    if rw.reward_weights and len(rw.reward_weights) != len(functions):
        p.append(
            f"worker.reward.reward_weights has {len(rw.reward_weights)} weight(s) for {len(functions)} reward "
            f"function(s) ({', '.join(functions)}): give one weight per function, reward_function first, or none"
        )
    if rw.code.sandbox == "fusion" and not rw.code.sandbox_url:
        p.append(
            "worker.reward.code.sandbox=fusion needs worker.reward.code.sandbox_url (the SandboxFusion server, "
            "e.g. http://host:8080), or use sandbox=local"
        )
    uses_model = "builtin:reward_model" in functions_in_use(rw)
    if uses_model and not rw.reward_model.model_path:
        p.append(
            "builtin:reward_model needs worker.reward.reward_model.model_path: a Hugging Face sequence-classification "
            "model directory with one output (num_labels=1)"
        )
    if uses_model:
        path_problems(p, ("worker.reward.reward_model.model_path", rw.reward_model.model_path))
    if uses_model and cfg.trainer.backend == "ray" and rw.num_workers == 0:
        p.append(
            "builtin:reward_model with trainer.backend=ray and worker.reward.num_workers=0 would load the reward "
            "model in the driver: set worker.reward.num_workers to the reward actors to load it in (each loads one "
            "copy, on worker.reward.reward_model.num_gpus GPUs)"
        )
    asker = judge_in_use(rw)
    if asker and not judge_endpoint(rw.judge).base_url:
        p.append(
            f"{asker} needs a judge endpoint: set worker.reward.judge.base_url (or the LLM_AS_A_JUDGE_BASE "
            "environment variable) to an OpenAI-compatible URL such as http://host:18901/v1"
        )
    judge_rules(rw.judge, p)
    codev_rules(rw, p)
    for key, fn in (
        [("worker.reward.reward_function", rw.reward_function)]
        + [(f"worker.reward.extra_reward_functions[{i}]", f) for i, f in enumerate(rw.extra_reward_functions)]
        + [
            (f"worker.reward.reward_function_by_source.{s}", f)
            for s, f in rw.reward_function_by_source.items()
        ]
    ):
        if problem := function_file_problem(key, fn) or default_function_problem(key, fn):
            p.append(problem)
