"""The rollout loop: generate, run the tool calls, append the observations, repeat.

It is the only caller of an engine (`rollout/engine.py`). Without tools it is single-turn
generation: one turn per trajectory, ending at EOS (`done`) or when the response budget runs out
(`over_length`). With tools (`worker.rollout.agent.tools`) every active trajectory of a batch is
generated together (one engine request per trajectory, its whole context and images), up to a
stop string of the call format (`</code>`, `</tool_call>`) or EOS. Each turn is then read:

- EOS: the trajectory is done (`done`);
- a tool call (or a malformed one): the calls of all trajectories run concurrently in threads
  (`max_tool_workers`), each trajectory with its own tool instances (`tools.registry.Toolbox`);
  the observation (text and images), wrapped as the agent's tool contract says (`tools/contract.py`:
  PyVision's `<interpreter>`, CodeV's `<sandbox_output>`, ...), is rendered through the chat template
  as the next turn (`models.vision.encode_observation`) and appended with `response_mask = 0`;
- a turn that ends without EOS and without a call (the response token budget ran out):
  `over_length`.

With an environment's `feedback` function (NeMo RL's multi-turn environments), a turn that ends with
EOS is an answer the function reads (`last_turn`, that turn's text, with the whole `response` so far and
the row's prompt, ground truth, data source and extra fields; within `tool_timeout_s` if set, else the trajectory ends
as `timeout`): a string it returns is appended as the next user turn (`response_mask = 0`) and the model
answers again; None, or the last of `max_turns` turns, ends the trajectory (`done`). The function runs
in the tool threads; one that raises or returns something else stops the rollout naming the row.

A trajectory also ends when it has made `max_turns` assistant turns while still calling tools
(`max_turns`), when an observation would not fit in the response budget (`over_length`), when a
tool's images would bring it past `max_images` (`max_images`), and when an observation cannot be
turned into tokens (an image the processor rejects: `tool_error`), and when its tool call has not
returned within `tool_timeout_s` (`timeout`: its tools are closed, which stops a sandboxed
interpreter, and the call's thread is left behind; the trainer drops the trajectory's whole group,
`rollout/dropped_groups`). An observation or reply that ended it unread stays in its `turns`, marked
`dropped` with the reason (for `over_length`, the tokens cut). Malformed calls, unknown tools,
bad arguments and crashing or hanging code are observations the model reads, never a crashed
rollout.

Each turn's request asks the engine to keep the trajectory's KV cache when another turn may follow
(`Request.keep`) and hands back the one its previous turn kept (`Request.cache`): the HF engine then
prefills only the new tokens (the previous turn's last token and the observation). A trajectory drops
its kept cache when it ends.

The response of a trajectory is everything after its prompt: sampled tokens (`response_mask` 1,
with their rollout log-probs) and observation tokens (`response_mask` 0, log-prob 0, never trained
on nor used in ratios). `max_response_length` bounds the whole response, observations included.

Nothing here touches a model: position ids (M-RoPE for vision-language models) are computed by the
workers that run the model, from the token ids and image grids.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from rlstack.batch import Batch
from rlstack.config import AgentConfig
from rlstack.errors import RLStackError
from rlstack.extensions import load_function, source_file, user_error
from rlstack.models.vision import ImageInputError, VisionProcessor, encode_observation
from rlstack.rollout.engine import Engine, Request, RequestTooLong, SamplingSettings, mix_seed
from rlstack.tools.base import Observation
from rlstack.tools.contract import CONTRACTS, reply_role
from rlstack.tools.parsing import STOP_STRINGS, ToolCallError, parse_tool_call
from rlstack.tools.registry import Toolbox, ToolSet, build_toolset

END_REASONS = ("done", "max_turns", "over_length", "tool_error", "max_images", "timeout")


@dataclass
class Trajectory:
    """One row being generated: its prompt, the response so far, its images and its tools."""

    prompt_ids: list[int]
    toolbox: Toolbox | None
    """None without tools."""
    where: str
    images: list[Image.Image]
    """Every image the model has seen (prompt images first, then tool images); empty for a text model."""
    pixel_values: torch.Tensor | None
    """The processor's rows of `images` (None for a text model)."""
    image_grid_thw: torch.Tensor | None
    """`[images, 3]`, in the same order."""
    num_images: int
    """Images in the context (a text-only model counts the row's images, which only tools see)."""
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    num_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    end_reason: str | None = None
    tool_seconds: float = 0.0
    seed: int | None = None
    """The trajectory's sampling seed; each turn's request gets one derived from it and the turn."""
    weight_version_last: int | None = None
    """The version of the weights that sampled its latest token, where the engine says."""
    turns: list[dict[str, Any]] = field(default_factory=list)
    """With tools, what a person reads: `{"role": "assistant", "text", "tool_call"}` (the parsed call
    `{"name", "arguments"}` or `{"error"}`) and `{"role": "tool", "text", "ok", "images"}` (indices into
    `tool_images`), in order; an environment's reply is `{"role": "user", "text"}`. A reply that ended the
    trajectory unread has `dropped`: `{"reason": "over_length", "tokens", "room"}` (its tokens, the
    response budget left), `{"reason": "max_images", "images"}` or `{"reason": "tool_error", "error"}`."""
    tool_images: list[Image.Image] = field(default_factory=list)
    """The images the tools returned, in order."""
    row: dict[str, Any] = field(default_factory=dict)
    """The data row's prompt, ground_truth, data_source and extra fields (what `feedback` reads)."""
    answered: bool = False
    """The last turn ended with EOS and waits for the environment's feedback."""
    feedback_turns: int = 0
    cache: object | None = None
    """The engine's kept KV cache of the context so far (`Completion.cache`), for the next turn's request."""

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    def finish(self, reason: str) -> None:
        self.end_reason = reason
        self.cache = None  # its memory goes back now, not when the rollout ends
        if self.toolbox is not None:
            self.toolbox.close()

    def append_turn(self, ids: list[int], turn: dict[str, Any], max_response_length: int) -> bool:
        """Append a turn the model reads but did not sample (an observation, an environment's reply): its
        tokens (`response_mask` 0, log-prob 0) and `turn`. Where they do not fit, False: the trajectory ends
        `over_length` and `turn` is kept, marked `dropped` with the tokens cut."""
        room = max_response_length - len(self.tokens)
        if len(ids) >= room:
            self.turns.append(turn | {"dropped": {"reason": "over_length", "tokens": len(ids), "room": room}})
            self.finish("over_length")
            return False
        self.tokens += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.turns.append(turn)
        return True

    def request(self, keep: bool) -> Request:
        """The next turn's request; `keep`: another turn may follow it (the engine keeps its KV cache)."""
        seed = None if self.seed is None else mix_seed(self.seed, self.num_turns)
        return Request(
            self.prompt_ids + self.tokens,
            self.images,
            self.pixel_values,
            self.image_grid_thw,
            seed,
            keep=keep,
            cache=self.cache,
        )


class AgentLoop:
    """Generates `n` trajectories per prompt row with an engine (see module docstring)."""

    def __init__(
        self,
        engine: Engine,
        processor: VisionProcessor,
        toolset: ToolSet | None,
        config: AgentConfig,
        max_response_length: int,
        multimodal: bool,
        ignore_eos: bool = False,
    ):
        self.engine = engine
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.toolset = toolset
        self.cfg = config
        self.max_response_length = max_response_length
        self.multimodal = multimodal
        self.ignore_eos = ignore_eos
        self.stop = tuple(STOP_STRINGS[config.call_format]) if toolset is not None else ()
        self.feedback = load_feedback(config.feedback) if config.feedback else None
        self.multi_turn = toolset is not None or self.feedback is not None
        self.timing = {"gen": 0.0, "tools": 0.0}
        """Seconds spent generating and running tools in the current `generate` call."""

    def generate(
        self, prompts: Batch, n: int, temperature: float, top_p: float = 1.0, top_k: int = -1
    ) -> Batch:
        """Trajectories for every row of `prompts`, `n` each; with tools, `meta["agent_timing"]` holds this
        call's seconds of generation (`gen`) and of tool calls (`tools`). A `sample_seed` column (one seed
        per prompt) seeds every trajectory's requests: sample j of a prompt samples the same tokens
        whatever other prompts share the call."""
        self.timing = {"gen": 0.0, "tools": 0.0}
        sampling = SamplingSettings(
            self.max_response_length, temperature, top_p, top_k, self.stop, ignore_eos=self.ignore_eos
        )
        batch = prompts.repeat_interleave(n)
        trajectories = [self._start(batch, i, i % n) for i in range(len(batch))]
        pool = ThreadPoolExecutor(self.cfg.max_tool_workers, thread_name_prefix="tool")
        try:
            while True:
                active = [t for t in trajectories if not t.done]
                if not active:
                    break
                self._generate_turn(active, sampling)
                answered = [t for t in active if t.answered]
                calling = [t for t in active if not t.done and not t.answered]
                if calling:
                    self._run_tools(calling, pool)
                if answered:
                    self._run_feedback(answered, pool)
        finally:
            for t in trajectories:  # after an error mid-rollout: stop the interpreters still running
                if not t.done and t.toolbox is not None:
                    t.toolbox.close()
                t.cache = None  # and let the kept KV caches go, even while a traceback holds the trajectories
            pool.shutdown(wait=False, cancel_futures=True)  # a timed-out call's thread is not waited for
        return self._assemble(batch, trajectories, temperature)

    # --------------------------------------------------------------------------------- turns

    def _start(self, batch: Batch, i: int, sample: int) -> Trajectory:
        images = list(batch["images"][i]) if "images" in batch else []
        extra = batch["extra"][i] if "extra" in batch else {}
        where = batch["where"][i] if "where" in batch else f"row {i}"
        pixel_values = grid = None
        if self.multimodal:
            if "image_grid_thw" in batch:
                pixel_values, grid = batch["pixel_values"][i], batch["image_grid_thw"][i]
            else:
                pixel_values, grid = self.processor.process_images([], where)
        return Trajectory(
            prompt_ids=list(batch["prompt_ids"][i]),
            toolbox=self.toolset.new(images, dict(extra)) if self.toolset is not None else None,
            where=where,
            images=images if self.multimodal else [],
            pixel_values=pixel_values,
            image_grid_thw=grid,
            num_images=len(images),
            seed=mix_seed(int(batch["sample_seed"][i]), sample) if "sample_seed" in batch else None,
            row={k: batch[k][i] for k in ("prompt", "ground_truth", "data_source") if k in batch}
            | {"extra": extra},
        )

    def _generate_turn(self, active: list[Trajectory], sampling: SamplingSettings) -> None:
        budget = max(self.max_response_length - len(t.tokens) for t in active)
        began = time.perf_counter()
        try:
            completions = self.engine.generate(
                [t.request(self.multi_turn and t.num_turns + 1 < self.cfg.max_turns) for t in active],
                dataclasses.replace(sampling, max_tokens=budget),
            )
        except RequestTooLong as e:
            t = active[e.index]
            raise RequestTooLong(
                e.index,
                f"{t.where}, turn {t.num_turns + 1}: {e} (the trajectory's context so far is too long)",
            ) from e
        self.timing["gen"] += time.perf_counter() - began
        eos = self.engine.eos_token_ids
        for t, c in zip(active, completions):
            room = self.max_response_length - len(t.tokens)
            cut = len(c.token_ids) > room
            new, logp = c.token_ids[:room], c.logprobs[:room]
            t.tokens += new
            t.mask += [1] * len(new)
            t.logprobs += logp
            t.num_turns += 1
            t.weight_version_last = c.weight_version
            t.cache = c.cache
            if self.multi_turn:
                t.turns.append(
                    {"role": "assistant", "text": self.tokenizer.decode(new, skip_special_tokens=True)}
                )
            if not cut and new and new[-1] in eos and not sampling.ignore_eos:
                if self.feedback is not None and t.num_turns < self.cfg.max_turns:
                    t.answered = True  # the environment reads the answer (`_run_feedback`)
                else:
                    t.finish("done")
            elif cut or c.finish_reason == "length" or len(t.tokens) >= self.max_response_length:
                t.finish("over_length")
            elif self.toolset is None:
                t.finish("done")  # a stop string ends a single-turn completion
            elif t.num_turns >= self.cfg.max_turns:
                t.finish("max_turns")

    def _run_tools(self, calling: list[Trajectory], pool: ThreadPoolExecutor) -> None:
        style = self.cfg.call_format
        parsed = []
        for t in calling:
            text = self.tokenizer.decode(t.tokens[_last_turn_start(t) :], skip_special_tokens=True)
            call = parse_tool_call(text, style)
            call = call if call is not None else ToolCallError("the turn holds no tool call", text)
            parsed.append(call)
            t.turns[-1]["tool_call"] = (
                {"error": call.message}
                if isinstance(call, ToolCallError)
                else {"name": call.name, "arguments": call.arguments}
            )

        def run(item: tuple[Trajectory, Any]) -> tuple[Observation, float]:
            t, call = item
            began = time.perf_counter()
            observation = t.toolbox.call(call)
            return observation, time.perf_counter() - began

        began = time.perf_counter()
        futures = [pool.submit(run, item) for item in zip(calling, parsed)]
        done, _ = wait(futures, timeout=self.cfg.tool_timeout_s)
        self.timing["tools"] += time.perf_counter() - began
        finished = []
        for t, f in zip(calling, futures):
            if f in done:
                finished.append((t, f.result()))
            else:  # still running past tool_timeout_s: the trajectory ends, its group is dropped
                t.tool_calls += 1
                t.tool_errors += 1
                t.tool_seconds += self.cfg.tool_timeout_s
                t.finish("timeout")
        for t, (observation, seconds) in finished:
            t.tool_calls += 1
            t.tool_errors += int(not observation.ok)
            t.tool_seconds += seconds
            self._append_observation(t, observation)

    def _run_feedback(self, answered: list[Trajectory], pool: ThreadPoolExecutor) -> None:
        """The environment's reply to each answer: the next user turn, or the end of the trajectory."""

        def run(t: Trajectory) -> Any:
            response = self.tokenizer.decode(t.tokens, skip_special_tokens=True)
            last_turn = self.tokenizer.decode(t.tokens[_last_turn_start(t) :], skip_special_tokens=True)
            # `answer`: `last_turn`'s old name, still passed for the functions written with it
            turn = {"response": response, "last_turn": last_turn, "answer": last_turn, "turn": t.num_turns}
            return self.feedback(t.row | turn)

        began = time.perf_counter()
        futures = [pool.submit(run, t) for t in answered]
        done, _ = wait(futures, timeout=self.cfg.tool_timeout_s)
        self.timing["tools"] += time.perf_counter() - began
        for t, future in zip(answered, futures):
            t.answered = False
            if future not in done:  # past tool_timeout_s, as a tool call: the trainer drops the group
                t.finish("timeout")
                continue
            error = future.exception()
            reply = None if error is not None else future.result()
            if error is not None or not (reply is None or isinstance(reply, str)):
                what = (
                    f"raised {user_error(error, source_file(self.feedback))}"
                    if error is not None
                    else f"returned {reply!r}"
                )
                raise RLStackError(
                    f"worker.rollout.agent.feedback ({self.cfg.feedback}) {what} for {t.where}, turn "
                    f"{t.num_turns}: it must return the next user message (a string) or None to accept the answer"
                )
            if reply is None:
                t.finish("done")
                continue
            encoded = encode_observation(
                self.processor,
                reply,
                [],
                f"{t.where}, turn {t.num_turns} feedback",
                response_ended_with_eos=True,
            )
            turn = {"role": "user", "text": reply}
            if t.append_turn(encoded.input_ids.tolist(), turn, self.max_response_length):
                t.feedback_turns += 1

    def _append_observation(self, t: Trajectory, observation: Observation) -> None:
        images = list(observation.images)
        if images and not self.multimodal:
            images = []  # a text-only policy cannot see images: it reads that one was made
            observation = dataclasses.replace(
                observation,
                text=observation.text + "\n[the tool produced an image; this model cannot see images]",
                images=[],
            )
        turn = {"role": "tool", "text": observation.text, "ok": observation.ok, "images": []}
        if t.num_images + len(images) > self.cfg.max_images:
            t.turns.append(turn | {"dropped": {"reason": "max_images", "images": len(images)}})
            t.finish("max_images")
            return
        content = CONTRACTS[self.cfg.tool_contract].render(observation, len(images), t.num_images)
        role = reply_role(self.cfg.tool_contract, self.cfg.call_format)
        try:
            encoded = encode_observation(
                self.processor,
                content,
                images,
                f"{t.where}, turn {t.num_turns} observation",
                response_ended_with_eos=False,
                role=role,
            )
        except ImageInputError as e:
            t.turns.append(turn | {"dropped": {"reason": "tool_error", "error": str(e)}})
            t.finish("tool_error")
            return
        if not t.append_turn(encoded.input_ids.tolist(), turn, self.max_response_length):
            return
        turn["images"] = list(range(len(t.tool_images), len(t.tool_images) + len(images)))
        t.tool_images += images
        if images:
            t.images += images
            t.pixel_values = torch.cat([t.pixel_values, encoded.pixel_values])
            t.image_grid_thw = torch.cat([t.image_grid_thw, encoded.image_grid_thw])
            t.num_images += len(images)
        if self.cfg.end_on_evaluation and observation.ok and observation.evaluated:
            t.finish("done")  # NeMo RL's terminate_on_evaluation: the evaluated result is the last turn

    # ------------------------------------------------------------------------------- assembly

    def _assemble(self, batch: Batch, trajectories: list[Trajectory], temperature: float) -> Batch:
        pad = self.tokenizer.pad_token_id
        P = max(len(t.prompt_ids) for t in trajectories)
        R = max(1, max(len(t.tokens) for t in trajectories))
        ids, attention, response, logprobs = [], [], [], []
        for t in trajectories:  # prompts left-padded to P, responses right-padded to R
            left, right = P - len(t.prompt_ids), R - len(t.tokens)
            ids.append([pad] * left + t.prompt_ids + t.tokens + [pad] * right)
            attention.append([0] * left + [1] * (len(t.prompt_ids) + len(t.tokens)) + [0] * right)
            response.append([0] * P + t.mask + [0] * right)
            logprobs.append([0.0] * P + t.logprobs + [0.0] * right)  # 0 on observation tokens already
        columns: dict[str, Any] = {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "attention_mask": torch.tensor(attention, dtype=torch.long),
            "response_mask": torch.tensor(response, dtype=torch.long),
            "rollout_logprobs": torch.tensor(logprobs, dtype=torch.float32),
            "truncated": torch.tensor([t.end_reason == "over_length" for t in trajectories]),
            "end_reason": [t.end_reason for t in trajectories],
            "response_text": self.tokenizer.batch_decode(
                [t.tokens for t in trajectories], skip_special_tokens=True
            ),
        }
        if all(t.weight_version_last is not None for t in trajectories):
            columns["weight_version_last"] = torch.tensor([t.weight_version_last for t in trajectories])
        if self.feedback is not None:
            columns["feedback_turns"] = torch.tensor([t.feedback_turns for t in trajectories])
        if self.multi_turn:
            columns |= {
                "num_turns": torch.tensor([t.num_turns for t in trajectories]),
                "tool_calls": torch.tensor([t.tool_calls for t in trajectories]),
                "tool_errors": torch.tensor([t.tool_errors for t in trajectories]),
                "num_images": torch.tensor([t.num_images for t in trajectories]),
                "turns": [t.turns for t in trajectories],
                "tool_images": [t.tool_images for t in trajectories],
            }
        if self.multimodal:
            columns["pixel_values"] = [t.pixel_values for t in trajectories]
            columns["image_grid_thw"] = [t.image_grid_thw for t in trajectories]
        out = batch.update(columns)
        if self.multi_turn:
            out.meta["agent_timing"] = dict(self.timing)
        return out


def agent_system_prompt(config: AgentConfig, toolset: ToolSet | None = None) -> str | None:
    """The system prompt of `config.system_prompt` (a file), with the Hermes `<tools>` block appended
    for hermes calls; None when neither applies."""
    text = Path(config.system_prompt).read_text().strip() if config.system_prompt else ""
    if config.call_format == "hermes" and config.tools:
        tools = (
            toolset or build_toolset(config.tools, "worker.rollout.agent.tools", config.tool_contract)
        ).hermes_tools_prompt()
        text = f"{text}\n\n{tools}" if text else tools
    return text or None


def load_feedback(ref: str) -> Any:
    """The environment's feedback function `file.py:fn` or `pkg.mod:fn` (`worker.rollout.agent.feedback`)."""
    return load_function(ref, "worker.rollout.agent.feedback", "feedback file", RLStackError)[1]


def _last_turn_start(t: Trajectory) -> int:
    """Index of the first token of the trajectory's last sampled run."""
    i = len(t.mask)
    while i > 0 and t.mask[i - 1] == 1:
        i -= 1
    return i
