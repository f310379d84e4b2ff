"""Tool contracts: what a checkpoint trained by one system expects of its tools (`worker.rollout.agent.tool_contract`).

A model trained with tools learned more than the tool: the names its programs give the input images,
the tags it writes a call in, and how a reply is wrapped when it comes back. A contract sets the three
together, so that a checkpoint of that system meets, in rlstack's agent loop, what it was trained on.

| contract | calls | input images in `builtin:python` | a tool's reply comes back as |
| --- | --- | --- | --- |
| `rlstack` | `tool_call_format`: code or hermes | `image_1`, `image_2`, ... (files `image_1.png`, ...) | its text then its images: a user turn (code), a tool turn (hermes, which Qwen's template wraps in `<tool_response>`) |
| `pyvision` | code | `image_clue_0`, `image_clue_1`, ... | a user turn `<interpreter>Text Result:\\n{text}\\nImage Result:\\n<image_clue_k><image></image_clue_k>...</interpreter>\\n` |
| `deepeyes` | hermes | rlstack's (DeepEyes has no interpreter) | a user turn `<tool_response><image></tool_response>` and DeepEyes' turn prompt |
| `codev` | code | the files `image_1.png`, ... in the working directory, the first's name in `image_filename` | a user turn `<sandbox_output>{text}\\n<image></sandbox_output>` and CodeV's turn prompt |

PyVision (its RL fork's `agents_x` tools, after its inference engine) numbers every image of a
trajectory: the prompt's are `image_clue_0`, ... and a reply's continue from there (k counts the images
before it); a reply without images has no `Image Result`, and a failed call is
`<interpreter>{text}</interpreter>\\n`. DeepEyes (`visual_toolbox_v2`) sends only the crop: a call that
returned images shows them without the tool's text (rlstack's zoom says which box it cut), one that
returned none (an error) is its text as it is. CodeV (`python_interpreter.py`) puts the printed text
before the images and reports a failure as `<sandbox_output>Error: {error}. You need to fix the bug and
then answer</sandbox_output>`.

Where rlstack departs: PyVision's RL fork sends its replies as an `observation` role, which Qwen's
template has no meaning for; rlstack sends a user turn, as PyVision's inference engine does. CodeV names
the image file as the dataset does and also reads back files whose names a program prints; rlstack's
files are `image_1.png`, ... (the prompt says so: `examples/agents/codev_format.jinja`) and images come
back from `plt.show()`, `Image.show()` and a final expression, as for the other contracts; a run with no
output says `(no output)` where CodeV has a line of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlstack.config.rollout import ToolContractName
from rlstack.models.vision import IMAGE_PLACEHOLDER
from rlstack.tools.base import Observation
from rlstack.tools.parsing import ToolCallStyle

DEEPEYES_TURN_PROMPT = (
    "\nThink first, call **image_zoom_in_tool** if needed, then answer. Format strictly as:  "
    "<think>...</think>  <tool_call>...</tool_call> (if tools needed)  <answer>...</answer> "
)
"""What DeepEyes appends to every question and after every tool response (its `USER_PROMPT_V2`)."""

CODEV_TURN_PROMPT = (
    "Analyze sandbox output to decide whether to answer the question with <answer> </answer> or run "
    "another round of python code with <code> </code>."
)
"""What CodeV appends after a successful run's `<sandbox_output>` (its interpreter's `user_prompt`)."""


@dataclass(frozen=True)
class ToolContract:
    """One system's tool conventions (see module docstring)."""

    name: ToolContractName
    image_prefix: str
    first_image: int
    """Input image i (from 0) is `{image_prefix}{first_image + i}` in the interpreter and as a file (`.png`)."""
    path_variable: str | None
    """A variable of the interpreter that holds the first input image's file name (CodeV's `image_filename`)."""
    render: Callable[[Observation, int, int], str]
    """(observation, its images, the trajectory's images before them) -> the reply turn's text, with one
    `<image>` placeholder per image."""
    role: str | None
    """The reply turn's chat role; None: `tool` for hermes calls, `user` for code (rlstack)."""

    def image_name(self, i: int) -> str:
        """The name of input image `i` (from 0)."""
        return f"{self.image_prefix}{self.first_image + i}"


def _rlstack(observation: Observation, images: int, seen: int) -> str:
    return observation.text + IMAGE_PLACEHOLDER * images


def _pyvision(observation: Observation, images: int, seen: int) -> str:
    if not observation.ok:
        return f"<interpreter>{observation.text}</interpreter>\n"
    if not images:
        return f"<interpreter>Text Result:\n{observation.text}</interpreter>\n"
    shown = "".join(
        f"<image_clue_{k}>{IMAGE_PLACEHOLDER}</image_clue_{k}>" for k in range(seen, seen + images)
    )
    return f"<interpreter>Text Result:\n{observation.text}\nImage Result:\n{shown}</interpreter>\n"


def _deepeyes(observation: Observation, images: int, seen: int) -> str:
    if not images:
        return observation.text
    return f"<tool_response>{IMAGE_PLACEHOLDER * images}</tool_response>{DEEPEYES_TURN_PROMPT}"


def _codev(observation: Observation, images: int, seen: int) -> str:
    if not observation.ok:
        error = observation.error or observation.text
        return f"<sandbox_output>Error: {error}. You need to fix the bug and then answer</sandbox_output>"
    text = observation.text if observation.text.strip() else ""
    body = f"{text}\n" if text and images else text
    return f"<sandbox_output>{body}{IMAGE_PLACEHOLDER * images}</sandbox_output>{CODEV_TURN_PROMPT}"


CONTRACTS: dict[str, ToolContract] = {
    "rlstack": ToolContract("rlstack", "image_", 1, None, _rlstack, None),
    "pyvision": ToolContract("pyvision", "image_clue_", 0, None, _pyvision, "user"),
    "deepeyes": ToolContract("deepeyes", "image_", 1, None, _deepeyes, "user"),
    "codev": ToolContract("codev", "image_", 1, "image_filename", _codev, "user"),
}
"""`worker.rollout.agent.tool_contract` -> its contract (its call format: `config.rollout.CONTRACT_CALL_FORMATS`, beside the key)."""


def reply_role(contract: str, style: ToolCallStyle) -> str:
    """The chat role of a tool's reply under `contract` with calls written in `style`."""
    return CONTRACTS[contract].role or ("tool" if style == "hermes" else "user")
