"""Finding the tool call in one turn of model text, in the two styles our users' models are trained on.

- `code` (CodeV, PyVision): a Python cell in `<code>```python ... ```</code>`; the fence may be
  missing (`<code>print(1)</code>`), or written ```` ```py ```` / bare ```` ``` ````. It becomes
  `ToolCall("python", {"code": ...})`, so the interpreter must be registered under the name `python`.
- `hermes` (veRL, DeepEyes, Qwen2.5 chat templates): `<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>`; `arguments` may also be a JSON string holding the object (OpenAI's wire format),
  and may be left out for a tool without parameters.

`parse_tool_call` returns the last complete call of the turn, `None` when the turn has no call, or a
`ToolCallError` (malformed JSON, missing name, empty cell, a tag that is never closed) whose message is
meant for the model: the agent loop turns it into an observation, so a malformed call is a mistake
the model can see and learn from, not an exception. An unclosed tag is only reported when the turn
holds no complete call. Generation should stop at `STOP_STRINGS[style]`, so a turn normally ends
with its one call. `has_final_answer` says whether a turn holds `<answer>...</answer>`.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from rlstack.rewards.math import extract_answer_tag
from rlstack.tools.base import ToolCall, ToolError

ToolCallStyle = Literal["code", "hermes"]

STOP_STRINGS: dict[str, tuple[str, ...]] = {"code": ("</code>",), "hermes": ("</tool_call>",)}
"""Per style, the strings at which generation stops so that the tool can answer the call."""

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_HERMES_SHAPE = '{"name": "<tool name>", "arguments": {...}}'


@dataclass(frozen=True)
class ToolCallError:
    """A call the model tried to make but wrote wrong; `message` says what and how to write it."""

    message: str
    raw: str
    """The offending text, tags included."""


def parse_tool_call(text: str, style: ToolCallStyle) -> ToolCall | ToolCallError | None:
    """The last complete call in `text` in `style` (see module docstring), a `ToolCallError`, or None."""
    if style not in _STYLES:
        raise ToolError(f"tool call style {style!r} is not one of {sorted(_STYLES)}")
    open_tag, close_tag, parse_body = _STYLES[style]
    end = text.rfind(close_tag)
    if end == -1:
        start = text.rfind(open_tag)
        if start == -1:
            return None
        return ToolCallError(f"the {open_tag} is never closed; end the call with {close_tag}", text[start:])
    previous_end = text.rfind(close_tag, 0, end)
    search_from = previous_end + len(close_tag) if previous_end != -1 else 0
    # The first opening tag after the previous call, so that a tag inside the body (a string) is body.
    start = text.find(open_tag, search_from, end)
    if start == -1:
        return ToolCallError(
            f"{close_tag} without an opening {open_tag}", text[search_from : end + len(close_tag)]
        )
    raw = text[start : end + len(close_tag)]
    return parse_body(text[start + len(open_tag) : end], raw)


def has_final_answer(text: str) -> bool:
    """Whether `text` holds a complete `<answer>...</answer>` (the agent's final answer)."""
    return extract_answer_tag(text) is not None


def _parse_code(body: str, raw: str) -> ToolCall | ToolCallError:
    fence = _FENCE.search(body)
    code = textwrap.dedent(fence.group(1) if fence else body).strip()
    if not code:
        return ToolCallError("the <code> block holds no code; write <code>```python\n...\n```</code>", raw)
    return ToolCall("python", {"code": code}, raw)


def _parse_hermes(body: str, raw: str) -> ToolCall | ToolCallError:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCallError(
            f"the <tool_call> is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
            f"write {_HERMES_SHAPE}",
            raw,
        )
    if not isinstance(call, dict):
        return ToolCallError(f"the <tool_call> must be a JSON object: {_HERMES_SHAPE}", raw)
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError(f'the <tool_call> has no "name" string: {_HERMES_SHAPE}', raw)
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            return ToolCallError(f'"arguments" of {name!r} is a string but not valid JSON ({e.msg})', raw)
    if not isinstance(arguments, dict):
        return ToolCallError(
            f'"arguments" of {name!r} must be a JSON object, not {type(arguments).__name__}', raw
        )
    return ToolCall(name, arguments, raw)


_STYLES: dict[str, tuple[str, str, Callable[[str, str], ToolCall | ToolCallError]]] = {
    "code": ("<code>", "</code>", _parse_code),
    "hermes": ("<tool_call>", "</tool_call>", _parse_hermes),
}
