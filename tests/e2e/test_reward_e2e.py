"""The reward settings of `worker.reward` wired through the trainer: judge fallback, code settings, reasons."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from judge_server import JudgeServer
from scored_batches import make_batch

from rlstack.config import ConfigError, load_config
from rlstack.rewards.manager import RewardManager
from rlstack.sft import run_sft
from rlstack.trainer import Trainer

# Questions whose answers are words: math-verify cannot parse them, so the rule leaves them to the judge.
QUESTIONS = [
    ("Which day follows Sunday?", "Monday", "Mon"),
    ("Which day follows Monday?", "Tuesday", "Tue"),
    ("What colour is the sky?", "blue", "blu"),
    ("What colour is grass?", "green", "gre"),
]


def _write_rows(path: Path, answers: list[str]) -> Path:
    with path.open("w") as f:
        for (question, _, _), answer in zip(QUESTIONS, answers):
            f.write(json.dumps({"problem": question, "answer": answer}) + "\n")
    return path


def _common(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"worker.actor.model.model_path={model}",
        f"trainer.output_dir={out}",
        "data.val_files=",
        "data.rollout_batch_size=4",
        "worker.actor.global_batch_size=4",
        "worker.actor.micro_batch_size_per_device_for_update=4",
        "data.max_prompt_length=64",
        "data.max_response_length=24",
        "worker.reward.reward_function=builtin:exact_match",
        "trainer.logger=[file]",
        "trainer.num_threads=1",
        *extra,
    ]


@pytest.fixture(scope="module")
def answering_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after 150 SFT steps (about 2 s): it writes `<answer>` + an abbreviation + `</answer>`."""
    tmp = tmp_path_factory.mktemp("answering")
    rows = _write_rows(tmp / "sft.jsonl", [f"<answer>{short}</answer>" for _, _, short in QUESTIONS])
    cfg = load_config(
        _common(
            tiny_model_dir,
            tmp,
            f"data.train_files={rows}",
            "worker.actor.optim.lr=3e-3",
            "trainer.max_steps=150",
            "trainer.experiment_name=sft",
        )
    )
    return run_sft(cfg)


def _judge_by_prefix(body: dict) -> tuple[str, str]:
    """Judgement 1 when the candidate's answer is a 3+ letter prefix of the reference answer."""
    user = body["messages"][-1]["content"]
    reference = re.findall(r"Reference answer: (.*)", user)[-1].strip()
    candidate = re.findall(r"Candidate answer: (.*)", user)[-1]
    inner = re.search(r"<answer>(.*?)</answer>", candidate)
    said = inner.group(1).strip() if inner else ""
    same = len(said) >= 3 and reference.lower().startswith(said.lower())
    return "ok", f"Judgement: {int(same)}"


@pytest.mark.slow
def test_math_with_judge_fallback_against_a_local_judge_server(answering_model: Path, tmp_path: Path):
    server = JudgeServer(default=_judge_by_prefix)
    server.script = [("status", 500)]  # the first request fails and is retried
    try:
        rows = _write_rows(tmp_path / "rl.jsonl", [gold for _, gold, _ in QUESTIONS])
        cfg = load_config(
            _common(
                answering_model,
                tmp_path,
                f"data.train_files={rows}",
                "worker.rollout.n=4",
                "worker.actor.optim.lr=1e-4",
                "trainer.max_steps=2",
                "trainer.total_epochs=2",
                "trainer.train_generations_to_log=16",
                "worker.reward.reward_function=builtin:math",
                "worker.reward.math.judge_fallback=true",
                f"worker.reward.judge.base_url={server.url}",
                "worker.reward.judge.backoff_base=0.01",
                "worker.reward.judge.backoff_max=0.02",
                "worker.reward.judge.check_at_start=false",  # counts below are the fallback's requests only
                "trainer.save_model_only=true",
            )
        )
        Trainer(cfg).fit()
    finally:
        server.stop()
    metrics = {
        json.loads(line)["step"]: json.loads(line)
        for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    }
    calls = sum(metrics[s]["reward/judge_calls"] for s in (1, 2))
    assert calls > 0 and metrics[1]["reward/judge_errors"] == metrics[2]["reward/judge_errors"] == 0
    # each distinct (question, gold, response) is sent once; the 500 adds one retried request
    assert server.model_requests == 1  # the model name was discovered once via GET /models
    assert 1 < len(server.chat_requests) <= calls + 1
    assert server.chat_requests[0]["model"] == "judge-72b"

    judged = 0
    for step in (1, 2):
        for line in (cfg.run_dir / "generations" / f"train_step_{step}.jsonl").read_text().splitlines():
            row = json.loads(line)
            info, accuracy = row["reward_info"], row["reward_components"]["accuracy"]
            if info["reason"].startswith("fallback"):
                judged += 1
                verdict = _judge_by_prefix(
                    {
                        "messages": [
                            {
                                "content": f"Reference answer: {row['ground_truth']}\nCandidate answer: "
                                f"{row['response']}"
                            }
                        ]
                    }
                )[1]
                assert accuracy == float(verdict.endswith("1")), row
            elif info["answer"] == "":
                assert info["reason"] == "no answer" and accuracy == 0.0
    assert judged > 0 and metrics[1]["reward/accuracy"] > 0


def _judge_by_length(body: dict) -> tuple[str, str]:
    """`Score: n` out of 10, n the response's length mod 11; `OK` to the check at start (no response in it)."""
    said = re.search(r"<<(.*)>>\Z", body["messages"][-1]["content"], re.DOTALL)
    return "ok", f"Score: {len(said.group(1)) % 11}" if said else "OK"


def test_builtin_judge_scores_every_response_of_a_run(tiny_model_dir: Path, tmp_path: Path):
    """GRPO on the tiny model with builtin:judge: the judge is checked before training, then every response
    (question, reference, response) goes through the user's Jinja template to the judge, whose `Score: n` the
    score_0_10 parser reads; each row's reward is its judge's verdict, logged as reward/judge."""
    server = JudgeServer(default=_judge_by_length)
    template = tmp_path / "judge.jinja"
    template.write_text(
        "Score the answer from 0 to 10.\nQ: {{ question }}\nReference: {{ reference }}\n<<{{ response }}>>"
    )
    try:
        rows = _write_rows(tmp_path / "rl.jsonl", [gold for _, gold, _ in QUESTIONS])
        cfg = load_config(
            _common(
                tiny_model_dir,
                tmp_path,
                f"data.train_files={rows}",
                "worker.rollout.n=2",
                "worker.actor.micro_batch_size_per_device_for_update=8",
                "data.max_response_length=8",
                "trainer.max_steps=2",
                "trainer.total_epochs=2",
                "trainer.train_generations_to_log=8",
                "worker.reward.reward_function=builtin:judge",
                f"worker.reward.judge.base_url={server.url}",
                f"worker.reward.judge.template={template}",
                "worker.reward.judge.parser=score_0_10",
                "trainer.save_model_only=true",
            )
        )
        Trainer(cfg).fit()
    finally:
        server.stop()
    ping, *judged = server.chat_requests
    assert ping["max_tokens"] == 1 and server.model_requests == 1  # the check at start found the model
    assert {r["model"] for r in judged} == {"judge-72b"}
    verdicts = {}
    for request in judged:
        text = request["messages"][-1]["content"]
        question = re.search(r"Q: (.*)\nReference: (.*)\n", text)
        assert (question.group(1), question.group(2)) in {(q, gold) for q, gold, _ in QUESTIONS}
        response = re.search(r"<<(.*)>>\Z", text, re.DOTALL).group(1)
        verdicts[response] = (len(response) % 11) / 10
    metrics = {
        json.loads(line)["step"]: json.loads(line)
        for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    }
    for step in (1, 2):
        assert metrics[step]["reward/judge_calls"] == 8  # every response of the step
        assert metrics[step]["reward/judge"] == pytest.approx(metrics[step]["reward/overall"])
        rows = [
            json.loads(line) for line in (cfg.run_dir / "generations" / f"train_step_{step}.jsonl").open()
        ]
        assert len(rows) == 8
        for row in rows:
            assert row["score"] == pytest.approx(verdicts[row["response"]]), row
            assert row["reward_components"]["judge"] == pytest.approx(row["score"])


def test_judge_fallback_without_an_endpoint_is_a_config_error(monkeypatch):
    monkeypatch.delenv("LLM_AS_A_JUDGE_BASE", raising=False)
    with pytest.raises(ConfigError, match="judge_fallback=true needs a judge endpoint"):
        load_config(["worker.reward.reward_function=builtin:math", "worker.reward.math.judge_fallback=true"])


def scored_judge(server: JudgeServer, *extra: str) -> list[str]:
    """builtin:math asking `server` about words, two attempts per sample, failures scored (on_error=score)."""
    return [
        "worker.reward.reward_function=builtin:math",
        "worker.reward.math.judge_fallback=true",
        f"worker.reward.judge.base_url={server.url}",
        "worker.reward.judge.model=j",
        "worker.reward.judge.max_attempts=2",
        "worker.reward.judge.backoff_base=0.01",
        "worker.reward.judge.on_error=score",
        "worker.reward.judge.check_at_start=false",  # the judge is down from the start
        *extra,
    ]


def test_judge_that_stays_down_scores_and_counts_with_on_error_score():
    server = JudgeServer(default=lambda body: ("status", 503))
    try:
        cfg = load_config(scored_judge(server, "worker.reward.judge.error_score=0.25"))
        manager = RewardManager.of(cfg.worker.reward, max_response_length=16)
        batch = manager.score(make_batch(["<answer>Mon</answer>", "<answer>7</answer>"], ["Monday", "7"]))
        manager.close()
    finally:
        server.stop()
    accuracy = [c["accuracy"] for c in batch["reward_components"]]
    assert accuracy == [0.25, 1.0]  # the rule decides "7" itself; the word goes to the (down) judge
    assert batch["reward_info"][0]["reason"].startswith("fallback")
    assert manager.pop_metrics() == {"reward/judge_calls": 1.0, "reward/judge_errors": 1.0}
    assert len(server.chat_requests) == 2  # max_attempts


CODE_RESPONSE = "```python\nprint(int(input()) * 2)\n```"


def test_code_settings_reach_the_builtin_code_reward():
    tests = json.dumps({"inputs": ["1", "2", "3"], "outputs": ["2", "4", "7"]})
    fraction = load_config(["worker.reward.reward_function=builtin:code"])
    strict = load_config(
        [
            "worker.reward.reward_function=builtin:code",
            "worker.reward.code.mode=all_or_nothing",
            "worker.reward.code.stop_at_first_failure=true",
        ]
    )
    out = RewardManager.of(fraction.worker.reward, max_response_length=16).score(
        make_batch([CODE_RESPONSE], [tests])
    )
    assert out["reward_components"][0]["pass_rate"] == pytest.approx(2 / 3)
    assert out["reward_info"][0] == {"status": "wrong_answer", "reason": "test 2: wrong answer"}
    out = RewardManager.of(strict.worker.reward, max_response_length=16).score(
        make_batch([CODE_RESPONSE], [tests])
    )
    assert out["scores"].tolist() == [0.0]


def test_stop_at_first_timeout_is_a_config_key_that_reaches_the_code_reward():
    tests = json.dumps({"inputs": ["1", "2", "3"], "outputs": ["2", "4", "6"]})
    hanging = "```python\nwhile True: pass\n```"
    reasons = {}
    for stop in ("true", "false"):
        cfg = load_config(
            [
                "worker.reward.reward_function=builtin:code",
                "worker.reward.code.test_time_s=0.5",
                f"worker.reward.code.stop_at_first_timeout={stop}",
            ]
        )
        out = RewardManager.of(cfg.worker.reward, max_response_length=16).score(
            make_batch([hanging], [tests])
        )
        assert out["scores"].tolist() == [0.0]
        reasons[stop] = out["reward_info"][0]["reason"]
    assert reasons["true"].endswith("tests 1-2 not run (counted as failed)")
    assert "not run" not in reasons["false"]


def test_code_on_a_sandboxfusion_server_needs_its_url():
    with pytest.raises(ConfigError, match="sandbox=fusion needs worker.reward.code.sandbox_url"):
        load_config(["worker.reward.reward_function=builtin:code", "worker.reward.code.sandbox=fusion"])


def test_extra_functions_and_weights_from_config(tmp_path: Path):
    extra = tmp_path / "length.py"
    extra.write_text("def score(xs):\n    return [{'overall': float(len(x['response']))} for x in xs]\n")
    cfg = load_config(
        [
            f"worker.reward.extra_reward_functions=[{extra}:score]",
            "worker.reward.reward_weights=[2.0,0.5]",
        ]
    )
    out = RewardManager.of(cfg.worker.reward, max_response_length=16).score(
        make_batch(["ab", "x"], ["ab", "y"])
    )
    assert out["scores"].tolist() == [2.0 * 1 + 0.5 * 2, 2.0 * 0 + 0.5 * 1]
    assert out["reward_components"][0]["score/overall"] == 2.0
    with pytest.raises(ConfigError, match="1 weight\\(s\\) for 2 reward function"):
        load_config(
            [f"worker.reward.extra_reward_functions=[{extra}:score]", "worker.reward.reward_weights=[2.0]"]
        )


def test_reward_errors_are_scored_and_explained_with_on_error_score(tmp_path: Path):
    fn = tmp_path / "boom.py"
    fn.write_text(
        "REWARD_TYPE = 'sequential'\n"
        "def score(x):\n"
        "    if x['response'] == 'bad':\n"
        "        raise ValueError('cannot grade')\n"
        "    return {'overall': 1.0}\n"
    )
    cfg = load_config(
        [
            f"worker.reward.reward_function={fn}:score",
            "worker.reward.on_error=score",
            "worker.reward.error_score=-1",
        ]
    )
    out = RewardManager.of(cfg.worker.reward, max_response_length=16).score(
        make_batch(["ok", "bad"], ["", ""])
    )
    assert out["scores"].tolist() == [1.0, -1.0]
    assert [c["errors"] for c in out["reward_components"]] == [0.0, 1.0]
    assert "cannot grade" in out["reward_info"][1]["error"]


FIXTURES = Path(__file__).parents[1] / "fixtures" / "formats"
PROGRAMS = [  # the fixture's three problems: sum of two numbers, 1 + ... + n, reverse a line
    "```python\na,b=map(int,input().split())\nprint(a+b)\n```",
    "```python\nn=int(input())\nprint(n*(n+1)//2)\n```",
    "```python\nprint(input()[::-1])\n```",
]


@pytest.mark.slow
def test_code_grpo_on_nemotron_rows_runs_programs_in_the_sandbox(tiny_model_dir: Path, tmp_path: Path):
    """Nemotron-RL rows, detected and converted; a warm-started tiny model writes programs that the
    built-in code reward runs in the sandbox, some passing, some not."""
    from rlstack.data.formats import normalize_rows
    from rlstack.data.readers import read_rows

    raw, where = read_rows(str(FIXTURES / "nemotron_code.jsonl"))
    rows = normalize_rows(raw, where, "auto")
    sft_rows = tmp_path / "sft.jsonl"
    sft_rows.write_text(
        "".join(json.dumps({"problem": r["problem"], "answer": p}) + "\n" for r, p in zip(rows, PROGRAMS))
    )
    sizes = ["data.rollout_batch_size=3", "worker.actor.global_batch_size=3", "data.max_prompt_length=256"]
    sft = load_config(
        _common(
            tiny_model_dir,
            tmp_path,
            *sizes,
            f"data.train_files={sft_rows}",
            "data.max_response_length=64",
            "worker.actor.micro_batch_size_per_device_for_update=3",
            "worker.actor.optim.lr=3e-3",
            "trainer.max_steps=150",
            "trainer.experiment_name=sft",
        )
    )
    model = run_sft(sft)
    cfg = load_config(
        _common(
            model,
            tmp_path,
            *sizes,
            f"data.train_files={FIXTURES / 'nemotron_code.jsonl'}",
            "data.max_response_length=64",
            "worker.rollout.n=4",
            "worker.actor.micro_batch_size_per_device_for_update=12",
            "worker.actor.optim.lr=1e-4",
            "worker.reward.reward_function=builtin:code",
            "worker.reward.num_workers=2",
            "worker.reward.code.test_time_s=2",
            "trainer.max_steps=2",
            "trainer.total_epochs=2",
            "trainer.train_generations_to_log=12",
            "trainer.save_model_only=true",
        )
    )
    trainer = Trainer(cfg)
    assert set(trainer.train_set.items[0]["ground_truth"]) == {"inputs", "outputs"}
    trainer.fit()
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    metrics = {json.loads(line)["step"]: json.loads(line) for line in lines}
    assert {"reward/overall", "reward/pass_rate"} <= set(metrics[2])
    statuses = []
    for step in (1, 2):
        for line in (cfg.run_dir / "generations" / f"train_step_{step}.jsonl").read_text().splitlines():
            row = json.loads(line)
            statuses.append(row["reward_info"]["status"])
            assert (row["reward_info"]["status"] == "passed") == (row["score"] == 1.0), row
    assert "passed" in statuses  # programs really ran and passed in the sandbox
    assert max(metrics[s]["reward/pass_rate"] for s in (1, 2)) > 0


def test_a_judge_outage_is_said_once_and_its_end_too(capsys):
    """The run goes on under on_error=score: one line when the judge starts failing, none while it stays
    down, one when it answers again."""
    server = JudgeServer(default=lambda body: ("status", 503))
    cfg = load_config(scored_judge(server))
    manager = RewardManager.of(cfg.worker.reward, max_response_length=16)
    try:
        for word in ("Mon", "Tue"):  # two steps of an outage
            manager.score(make_batch([f"<answer>{word}</answer>"], ["Monday"]))
            assert manager.pop_metrics()["reward/judge_errors"] == 1.0
        server.default = lambda body: ("ok", "Judgement: 1")
        manager.score(make_batch(["<answer>Wed</answer>"], ["Monday"]))
        assert manager.pop_metrics() == {"reward/judge_calls": 1.0, "reward/judge_errors": 0.0}
    finally:
        manager.close()
        server.stop()
    lines = [line for line in capsys.readouterr().err.splitlines() if "[rlstack] judge" in line]
    assert len(lines) == 2, lines
    assert f"judge {server.url} failed for 1 of 1 samples (" in lines[0] and "after 2 attempt(s))" in lines[0]
    assert "503" in lines[0] and "on_error=score" in lines[0]
    assert (
        lines[1] == f"[rlstack] judge {server.url} answers again (2 samples were scored 0.0 while it failed)"
    )
