"""Tools the agent calls during multi-turn rollouts ("thinking with images").

- `base.py`: the protocol (`Tool`, `ToolCall`, `Observation`) and `fit_image`.
- `parsing.py`: finding the call in a turn (`<code>` or `<tool_call>` style), stop strings, final answers.
- `contract.py`: each system's tool conventions (PyVision, DeepEyes, CodeV): input image names, reply wrapping.
- `registry.py`: tool specs from the config -> `ToolSet` -> one `Toolbox` per trajectory.
- `python.py`: `builtin:python` (+ `python_channel.py`, the trainer's end of the interpreter's pipes;
  `python_packages.py`, where it imports its packages from; `python_worker.py`, which runs inside the sandbox).
- `zoom.py`: `builtin:zoom`, DeepEyes' `image_zoom_in_tool`.
"""

from rlstack.tools.base import Observation, Tool, ToolCall, ToolError, fit_image
from rlstack.tools.parsing import (
    STOP_STRINGS,
    ToolCallError,
    ToolCallStyle,
    has_final_answer,
    parse_tool_call,
)
from rlstack.tools.registry import BUILTINS, Toolbox, ToolConfigError, ToolSet, ToolSpec, build_toolset

__all__ = [
    "BUILTINS",
    "STOP_STRINGS",
    "Observation",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolCallStyle",
    "ToolConfigError",
    "ToolError",
    "ToolSet",
    "ToolSpec",
    "Toolbox",
    "build_toolset",
    "fit_image",
    "has_final_answer",
    "parse_tool_call",
]
