"""Tool contracts (`rlstack/tools/contract.py`), each checked against the text of the system it comes
from, and the prompts in examples/agents/ checked against their contract.

The seed documents name where each system keeps these conventions rather than spelling them out:
seeds/pyvision-rl-training.md points at `./verl_agents/verl/workers/agent/envs/agents_x` (the agent
code) and at DeepEyes (`https://github.com/Visual-Agent/DeepEyes`, whose lineage it follows);
seeds/codev-rl-stack.md at `rl/verl/workers/agent/envs/python_interpreter/python_interpreter.py` and
`scripts/sys_prompt.txt`. The strings below are quoted from those files, each with its file named.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest
from PIL import Image

from rlstack.config import AgentConfig
from rlstack.config.rollout import CONTRACT_CALL_FORMATS, ToolContractName
from rlstack.data.dataset import _load_template, _messages
from rlstack.tools.base import Observation, failed
from rlstack.tools.contract import CONTRACTS, reply_role
from rlstack.tools.parsing import STOP_STRINGS, parse_tool_call

AGENTS = Path(__file__).resolve().parents[2] / "examples" / "agents"
IMAGE = Image.new("RGB", (56, 56), "red")

# ------------------------------------------------------------------------------------------ PyVision
# seeds/pyvision-rl-training.md: "Where is the agent inference code? ./verl_agents/verl/workers/agent/envs/agents_x"
# -> agents_x/safe_persis_python_exe_tool_w_image_hint.py (agents-x-project/PyVision-RL):
PYVISION_IMAGE_VARIABLE = 'image_var_dict[f"image_clue_{i}"] = img'
PYVISION_CODE = r"<code>\s*```python\s*(.*?)\s*```\s*</code>"
PYVISION_ANSWER = r"<answer>(.*?)</answer>"
PYVISION_PREFIX = ["<interpreter>", "Text Result:\n{obs_content}\n", "Image Result:\n"]
PYVISION_IMAGE = ["<image_clue_{image_clue_idx}>", "<image>", "</image_clue_{image_clue_idx}>"]
PYVISION_SUFFIX = "</interpreter>\n"
PYVISION_TEXT_ONLY = "<interpreter>Text Result:\n{obs_content}</interpreter>\n"
PYVISION_ERROR = "<interpreter>{error_msg}</interpreter>\n"
# and PyVision's inference engine (agents-x-project/PyVision, inference_engine/vis_inference_demo_gpt.py)
# numbers a reply's images on from the inputs:
PYVISION_FIRST_REPLY_IMAGE = "image_clue_idx = len(image_path_list)"


def test_pyvision_contract_matches_its_seed():
    c = CONTRACTS["pyvision"]
    assert "image_clue_{i}" in PYVISION_IMAGE_VARIABLE
    assert [c.image_name(i) for i in range(3)] == [f"image_clue_{i}" for i in range(3)]
    assert c.path_variable is None
    # a call: PyVision's regex and rlstack's parser read the same program; generation stops at </code>
    action = "<think>Look closer.</think>\n<code>\n```python\nprint(image_clue_0.size)\n```\n</code>"
    (code,) = re.findall(PYVISION_CODE, action, re.DOTALL)
    assert CONTRACT_CALL_FORMATS["pyvision"] == "code" and STOP_STRINGS["code"] == ("</code>",)
    assert parse_tool_call(action, "code").arguments["code"] == code
    assert re.findall(PYVISION_ANSWER, "<answer>\\boxed{3}</answer>") == ["\\boxed{3}"]
    # replies: one input image (image_clue_0) seen, so the first image shown is image_clue_1
    assert "len(image_path_list)" in PYVISION_FIRST_REPLY_IMAGE
    obs_content = "(64, 48)"
    shown = "".join("".join(PYVISION_IMAGE).format(image_clue_idx=k) for k in (1, 2))
    expected = "".join(PYVISION_PREFIX).format(obs_content=obs_content) + shown + PYVISION_SUFFIX
    assert c.render(Observation(obs_content, [IMAGE, IMAGE]), 2, 1) == expected
    assert c.render(Observation(obs_content), 0, 1) == PYVISION_TEXT_ONLY.format(obs_content=obs_content)
    error = failed(
        "ZeroDivisionError: division by zero", "Traceback ...\nZeroDivisionError: division by zero"
    )
    assert c.render(error, 0, 1) == PYVISION_ERROR.format(error_msg=error.text)
    assert reply_role("pyvision", "code") == "user"  # as its inference engine ("role": "user")


# ------------------------------------------------------------------------------------------ DeepEyes
# seeds/pyvision-rl-training.md: "see https://github.com/Visual-Agent/DeepEyes" (the DeepEyes lineage)
# -> verl/workers/agent/envs/mm_process_engine/visual_toolbox_v2.py and prompt.py (PROMPT.USER_PROMPT_V2):
DEEPEYES_CALL = r"<tool_call>(.*?)</tool_call>"
DEEPEYES_REPLY = '"<tool_response>" +"<image>"  + "</tool_response>" + self.user_prompt'
DEEPEYES_USER_PROMPT_V2 = (
    "\nThink first, call **image_zoom_in_tool** if needed, then answer. Format strictly as:  "
    "<think>...</think>  <tool_call>...</tool_call> (if tools needed)  <answer>...</answer> "
)
DEEPEYES_ERROR = 'f"Error: {str(e)}"'
DEEPEYES_EXAMPLE = '{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [10, 20, 100, 200], "label": "the apple on the desk"}}'


def test_deepeyes_contract_matches_its_seed():
    c = CONTRACTS["deepeyes"]
    assert CONTRACT_CALL_FORMATS["deepeyes"] == "hermes" and STOP_STRINGS["hermes"] == ("</tool_call>",)
    action = f"<think>Small text.</think>\n<tool_call>\n{DEEPEYES_EXAMPLE}\n</tool_call>"
    (body,) = re.findall(DEEPEYES_CALL, action, re.DOTALL)
    call = parse_tool_call(action, "hermes")
    assert body.strip() == DEEPEYES_EXAMPLE and call.name == "image_zoom_in_tool"
    assert call.arguments == {"bbox_2d": [10, 20, 100, 200], "label": "the apple on the desk"}
    # the reply is the crop alone inside <tool_response>, then the turn prompt; an error is its text
    reply = "<tool_response>" + "<image>" + "</tool_response>" + DEEPEYES_USER_PROMPT_V2
    assert '"<tool_response>"' in DEEPEYES_REPLY and "self.user_prompt" in DEEPEYES_REPLY
    assert c.render(Observation("Zoomed in on [10, 20, 100, 200]", [IMAGE]), 1, 1) == reply
    assert "Error: {str(e)}" in DEEPEYES_ERROR
    assert c.render(failed("bbox_2d is required"), 0, 1) == "Error: bbox_2d is required"
    assert reply_role("deepeyes", "hermes") == "user"  # "<|im_start|>user\n" + "<tool_response>" ...


# --------------------------------------------------------------------------------------------- CodeV
# seeds/codev-rl-stack.md: "Python sandbox design can be found here:
# (`rl/verl/workers/agent/envs/python_interpreter/python_interpreter.py`)" and "`scripts/sys_prompt.txt`":
CODEV_TAGS = (
    'code_start = "<code>"',
    'code_end = "</code>"',
    'answer_start = "<answer>"',
    'answer_end = "</answer>"',
)
CODEV_USER_PROMPT = (
    "Analyze sandbox output to decide whether to answer the question with <answer> </answer> or run another "
    "round of python code with <code> </code>."
)
CODEV_WITH_IMAGES = '"<sandbox_output>" + (f"{filtered_output}\\n" if filtered_output.strip() else "") + image_placeholders + "</sandbox_output>" + self.user_prompt'
CODEV_TEXT_ONLY = '"<sandbox_output>" + f"{output_text}" + "</sandbox_output>" + self.user_prompt'
CODEV_ERROR = "<sandbox_output>Error: {error_msg}. You need to fix the bug and then answer</sandbox_output>"
CODEV_IMAGE_VARIABLE = 'image_filename = "{self.image_filename}"'
CODEV_SYS_PROMPT_BLOCK = "<code>\n```python\n# your python code here\n```\n</code>"


def test_codev_contract_matches_its_seed():
    c = CONTRACTS["codev"]
    assert all(tag in "".join(CODEV_TAGS) for tag in ("<code>", "</code>", "<answer>", "</answer>"))
    assert CONTRACT_CALL_FORMATS["codev"] == "code"
    program = "from PIL import Image\nImage.open(image_filename).crop((0, 0, 10, 10)).show()"
    action = CODEV_SYS_PROMPT_BLOCK.replace("# your python code here", program)
    codev_code = (
        action.removeprefix("<code>").removesuffix("</code>").replace("```python", "").replace("```", "")
    )
    assert parse_tool_call(action, "code").arguments["code"] == codev_code.strip()
    # the image's file name is a variable of the sandbox
    assert CODEV_IMAGE_VARIABLE.startswith(f"{c.path_variable} = ")
    assert c.image_name(0) == "image_1"  # its file: image_1.png, which codev_format.jinja names
    # replies
    assert "filtered_output" in CODEV_WITH_IMAGES and "self.user_prompt" in CODEV_TEXT_ONLY
    with_images = "<sandbox_output>" + "(64, 48)\n" + "<image>" + "</sandbox_output>" + CODEV_USER_PROMPT
    assert c.render(Observation("(64, 48)", [IMAGE]), 1, 1) == with_images
    only_images = "<sandbox_output>" + "<image><image>" + "</sandbox_output>" + CODEV_USER_PROMPT
    assert c.render(Observation("", [IMAGE, IMAGE]), 2, 1) == only_images
    text_only = "<sandbox_output>" + "(64, 48)" + "</sandbox_output>" + CODEV_USER_PROMPT
    assert c.render(Observation("(64, 48)"), 0, 1) == text_only
    error = failed("NameError: name 'img' is not defined", "Traceback ...")
    assert c.render(error, 0, 1) == CODEV_ERROR.format(error_msg=error.error)
    assert reply_role("codev", "code") == "user"


def test_rlstack_contract_is_todays_behaviour():
    assert sorted(CONTRACTS) == sorted(CONTRACT_CALL_FORMATS) == sorted(get_args(ToolContractName))
    c = CONTRACTS["rlstack"]
    assert [c.image_name(i) for i in range(2)] == ["image_1", "image_2"] and c.path_variable is None
    assert c.render(Observation("printed", [IMAGE, IMAGE]), 2, 1) == "printed<image><image>"
    assert c.render(failed("boom"), 0, 1) == "Error: boom"
    assert reply_role("rlstack", "code") == "user" and reply_role("rlstack", "hermes") == "tool"
    assert (
        AgentConfig().call_format == "code" and AgentConfig(tool_call_format="hermes").call_format == "hermes"
    )
    assert [AgentConfig(tool_contract=n).call_format for n in ("pyvision", "deepeyes", "codev")] == [
        "code",
        "hermes",
        "code",
    ]


# ----------------------------------------------------------------------------- examples/agents/ prompts

PROMPTS = {
    "code_format.jinja": "rlstack",
    "pyvision_system.txt": "pyvision",
    "pyvision_format.jinja": "pyvision",
    "codev_system.txt": "codev",
    "codev_format.jinja": "codev",
    "zoom_hermes_system.txt": "deepeyes",
    "zoom_format.jinja": "deepeyes",
}
"""Each prompt file -> the tool contract it is written for (the README's table says the same)."""

CALL_TAGS = {"code": ("<code>```python", "```</code>"), "hermes": ("<tool_call>", "</tool_call>")}


def _names(contract: str) -> set[str]:
    """What a program under `contract` calls the first input image (none without an interpreter)."""
    c = CONTRACTS[contract]
    if AgentConfig(tool_contract=c.name).call_format != "code":
        return set()
    return {c.image_name(0)} | ({c.path_variable} if c.path_variable else set())


def _reply_tags(contract: str) -> set[str]:
    """The tags a reply under `contract` is wrapped in (none for rlstack's)."""
    wrapper = re.match(r"<([a-z_]+)>", CONTRACTS[contract].render(Observation("x", [IMAGE]), 1, 1))
    return {f"<{wrapper[1]}>", f"</{wrapper[1]}>"} if wrapper else set()


@pytest.mark.parametrize(("name", "contract"), sorted(PROMPTS.items()))
def test_each_example_prompt_uses_its_contracts_names_and_tags(name, contract):
    text = (AGENTS / name).read_text()
    style = AgentConfig(tool_contract=contract).call_format
    assert all(tag in text for tag in CALL_TAGS[style]), (name, CALL_TAGS[style])
    other = next(s for s in CALL_TAGS if s != style)
    assert not any(tag in text for tag in CALL_TAGS[other]), (name, CALL_TAGS[other])
    assert "<answer>" in text and "</answer>" in text
    words = set(re.findall(r"\b\w+\b", text))
    assert _names(contract) <= words, (name, _names(contract) - words)
    others = {n for c in CONTRACTS for n in _names(c)} - _names(contract)
    assert not others & words, (name, others & words)
    foreign = {t for c in CONTRACTS if c != contract for t in _reply_tags(c)}
    assert not {t for t in foreign if t in text}, name
    if name.endswith("_system.txt"):  # the system prompt says how replies come back
        assert all(tag in text for tag in _reply_tags(contract)), (name, _reply_tags(contract))


def test_every_example_prompt_has_a_contract_and_the_readme_says_which():
    assert sorted(p.name for p in AGENTS.iterdir() if p.name != "README.md") == sorted(PROMPTS)
    rows = dict(
        re.findall(r"^\| `([\w.]+)` \|.*\| `(\w+)`[^|]*\|$", (AGENTS / "README.md").read_text(), re.M)
    )
    assert rows == PROMPTS


def test_pyvision_format_tags_each_question_image_as_pyvision_does():
    # PyVision's inference engine wraps input image i as f"<image_clue_{i}>", the image, f"</image_clue_{i}>"
    template = _load_template(str(AGENTS / "pyvision_format.jinja"))
    (message,) = _messages("<image>Which is larger, this or <image>?", {}, template, "row", "t", [])
    assert message["content"].startswith(
        "<image_clue_0><image></image_clue_0>Which is larger, this or <image_clue_1><image></image_clue_1>?"
    )
