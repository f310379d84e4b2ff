"""Tool-call parsing, the tool registry, the zoom tool and image fitting (all in-process, fast)."""

from __future__ import annotations

import json
import pickle

import pytest
from PIL import Image

from rlstack.tools import (
    STOP_STRINGS,
    Observation,
    ToolCall,
    ToolCallError,
    ToolConfigError,
    ToolSpec,
    build_toolset,
    fit_image,
    has_final_answer,
    parse_tool_call,
)
from rlstack.tools.base import MAX_PIXELS, MIN_PIXELS, ToolError
from rlstack.tools.zoom import ZoomTool

# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, code",
    [
        ("Let me look.\n<code>\n```python\nprint(image_1.size)\n```\n</code>", "print(image_1.size)"),
        ("<code>print(1)</code>", "print(1)"),
        ("<code>```py\nx = 1\n  # indented comment\n```</code>", "x = 1\n  # indented comment"),
        ("<code>\n    a = 1\n    print(a)\n</code>", "a = 1\nprint(a)"),
        ("<code>```python\nprint(1)</code>", "print(1)"),  # the fence is never closed
        ("<code>print(1)</code> then <code>print(2)</code>", "print(2)"),  # the last call
        ("<code>s = '<code>'\nprint(s)</code>", "s = '<code>'\nprint(s)"),  # a tag inside the code
        ("<code>print(1)</code> and then <code>print(2)", "print(1)"),  # last COMPLETE call
    ],
)
def test_code_style(text, code):
    call = parse_tool_call(text, "code")
    assert isinstance(call, ToolCall)
    assert (call.name, call.arguments) == ("python", {"code": code})
    assert call.raw.startswith("<code>") and call.raw.endswith("</code>")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("<code>\n```python\n```\n</code>", "holds no code"),
        ("<code>   </code>", "holds no code"),
        ("I will run <code>print(1)", "never closed"),
        ("print(1)</code>", "without an opening"),
    ],
)
def test_code_style_errors(text, fragment):
    err = parse_tool_call(text, "code")
    assert isinstance(err, ToolCallError) and fragment in err.message, err


def test_no_call():
    assert parse_tool_call("The answer is <answer>4</answer>", "code") is None
    assert parse_tool_call("no tools here", "hermes") is None


@pytest.mark.parametrize(
    "body, name, arguments",
    [
        (
            '{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2, 3, 4]}}',
            "image_zoom_in_tool",
            {"bbox_2d": [1, 2, 3, 4]},
        ),
        ('{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}', "python", {"code": "print(1)"}),
        ('\n{"name": "noargs"}\n', "noargs", {}),
    ],
)
def test_hermes_style(body, name, arguments):
    text = f"thinking...\n<tool_call>{body}</tool_call>"
    call = parse_tool_call(text, "hermes")
    assert isinstance(call, ToolCall)
    assert (call.name, call.arguments) == (name, arguments)
    assert call.raw == f"<tool_call>{body}</tool_call>"


def test_hermes_last_call_wins():
    text = '<tool_call>{"name": "a"}</tool_call> text <tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>'
    call = parse_tool_call(text, "hermes")
    assert isinstance(call, ToolCall) and call.name == "b" and call.arguments == {"x": 1}


@pytest.mark.parametrize(
    "body, fragment",
    [
        ('{"name": "a", "arguments": {"x": 1}', "not valid JSON"),
        ("", "not valid JSON"),
        ('["a"]', "must be a JSON object"),
        ('{"arguments": {}}', 'no "name"'),
        ('{"name": "", "arguments": {}}', 'no "name"'),
        ('{"name": "a", "arguments": "{oops"}', "string but not valid JSON"),
        ('{"name": "a", "arguments": [1, 2]}', "must be a JSON object"),
    ],
)
def test_hermes_errors(body, fragment):
    err = parse_tool_call(f"<tool_call>{body}</tool_call>", "hermes")
    assert isinstance(err, ToolCallError) and fragment in err.message, err
    assert err.raw == f"<tool_call>{body}</tool_call>"
    unclosed = parse_tool_call('<tool_call>{"name": "a"', "hermes")
    assert isinstance(unclosed, ToolCallError) and "never closed" in unclosed.message


def test_stop_strings_answer_and_unknown_style():
    assert STOP_STRINGS == {"code": ("</code>",), "hermes": ("</tool_call>",)}
    assert has_final_answer("so <answer>42</answer>")
    assert not has_final_answer("<answer>42") and not has_final_answer("42")
    with pytest.raises(ToolError, match="'xml' is not one of"):
        parse_tool_call("x", "xml")


# ---------------------------------------------------------------- registry

USER_TOOL = """
class Echo:
    name = "echo"
    schema = {"type": "function", "function": {"name": "echo", "description": "Echo.",
              "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}

    def __init__(self, prefix: str = ""):
        if prefix == "bad":
            raise ValueError("prefix must not be 'bad'")
        self.prefix = prefix
        self.closed = False

    def reset(self, images, extra):
        self.seen = (len(images), dict(extra))

    def execute(self, call):
        from rlstack.tools import Observation
        if call.arguments.get("boom"):
            raise RuntimeError("kaboom")
        return Observation(self.prefix + call.arguments["text"] + f" {self.seen}")

    def close(self):
        self.closed = True


class NoExecute:
    name = "x"
    schema = Echo.schema
    def reset(self, images, extra): ...
    def close(self): ...


class NoName:
    schema = Echo.schema
    def reset(self, images, extra): ...
    def execute(self, call): ...
    def close(self): ...
"""


@pytest.fixture
def user_tools(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text(USER_TOOL)
    return str(path)


def test_toolset_from_dicts_and_prompt(user_tools):
    toolset = build_toolset(
        [
            {"import_path": "builtin:zoom"},
            {"import_path": f"{user_tools}:Echo", "name": "say", "kwargs": {"prefix": ">"}},
        ]
    )
    assert toolset.names == ["image_zoom_in_tool", "say"]
    assert [s["function"]["name"] for s in toolset.schemas] == toolset.names
    prompt = toolset.hermes_tools_prompt()
    assert prompt.startswith("# Tools\n") and "<tools>\n" in prompt and "\n</tools>" in prompt
    lines = prompt.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line)["function"]["name"] for line in lines] == ["image_zoom_in_tool", "say"]
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in prompt

    image = Image.new("RGB", (64, 64))
    with toolset.new([image], {"k": 1}) as box:
        obs = box.call(ToolCall("say", {"text": "hi"}, ""))
        assert (obs.ok, obs.text) == (True, ">hi (1, {'k': 1})")
        other = toolset.new([], {})
        assert other.tools["say"] is not box.tools["say"]  # one instance per trajectory
        assert other.call(ToolCall("say", {"text": "x"}, "")).text == ">x (0, {})"
        echo = box.tools["say"]
    assert echo.closed

    restored = pickle.loads(pickle.dumps(toolset))
    assert restored.names == toolset.names and restored.schemas == toolset.schemas
    assert build_toolset([]).hermes_tools_prompt() == ""


def test_toolbox_never_raises(user_tools):
    box = build_toolset([ToolSpec(f"{user_tools}:Echo")]).new([], {})
    unknown = box.call(ToolCall("nope", {}, ""))
    assert not unknown.ok and "no tool 'nope'" in unknown.text and "['echo']" in unknown.text
    raised = box.call(ToolCall("echo", {"boom": True}, ""))
    assert not raised.ok and "RuntimeError: kaboom" in raised.error
    bad = box.call(ToolCallError("the <tool_call> is not valid JSON", "<tool_call>{</tool_call>"))
    assert (bad.ok, bad.text) == (False, "Error: the <tool_call> is not valid JSON")
    box.close()


@pytest.mark.parametrize(
    "spec, fragments",
    [
        ({"import_path": "builtin:shell"}, ["tools[0]", "no built-in tool 'shell'", "builtin:python"]),
        ({"import_path": "no_such_pkg.mod:Tool"}, ["cannot import module 'no_such_pkg.mod'"]),
        ({"import_path": "missing/file.py:Tool"}, ["file 'missing/file.py' does not exist"]),
        ({"import_path": "rlstack.tools.zoom"}, ["import_path must be builtin:<name>"]),
        ({"import_path": "rlstack.tools.zoom:Zoom"}, ["has no class 'Zoom'", "ZoomTool"]),
        ({"import_path": "builtin:zoom", "kwarg": {}}, ["unknown key 'kwarg'", "did you mean 'kwargs'"]),
        ({"name": "x"}, ["'import_path' is required"]),
        ({"import_path": "builtin:zoom", "kwargs": {"max_pixel": 10}}, ["do not fit ZoomTool", "max_pixel"]),
        (
            {"import_path": "builtin:zoom", "kwargs": {"max_pixels": 10}},
            ["building ZoomTool", "min_pixels <= max_pixels"],
        ),
        ({"import_path": "builtin:zoom", "schema": {"name": "z"}}, ["must be an OpenAI function schema"]),
        (
            {
                "import_path": "builtin:zoom",
                "schema": {**ZoomTool.schema, "function": {"name": "other", "parameters": {}}},
            },
            ["names the function 'other'", "'image_zoom_in_tool'"],
        ),
    ],
)
def test_registry_errors(spec, fragments):
    with pytest.raises(ToolConfigError) as info:
        build_toolset([spec])
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_registry_reads_config_containers():
    from omegaconf import OmegaConf

    specs = OmegaConf.create(
        [{"import_path": "builtin:zoom", "name": "zoom", "kwargs": {"max_pixels": 200_000}}]
    )
    toolset = build_toolset(specs, key="worker.rollout.agent.tools")
    assert toolset.names == ["zoom"] and toolset.schemas[0]["function"]["name"] == "zoom"
    assert toolset.new([], {}).tools["zoom"].max_pixels == 200_000
    with pytest.raises(ToolConfigError, match=r"^worker\.rollout\.agent\.tools\[0\] \(builtin:nope\)"):
        build_toolset([{"import_path": "builtin:nope"}], key="worker.rollout.agent.tools")


def test_registry_protocol_errors(user_tools, tmp_path):
    with pytest.raises(ToolConfigError, match=r"tools\[1\].*lacks method\(s\) \['execute'\]"):
        build_toolset([{"import_path": "builtin:zoom"}, {"import_path": f"{user_tools}:NoExecute"}])
    with pytest.raises(ToolConfigError, match="no class attribute 'name'"):
        build_toolset([{"import_path": f"{user_tools}:NoName"}])
    assert build_toolset([{"import_path": f"{user_tools}:NoName", "name": "n"}]).names == ["n"]
    with pytest.raises(ToolConfigError, match="prefix must not be 'bad'"):
        build_toolset([{"import_path": f"{user_tools}:Echo", "kwargs": {"prefix": "bad"}}])
    with pytest.raises(ToolConfigError, match=r"tools\[1\] and tools\[0\] are both named 'echo'"):
        build_toolset([{"import_path": f"{user_tools}:Echo"}, {"import_path": f"{user_tools}:Echo"}])
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_xyz\n")
    with pytest.raises(ToolConfigError, match="importing .*broken.py.* failed: ModuleNotFoundError"):
        build_toolset([{"import_path": f"{broken}:Tool"}])


def test_the_agents_tool_contract_reaches_the_tools_that_take_one(user_tools):
    """`worker.rollout.agent.tool_contract` is handed to every tool whose constructor has `contract`
    (`builtin:python` names the input images by it), survives pickling, and is not a tool's kwarg."""
    specs = [{"import_path": "builtin:python"}, {"import_path": f"{user_tools}:Echo"}]
    toolset = build_toolset(specs, contract="pyvision")
    box = toolset.new([], {})
    assert box.tools["python"].contract.image_name(0) == "image_clue_0"
    box.close()
    restored = pickle.loads(pickle.dumps(toolset))
    assert (
        restored.contract == "pyvision" and restored.new([], {}).tools["python"].contract.name == "pyvision"
    )
    assert build_toolset(specs[:1]).new([], {}).tools["python"].contract.name == "rlstack"
    with pytest.raises(ToolConfigError, match="'contract' is worker.rollout.agent.tool_contract's to set"):
        build_toolset([{"import_path": "builtin:python", "kwargs": {"contract": "codev"}}])
    with pytest.raises(ToolConfigError, match="contract='nope' is not one of"):
        build_toolset(specs[:1], contract="nope")


# ---------------------------------------------------------------- zoom


def _zoom(args, images=None):
    tool = ZoomTool()
    tool.reset(images if images is not None else [_grid()], {})
    return tool.execute(ToolCall("image_zoom_in_tool", args, ""))


def _grid() -> Image.Image:
    """400x300, left half red, right half blue."""
    img = Image.new("RGB", (400, 300), "red")
    img.paste((0, 0, 255), (200, 0, 400, 300))
    return img


def test_zoom_crops_and_enlarges():
    obs = _zoom({"bbox_2d": [210, 10, 250, 40], "label": "sky"})
    assert obs.ok and len(obs.images) == 1
    crop = obs.images[0]
    assert crop.width * crop.height >= MIN_PIXELS and crop.width % 28 == 0 and crop.height % 28 == 0
    assert crop.getpixel((crop.width // 2, crop.height // 2)) == (0, 0, 255)
    assert "[210, 10, 250, 40]" in obs.text and "(sky)" in obs.text and "40x30" in obs.text

    second = Image.new("RGB", (100, 100), "green")
    obs = _zoom({"bbox_2d": [0, 0, 10, 10], "image_index": 2}, [_grid(), second])
    assert obs.ok and obs.images[0].getpixel((5, 5)) == (0, 128, 0)


def test_zoom_clamps_partly_outside_box():
    obs = _zoom({"bbox_2d": [-50, 250, 100.5, 900]})
    assert obs.ok and "clamped to the 400x300 image" in obs.text and "[0, 250, 101, 300]" in obs.text


@pytest.mark.parametrize(
    "args, fragment",
    [
        ({}, "bbox_2d is required"),
        ({"bbox_2d": [1, 2, 3]}, "four numbers"),
        ({"bbox_2d": "0,0,10,10"}, "four numbers"),
        ({"bbox_2d": [0, 0, True, 10]}, "four numbers"),
        ({"bbox_2d": [0, 0, float("nan"), 10]}, "four numbers"),
        ({"bbox_2d": [50, 10, 20, 40]}, "need x1 < x2 and y1 < y2"),
        ({"bbox_2d": [500, 400, 600, 500]}, "outside the 400x300 image"),
        ({"bbox_2d": [0, 0, 10, 10], "image_index": 2}, "from 1 to 1"),
        ({"bbox_2d": [0, 0, 10, 10], "image_index": 0}, "from 1 to 1"),
        ({"bbox_2d": [0, 0, 10, 10], "label": 3}, "label must be a string"),
        ({"bbox_2d": [0, 0, 10, 10], "zoom": 2}, "unknown argument(s) ['zoom']"),
    ],
)
def test_zoom_bad_arguments(args, fragment):
    obs = _zoom(args)
    assert not obs.ok and not obs.images and fragment in obs.error, obs
    assert obs.text.startswith("Error: ")


def test_zoom_without_images():
    obs = _zoom({"bbox_2d": [0, 0, 10, 10]}, images=[])
    assert not obs.ok and "no input image" in obs.error


# ---------------------------------------------------------------- fit_image


@pytest.mark.parametrize(
    "size", [(10, 10), (100, 50), (640, 480), (4000, 3000), (1, 5000), (30000, 2), (28, 28)]
)
def test_fit_image_bounds(size):
    out = fit_image(Image.new("L", size), MIN_PIXELS, MAX_PIXELS)
    w, h = out.size
    assert out.mode == "RGB" and w % 28 == 0 and h % 28 == 0
    assert MIN_PIXELS <= w * h <= MAX_PIXELS, (size, out.size)


def test_fit_image_keeps_fitting_images():
    img = Image.new("RGB", (280, 140))
    assert fit_image(img, MIN_PIXELS, MAX_PIXELS).size == (280, 140)
    assert isinstance(Observation("x").images, list)
