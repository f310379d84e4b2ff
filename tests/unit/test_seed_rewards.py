"""`builtin:pyvision` and `builtin:codev` score as their systems' own reward code does.

Each table is a set of trajectories and the score the upstream rule gives them, worked out by hand from
that rule (written above each table), not from rlstack's code. The judge is a fake that answers with reply
texts, read by the parser the reward sends with its requests, so the tables pin how a reply is read too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image
from scored_batches import make_batch

from rlstack.config import ConfigError, RewardConfig, load_config
from rlstack.config.reward import CODEV_RUBRICS
from rlstack.rewards import codev, pyvision
from rlstack.rewards.manager import RewardManager

ROOT = Path(__file__).parents[2]


class FakeJudge:
    """`RewardManager.ask_judge` stand-in: `replies[(template name, question)]` is the judge's reply text, read
    by the template the reward sent; every call is kept."""

    def __init__(self, replies: dict[tuple[str, str], str]):
        self.replies = replies
        self.calls: list[tuple[str, bool | None, list[tuple]]] = []

    def __call__(self, queries, template=None, send_images=None):
        self.calls.append((template.name, send_images, list(queries)))
        return [template.parse(self.replies[template.name, q[0]])[1] for q in queries]

    def asked(self, name: str) -> list[str]:
        """The questions sent with template `name`, in order."""
        return [q[0] for n, _, queries in self.calls if n == name for q in queries]


def boxed(answer: str) -> str:
    return f"<answer>\n\\boxed{{{answer}}}\n</answer>"


CELL = {
    "role": "assistant",
    "text": "<think>zoom</think><code>```python\nprint(image_clue_0.size)\n```</code>",
    "tool_call": {"name": "python", "arguments": {"code": "print(image_clue_0.size)"}},
}
BAD_CELL = {"role": "assistant", "text": "<code>print(</code>", "tool_call": {"error": "no Python cell"}}
LAST = {"role": "assistant", "text": "the answer"}


def reply(ok: bool) -> dict:
    return {"role": "tool", "text": "(224, 224)" if ok else "Traceback ...", "ok": ok, "images": []}


# ----------------------------------------------------------------------------------------------- PyVision

# PyVision-RL 2c04517, vl_agent.py compute_score: answer = the first `<answer>\n\boxed{X}\n</answer>`, X
# stripped; none, or X holding <interpreter>, <answer> or \boxed: score 0, judge not asked. Else the judge:
# after the last "Judgement:", 1 if "1" is in the rest, else 0; without the label, 1 only for a reply that is
# "1". len(X) >= 1000: accuracy 0. naive.py then adds the tool env's rewards where the verdict was 1: 0.1 per
# action whose code the tool ran (safe_persis_python_exe_tool.py, errors included), 0 for one without code.
PYVISION = [
    # id, response, turns, the judge's reply (None: not asked), overall
    ("right, two cells (one raised)", "<think>ok</think>" + boxed("3"), [CELL, reply(True), CELL, reply(False), LAST], "Judgement: 1", 1.0 + 0.1 * 2),
    ("right, no tool", boxed("3"), [], "1", 1.0),
    ("right, a call that did not parse earns nothing", boxed("3"), [BAD_CELL, reply(False), CELL, reply(True), LAST], "Judgement: 1", 1.0 + 0.1),
    ("wrong, with a cell: no tool reward", boxed("5"), [CELL, reply(True), LAST], "Judgement: 0", 0.0),
    ("an answer without the box: 0, not asked", "<answer>3</answer>", [CELL, reply(True), LAST], None, 0.0),
    ("a box without its newlines: 0, not asked", "<answer>\\boxed{3}</answer>", [], None, 0.0),
    ("no answer at all", "<think>hmm</think> it is 3", [CELL, reply(True), LAST], None, 0.0),
    ("a tag inside the box", "<answer>\n\\boxed{<interpreter>3}\n</answer>", [], None, 0.0),
    ("a box inside the box", "<answer>\n\\boxed{\\boxed{3}}\n</answer>", [], None, 0.0),
    ("a 1 anywhere after the label", boxed("3"), [], "Judgement: yes (1)", 1.0),
    ("the last label counts", boxed("3"), [], "Judgement: 1? No. Judgement: 0", 0.0),
    ("a reply without a verdict is 0", boxed("3"), [CELL, reply(True), LAST], "consistent", 0.0),
    ("a bare 1 with spaces", boxed("3"), [], " 1\n", 1.0),
    ("a long answer judged right: only the tool reward", boxed("3" * 1000), [CELL, reply(True), LAST], "Judgement: 1", 0.1),
    ("the first boxed answer is the one judged", boxed("5") + "\n" + boxed("3"), [], "Judgement: 0", 0.0),
]  # fmt: skip


def test_pyvision_scores_as_its_rl_fork():
    rows = [
        {"response": r, "ground_truth": "3", "question": name, "turns": turns}
        for name, r, turns, _, _ in PYVISION
    ]
    judge = FakeJudge({("pyvision", name): text for name, _, _, text, _ in PYVISION if text is not None})
    out = pyvision.compute_score(rows, judge=judge)
    assert {name: o["overall"] for (name, *_), o in zip(PYVISION, out)} == pytest.approx(
        {name: want for name, *_, want in PYVISION}
    )
    assert judge.asked("pyvision") == [name for name, _, _, text, _ in PYVISION if text is not None]
    assert [(name, send) for name, send, _ in judge.calls] == [("pyvision", False)]  # one batch, no images
    first = judge.calls[0][2][0]
    assert first == ("right, two cells (one raised)", "3", "3")  # (question, ground truth, the boxed answer)
    assert ("the first boxed answer is the one judged", "3", "5") in judge.calls[0][2]
    long = out[[p[0] for p in PYVISION].index("a long answer judged right: only the tool reward")]
    assert (long["accuracy"], long["tool"]) == (0.0, pytest.approx(0.1))


def test_pyvisions_judge_prompt_ends_with_the_item_to_complete():
    system, user = pyvision.JUDGE.prompt("Is the car red?", "The car is red.", "red")
    assert system == {"role": "system", "content": "You are a helpful assistant."}
    assert user["content"].endswith(
        "Question: Is the car red?\nStandard answer: The car is red.\nModel answer: red\nJudgement:"
    )
    assert user["content"].count("Judgement: 1") >= 3 and "Judgement: 0" in user["content"]  # few-shot


def test_the_pyvision_prompts_ask_for_the_form_its_reward_reads():
    from rlstack.data.dataset import _load_template, _messages

    template = _load_template(str(ROOT / "examples/agents/pyvision_format.jinja"))
    (message,) = _messages("<image>What digit is in the box?", {}, template, "row", "t", [])
    assert pyvision.extract_answer(message["content"]) == "the answer"
    system = (ROOT / "examples/agents/pyvision_system.txt").read_text()
    assert pyvision.extract_answer(system) == "the answer"


# ----------------------------------------------------------------------------------------------- CodeV

# CodeV c7eed11, vl_agent.py compute_score_generative: 1.0 * acc + 0.3 * format + 0.5 * tool.
# answer: after the last </think>, the last <answer>'s content up to its </answer>; else (none, or the last
# never closed) the last \boxed{X} there. acc: math-verify verify(parse(gt), parse(answer)) -> 1, else the
# judge: "true" in the lower-cased reply and "false" not -> 1, else 0; no answer -> 0, not asked.
# format 0 when: <code>/</code> or <think>/</think> counts differ; "<code>" after the last </answer> (the
# whole text when there is none); <answer>/</answer> counts differ after </think>; a tagged answer with two
# <answer>s there; no answer; more than one \boxed. tool: the rubric judge's reply, its first number clamped
# to [0, 1], none -> 0; asked for every row.
TOOL_USE = (
    "<think>crop the box</think><code>```python\nprint(1)\n```</code>\n<sandbox_output>1</sandbox_output>"
    "<think>it reads 3</think><answer>3</answer>"
)
CODEV = [
    # id, response, ground truth, the verifier's reply (None: not asked), the grader's reply, overall
    ("math-verify: right, tools used", TOOL_USE, "3", None, "1", 1.0 + 0.3 + 0.5 * 1.0),
    ("judged TRUE", "<think>x</think><answer>left</answer>", "left", "TRUE", "0.25", 1.0 + 0.3 + 0.5 * 0.25),
    ("judged FALSE", "<think>x</think><answer>right</answer>", "left", "FALSE", "0", 0.3),
    ("no answer: not verified, format 0", "<think>x</think>It is 3.", "3", None, "0.5", 0.5 * 0.5),
    ("a code block left open", "<code>print(1)<answer>3</answer>", "3", None, "Score: 0.75", 1.0 + 0.5 * 0.75),
    ("a boxed answer", "<think>x</think>The answer is \\boxed{3}.", "3", None, "1.0", 1.8),
    ("two answers: the last is read, format 0", "<answer>2</answer> <answer>3</answer>", "3", None, "0", 1.0),
    ("code after the answer", "<answer>3</answer><code>x</code>", "3", None, "0", 1.0),
    ("a cell and no </answer>", "<code>x</code> so \\boxed{3}", "3", None, "0.5", 1.0 + 0.5 * 0.5),
    ("two boxes", "\\boxed{2} or \\boxed{3}", "3", None, "0", 1.0),
    ("an unclosed last answer falls back to the box", "<answer>\\boxed{3}", "3", None, "0", 1.0),
    ("true without false is TRUE", "<answer>blue</answer>", "navy blue", "It is not true", "0", 1.3),
    ("both words are FALSE", "<answer>blue</answer>", "navy", "TRUE? FALSE? TRUE", "0", 0.3),
    ("the grade is the first number, clamped", "<answer>4</answer>", "3", "FALSE", "7/10", 0.3 + 0.5),
    ("a grade without a number is 0", "<answer>3</answer>", "3", None, "good use of tools", 1.3),
    ("an empty answer is asked about", "<answer></answer>", "3", "FALSE", "0", 0.3),
]  # fmt: skip


def test_codev_scores_as_its_tapo_reward():
    rows = [
        {"response": r, "ground_truth": gt, "question": name, "data_source": "vstar"}
        for name, r, gt, *_ in CODEV
    ]
    replies = {("codev_verify", name): v for name, _, _, v, _, _ in CODEV if v is not None}
    replies |= {("codev_rubric", name): g for name, _, _, _, g, _ in CODEV}
    judge = FakeJudge(replies)
    out = codev.compute_score(rows, judge=judge)
    assert {name: o["overall"] for (name, *_), o in zip(CODEV, out)} == pytest.approx(
        {name: want for name, *_, want in CODEV}
    )
    assert judge.asked("codev_verify") == [name for name, _, _, v, _, _ in CODEV if v is not None]
    assert judge.asked("codev_rubric") == [name for name, *_ in CODEV]  # every row's tool use is graded
    assert [(name, send) for name, send, _ in judge.calls] == [
        ("codev_verify", False),
        ("codev_rubric", True),
    ]
    by_id = {name: o for (name, *_), o in zip(CODEV, out)}
    assert by_id["a code block left open"]["format"] == 0.0 and by_id["a boxed answer"]["format"] == 1.0
    assert by_id["two answers: the last is read, format 0"]["answer"] == "3"
    assert judge.calls[0][2][0] == ("judged TRUE", "left", "left")  # (question, ground truth, answer)


def test_codev_grades_each_source_by_its_rubric_and_shows_the_images():
    sources = ["vstar", "chart", "high_res", "IconQA", "GeoQA", "visual", "count_apples", "other"]
    rows = [
        {"response": "<answer>3</answer>", "ground_truth": "3", "question": s, "data_source": s}
        for s in sources
    ]
    rows[0] |= {"images": ["question image"], "tool_images": ["crop 1", "crop 2", "crop 3", "crop 4"]}
    judge = FakeJudge({("codev_rubric", s): "1" for s in sources})
    out = codev.compute_score(
        rows, {"visual": "search", "count_*": "counting", "vstar": "calculation"}, judge=judge
    )
    want = ["calculation", "search", "search", "counting", "calculation", "search", "counting", "calculation"]
    assert [o["rubric"] for o in out] == want
    ((_, _, graded),) = judge.calls
    assert [g[1] for g in graded] == [codev.RUBRICS[r] for r in want]  # the rubric is the system prompt
    question, _, content, images = graded[0]
    assert images == ["question image", "crop 1", "crop 2", "crop 3"]  # the row's, then the tools' first 3
    assert "the first 1 are the question's" in content and "the last 3 are images the agent's code" in content
    assert "## Question\nvstar" in content and "<answer>3</answer>" in content
    assert "produced no image" in graded[1][2] and graded[1][3] == []
    assert tuple(codev.RUBRICS) == CODEV_RUBRICS


def test_codev_shows_the_grader_the_responses_last_6000_characters():
    response = "x" * 7000 + "<answer>3</answer>"
    judge = FakeJudge({("codev_rubric", "q"): "0"})
    codev.compute_score([{"response": response, "ground_truth": "3", "question": "q"}], judge=judge)
    content = judge.calls[0][2][0][2]
    assert "x" * 5982 + "<answer>3</answer>" in content and "x" * 5983 not in content


# ----------------------------------------------------------------------------------------------- through the manager


def _batch(responses: list[str], truths: list[str]):
    batch = make_batch(responses, truths)
    n = len(responses)
    batch["images"] = [[Image.new("RGB", (8, 8), "white")] for _ in range(n)]
    batch["tool_calls"] = [1] * n
    batch["tool_errors"] = [0] * n
    batch["turns"] = [[CELL, reply(True), LAST] for _ in range(n)]
    batch["tool_images"] = [[Image.new("RGB", (4, 4), "red")] for _ in range(n)]
    return batch


def _manager(server, **settings) -> RewardManager:
    cfg = RewardConfig(**settings)
    cfg.judge.base_url, cfg.judge.model, cfg.judge.check_at_start = server.url, "judge", False
    return RewardManager.of(cfg, max_response_length=8)


def test_builtin_pyvision_asks_the_runs_judge_with_its_own_prompt():
    from judge_server import JudgeServer

    server = JudgeServer(default=lambda body: ("ok", "Judgement: 1"))
    try:
        manager = _manager(server, reward_function="builtin:pyvision")
        try:
            out = manager.score(_batch([boxed("3"), "<answer>3</answer>"], ["3", "3"]))
            metrics = manager.pop_metrics()
        finally:
            manager.close()
    finally:
        server.stop()
    assert out["scores"].tolist() == pytest.approx([1.1, 0.0])
    assert out["reward_components"][0] == pytest.approx({"overall": 1.1, "accuracy": 1.0, "tool": 0.1})
    assert out["reward_info"][0] == {"answer": "3"}
    (request,) = server.chat_requests  # the second row has no boxed answer: not asked
    assert request["messages"][0]["content"] == "You are a helpful assistant."
    assert request["messages"][1]["content"].endswith("Model answer: 3\nJudgement:")  # text only, no image
    assert metrics["reward/judge_calls"] == 1.0


def test_builtin_codev_asks_the_verifier_and_the_grader_with_images():
    from judge_server import JudgeServer

    def answer(body):
        return ("ok", "0.75") if body["messages"][0]["role"] == "system" else ("ok", "TRUE")

    server = JudgeServer(default=answer)
    try:
        manager = _manager(server, reward_function="builtin:codev")
        try:
            out = manager.score(_batch(["<think>x</think><answer>left</answer>"], ["left"]))
        finally:
            manager.close()
    finally:
        server.stop()
    assert out["reward_components"][0] == pytest.approx(
        {"overall": 1.0 + 0.3 + 0.5 * 0.75, "accuracy": 1.0, "format": 1.0, "tool": 0.75}
    )
    assert out["reward_info"][0] == {"answer": "left", "rubric": "calculation"}
    verify, grade = server.chat_requests
    # the verifier's one text message: the ground truth and the extracted answer, each in its place
    (message,) = verify["messages"]
    assert message["content"].endswith("Reference answer:\nleft\n\nStudent answer:\nleft"), message
    assert grade["messages"][0]["content"] == codev.RUBRICS["calculation"]
    parts = [p["type"] for p in grade["messages"][-1]["content"]]
    assert parts == ["image_url", "image_url", "text"]  # the row's image, the tool's, then the text


@pytest.mark.parametrize("name", ["builtin:pyvision", "builtin:codev"])
def test_the_seed_rewards_need_a_judge_endpoint_at_load(name, monkeypatch):
    monkeypatch.delenv("LLM_AS_A_JUDGE_BASE", raising=False)
    with pytest.raises(ConfigError, match=f"{name} needs a judge endpoint"):
        load_config([f"worker.reward.reward_function={name}"])


def test_a_codev_rubric_must_be_one_of_codevs():
    with pytest.raises(ConfigError) as e:
        load_config(
            [
                "worker.reward.reward_function=builtin:codev",
                "worker.reward.judge.base_url=http://judge:18901/v1",
                "worker.reward.codev.rubric_by_source={visual: zoom}",
            ]
        )
    assert e.value.problems == [
        "worker.reward.codev.rubric_by_source.visual='zoom': must be one of search, calculation, counting "
        "(CodeV's tool-use rubrics)"
    ]


def test_a_rubric_codev_does_not_have_is_refused_by_name():
    assert (
        codev.rubric_of("vstar", {}) == "search"
        and codev.rubric_of("mine", {"mi*": "counting"}) == "counting"
    )
    with pytest.raises(ValueError, match=r"'mine' the rubric 'zoom'.*worker.reward.codev.rubric_by_source"):
        codev.rubric_of("mine", {"mine": "zoom"})  # as reward_function_kwargs would pass it, unchecked
