"""Rule-based math reward: answer extraction, math-verify equivalence, format check, judge fallback.

EasyR1 batch interface::

    compute_score(reward_inputs, format_weight=0.1, fallback=None, ...) -> list[dict[str, float]]

Each input dict needs `response` and `ground_truth`; the question for the optional judge fallback is
read from `question`, `problem` or `prompt` (first present). Each output dict holds floats only:
`overall = (1 - format_weight) * accuracy + format_weight * format`, `accuracy`, `format`.
`score_details` returns the same scores together with the reason for each, for logging and tests.

Pipeline for one sample:

1. The answer is extracted from the response (`extract_answer`): the last `<answer>...</answer>`
   (and the last `\\boxed{}` inside it, if any), else the last `\\boxed{}` / `\\fbox{}` in the
   response, else the last GSM8K `#### 42` line, else, as a last resort, "the (final) answer is X".
   Nothing found -> accuracy 0 with reason "no answer" (DAPO style; the fallback is NOT called).
2. The ground truth is normalized the same way (`normalize_ground_truth`): "...#### 42" -> "42",
   "\\boxed{x}" -> "x", surrounding `$` removed.
3. Both are pre-normalized (`\\dfrac` -> `\\frac`, `1,000` -> `1000`, `3e5` -> `3\\times10^{5}`,
   multiple-choice letters such as `(B)` / `\\text{B}` / `B.` -> `B`) and parsed with math-verify
   (`parse("$" + text + "$")` with LaTeX and plain-expression extraction), then compared with
   `verify(gold, answer)`.
4. Exceptions and timeouts of math-verify never propagate: a `verify` failure counts as not equal
   with reason "verify error: ..." / "verify timeout".

Judge fallback (`fallback`): a callable taking a list of `(question, gold, response, images)` tuples
(`images`: the row's images, empty for text rows) and
returning one float in [0, 1] per tuple. It is called ONCE per batch, with ONLY the samples for which
the rule could not decide because math-verify could not parse the extracted answer or the ground
truth into a mathematical object (and a plain string comparison did not match either). It is never
called for samples with no answer at all, for samples the rule scored (equal or not), or for answers
longer than `max_answer_chars`. `gold` is the normalized ground truth, `response` the full response.
Errors raised by the fallback propagate (the judge client applies its own failure policy; a silent 0
is not an option). Without a fallback such samples score accuracy 0 with reason "unparseable ...".

Timeouts: math-verify implements its timeouts with `signal.alarm`, which only works in the main
thread. In other threads the math-verify timeouts are switched off and the caller (the reward
manager's per-sample timeout) must bound the time.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

REWARD_NAME = "math"
REWARD_TYPE = "batch"

Fallback = Callable[[list[tuple[str, str, str, Any]]], Sequence[float]]

MAX_ANSWER_CHARS = 1000

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*(\{)?")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_GSM8K = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"(?:final answer|the answer)\s*(?:is|:)\s*:?\s*([^\n]+)", re.IGNORECASE)
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_SCI = re.compile(r"^(-?\d+(?:\.\d+)?)\s*[eE]\s*([+-]?\d+)$")
_CHOICE = re.compile(
    r"^\(?\s*(?:\\text(?:bf)?\{\s*)?\(?\s*([A-J])\s*\)?\s*\}?\s*\)?\s*[.:]?$",
)
_CHOICE_IN_TEXT = re.compile(r"^\(?\s*([A-J])\s*\)(?:\s|$)|^([A-J])[.:](?:\s|$)")


# --------------------------------------------------------------------------------------------------
# Extraction


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` or `\\fbox{...}` (nested braces balanced), or of `\\boxed 5`.

    None when there is none or the last one is unbalanced.
    """
    matches = list(_BOXED.finditer(text))
    for m in reversed(matches):
        if m.group(1) is None:  # "\boxed 5": up to the next whitespace or `$`
            rest = re.match(r"([^\s$]+)", text[m.end() :])
            if rest:
                return rest.group(1).strip()
            continue
        depth, i = 1, m.end()
        for j in range(i, len(text)):
            c = text[j]
            if c == "{" and text[j - 1] != "\\":
                depth += 1
            elif c == "}" and text[j - 1] != "\\":
                depth -= 1
                if depth == 0:
                    return text[i:j].strip()
        # unbalanced: try an earlier one
    return None


def extract_answer_tag(text: str) -> str | None:
    """Content of the last complete `<answer>...</answer>`, or None."""
    tags = _ANSWER_TAG.findall(text)
    return tags[-1].strip() if tags else None


def extract_gsm8k(text: str) -> str | None:
    """The text after the last `####` (GSM8K), or None."""
    found = [s.strip() for s in _GSM8K.findall(text)]
    found = [s for s in found if s]
    return found[-1] if found else None


def extract_answer_phrase(text: str) -> str | None:
    """X from the last "the answer is X" / "final answer: X", trailing period and `$` removed."""
    found = _ANSWER_IS.findall(text)
    if not found:
        return None
    ans = found[-1].strip()
    ans = re.sub(r"[.\s]+$", "", ans)
    ans = ans.strip().strip("$").strip()
    ans = re.sub(r"^\\\(|\\\)$", "", ans).strip()
    return ans or None


def extract_answer(response: str) -> str | None:
    """The answer in a response, or None when there is none (see the module doc for the order)."""
    if not isinstance(response, str):
        response = "" if response is None else str(response)
    tag = extract_answer_tag(response)
    if tag is not None:
        boxed = extract_boxed(tag)
        ans = boxed if boxed is not None else tag
        return ans or None
    for extractor in (extract_boxed, extract_gsm8k, extract_answer_phrase):
        ans = extractor(response)
        if ans:
            return ans
    return None


def normalize_ground_truth(ground_truth: Any) -> str:
    """Ground truth as a bare answer: "...#### 42" -> "42", "\\boxed{x}" -> "x", `$x$` -> "x"."""
    gt = "" if ground_truth is None else str(ground_truth)
    for extractor in (extract_gsm8k, extract_answer_tag, extract_boxed):
        got = extractor(gt)
        if got:
            gt = got
            break
    gt = gt.strip()
    if len(gt) >= 2 and gt.startswith("$") and gt.endswith("$"):
        gt = gt.strip("$").strip()
    return gt


def _choice_letter(text: str) -> str | None:
    """ "B", "(B)", "\\text{B}", "B." -> "B"; also "(B) 12" / "B. 12" (a letter followed by its option)."""
    t = text.strip().strip("$").strip()
    m = _CHOICE.match(t)
    if m:
        return m.group(1)
    m = _CHOICE_IN_TEXT.match(t)
    if m:
        return m.group(1) or m.group(2)
    return None


def prenormalize(text: str) -> str:
    """Rewrites that math-verify does not do itself (see module doc)."""
    t = text.strip()
    t = t.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    if _THOUSANDS.match(t):
        t = t.replace(",", "")
    m = _SCI.match(t)
    if m:
        t = f"{m.group(1)}\\times10^{{{int(m.group(2))}}}"
    return t


_MATH_WORDS = frozenset(
    [
        "sin",
        "cos",
        "tan",
        "cot",
        "sec",
        "csc",
        "arcsin",
        "arccos",
        "arctan",
        "sinh",
        "cosh",
        "tanh",
        "log",
        "ln",
        "exp",
        "sqrt",
        "min",
        "max",
        "gcd",
        "lcm",
        "det",
        "mod",
        "inf",
        "infty",
        "pi",
    ]
)


def is_wordy(text: str) -> bool:
    """True when the text holds an ordinary word (3+ letters, LaTeX commands and math names aside).

    math-verify parses words as products of symbols ("red" -> E*d*r), which is meaningless, so a
    wordy ground truth without digits is left to a string match or the judge fallback.
    """
    t = re.sub(r"\\(?:text|textbf|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}", r" \1 ", text)
    t = re.sub(r"\\[A-Za-z]+", " ", t)
    return any(w.lower() not in _MATH_WORDS for w in re.findall(r"[A-Za-z]{3,}", t))


def _plain(text: str) -> str:
    """Loose string form for a last-resort string comparison of unparseable answers."""
    t = re.sub(r"\\text(?:bf|rm)?\{([^{}]*)\}", r"\1", text)
    t = re.sub(r"\\[,;:! ]|\s+", "", t)
    return t.strip("$.").lower()


# --------------------------------------------------------------------------------------------------
# Format


def check_format(response: str) -> tuple[bool, str]:
    """`<think>...</think>` followed by exactly one answer; returns (ok, reason).

    The response must start with `<think>` (leading whitespace allowed) and contain exactly one
    `<think>` and one `</think>`. After `</think>`: either exactly one `<answer>...</answer>` pair
    (no stray tags, no text after `</answer>`), or, without answer tags, exactly one `\\boxed{}`.
    """
    if not isinstance(response, str):
        return False, "not a string"
    if response.count("<think>") != 1 or response.count("</think>") != 1:
        return False, "think tags not balanced"
    if not response.lstrip().startswith("<think>"):
        return False, "does not start with <think>"
    head, tail = response.split("</think>", 1)
    if "<answer>" in head or "</answer>" in head:
        return False, "answer inside think"
    opens, closes = tail.count("<answer>"), tail.count("</answer>")
    if opens or closes:
        if opens != 1 or closes != 1:
            return False, "answer tags not balanced or more than one answer"
        m = re.fullmatch(r"(.*?)<answer>(.*?)</answer>\s*", tail, re.DOTALL)
        if not m:
            return False, "text after </answer> or tags out of order"
        if not m.group(2).strip():
            return False, "empty answer"
        return True, "ok"
    n_boxed = len(_BOXED.findall(tail))
    if n_boxed == 1 and extract_boxed(tail):
        return True, "ok"
    return False, "no answer after </think>" if n_boxed == 0 else "more than one boxed answer"


def format_score(response: str) -> float:
    return 1.0 if check_format(response)[0] else 0.0


# --------------------------------------------------------------------------------------------------
# Equivalence


def _timeouts(timeout_seconds: int | None) -> int | None:
    if threading.current_thread() is not threading.main_thread():
        return None  # signal.alarm only works in the main thread
    return timeout_seconds


def _failure(e: BaseException) -> str:
    """Kind of a math-verify failure; re-raises interrupts, which are not math-verify's."""
    if isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        raise e
    kind = "timeout" if "timeout" in type(e).__name__.lower() else "error"
    return f"{kind}: {type(e).__name__}"


def parse_math(text: str, timeout_seconds: int | None = 5, wrap: bool = True) -> tuple[list, str]:
    """math-verify parse of a bare answer (as `$text$`, or as-is with wrap=False); never raises.

    Returns (parsed, error).

    `parsed` is what `math_verify.parse` returns (sympy objects, then the raw string); empty on
    failure, with `error` saying why.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    try:
        return (
            parse(
                f"${text}$" if wrap else text,
                extraction_config=config,
                parsing_timeout=_timeouts(timeout_seconds),
                raise_on_error=True,
            ),
            "",
        )
    except BaseException as e:  # math-verify's TimeoutException derives from BaseException
        return [], f"parse {_failure(e)}"


def _has_math(parsed: list) -> bool:
    return any(not isinstance(p, str) for p in parsed)


def is_equivalent(gold: str, answer: str, timeout_seconds: int | None = 5) -> tuple[bool | None, str]:
    """Whether `answer` equals `gold` (both bare answers, not full responses).

    Returns (True/False, reason), or (None, reason) when the rule cannot decide because one side
    could not be parsed -- the case for the judge fallback. Never raises.
    """
    gold_p, answer_p = prenormalize(gold), prenormalize(answer)
    if not gold_p:
        return None, "unparseable gold: empty"
    gold_choice = _choice_letter(gold_p)
    if gold_choice is not None:
        ans_choice = _choice_letter(answer_p)
        if ans_choice is not None:
            same = ans_choice == gold_choice
            return same, f"choice {ans_choice} {'==' if same else '!='} {gold_choice}"
    if _plain(gold_p) == _plain(answer_p):
        return True, "string match"
    if is_wordy(gold_p) and not any(c.isdigit() for c in gold_p):
        # words without numbers ("\\text{Monday}", "no solution"); "12\\text{ inches}" stays a number
        return None, "unparseable gold (words, not mathematics)"
    g, gerr = parse_math(gold_p, timeout_seconds)
    if not _has_math(g):
        return None, f"unparseable gold ({gerr or 'no expression'})"
    a, aerr = parse_math(answer_p, timeout_seconds)
    if not _has_math(a):
        return None, f"unparseable answer ({aerr or 'no expression'})"
    from math_verify import verify

    try:
        same = bool(verify(g, a, timeout_seconds=_timeouts(timeout_seconds), raise_on_error=True))
        if not same and is_wordy(answer_p):
            # "17 apples": let math-verify pick the expression out of the text itself
            a2, _ = parse_math(answer_p, timeout_seconds, wrap=False)
            if _has_math(a2):
                same = bool(verify(g, a2, timeout_seconds=_timeouts(timeout_seconds), raise_on_error=True))
    except BaseException as e:  # math-verify's TimeoutException derives from BaseException
        return False, f"verify {_failure(e)}"
    return same, "equal" if same else "not equal"


# --------------------------------------------------------------------------------------------------
# Batch interface


@dataclass
class MathScore:
    accuracy: float
    format: float
    overall: float
    reason: str
    answer: str | None
    gold: str
    used_fallback: bool = False

    def scores(self) -> dict[str, float]:
        return {"overall": self.overall, "accuracy": self.accuracy, "format": self.format}


def _question(x: dict[str, Any]) -> str:
    for key in ("question", "problem", "prompt"):
        if x.get(key) is not None:
            return str(x[key])
    return ""


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_NUMBER_AS_ANSWER = re.compile(r"\\?\$?\s*[-+]?\d+(?:\.\d+)?\s*(?:[A-Za-z%][^\d=]*)?")
"""A number, perhaps after a currency sign and before its unit (`53`, `$53`, `53 candies`): no operator."""


def is_number_answer(answer: str) -> bool:
    """Whether an extracted answer is a plain number (perhaps with a currency sign or a unit)."""
    return bool(_NUMBER_AS_ANSWER.fullmatch(prenormalize(answer).replace(",", "").strip()))


def score_details(
    reward_inputs: list[dict[str, Any]],
    format_weight: float = 0.1,
    fallback: Fallback | None = None,
    timeout_seconds: int | None = 5,
    max_answer_chars: int = MAX_ANSWER_CHARS,
    numeric_answers: bool = False,
) -> list[MathScore]:
    """Scores with reasons; `compute_score` is this without the reasons. `numeric_answers`: where the
    ground truth is a number, an answer that is not one (an expression equal to it) scores 0."""
    results: list[MathScore] = []
    pending: list[int] = []
    for x in reward_inputs:
        response = x.get("response")
        response = "" if response is None else str(response)
        gold = normalize_ground_truth(x.get("ground_truth"))
        fmt = format_score(response)
        answer = extract_answer(response)
        if answer is None:
            acc, reason = False, "no answer"
        elif len(answer) > max_answer_chars:
            acc, reason = False, f"answer too long ({len(answer)} chars)"
        elif numeric_answers and _NUMBER.fullmatch(prenormalize(gold)) and not is_number_answer(answer):
            acc, reason = False, "not a number (the ground truth is one: numeric_answers)"
        else:
            acc, reason = is_equivalent(gold, answer, timeout_seconds)
        if acc is None:
            pending.append(len(results))
        acc_f = 1.0 if acc else 0.0
        results.append(MathScore(acc_f, fmt, 0.0, reason, answer, gold))
    if fallback is not None and pending:
        queries = [
            (
                _question(reward_inputs[i]),
                results[i].gold,
                str(reward_inputs[i].get("response") or ""),
                reward_inputs[i].get("images") or (),
            )
            for i in pending
        ]
        judged = list(fallback(queries))
        if len(judged) != len(queries):
            raise ValueError(f"math fallback returned {len(judged)} scores for {len(queries)} samples")
        for i, s in zip(pending, judged, strict=True):
            r = results[i]
            r.accuracy = min(1.0, max(0.0, float(s)))
            r.used_fallback = True
            r.reason = f"fallback ({r.reason})"
    for r in results:
        r.overall = (1.0 - format_weight) * r.accuracy + format_weight * r.format
    return results


def compute_score(
    reward_inputs: list[dict[str, Any]],
    format_weight: float = 0.1,
    fallback: Fallback | None = None,
    timeout_seconds: int | None = 5,
    max_answer_chars: int = MAX_ANSWER_CHARS,
) -> list[dict[str, float]]:
    """EasyR1 batch reward: `overall`, `accuracy`, `format` per input (floats only)."""
    details = score_details(reward_inputs, format_weight, fallback, timeout_seconds, max_answer_chars)
    return [d.scores() for d in details]
