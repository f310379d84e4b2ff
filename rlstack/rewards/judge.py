"""Scoring responses with an LLM judge served behind any OpenAI-compatible endpoint (`vllm serve`, ...).

Three built-in prompt templates, chosen per item from `TEMPLATES`:
  - `consistency`: the two-answer consistency judge of DeepEyes (Zheng et al., 2025, "DeepEyes: Incentivizing
    'Thinking with Images' via Reinforcement Learning"): few-shot examples, then the question, the ground
    truth and the model's answer; the judge ends with `Judgement: 1` (same answer) or `Judgement: 0`.
    The prompt text is ours, not DeepEyes'.
  - `verifier`: the judge answers TRUE or FALSE to "is the response correct given the reference".
  - `rubric`: the judge grades the response against a rubric (passed as `answer`) with a score in [0, 1].
A user's template is a Jinja file rendered with `question`, `reference` and `response` as the user message
(`file_prompt`); the judge's reply is read by a named parser (`PARSERS`) or the user's `path/to/file.py:fn`
(`load_template`). A reward may send its own `Template` with each item: `builtin:pyvision` and
`builtin:codev` ask with their systems' prompts and read the replies as those systems do.

Every call is retried (exponential backoff with jitter) on connection errors, timeouts, HTTP 429/5xx,
malformed bodies and unparseable verdicts. A (template, question, answer, response) is sent once per client:
results are cached and identical items in flight share one request. When the endpoint stays down,
`on_error="raise"` raises `JudgeUnavailable` naming the endpoint and the sample; `on_error="score"` returns
`error_score` and counts the failure in `JudgeClient.errors` (log it as `reward/judge_errors`). Never a
silent 0. `check` asks the endpoint once before a run (GET /models, a one-token completion).
"""

from __future__ import annotations

import base64
import hashlib
import io
import numbers
import random
import re
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import jinja2
import openai

from rlstack.config import JudgeConfig
from rlstack.config.reward import judge_endpoint
from rlstack.errors import RLStackError
from rlstack.extensions import load_function, source_file, user_error

Messages = list[dict[str, str]]
T = TypeVar("T")


class JudgeError(RLStackError, RuntimeError):
    """A judge endpoint that is not configured, or a judge call that failed for good."""


class JudgeUnavailable(JudgeError):
    """The judge endpoint failed every attempt for a sample, under `on_error="raise"`."""


class UnparseableVerdict(JudgeError, ValueError):
    """The judge's reply holds no verdict its template can read; retried like an endpoint failure."""


@dataclass(frozen=True)
class JudgeItem:
    question: str
    answer: str
    """Ground-truth answer (consistency, verifier) or the rubric (rubric)."""
    response: str
    """The policy's answer being judged."""
    template: str | Template = "consistency"
    """A built-in template's name, the client's own (`worker.reward.judge.template`, a file's path too), or a
    reward's own `Template` (the prompts of `builtin:pyvision` and `builtin:codev`)."""
    images: tuple[bytes, ...] = ()
    """The question's images, PNG-encoded (`png_images`), sent before the prompt's text for a
    vision-language judge; part of the cache key (by digest) like the texts."""


@dataclass
class JudgeResult:
    verdict: str | None
    """Normalized: "1"/"0" (judgement_0_1), "TRUE"/"FALSE" (true_false), "YES"/"NO" (yes_no), score text
    (the others); None: failed."""
    score: float
    """Reward in [0, 1] (a user's parser: what it returns); error_score when judging failed under on_error=score."""
    cached: bool
    """True when no request was sent for this item (from the cache or an identical item in flight)."""
    attempts: int
    """Requests sent for this item (0 when cached)."""
    error: str | None = None
    """Why judging failed, with on_error=score; None on success."""


# ---------------------------------------------------------------------------------------------------------
# Prompts


_CONSISTENCY_INSTRUCTIONS = """\
You compare two answers to the same question: a reference answer known to be correct, and a candidate \
answer written by a student model. Decide whether the candidate gives the same final answer as the \
reference. Ignore wording, formatting, units written differently and extra explanation; only the final \
answer matters. A candidate that hedges between several answers, or gives none, does not match.
Write at most one short sentence of reasoning, then end with "Judgement: 1" if the answers match or \
"Judgement: 0" if they do not."""

_CONSISTENCY_EXAMPLES = [
    (
        "How many apples are left if Tom has 12 and gives away 5?",
        "7",
        "Tom starts with 12 and gives 5 away, so seven apples remain.",
        "Seven is the same number as 7. Judgement: 1",
    ),
    (
        "What colour is the traffic light in the picture?",
        "green",
        "The light is red, so cars must stop.",
        "Red is not green. Judgement: 0",
    ),
    (
        "Which option shows the largest area? (A) 2 m^2 (B) 3.5 m^2 (C) 3 m^2",
        "B",
        "(B) 3.5 m^2",
        "Option B is the reference answer. Judgement: 1",
    ),
    (
        "What is the capital of Australia?",
        "Canberra",
        "It is either Sydney or Canberra.",
        "The candidate hedges between two answers. Judgement: 0",
    ),
]


def _consistency_block(question: str, answer: str, response: str) -> str:
    return f"Question: {question}\nReference answer: {answer}\nCandidate answer: {response}\n"


def consistency_prompt(question: str, answer: str, response: str) -> Messages:
    shots = "\n".join(_consistency_block(q, a, r) + j + "\n" for q, a, r, j in _CONSISTENCY_EXAMPLES)
    user = (
        f"{_CONSISTENCY_INSTRUCTIONS}\n\nExamples:\n\n{shots}\nNow judge this one.\n\n"
        + _consistency_block(question, answer, response)
    )
    return [{"role": "system", "content": "You are a careful grader."}, {"role": "user", "content": user}]


def verifier_prompt(question: str, answer: str, response: str) -> Messages:
    user = (
        "Decide whether the response correctly answers the question, using the reference answer as the "
        "truth. Equivalent forms (fractions vs decimals, different wording) count as correct.\n\n"
        f"Question: {question}\nReference answer: {answer}\nResponse: {response}\n\n"
        "Reply with exactly one word: TRUE if the response is correct, FALSE otherwise."
    )
    return [{"role": "system", "content": "You are a strict verifier."}, {"role": "user", "content": user}]


def rubric_prompt(question: str, answer: str, response: str) -> Messages:
    user = (
        "Grade the response to the task below against the rubric. Give a score between 0 and 1, where 0 "
        "means no rubric item is met and 1 means every item is fully met.\n\n"
        f"Task: {question}\n\nRubric:\n{answer}\n\nResponse:\n{response}\n\n"
        'Write at most two sentences of justification, then end with "Score: <number between 0 and 1>".'
    )
    return [{"role": "system", "content": "You are a fair grader."}, {"role": "user", "content": user}]


# ---------------------------------------------------------------------------------------------------------
# Verdict parsing: judge text -> (normalized verdict, score), or UnparseableVerdict


_BINARY_LABELLED = re.compile(r"judge?ment\W{0,5}([01])(?!\.?\d)", re.IGNORECASE)
_BINARY_ALONE = re.compile(r"\W*([01])\W*")
_BOOL_LABELLED = re.compile(r"(?:verdict|answer|judge?ment)\W{0,5}(true|false)\b", re.IGNORECASE)
_BOOL_WORD = re.compile(r"\b(true|false)\b", re.IGNORECASE)
_NUMBER = r"(\d+(?:\.\d+)?|\.\d+)(?!\.?\d)"
_YES_NO_LABELLED = re.compile(r"(?:verdict|answer|judge?ment)\W{0,5}(yes|no)\b", re.IGNORECASE)
_YES_NO_WORD = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_SCORE_LABELLED = re.compile(r"score[^\w.]{0,5}" + _NUMBER, re.IGNORECASE)
_NUMBER_ANY = re.compile(r"(?<![\d.])" + _NUMBER)


def _unparseable(text: str, expected: str) -> UnparseableVerdict:
    snippet = text if len(text) <= 200 else text[:197] + "..."
    return UnparseableVerdict(f"judge reply has no {expected}: {snippet!r}")


def parse_consistency(text: str) -> tuple[str, float]:
    """`Judgement: 1` (last one wins, any case and punctuation), or a reply that is only 0 or 1."""
    labelled = _BINARY_LABELLED.findall(text)
    alone = _BINARY_ALONE.fullmatch(text)
    digit = labelled[-1] if labelled else alone.group(1) if alone else None
    if digit is None:
        raise _unparseable(text, '"Judgement: 0/1"')
    return digit, float(digit)


def parse_verifier(text: str) -> tuple[str, float]:
    """TRUE/FALSE: after a `Verdict:`-style label, else the only one of the two words the reply uses."""
    return _parse_word(text, _BOOL_LABELLED, _BOOL_WORD, ("TRUE", "FALSE"))


def parse_yes_no(text: str) -> tuple[str, float]:
    """YES/NO, read as `parse_verifier` reads TRUE/FALSE."""
    return _parse_word(text, _YES_NO_LABELLED, _YES_NO_WORD, ("YES", "NO"))


def _parse_word(
    text: str, labelled: re.Pattern, word: re.Pattern, pair: tuple[str, str]
) -> tuple[str, float]:
    """One of `pair` (score 1 for the first): the last labelled one, else the only one of the two the reply uses."""
    found = labelled.findall(text)
    words = {w.upper() for w in (found[-1:] if found else word.findall(text))}
    if len(words) != 1:
        raise _unparseable(text, f"single {'/'.join(pair)} verdict")
    verdict = words.pop()
    return verdict, float(verdict == pair[0])


def _parse_score(text: str, top: float) -> tuple[str, float]:
    """A number in [0, top]: after `Score:` (last one wins), else the only number in the reply; scaled to [0, 1]."""
    labelled = _SCORE_LABELLED.findall(text)
    found = labelled[-1:] if labelled else _NUMBER_ANY.findall(text)
    if len(found) != 1 or not 0.0 <= float(found[0]) <= top:
        raise _unparseable(text, f"single score in [0, {top:g}]")
    score = float(found[0])
    return f"{score:g}", score / top


def parse_rubric(text: str) -> tuple[str, float]:
    """A number in [0, 1]: after `Score:` (last one wins), else the only number in the reply."""
    return _parse_score(text, 1.0)


def parse_score_0_10(text: str) -> tuple[str, float]:
    """A number in [0, 10] as `parse_rubric` reads one in [0, 1], divided by 10."""
    return _parse_score(text, 10.0)


Parse = Callable[[str], tuple[str, float]]
"""The judge's reply -> (normalized verdict, score); UnparseableVerdict when it holds none."""

PARSERS: dict[str, Parse] = {
    "judgement_0_1": parse_consistency,
    "true_false": parse_verifier,
    "yes_no": parse_yes_no,
    "score_0_1": parse_rubric,
    "score_0_10": parse_score_0_10,
}
"""The parsers `worker.reward.judge.parser` names (`config.reward.JUDGE_PARSERS`)."""


@dataclass(frozen=True)
class Template:
    prompt: Callable[[str, str, str], Messages]
    """(question, answer, response) -> the chat messages sent."""
    parse: Parse
    name: str = ""
    """How errors name it; a built-in's is its key in `TEMPLATES`."""


TEMPLATES: dict[str, Template] = {
    "consistency": Template(consistency_prompt, parse_consistency, "consistency"),
    "verifier": Template(verifier_prompt, parse_verifier, "verifier"),
    "rubric": Template(rubric_prompt, parse_rubric, "rubric"),
}
"""The built-in templates (`config.reward.JUDGE_TEMPLATES`), each with its own parser."""


def load_template(template: str, parser: str) -> Template:
    """`worker.reward.judge.template` and `.parser`: a built-in template or a Jinja file (`file_prompt`), read
    by the template's own parser (`parser` empty: built-ins only), a named one (`PARSERS`) or a user's
    `path/to/file.py:fn` (`user_parser`)."""
    if not parser and template not in TEMPLATES:
        raise JudgeError(
            f"worker.reward.judge.template={template!r} is a file: name how its verdict is read with "
            f"worker.reward.judge.parser ({', '.join(PARSERS)}, or path/to/file.py:fn)"
        )
    prompt = TEMPLATES[template].prompt if template in TEMPLATES else file_prompt(template)
    if not parser:
        return TEMPLATES[template]
    return Template(prompt, PARSERS[parser] if parser in PARSERS else user_parser(parser), template)


def file_prompt(path: str) -> Callable[[str, str, str], Messages]:
    """A Jinja file as a prompt: rendered with `question`, `reference` (the ground truth, or a rubric) and
    `response`, the whole text one user message. A name it uses that is none of these is an error here, at
    load, not at the first judged sample."""
    where = f"worker.reward.judge.template={path!r}"
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise JudgeError(
            f"{where}: cannot read it ({e}); give a built-in ({', '.join(TEMPLATES)}) or a file"
        ) from e
    try:
        compiled = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(text)
    except jinja2.TemplateSyntaxError as e:
        raise JudgeError(f"{where}: Jinja syntax error at line {e.lineno}: {e.message}") from e

    def prompt(question: str, answer: str, response: str) -> Messages:
        return [
            {
                "role": "user",
                "content": compiled.render(question=question, reference=answer, response=response),
            }
        ]

    try:
        prompt("question", "reference", "response")
    except jinja2.UndefinedError as e:
        raise JudgeError(
            f"{where}: {e.message}; a judge template has question, reference and response"
        ) from e
    return prompt


def user_parser(ref: str) -> Parse:
    """A user's `path/to/file.py:fn` (`fn(reply: str) -> float`) as a parser: it raises, or returns None, when
    the reply holds no verdict (retried like an unreadable reply of a named parser)."""
    _, fn = load_function(ref, "worker.reward.judge.parser", "judge parser file", JudgeError)
    file = source_file(fn)

    def parse(text: str) -> tuple[str, float]:
        try:
            value = fn(text)
        except Exception as e:
            raise UnparseableVerdict(f"parser {ref} raised on {_short(text)!r}: {user_error(e, file)}") from e
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise UnparseableVerdict(f"parser {ref} returned {value!r}, not a score, for {_short(text)!r}")
        return f"{float(value):g}", float(value)

    return parse


# ---------------------------------------------------------------------------------------------------------
# Client


_RETRYABLE = (openai.APIConnectionError, openai.APITimeoutError, openai.APIResponseValidationError)


class _Failed(Exception):
    """Every attempt for one item failed (or one failed in a way retrying cannot fix)."""

    def __init__(self, reason: str, attempts: int):
        super().__init__(reason)
        self.reason, self.attempts = reason, attempts


class JudgeClient:
    """Thread-safe, one per trainer. Log `errors` as reward/judge_errors; `close()` when done."""

    def __init__(self, config: JudgeConfig):
        self.config = config
        endpoint = judge_endpoint(config)
        self.base_url = endpoint.base_url
        if not self.base_url:
            raise JudgeError(
                "no judge endpoint: set worker.reward.judge.base_url or the LLM_AS_A_JUDGE_BASE environment "
                "variable to the OpenAI-compatible URL of the judge server, e.g. http://host:18901/v1"
            )
        if config.on_error not in ("raise", "score"):
            raise JudgeError(f"judge on_error={config.on_error!r}: must be 'raise' or 'score'")
        if config.max_concurrency < 1 or config.max_attempts < 1:
            raise JudgeError("judge max_concurrency and max_attempts must be at least 1")
        self.template = load_template(config.template, config.parser)
        """The configured template, read by the configured parser."""
        self._openai = openai.OpenAI(
            base_url=self.base_url, api_key=endpoint.api_key or "EMPTY", timeout=config.timeout, max_retries=0
        )
        self.model = config.model
        self.errors = 0
        """Items scored with error_score because judging failed (cumulative; log as reward/judge_errors)."""
        self.last_error = ""
        """Why the latest of those failed, and after how many attempts."""
        self.answered = 0
        """Items the endpoint itself answered (not from the cache; cumulative)."""
        self._pool = ThreadPoolExecutor(config.max_concurrency, thread_name_prefix="judge")
        self._cache: dict[tuple, Future[JudgeResult]] = {}
        """Results by `_cache_key` (the images by digest: the cache does not keep them)."""
        self._lock = threading.Lock()
        self._model_lock = threading.Lock()
        self._rng = random.Random(config.seed)

    def judge(self, item: JudgeItem) -> JudgeResult:
        return self.judge_batch([item])[0]

    def judge_batch(self, items: list[JudgeItem]) -> list[JudgeResult]:
        """One result per item, in order; JudgeUnavailable (on_error=raise) names the failing sample."""
        for item in items:
            if isinstance(item.template, Template):
                continue
            if item.template not in TEMPLATES and item.template != self.config.template:
                raise JudgeError(
                    f"judge template {item.template!r}: must be one of {sorted(TEMPLATES)} or the configured "
                    f"{self.config.template!r}"
                )
        futures: list[tuple[Future[JudgeResult], bool]] = []
        with self._lock:
            for item in items:
                future = self._cache.get(_cache_key(item))
                fresh = future is None
                if fresh:
                    future = self._pool.submit(self._judge_one, item)
                    self._cache[_cache_key(item)] = future
                futures.append((future, fresh))
        results = []
        for i, (future, fresh) in enumerate(futures):
            try:
                result = future.result()
            except _Failed as e:
                self._forget(items[i], future)
                if self.config.on_error == "raise":
                    self._cancel_pending(items, futures)
                    raise JudgeUnavailable(
                        f"judge endpoint {self.base_url} (model {self.model or '?'}) failed on sample {i} "
                        f"after {e.attempts} attempt(s): {e.reason}; sample: {_describe(items[i])}. Check "
                        "the judge server, or set worker.reward.judge.on_error=score to score such samples "
                        "with error_score and count them in reward/judge_errors"
                    ) from e
                with self._lock:
                    self.errors += 1
                    self.last_error = f"{e.reason}, after {e.attempts} attempt(s)"
                result = JudgeResult(None, self.config.error_score, False, e.attempts, e.reason)
                results.append(result if fresh else replace(result, cached=True, attempts=0))
                continue
            if fresh:
                with self._lock:
                    self.answered += 1
            results.append(result if fresh else replace(result, cached=True, attempts=0))
        return results

    def check(self) -> None:
        """Ask the endpoint once, from this host, before a run: GET /models (no model configured: the first
        listed is taken) and a one-token chat completion with the model. Each retried as a judged sample is;
        a JudgeError names the URL, this host, what failed and the models the endpoint lists."""
        where = f"judge check at start (worker.reward.judge.check_at_start) from host {socket.gethostname()}"
        fix = (
            "start the judge server, or fix worker.reward.judge.base_url / api_key (or the LLM_AS_A_JUDGE_BASE / "
            "OPENAI_API_KEY environment variables) so that this host reaches it; "
            "worker.reward.judge.check_at_start=false skips this check"
        )
        url = self.base_url.rstrip("/")
        try:
            served, _ = self._attempts(lambda: [m.id for m in self._openai.models.list()])
        except _Failed as e:
            raise JudgeError(
                f"{where}: GET {url}/models failed after {e.attempts} attempt(s): {e.reason}; {fix}"
            ) from e
        with self._model_lock:
            if not (self.model or served):
                raise JudgeError(
                    f"{where}: GET {url}/models lists no models; name one in worker.reward.judge.model"
                )
            self.model = self.model or served[0]
        try:
            self._attempts(self._ping)
        except _Failed as e:
            raise JudgeError(
                f"{where}: POST {url}/chat/completions (model {self.model!r}; it lists {served}) failed after "
                f"{e.attempts} attempt(s): {e.reason}; {fix}"
            ) from e

    def _ping(self) -> None:
        completion = self._openai.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "Say OK."}], temperature=0.0, max_tokens=1
        )
        if not getattr(completion, "choices", None):
            raise ValueError(f"chat completion without choices: {_short(repr(completion))}")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._openai.close()

    def __enter__(self) -> JudgeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _forget(self, item: JudgeItem, future: Future[JudgeResult]) -> None:
        """Failures are not cached: a later call for the same item tries the endpoint again."""
        with self._lock:
            if self._cache.get(_cache_key(item)) is future:
                del self._cache[_cache_key(item)]

    def _cancel_pending(
        self, items: list[JudgeItem], futures: list[tuple[Future[JudgeResult], bool]]
    ) -> None:
        for item, (future, fresh) in zip(items, futures):
            if fresh and future.cancel():
                self._forget(item, future)

    def _judge_one(self, item: JudgeItem) -> JudgeResult:
        if isinstance(item.template, Template):
            template = item.template
        else:
            template = self.template if item.template == self.config.template else TEMPLATES[item.template]
        messages = with_images(template.prompt(item.question, item.answer, item.response), item.images)
        (verdict, score), attempts = self._attempts(lambda: template.parse(self._complete(messages)))
        return JudgeResult(verdict, score, False, attempts)

    def _attempts(self, call: Callable[[], T]) -> tuple[T, int]:
        """`call()`'s value and the attempts it took: retried with backoff on connection errors, timeouts,
        HTTP 429/5xx, malformed bodies and unreadable verdicts; `_Failed` when every attempt failed, or at
        once on another HTTP error (retrying cannot fix a 4xx)."""
        reason = ""
        for attempt in range(1, self.config.max_attempts + 1):
            if attempt > 1:
                time.sleep(self._backoff(attempt - 1))
            try:
                return call(), attempt
            except openai.APIStatusError as e:
                reason = f"HTTP {e.status_code}: {_short(e.message)}"
                if e.status_code != 429 and e.status_code < 500:
                    raise _Failed(reason, attempt) from e
            except (*_RETRYABLE, UnparseableVerdict, ValueError) as e:
                reason = f"{type(e).__name__}: {_short(str(e))}"
        raise _Failed(reason, self.config.max_attempts)

    def _backoff(self, retry: int) -> float:
        delay = min(self.config.backoff_max, self.config.backoff_base * 2 ** (retry - 1))
        with self._lock:
            return delay * (0.5 + 0.5 * self._rng.random())

    def _complete(self, messages: Messages) -> str:
        completion = self._openai.chat.completions.create(
            model=self._model(), messages=messages, temperature=0.0, max_tokens=self.config.max_tokens
        )
        choices = getattr(completion, "choices", None)
        content = choices[0].message.content if choices else None
        if not isinstance(content, str):
            raise ValueError(f"chat completion without message content: {_short(repr(completion))}")
        return content

    def _model(self) -> str:
        """The configured model, else the first one GET /models lists (asked once, retried like a request)."""
        with self._model_lock:
            if not self.model:
                models = [m.id for m in self._openai.models.list()]
                if not models:
                    raise ValueError(f"judge endpoint {self.base_url} lists no models at /models")
                self.model = models[0]
            return self.model


def _cache_key(item: JudgeItem) -> tuple:
    """What makes two items the same judgement: the texts, the template and the images' digest."""
    digest = hashlib.sha256(b"".join(hashlib.sha256(im).digest() for im in item.images)).hexdigest()
    return item.template, item.question, item.answer, item.response, digest if item.images else ""


def png_images(images) -> tuple[bytes, ...]:
    """A row's images (PIL images, or PNG / JPEG bytes as they are) as the bytes a `JudgeItem` carries."""
    out = []
    for image in images or ():
        if isinstance(image, bytes):
            out.append(image)
            continue
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return tuple(out)


def with_images(messages: Messages, images: tuple[bytes, ...]) -> list[dict]:
    """`messages` with `images` put before the text of the last user message, as OpenAI-style content
    parts (`image_url` with a base64 data URL, what `vllm serve` takes for Qwen2.5-VL and the like)."""
    if not images:
        return messages
    *head, last = messages
    parts = [
        {
            "type": "image_url",
            "image_url": {"url": f"data:{_mime(image)};base64,{base64.b64encode(image).decode()}"},
        }
        for image in images
    ]
    return [*head, {"role": last["role"], "content": [*parts, {"type": "text", "text": last["content"]}]}]


def _mime(image: bytes) -> str:
    return "image/jpeg" if image[:3] == b"\xff\xd8\xff" else "image/png"


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(item: JudgeItem) -> str:
    question, response = _short(item.question, 80), _short(item.response, 80)
    images = f", {len(item.images)} image(s)" if item.images else ""
    template = item.template.name if isinstance(item.template, Template) else item.template
    return f"template={template}, question={question!r}, response={response!r}{images}"
