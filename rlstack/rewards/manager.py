"""Scoring a Batch of responses with the configured reward function."""

from __future__ import annotations

import functools
import numbers
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

import torch

from rlstack.algos.filters import overlong_penalty
from rlstack.batch import Batch, columns_read_by
from rlstack.config import RewardConfig
from rlstack.config.reward import route_of
from rlstack.errors import RLStackError
from rlstack.extensions import user_error
from rlstack.rewards.builtin import BUILTINS
from rlstack.rewards.inputs import reward_inputs
from rlstack.rewards.loader import RewardFunction, load_reward_function

if TYPE_CHECKING:
    from rlstack.rewards.judge import JudgeClient, Template


class RewardError(RLStackError, RuntimeError):
    """A reward function that failed or returned something unusable, naming the sample."""


class Rewards(Protocol):
    """What scores a run's trajectories: a `RewardManager` in this process, or with Ray the reward actors
    (`RayRewards`) that run one each. Implement it, do not subclass it."""

    def score(self, batch: Batch) -> Batch:
        """`batch` with `scores` [B], `reward_components` (per row: name -> float) and `reward_info` added."""
        ...

    def pop_metrics(self) -> dict[str, float]:
        """The reward metrics (`reward/...`) gathered since the last call."""
        ...

    def close(self) -> None:
        """Release what scoring holds (the judge's client)."""
        ...


class RewardManager:
    """Runs the reward function(s) over a batch, as its `worker.reward` section says (`RewardManager.of`).

    - `num_workers`: calls run in that many threads at once (a sequential function: one call per
      sample; a batch function: the batch cut into `num_workers` chunks).
    - `timeout_s`: time allowed per sample (a chunk gets `timeout_s * len(chunk)`). A call past it is
      abandoned: its daemon thread is left to finish on its own, so a reward function that can hang
      on untrusted input must run that input in the sandbox (`rewards/sandbox/`).
    - `on_error`: a call that raises or times out either stops the run (`raise`, naming the sample) or
      gives its samples `error_score` and counts them in the `errors` component (`reward/errors`).
    - `extra_reward_functions` / `reward_weights`: more reward functions; `overall` is the weighted sum of
      their `overall`s, and each extra function's components are logged under `<its name>/<key>`.
    - `reward_function_by_source`: data sources (names or glob patterns) whose rows another function scores
      in place of `reward_function` (exact names first, then patterns in order; veRL's dispatch on
      `data_source`). A row's components are those its own function returned: `reward/<key>` averages
      a key over the rows that have it.

    Numeric values a function returns are components (logged as `reward/<key>`); string values
    (a failure reason, a status) are kept per row in `reward_info` and written to `generations/`.
    """

    def __init__(
        self,
        cfg: RewardConfig,
        functions: list[RewardFunction],
        *,
        routes: list[tuple[str, RewardFunction]] | None = None,
        judge: JudgeClient | None = None,
        max_response_length: int = 0,
    ):
        """`functions`: the section's `reward_function` then its `extra_reward_functions`, loaded; `routes`:
        its `reward_function_by_source`, loaded, in order; `max_response_length`: `data.max_response_length`,
        which the overlong buffer ends at."""
        self.cfg = cfg
        self.functions = functions
        self.routes = routes or []
        self.weights = list(cfg.reward_weights) or [1.0] * len(self.functions)
        if len(self.weights) != len(self.functions):
            raise RewardError(
                f"{len(self.weights)} reward weights for {len(self.functions)} reward functions"
            )
        self.max_response_length = max_response_length
        self.num_workers = max(1, cfg.num_workers)
        """Calls at once: `num_workers=0` (Ray's driver scoring itself) makes one."""
        self.judge = judge
        """The JudgeClient behind `ask_judge` (closed by `close`), or None."""
        self._judge_calls = 0
        self._judge_errors_seen = 0
        self._judge_lock = threading.Lock()  # worker threads count their judge calls
        self._judge_down = 0
        """Samples scored error_score since the judge last answered (0: it answers)."""
        self._judge_answered_seen = 0
        self._said: set[tuple] = set()
        """Failures scored error_score that were reported (`_say_scored_error`)."""

    @classmethod
    def of(cls, cfg: RewardConfig, *, max_response_length: int) -> RewardManager:
        """The manager for `worker.reward`: functions loaded, built-ins given their sections' settings
        (`builtin.BUILTINS`), and the judge client built where a function asks for it (`builtin:judge`, a
        parameter named `judge`, a built-in's judge_fallback) and, unless `judge.check_at_start=false`, asked
        once from here (`JudgeClient.check`)."""
        functions = [load_reward_function(ref) for ref in [cfg.reward_function, *cfg.extra_reward_functions]]
        routes = [
            (source, load_reward_function(ref, f"worker.reward.reward_function_by_source.{source}"))
            for source, ref in cfg.reward_function_by_source.items()
        ]
        loaded = [*functions, *(rf for _, rf in routes)]
        used = [rf.name.removeprefix("builtin:") for rf in loaded if rf.name.startswith("builtin:")]
        builtins = {name: BUILTINS[name] for name in used}
        judge = None
        if any(rf.wants_judge for rf in loaded) or any(
            b.asks_judge and b.asks_judge(cfg) for b in builtins.values()
        ):
            from rlstack.rewards.judge import JudgeClient

            judge = JudgeClient(cfg.judge)
            try:
                if cfg.judge.check_at_start:
                    judge.check()
            except BaseException:
                judge.close()
                raise
        manager = cls(cfg, functions, routes=routes, judge=judge, max_response_length=max_response_length)
        ask = manager.ask_judge if judge is not None else None
        # one set of settings per built-in, however often it is named: one reward model loaded
        settings = {name: b.settings(cfg, ask) if b.settings else {} for name, b in builtins.items()}
        for rf in loaded:
            if rf.name.startswith("builtin:"):
                rf.fn = functools.partial(rf.fn, **settings[rf.name.removeprefix("builtin:")])
            if rf.wants_judge:
                rf.fn = functools.partial(rf.fn, judge=manager.ask_judge)
        return manager

    def score(self, batch: Batch) -> Batch:
        """Adds `scores` [B], `reward_components` (per row: name -> float) and `reward_info` (per row: name ->
        str)."""
        inputs = reward_inputs(batch)
        overall = torch.zeros(len(batch))
        components: list[dict[str, float]] = [{} for _ in range(len(batch))]
        info: list[dict[str, str]] = [{} for _ in range(len(batch))]
        for n, (rf, weight) in enumerate(zip(self.functions, self.weights)):
            if n == 0:
                results: list[dict] = [{}] * len(batch)
                for own, rows in self._routed(inputs, rf):
                    kwargs = self.cfg.reward_function_kwargs if own is rf else {}  # the main function's alone
                    for i, r in zip(rows, self._call(own, kwargs, inputs, batch, rows)):
                        results[i] = r
            else:
                results = self._call(rf, {}, inputs, batch)
            prefix = "" if n == 0 else f"{_short_name(rf.name)}/"
            for i, r in enumerate(results):
                for k in sorted(r):
                    if isinstance(r[k], str):
                        info[i][prefix + k] = r[k]
                    else:
                        components[i][prefix + k] = float(r[k])
            overall += weight * torch.tensor([float(r["overall"]) for r in results])
        if len(self.functions) > 1:
            for c, o in zip(components, overall.tolist()):
                c["overall"] = o
        scores = overall.float()
        if self.cfg.overlong_buffer_length:
            penalty = overlong_penalty(
                batch["response_mask"].sum(-1),
                self.max_response_length,
                self.cfg.overlong_buffer_length,
                self.cfg.overlong_penalty_factor,
            )
            scores = scores + penalty
            for c, p in zip(components, penalty.tolist()):
                c["overlong"] = p
        batch["scores"] = scores
        batch["reward_components"] = components
        batch["reward_info"] = info
        return batch

    def _routed(self, inputs: list[dict], default: RewardFunction) -> list[tuple[RewardFunction, list[int]]]:
        """The rows each function scores: a route's function the rows of its data sources, `default` the rest."""
        patterns = [pattern for pattern, _ in self.routes]
        rows: dict[int, list[int]] = {}
        for i, x in enumerate(inputs):
            k = route_of(x["data_source"], patterns)
            rows.setdefault(-1 if k is None else k, []).append(i)
        return [(default if k < 0 else self.routes[k][1], rows[k]) for k in sorted(rows)]

    def ask_judge(
        self, queries: list[tuple], template: Template | None = None, send_images: bool | None = None
    ) -> list[float]:
        """(question, reference, response[, images]) -> the judge's scores, in order: the `judge` that
        `builtin:judge`, the built-ins' `judge_fallback` and reward functions with a `judge` parameter are
        given. Sent together (up to `judge.max_concurrency` at once), with the configured template and parser
        unless a built-in passes its own `template` (`builtin:pyvision`, `builtin:codev`); the images (PIL
        images or PNG/JPEG bytes) go with a request where `send_images`, else `worker.reward.judge.send_images`,
        is set. A failed judgement follows `judge.on_error`."""
        from rlstack.rewards.judge import JudgeItem, png_images

        assert self.judge is not None
        config = self.judge.config
        send = config.send_images if send_images is None else send_images
        asked: str | Template = config.template if template is None else template
        encoded: dict[tuple[int, ...], tuple[bytes, ...]] = {}  # the n samples of a prompt share its images

        def images(rest: list) -> tuple[bytes, ...]:
            if not (send and rest and rest[0]):
                return ()
            key = tuple(id(im) for im in rest[0])
            if key not in encoded:
                encoded[key] = png_images(rest[0])
            return encoded[key]

        items = [JudgeItem(q, g, r, asked, images(rest)) for q, g, r, *rest in queries]
        results = self.judge.judge_batch(items)
        with self._judge_lock:
            self._judge_calls += len(queries)
        return [r.score for r in results]

    def pop_metrics(self) -> dict[str, float]:
        """Judge activity since the last call: `reward/judge_calls` (samples sent to the judge) and
        `reward/judge_errors` (samples scored `error_score` because judging failed)."""
        if self.judge is None:
            return {}
        errors = self.judge.errors - self._judge_errors_seen
        self._judge_errors_seen = self.judge.errors
        answered = self.judge.answered - self._judge_answered_seen
        self._judge_answered_seen = self.judge.answered
        calls, self._judge_calls = self._judge_calls, 0
        self._say_judge_state(calls, errors, answered)
        return {"reward/judge_calls": float(calls), "reward/judge_errors": float(errors)}

    def _say_judge_state(self, calls: int, errors: int, answered: int) -> None:
        """A line when judging starts failing (the run goes on under on_error=score): once for an outage (steps
        where the endpoint answers nothing), at each step where some verdicts failed while the endpoint
        answered others (unparseable replies); and one line when the endpoint answers again after an
        outage. Under Ray, each reward worker says it for its own share of the rows."""
        cfg = self.judge.config
        where = f"judge {self.judge.base_url}"
        if errors and not self._judge_down:
            print(
                f"[rlstack] {where} failed for {errors} of {calls} samples ({self.judge.last_error}); the run "
                f"goes on, scoring them {cfg.error_score} (worker.reward.judge.on_error=score) and counting them "
                "in reward/judge_errors",
                file=sys.stderr,
                flush=True,
            )
        elif self._judge_down and answered and not errors:
            print(
                f"[rlstack] {where} answers again ({self._judge_down} samples were scored {cfg.error_score} "
                "while it failed)",
                file=sys.stderr,
                flush=True,
            )
        self._judge_down = 0 if answered else self._judge_down + errors

    def close(self) -> None:
        if self.judge is not None:
            self.judge.close()

    def _call(
        self,
        rf: RewardFunction,
        kwargs: dict,
        inputs: list[dict],
        batch: Batch,
        rows: list[int] | None = None,
    ) -> list[dict]:
        """`rf`'s results for the `rows` of the batch (default: all), in their order."""
        rows = list(range(len(inputs))) if rows is None else rows
        if rf.reward_type == "sequential":
            chunks = [[i] for i in rows]
        else:
            size = -(-len(rows) // self.num_workers)
            chunks = [rows[i : i + size] for i in range(0, len(rows), size)]

        def task(idx: list[int]):
            if rf.reward_type == "sequential":
                return [rf.fn(inputs[idx[0]], **kwargs)]
            return rf.fn([inputs[i] for i in idx], **kwargs)

        results: list[dict | None] = [None] * len(inputs)
        errors = [0.0] * len(inputs)
        timeout_s = self.cfg.timeout_s
        for wave in range(0, len(chunks), self.num_workers):
            runner = _Inline if self.num_workers == 1 and timeout_s is None else _Call
            running = [(idx, runner(task, idx)) for idx in chunks[wave : wave + self.num_workers]]
            for idx, call in running:
                outcome, value = call.wait(None if timeout_s is None else timeout_s * len(idx))
                if outcome == "ok":
                    _check_shape(rf.name, value, len(idx))
                    for i, r in zip(idx, value):
                        results[i] = r
                    continue
                if self.cfg.on_error == "raise":
                    raise RewardError(self._failure_message(rf, kwargs, inputs, batch, idx, outcome, value))
                why = (
                    f"timed out after {timeout_s} s per sample"
                    if outcome == "timeout"
                    else user_error(value, rf.file)
                )
                self._say_scored_error(rf, why, _failure_place(value), len(idx))
                for i in idx:
                    results[i], errors[i] = {"overall": self.cfg.error_score, "error": why}, 1.0
        for i in rows:
            _check_result(rf.name, results[i], batch, i)
        if self.cfg.on_error == "score":
            for i in rows:
                results[i]["errors"] = errors[i]  # type: ignore[index]
        return [results[i] for i in rows]  # type: ignore[misc]

    def _failure_message(self, rf, kwargs, inputs, batch, idx, outcome, value) -> str:
        if outcome == "timeout":
            where = _describe(batch, idx[0]) if len(idx) == 1 else f"samples {idx[0]}..{idx[-1]}"
            return (
                f"reward function {rf.name} took longer than worker.reward.timeout_s={self.cfg.timeout_s} s per sample "
                f"on {where}; raise the timeout, or set worker.reward.on_error=score to score such samples "
                f"{self.cfg.error_score}"
            )
        if len(idx) == 1:
            return f"reward function {rf.name} raised on {_describe(batch, idx[0])}: {user_error(value, rf.file)}"
        for i in idx:  # re-run one sample at a time to name the one that raises
            try:
                rf.fn([inputs[i]], **kwargs)
            except Exception as e:
                return f"reward function {rf.name} raised on {_describe(batch, i)}: {user_error(e, rf.file)}"
        return (
            f"reward function {rf.name} raised on the whole batch (each sample alone scored fine): "
            f"{user_error(value, rf.file)}"
        )

    def _say_scored_error(self, rf: RewardFunction, why: str, place: tuple, samples: int) -> None:
        """A line the first time a failure (`place`: a timeout, or the exception's type and the line that raised
        it) scores samples `error_score` (on_error=score): the run goes on, and the failure, with its place in
        the user's file, is more than a count."""
        if (rf.name, place) in self._said:
            return
        self._said.add((rf.name, place))
        print(
            f"[rlstack] reward function {rf.name} failed on {samples} sample(s) ({why}); the run goes on, scoring "
            f"them {self.cfg.error_score} (worker.reward.on_error=score) and counting them in reward/errors; this "
            "failure is not reported again",
            file=sys.stderr,
            flush=True,
        )


class _Call:
    """A call running in a daemon thread, so that one that never returns cannot block the process exit."""

    def __init__(self, fn, arg):
        self.box: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, args=(fn, arg), daemon=True)
        self.started = time.monotonic()
        self.thread.start()

    def _run(self, fn, arg) -> None:
        try:
            self.box["value"] = fn(arg)
        except Exception as e:
            self.box["error"] = e

    def wait(self, timeout: float | None) -> tuple[str, Any]:
        remaining = None if timeout is None else max(0.0, timeout - (time.monotonic() - self.started))
        self.thread.join(remaining)
        if self.thread.is_alive():
            return "timeout", None
        return ("error", self.box["error"]) if "error" in self.box else ("ok", self.box["value"])


class _Inline:
    """A call made right away in this thread (no workers, no timeout): math-verify's own timeouts use
    `signal.alarm`, which works only in the main thread."""

    def __init__(self, fn, arg):
        try:
            self.outcome = ("ok", fn(arg))
        except Exception as e:
            self.outcome = ("error", e)

    def wait(self, timeout: float | None) -> tuple[str, Any]:
        return self.outcome


def _failure_place(error: BaseException | None) -> tuple:
    """What tells failures apart for `_say_scored_error`: none for a timeout, else the exception's type and the
    file and line that raised it."""
    if error is None:
        return ()
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return (type(error).__name__, *((tb.tb_frame.f_code.co_filename, tb.tb_lineno) if tb else ()))


def _short_name(ref: str) -> str:
    return ref.rsplit(":", 1)[-1]


def _check_shape(name: str, results: Any, n: int) -> None:
    if not isinstance(results, list) or len(results) != n:
        got = (
            f"{type(results).__name__} of length {len(results)}"
            if hasattr(results, "__len__")
            else repr(results)
        )
        raise RewardError(f"reward function {name} must return a list of {n} dicts, got {got}")


def _check_result(name: str, r: Any, batch: Batch, i: int) -> None:
    if not isinstance(r, dict) or "overall" not in r:
        raise RewardError(
            f"reward function {name} returned {r!r} for {_describe(batch, i)}: each result needs an 'overall' key"
        )
    for k, v in r.items():
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            r[k] = v = v.item()
        if isinstance(v, str) and k != "overall":
            continue
        if not isinstance(v, numbers.Real) or isinstance(v, bool):
            raise RewardError(
                f"reward function {name}: {k}={v!r} for {_describe(batch, i)} is not a number "
                "(components are numbers; strings such as a failure reason are kept in reward_info)"
            )


REWARD_COLUMNS = columns_read_by("reward")
"""The columns scoring reads (what a remote reward worker is sent)."""


def reward_function_for(cfg: RewardConfig, source: str) -> str:
    """The reward function (as configured) that scores the rows of data source `source`."""
    routes = cfg.reward_function_by_source
    k = route_of(source, list(routes))
    return cfg.reward_function if k is None else list(routes.values())[k]


def _describe(batch: Batch, i: int) -> str:
    text = batch["response_text"][i]
    snippet = text if len(text) <= 80 else text[:77] + "..."
    return f"sample {i} (row {batch['where'][i]}, response {snippet!r})"
