"""The reward manager's workers, per-sample timeout, failure policy and weighted combination."""

from __future__ import annotations

import dataclasses
import inspect
import threading
import time
from pathlib import Path

import pytest
from scored_batches import make_batch

from rlstack.batch_metrics import reward_component_means
from rlstack.config import ConfigError, RewardConfig, load_config
from rlstack.rewards.loader import RewardLoadError, load_reward_function
from rlstack.rewards.manager import RewardError, RewardManager, Rewards
from rlstack.workers.ray_group import RayRewards

FUNCTIONS = """
import time

REWARD_TYPE = "sequential"

def slow_on_hang(x):
    if x["response"] == "hang":
        time.sleep(30)
    time.sleep(0.2)
    return {"overall": float(x["response"] == x["ground_truth"]), "acc": 1.0}

def boom_on_bad(x):
    if x["response"] == "bad":
        raise ValueError("cannot grade this")
    return {"overall": 1.0}

def length(x):
    return {"overall": float(len(x["response"])), "len": float(len(x["response"]))}

def scaled(x, factor=1.0):
    return {"overall": factor * float(x["response"] == x["ground_truth"]), "accuracy": 1.0}
"""


@pytest.fixture()
def module(tmp_path: Path) -> Path:
    path = tmp_path / "fns.py"
    path.write_text(FUNCTIONS)
    return path


def test_workers_run_samples_in_parallel(module: Path):
    fn = load_reward_function(f"{module}:slow_on_hang")
    start = time.perf_counter()
    out = RewardManager(RewardConfig(num_workers=4, timeout_s=5), [fn]).score(
        make_batch(["a", "b", "c", "d"], ["a", "x", "c", "x"])
    )
    elapsed = time.perf_counter() - start
    assert out["scores"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert elapsed < 0.6  # four 0.2 s calls at once, not 0.8 s in a row


def test_a_hanging_sample_times_out_and_is_named(module: Path):
    fn = load_reward_function(f"{module}:slow_on_hang")
    start = time.perf_counter()
    with pytest.raises(RewardError, match=r"timeout_s=0.5.*sample 1 \(row train.jsonl:2"):
        RewardManager(RewardConfig(num_workers=2, timeout_s=0.5), [fn]).score(
            make_batch(["a", "hang"], ["a", "a"])
        )
    assert time.perf_counter() - start < 3


def test_score_policy_gives_the_error_score_and_counts_errors(module: Path):
    fn = load_reward_function(f"{module}:boom_on_bad")
    out = RewardManager(RewardConfig(on_error="score", error_score=-1.0), [fn]).score(
        make_batch(["ok", "bad", "ok"], ["", "", ""])
    )
    assert out["scores"].tolist() == [1.0, -1.0, 1.0]
    assert [c["errors"] for c in out["reward_components"]] == [0.0, 1.0, 0.0]


def test_timeouts_under_the_score_policy_do_not_stop_the_run(module: Path):
    fn = load_reward_function(f"{module}:slow_on_hang")
    out = RewardManager(RewardConfig(num_workers=2, timeout_s=0.5, on_error="score"), [fn]).score(
        make_batch(["a", "hang"], ["a", "a"])
    )
    assert out["scores"].tolist() == [1.0, 0.0]
    assert [c["errors"] for c in out["reward_components"]] == [0.0, 1.0]


def test_raise_policy_names_the_sample_that_raised(module: Path):
    fn = load_reward_function(f"{module}:boom_on_bad")
    with pytest.raises(RewardError, match=r"sample 1 \(row train.jsonl:2.*ValueError: cannot grade this"):
        RewardManager(RewardConfig(), [fn]).score(make_batch(["ok", "bad"], ["", ""]))


RAISING = """
import json


def answer_of(x):
    return x["extra"]["answer"]


def score(xs):
    return [{"overall": float(answer_of(x) == x["response"])} for x in xs]


def parsed(xs):
    return [{"overall": float(json.loads(x["response"]))} for x in xs]
"""


def test_a_user_reward_function_that_raises_is_shown_at_its_lines_in_the_users_file(tmp_path: Path, capsys):
    """The exception's type and message with each frame of the user's file (path, line, function, the line's
    text) and, for a library's exception, where it was raised; under on_error=score the same in reward_info
    and one line on stderr per failure place, not a bare count."""
    path = tmp_path / "my_reward.py"
    path.write_text(RAISING.lstrip())
    with pytest.raises(RewardError) as info:
        RewardManager(RewardConfig(), [load_reward_function(f"{path}:score")]).score(make_batch(["1"], [""]))
    assert str(info.value).endswith(
        f"KeyError: 'answer' at {path}:9 in score: "
        '`return [{"overall": float(answer_of(x) == x["response"])} for x in xs]` -> '
        f'{path}:5 in answer_of: `return x["extra"]["answer"]`'
    ), info.value
    assert "rlstack/" not in str(info.value)
    with pytest.raises(RewardError) as info:
        RewardManager(RewardConfig(), [load_reward_function(f"{path}:parsed")]).score(
            make_batch(["1", "x"], ["", ""])
        )
    assert "raised on sample 1 (row train.jsonl:2, response 'x'): JSONDecodeError: Expecting value" in str(
        info.value
    )
    assert f"at {path}:13 in parsed: " in str(info.value) and "-> raised in " in str(info.value)
    assert "json/decoder.py:" in str(info.value)

    out = RewardManager(RewardConfig(on_error="score"), [load_reward_function(f"{path}:score")]).score(
        make_batch(["1", "2"], ["", ""])
    )
    errors = [r["error"] for r in out["reward_info"]]
    assert errors[0] == errors[1] and errors[0].startswith(f"KeyError: 'answer' at {path}:9 in score: ")
    [line] = capsys.readouterr().err.splitlines()  # two samples, one place: said once
    assert line.startswith(
        f"[rlstack] reward function {path}:score failed on 2 sample(s) (KeyError: 'answer' at "
    )


def test_a_reward_file_that_fails_on_import_shows_the_line(tmp_path: Path):
    for source, shown in (
        ("x = 1\ny = z + 1\n", "NameError: name 'z' is not defined at {path}:2 in <module>: `y = z + 1`"),
        ("def f(:\n    pass\n", "SyntaxError: invalid syntax at {path}:1: `def f(:`"),
    ):
        path = tmp_path / f"broken_{source[0]}.py"
        path.write_text(source)
        with pytest.raises(RewardLoadError) as info:
            load_reward_function(f"{path}:f")
        assert str(info.value).endswith(
            f"importing reward file {str(path)!r} failed: {shown.format(path=path)}"
        ), info.value


def test_weighted_combination_of_several_functions(module: Path):
    main = load_reward_function("builtin:exact_match")
    extra = load_reward_function(f"{module}:length")
    out = RewardManager(RewardConfig(reward_weights=[1.0, 0.5]), [main, extra]).score(
        make_batch(["ab", "x"], ["ab", "y"])
    )
    # overall = 1.0 * exact + 0.5 * len: [1 + 1.0, 0 + 0.5]
    assert out["scores"].tolist() == [2.0, 0.5]
    comps = out["reward_components"]
    assert comps[0]["accuracy"] == 1.0 and comps[0]["length/len"] == 2.0 and comps[0]["overall"] == 2.0
    with pytest.raises(RewardError, match="2 reward weights for 1 reward functions"):
        RewardManager(RewardConfig(reward_weights=[1.0, 2.0]), [main])


def test_no_thread_is_used_without_workers_or_timeout(module: Path):
    seen = []
    fn = load_reward_function(f"{module}:length")
    original = fn.fn
    fn.fn = lambda x: seen.append(threading.get_ident()) or original(x)
    RewardManager(RewardConfig(), [fn]).score(make_batch(["a", "b"], ["", ""]))
    assert set(seen) == {threading.get_ident()}  # math-verify needs the main thread


def test_a_rows_dataset_fields_reach_the_reward_function_at_the_top_level_too():
    """EasyR1 hands a row's own fields to the reward function as keys of its input; they are also under
    `extra`, and never replace the keys rlstack sets."""
    from rlstack.rewards.manager import reward_inputs

    batch = make_batch(["4", "5"], ["4", "4"])
    batch["extra"] = [{"difficulty": "easy", "response": "not the response"}, {"difficulty": "hard"}]
    first, second = reward_inputs(batch)
    assert (first["difficulty"], second["difficulty"]) == ("easy", "hard")
    assert first["extra"] == {"difficulty": "easy", "response": "not the response"}
    assert (first["response"], first["response_length"], first["ground_truth"]) == ("4", 1, "4")


def _sources(batch, sources: list[str]):
    batch["data_source"] = sources
    return batch


def test_each_data_source_is_scored_by_its_own_function(module: Path):

    cfg = RewardConfig(
        reward_function=f"{module}:scaled",
        reward_function_kwargs={"factor": 2.0},  # the default function's alone: the others take none
        reward_function_by_source={"code_*": f"{module}:length", "code_py": f"{module}:boom_on_bad"},
    )
    batch = _sources(
        make_batch(["ab", "xyz", "x ", "ok", "bad"], ["ab", "", "x", "", ""]),
        ["math", "code_cpp", "math", "code_py", "code_py"],
    )
    manager = RewardManager.of(cfg, max_response_length=8)
    with pytest.raises(RewardError, match=r"boom_on_bad.*sample 4 \(row train.jsonl:5.*cannot grade this"):
        manager.score(batch)  # the exact name wins over the pattern; the failing sample keeps its place
    batch["response_text"][4] = "fine"
    out = manager.score(batch)
    # scaled exact match for math ("x " is not "x"), length for code_cpp, boom_on_bad for code_py
    assert out["scores"].tolist() == [2.0, 3.0, 0.0, 1.0, 1.0]
    comps = out["reward_components"]
    assert comps[1] == {"len": 3.0, "overall": 3.0} and comps[3] == {"overall": 1.0}
    assert "accuracy" in comps[0] and "len" not in comps[0]
    means = reward_component_means(out)
    assert means["reward/len"] == 3.0 and means["reward/accuracy"] == 1.0
    assert means["reward/overall"] == pytest.approx(7.0 / 5)


def test_a_routed_function_that_cannot_load_names_its_key(module: Path):
    from rlstack.rewards.loader import RewardLoadError

    cfg = RewardConfig(reward_function_by_source={"gsm8k": "builtin:maths"})
    with pytest.raises(
        RewardLoadError, match=r"worker.reward.reward_function_by_source.gsm8k='builtin:maths'"
    ):
        RewardManager.of(cfg, max_response_length=8)


def test_a_rows_images_reach_the_reward_function_and_a_vision_judge(tmp_path: Path):
    """Vision-language rows hand their images to the reward function (`images`); the built-in agent reward's
    judge fallback sends them to the judge only with `judge.send_images`."""
    from judge_server import JudgeServer
    from PIL import Image

    from rlstack.batch import Batch
    from rlstack.rewards.manager import REWARD_COLUMNS, reward_inputs

    batch = make_batch(["<answer>a small dog</answer>", "<answer>3</answer>"], ["a puppy", "3"])
    batch["images"] = [[Image.new("RGB", (4, 4), "green")], []]
    inputs = reward_inputs(batch)
    assert inputs[0]["images"][0].getpixel((0, 0)) == (0, 128, 0) and inputs[1]["images"] == []
    assert "images" not in reward_inputs(make_batch(["4"], ["4"]))  # text rows: no key
    # what a remote reward worker is sent (REWARD_COLUMNS) gives it the same inputs
    sent = reward_inputs(Batch({k: batch[k] for k in REWARD_COLUMNS if k in batch}))
    assert [x.keys() for x in sent] == [x.keys() for x in inputs] and sent[0]["images"] is inputs[0]["images"]

    server = JudgeServer()
    try:
        for send in (False, True):
            cfg = RewardConfig(reward_function="builtin:agent")
            cfg.agent.judge_fallback = True
            cfg.judge.base_url, cfg.judge.model, cfg.judge.send_images = server.url, "judge", send
            cfg.judge.check_at_start = False
            manager = RewardManager.of(cfg, max_response_length=8)
            try:
                out = manager.score(batch)
            finally:
                manager.close()
            assert out["reward_components"][0]["accuracy"] == 1.0  # the judge said 1 for the undecided row
        assert len(server.chat_requests) == 2  # one undecided row per run; the second carried the image
        without, with_image = (r["messages"][-1]["content"] for r in server.chat_requests)
        assert isinstance(without, str)
        assert [p["type"] for p in with_image] == ["image_url", "text"]
    finally:
        server.stop()


def test_judge_always_asks_about_every_answer_as_vl_agent_does(monkeypatch):
    """DeepEyes' vl_agent reward asks the judge about each answer: a rule-wrong answer
    the judge accepts scores, a response without an answer is 0 and not asked."""
    from judge_server import JudgeServer

    responses = ["<answer>5</answer>", "<answer>3</answer>", "no answer"]
    server = JudgeServer()
    try:
        cfg = RewardConfig(reward_function="builtin:agent")
        cfg.agent.judge_always = True
        cfg.judge.base_url, cfg.judge.model, cfg.judge.check_at_start = server.url, "judge", False
        manager = RewardManager.of(cfg, max_response_length=8)
        try:
            out = manager.score(make_batch(responses, ["3", "3", "3"]))
        finally:
            manager.close()
        assert [c["accuracy"] for c in out["reward_components"]] == [1.0, 1.0, 0.0]
        assert len(server.chat_requests) == 2
    finally:
        server.stop()
    monkeypatch.delenv("LLM_AS_A_JUDGE_BASE", raising=False)
    with pytest.raises(ConfigError, match="worker.reward.agent.judge_always=true needs a judge endpoint"):
        load_config(["worker.reward.reward_function=builtin:agent", "worker.reward.agent.judge_always=true"])


ASKS_THE_JUDGE = """
REWARD_TYPE = "{kind}"

def batch(reward_inputs, judge):
    scores = judge([(x["question"], x["ground_truth"], x["response"]) for x in reward_inputs])
    return [{{"overall": s + 10.0, "asked": s}} for s in scores]

def sequential(reward_input, judge):
    (score,) = judge([(reward_input["question"], reward_input["ground_truth"], reward_input["response"])])
    return {{"overall": score + 10.0, "asked": score}}
"""


@pytest.mark.parametrize("kind", ["batch", "sequential", "verl"])
def test_a_reward_function_with_a_judge_parameter_is_given_the_judge(tmp_path: Path, kind: str):
    """EasyR1's batch and sequential functions and veRL's `compute_score` that take `judge` get the run's judge:
    the configured template and parser, its calls counted in reward/judge_calls."""
    from judge_server import JudgeServer

    if kind == "verl":
        (tmp_path / "fn.py").write_text(
            "def compute_score(data_source, solution_str, ground_truth, extra_info, judge):\n"
            "    return judge([(extra_info['question'], ground_truth, solution_str)])[0] + 10.0\n"
        )
        ref = f"{tmp_path / 'fn.py'}:compute_score"
    else:
        (tmp_path / "fn.py").write_text(ASKS_THE_JUDGE.format(kind=kind))
        ref = f"{tmp_path / 'fn.py'}:{kind}"
    server = JudgeServer(
        default=lambda body: ("ok", "TRUE" if "Response: 4" in body["messages"][-1]["content"] else "FALSE")
    )
    try:
        cfg = RewardConfig(reward_function=ref)
        cfg.judge.base_url, cfg.judge.template, cfg.judge.check_at_start = server.url, "verifier", False
        manager = RewardManager.of(cfg, max_response_length=8)
        batch = make_batch(["4", "5"], ["4", "4"])
        batch["extra"] = [{"question": "What is 2 + 2?"}] * 2
        out = manager.score(batch)
        metrics = manager.pop_metrics()
        manager.close()
    finally:
        server.stop()
    assert out["scores"].tolist() == [11.0, 10.0]
    assert metrics == {"reward/judge_calls": 2.0, "reward/judge_errors": 0.0}
    assert all("Question: What is 2 + 2?" in r["messages"][-1]["content"] for r in server.chat_requests)


def test_builtin_judge_scores_every_response_and_sends_a_rows_images(tmp_path: Path):
    """builtin:judge: the question (the row's last user message), the reference and the response go to the
    judge for every row, with the row's images under send_images; overall = judge = its score."""
    from judge_server import JudgeServer
    from PIL import Image

    server = JudgeServer(
        default=lambda body: ("ok", f"Judgement: {int('Candidate answer: a cat' in str(body['messages']))}")
    )
    try:
        cfg = RewardConfig(reward_function="builtin:judge")
        cfg.judge.base_url, cfg.judge.send_images = server.url, True
        manager = RewardManager.of(cfg, max_response_length=8)
        batch = make_batch(["a cat", "a dog", "a cat"], ["cat", "cat", "cat"])
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What animal is it?"},
        ]
        batch["prompt_messages"] = [messages] * 3
        batch["images"] = [[Image.new("RGB", (4, 4), "red")], [], []]
        out = manager.score(batch)
        manager.close()
    finally:
        server.stop()
    assert out["scores"].tolist() == [1.0, 0.0, 1.0]
    assert [c["judge"] for c in out["reward_components"]] == [1.0, 0.0, 1.0]
    assert set(out["reward_components"][0]) == {"overall", "judge"}
    ping, *judged = server.chat_requests  # the check at start, then one request per row (each is distinct)
    assert ping["max_tokens"] == 1 and len(judged) == 3
    contents = [r["messages"][-1]["content"] for r in judged]  # sent at once: in any order
    (with_image,) = [c for c in contents if isinstance(c, list)]
    text_only = [c for c in contents if not isinstance(c, list)]
    assert [p["type"] for p in with_image] == ["image_url", "text"]
    assert (
        "Question: What animal is it?\nReference answer: cat\nCandidate answer: a cat"
        in with_image[1]["text"]
    )
    assert all(isinstance(t, str) and "Candidate answer: a " in t for t in text_only)


def test_the_judge_is_checked_where_the_manager_is_built_unless_turned_off():
    from judge_server import JudgeServer

    from rlstack.rewards.judge import JudgeError

    server = JudgeServer(default=lambda body: ("status", 503))
    try:
        cfg = RewardConfig(reward_function="builtin:judge")
        cfg.judge.base_url, cfg.judge.max_attempts, cfg.judge.backoff_base = server.url, 2, 0.01
        with pytest.raises(
            JudgeError, match=rf"POST {server.url}/chat/completions .* failed after 2 attempt\(s\): HTTP 503"
        ):
            RewardManager.of(cfg, max_response_length=8)
        cfg.judge.check_at_start = False
        RewardManager.of(cfg, max_response_length=8).close()
    finally:
        server.stop()
    assert len(server.chat_requests) == 2 and server.model_requests == 1  # nothing asked with the check off


def _methods(cls: type) -> dict[str, inspect.Signature]:
    return {n: inspect.signature(v) for n, v in vars(cls).items() if inspect.isfunction(v) and n[0] != "_"}


@pytest.mark.parametrize("cls", [RewardManager, RayRewards])
def test_each_rewards_implementation_has_the_protocols_methods_as_declared(cls: type):
    """What holds a `Rewards` (the collector, validation, the workers) calls these methods only; the manager
    and Ray's reward actors each take and return what the protocol declares."""
    declared = _methods(Rewards)
    assert sorted(declared) == ["close", "pop_metrics", "score"]
    assert {n: inspect.signature(getattr(cls, n)) for n in declared} == declared


def test_a_builtins_settings_come_from_its_section_once_per_run_and_the_users_kwargs_win(monkeypatch):
    """`builtin:math` named three times (main, extra, a data source's) reads `worker.reward.math` once; the
    main function's `reward_function_kwargs` win over the section, the others keep the section's."""
    from rlstack.rewards import builtin

    math = builtin.BUILTINS["math"]
    judges = []
    monkeypatch.setitem(
        builtin.BUILTINS,
        "math",
        dataclasses.replace(
            math, settings=lambda cfg, judge: judges.append(judge) or math.settings(cfg, judge)
        ),
    )
    cfg = RewardConfig(
        reward_function="builtin:math",
        reward_function_kwargs={"format_weight": 0.0},
        extra_reward_functions=["builtin:math"],
        reward_function_by_source={"gsm8k": "builtin:math"},
    )
    cfg.math.format_weight = 0.5
    manager = RewardManager.of(cfg, max_response_length=8)
    assert judges == [None]  # once, and without a judge: nothing asked for one
    batch = _sources(make_batch(["<answer>3</answer>"] * 2, ["3", "3"]), ["addition", "gsm8k"])
    out = manager.score(batch)
    # a right answer without the think format: 1 - format_weight per function, main + extra
    assert out["scores"].tolist() == [1.0 + 0.5, 0.5 + 0.5]


def test_the_judge_is_built_where_a_builtin_in_use_asks_for_it_in_its_section():

    cfg = RewardConfig(reward_function="builtin:math")
    cfg.judge.base_url, cfg.judge.model, cfg.judge.check_at_start = "http://127.0.0.1:9/v1", "judge", False
    cfg.agent.judge_fallback = True  # builtin:agent's section: agent is not in use
    assert RewardManager.of(cfg, max_response_length=8).judge is None
    cfg.math.judge_fallback = True
    manager = RewardManager.of(cfg, max_response_length=8)
    assert manager.judge is not None
    manager.close()


def test_the_overlong_buffer_is_the_sections_and_ends_at_the_max_response_length_given():
    """DAPO's penalty from `overlong_buffer_length` / `overlong_penalty_factor` (the section) and
    `data.max_response_length` (given apart): rows of 1..6 tokens, the buffer's 4 tokens ending at 6."""
    cfg = RewardConfig(overlong_buffer_length=4, overlong_penalty_factor=0.5)
    answers = list("abcdef")
    out = RewardManager.of(cfg, max_response_length=6).score(make_batch(answers, answers))
    penalty = [0.0, 0.0, -0.125, -0.25, -0.375, -0.5]  # -0.5 * clamp((length - 2) / 4, 0, 1)
    assert [c["overlong"] for c in out["reward_components"]] == penalty
    assert out["scores"].tolist() == [1.0 + p for p in penalty]
