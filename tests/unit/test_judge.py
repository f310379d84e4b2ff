"""The LLM judge client against a real local HTTP server speaking the OpenAI chat-completions protocol."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from judge_server import JudgeServer

from rlstack.errors import RLStackError
from rlstack.rewards.judge import (
    JudgeClient,
    JudgeConfig,
    JudgeError,
    JudgeItem,
    JudgeUnavailable,
    UnparseableVerdict,
    parse_consistency,
    parse_rubric,
    parse_score_0_10,
    parse_verifier,
    parse_yes_no,
)


@pytest.fixture
def server():
    s = JudgeServer()
    yield s
    s.stop()


def make_client(server: JudgeServer, **overrides) -> JudgeClient:
    config = dict(
        base_url=server.url, model="judge", timeout=2.0, max_attempts=3, backoff_base=0.01, backoff_max=0.02
    )
    config.update(overrides)
    return JudgeClient(JudgeConfig(**config))


def item(i: int = 0, template: str = "consistency") -> JudgeItem:
    return JudgeItem(f"What is {i} + {i}?", str(2 * i), f"The answer is {2 * i}.", template)


# ---------------------------------------------------------------------------------------------------------
# Parsing realistic judge replies


@pytest.mark.parametrize(
    "text, verdict",
    [
        ("Judgement: 1", "1"),
        ("judgement: 0", "0"),
        ("The candidate says 7, the reference is 7. Judgement: 1.", "1"),
        ("Both answers name Canberra.\n\n**Judgement:** 1", "1"),
        ("JUDGMENT - 0", "0"),
        ("1", "1"),
        (" 0.\n", "0"),
        ("Judgement: 0 ... wait, they match after simplification. Judgement: 1", "1"),
    ],
)
def test_parse_consistency(text, verdict):
    assert parse_consistency(text) == (verdict, float(verdict))


@pytest.mark.parametrize(
    "text", ["The answers match.", "Judgement: yes", "Judgement: 10", "Judgement: 0.5", "", "I think 1 or 0"]
)
def test_parse_consistency_rejects(text):
    with pytest.raises(UnparseableVerdict):
        parse_consistency(text)


@pytest.mark.parametrize(
    "text, verdict",
    [
        ("TRUE", "TRUE"),
        ("false", "FALSE"),
        ("TRUE.", "TRUE"),
        ("**False**", "FALSE"),
        ("The response gives 3/4, which equals the reference 0.75, so it is True.", "TRUE"),
        ("It is not true that 5 = 6.\nVerdict: FALSE", "FALSE"),
    ],
)
def test_parse_verifier(text, verdict):
    assert parse_verifier(text) == (verdict, float(verdict == "TRUE"))


@pytest.mark.parametrize("text", ["Correct", "TRUE or FALSE, hard to say", "", "yes"])
def test_parse_verifier_rejects(text):
    with pytest.raises(UnparseableVerdict):
        parse_verifier(text)


@pytest.mark.parametrize(
    "text, score",
    [
        ("0.8", 0.8),
        ("Score: 1", 1.0),
        ("score: .25", 0.25),
        ("The response meets 3 of the 4 rubric items but misses the edge case.\nScore: 0.75.", 0.75),
        ("**Score**: 0", 0.0),
    ],
)
def test_parse_rubric(text, score):
    verdict, got = parse_rubric(text)
    assert got == pytest.approx(score) and float(verdict) == pytest.approx(score)


@pytest.mark.parametrize("text", ["Score: 8", "Score: 1.5", "good answer", "It meets 3 of 4 items", ""])
def test_parse_rubric_rejects(text):
    with pytest.raises(UnparseableVerdict):
        parse_rubric(text)


def test_templates_end_to_end(server):
    """Each template's prompt reaches the server and its reply is parsed into a score."""
    replies = {"Reference answer: 4\nCandidate": "Judgement: 0", "TRUE if": "TRUE.", "Rubric:": "Score: 0.6"}

    def default(body):
        prompt = body["messages"][-1]["content"]
        return ("ok", next(r for key, r in replies.items() if key in prompt))

    server.default = default
    with make_client(server) as client:
        results = client.judge_batch(
            [
                JudgeItem("What is 2 + 2?", "4", "5", "consistency"),
                JudgeItem("What is 2 + 2?", "4", "four", "verifier"),
                JudgeItem("Write a haiku.", "- 3 lines\n- 5/7/5 syllables", "old pond...", "rubric"),
            ]
        )
    assert [(r.verdict, r.score) for r in results] == [("0", 0.0), ("TRUE", 1.0), ("0.6", 0.6)]
    prompts = [r["messages"][-1]["content"] for r in server.chat_requests]
    few_shot = [p for p in prompts if "Examples:" in p]
    assert len(few_shot) == 1 and few_shot[0].count("Judgement:") >= 4


def test_unknown_template_is_a_clear_error(server):
    with make_client(server) as client, pytest.raises(JudgeError, match="must be one of"):
        client.judge_batch([JudgeItem("q", "a", "r", "likert")])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# Endpoint, model and cache


def test_model_discovery_and_env_base_url(server, monkeypatch):
    monkeypatch.setenv("LLM_AS_A_JUDGE_BASE", server.url)
    with JudgeClient(JudgeConfig(backoff_base=0.01)) as client:
        assert client.judge(item(1)).score == 1.0
        client.judge(item(2))
    assert server.model_requests == 1
    assert [r["model"] for r in server.chat_requests] == ["judge-72b", "judge-72b"]


def test_missing_endpoint_says_how_to_fix(monkeypatch):
    monkeypatch.delenv("LLM_AS_A_JUDGE_BASE", raising=False)
    with pytest.raises(RLStackError, match="LLM_AS_A_JUDGE_BASE"):
        JudgeClient(JudgeConfig())


def test_cache_sends_each_triple_once(server):
    with make_client(server, max_concurrency=4) as client:
        first = client.judge_batch([item(1), item(1), item(2)] + [item(3)] * 8)
        assert len(server.chat_requests) == 3
        assert [r.cached for r in first[:3]] == [False, True, False]
        assert sum(not r.cached for r in first[3:]) == 1 and first[4].attempts == 0
        again = client.judge_batch([item(1), item(2)])
        assert len(server.chat_requests) == 3
        assert all(r.cached and r.score == 1.0 for r in again)
        # a different template on the same triple is a different judgement
        client.judge(replace(item(1), template="rubric"))
        assert len(server.chat_requests) == 4


def test_concurrency_is_bounded(server):
    server.default = lambda body: ("sleep", 0.05, "Judgement: 1")
    with make_client(server, max_concurrency=3) as client:
        results = client.judge_batch([item(i) for i in range(12)])
    assert all(r.score == 1.0 and r.attempts == 1 for r in results)
    assert len(server.chat_requests) == 12
    assert 2 <= server.max_in_flight <= 3


# ---------------------------------------------------------------------------------------------------------
# Faults


def test_http_500_is_retried(server):
    server.script = [("status", 500), ("status", 503), ("ok", "Judgement: 1")]
    with make_client(server, max_attempts=4) as client:
        result = client.judge(item())
    assert (result.score, result.attempts, result.error) == (1.0, 3, None)
    assert len(server.chat_requests) == 3


def test_http_4xx_is_not_retried(server):
    server.script = [("status", 404)]
    with make_client(server, max_attempts=4) as client, pytest.raises(JudgeUnavailable, match="HTTP 404"):
        client.judge(item())
    assert len(server.chat_requests) == 1


def test_timeout_is_retried(server):
    server.script = [("sleep", 1.0, "Judgement: 0"), ("ok", "Judgement: 1")]
    with make_client(server, timeout=0.2) as client:
        start = time.monotonic()
        result = client.judge(item())
    assert (result.score, result.attempts) == (1.0, 2)
    assert time.monotonic() - start < 0.9


def test_malformed_json_is_retried(server):
    server.script = [("malformed",), ("ok", "Judgement: 1")]
    with make_client(server) as client:
        result = client.judge(item())
    assert (result.score, result.attempts) == (1.0, 2)


def test_unparseable_verdict_is_retried(server):
    server.script = [("ok", "The two answers look similar to me."), ("ok", "Judgement: 0")]
    with make_client(server) as client:
        result = client.judge(item())
    assert (result.verdict, result.score, result.attempts) == ("0", 0.0, 2)


def test_unparseable_every_time_follows_failure_policy(server):
    server.default = lambda body: ("ok", "no idea")
    with make_client(server, on_error="score", error_score=-1.0) as client:
        result = client.judge(item())
        assert client.errors == 1
    assert (result.verdict, result.score, result.attempts) == (None, -1.0, 3)
    assert "UnparseableVerdict" in result.error and "no idea" in result.error


def test_backoff_is_exponential_capped_and_seeded(server):
    delays = []
    for _ in range(2):
        client = make_client(server, backoff_base=1.0, backoff_max=3.0, seed=7)
        delays.append([client._backoff(k) for k in range(1, 5)])
        client.close()
    assert delays[0] == delays[1]
    for k, d in enumerate(delays[0], start=1):
        cap = min(3.0, 2 ** (k - 1))
        assert cap / 2 <= d <= cap


def test_server_gone_mid_run_raises_naming_endpoint_and_sample(server):
    server.script = [("ok", "Judgement: 1"), ("drop",)]
    with make_client(server, max_concurrency=1) as client, pytest.raises(JudgeUnavailable) as info:
        client.judge_batch([item(i) for i in range(4)])
    message = str(info.value)
    assert server.url in message and "sample 1" in message and "What is 1 + 1?" in message
    assert "on_error=score" in message


def test_server_gone_mid_run_scores_and_counts(server):
    server.script = [("ok", "Judgement: 1"), ("drop",)]
    with make_client(server, max_concurrency=1, on_error="score", error_score=0.0) as client:
        results = client.judge_batch([item(i) for i in range(4)])
        assert [r.score for r in results] == [1.0, 0.0, 0.0, 0.0]
        assert results[0].error is None and all(r.error and r.verdict is None for r in results[1:])
        assert all(r.attempts == 3 for r in results[1:])
        assert client.errors == 3


def test_failures_are_not_cached(server):
    server.default = lambda body: ("status", 500)
    with make_client(server, on_error="score") as client:
        assert client.judge(item()).error.startswith("HTTP 500")
        server.default = lambda body: ("ok", "Judgement: 1")
        result = client.judge(item())
    assert (result.score, result.cached, result.attempts) == (1.0, False, 1)
    assert len(server.chat_requests) == 4


# ---------------------------------------------------------------------------------------------------------
# Images for a vision-language judge


def _image(colour: str):
    from PIL import Image

    return Image.new("RGB", (8, 6), colour)


def test_images_go_before_the_text_as_data_urls_and_are_part_of_the_cache_key(server):
    import base64
    import io

    from PIL import Image

    from rlstack.rewards.judge import png_images

    red, blue = png_images([_image("red")]), png_images([_image("blue"), _image("red")])
    with make_client(server) as client:
        plain = client.judge(item(1))
        with_red = client.judge(replace(item(1), images=red))
        with_blue = client.judge(replace(item(1), images=blue))
        again = client.judge(replace(item(1), images=png_images([_image("red")])))
    assert not plain.cached and not with_red.cached and not with_blue.cached and again.cached
    # the cache keeps the images' digest, not the images (a run judges many)
    assert all(not isinstance(part, bytes) for key in client._cache for part in key)
    assert len(server.chat_requests) == 3
    text_only, red_request, blue_request = (r["messages"][-1]["content"] for r in server.chat_requests)
    assert isinstance(text_only, str)
    assert [p["type"] for p in red_request] == ["image_url", "text"]
    assert red_request[-1]["text"] == text_only  # the same prompt, after the images
    assert [p["type"] for p in blue_request] == ["image_url", "image_url", "text"]
    url = blue_request[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    decoded = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert decoded.size == (8, 6) and decoded.getpixel((0, 0)) == (0, 0, 255)


def test_a_failing_sample_with_images_says_how_many(server):
    from rlstack.rewards.judge import png_images

    server.default = lambda body: ("status", 400)
    with (
        make_client(server) as client,
        pytest.raises(JudgeUnavailable, match=r"response='The answer is 2.', 1 image"),
    ):
        client.judge(replace(item(1), images=png_images([_image("red")])))


# ---------------------------------------------------------------------------------------------------------
# A template of the user's, and the parser of the judge's reply


@pytest.mark.parametrize(
    "text, verdict",
    [
        ("YES", "YES"),
        ("no.", "NO"),
        ("The units differ, so the answer is wrong. Verdict: No", "NO"),
        ("Yes!", "YES"),
    ],
)
def test_parse_yes_no(text, verdict):
    assert parse_yes_no(text) == (verdict, float(verdict == "YES"))


@pytest.mark.parametrize("text", ["yes or no, hard to say", "maybe", ""])
def test_parse_yes_no_rejects(text):
    with pytest.raises(UnparseableVerdict):
        parse_yes_no(text)


@pytest.mark.parametrize(
    "text, score",
    [
        ("Score: 7", 0.7),
        ("10", 1.0),
        ("**Score**: 2.5/10", 0.25),
        ("Score: 11", None),
        ("between 6 and 8", None),
    ],
)
def test_parse_score_0_10(text, score):
    if score is None:
        with pytest.raises(UnparseableVerdict):
            parse_score_0_10(text)
    else:
        assert parse_score_0_10(text)[1] == pytest.approx(score)


def test_the_named_parsers_and_templates_are_those_the_config_offers():
    from rlstack.config.reward import JUDGE_PARSERS, JUDGE_TEMPLATES
    from rlstack.rewards.judge import PARSERS, TEMPLATES

    assert tuple(PARSERS) == JUDGE_PARSERS and tuple(TEMPLATES) == JUDGE_TEMPLATES


def test_a_jinja_template_file_read_by_a_named_parser(server, tmp_path):
    template = tmp_path / "grade.jinja"
    template.write_text("Grade from 0 to 10.\nQ: {{ question }}\nGold: {{ reference }}\nA: {{ response }}\n")
    server.default = lambda body: ("ok", "Mostly right. Score: 8")
    with make_client(server, template=str(template), parser="score_0_10") as client:
        result = client.judge(JudgeItem("What is 2 + 2?", "4", "four-ish", str(template)))
    assert (result.verdict, result.score) == ("8", 0.8)
    (request,) = server.chat_requests
    assert request["messages"] == [
        {"role": "user", "content": "Grade from 0 to 10.\nQ: What is 2 + 2?\nGold: 4\nA: four-ish"}
    ]


def test_a_built_in_template_with_another_named_parser(server):
    server.default = lambda body: ("ok", "yes")
    with make_client(server, template="verifier", parser="yes_no") as client:
        assert client.judge(item(1, "verifier")).verdict == "YES"


def test_a_template_file_with_an_unknown_name_fails_at_load(server, tmp_path):
    template = tmp_path / "bad.jinja"
    template.write_text("Q: {{ question }} A: {{ answer }}")
    with pytest.raises(
        JudgeError, match=r"'answer' is undefined; a judge template has question, reference and response"
    ):
        make_client(server, template=str(template), parser="yes_no")
    with pytest.raises(JudgeError, match="is a file: name how its verdict is read"):
        make_client(server, template=str(template))


def test_a_users_parser_reads_the_reply_and_none_means_no_verdict(server, tmp_path):
    parser = tmp_path / "stars.py"
    parser.write_text(
        "def stars(reply):\n    if '*' not in reply:\n        return None\n    return reply.count('*') / 5\n"
    )
    server.script = [("ok", "no stars here"), ("ok", "***")]  # the first reply holds no verdict: retried
    with make_client(server, parser=f"{parser}:stars") as client:
        result = client.judge(item(1))
    assert (result.verdict, result.score, result.attempts) == ("0.6", 0.6, 2)
    server.default = lambda body: ("ok", "never")
    with make_client(server, parser=f"{parser}:stars", on_error="score", error_score=-1.0) as client:
        failed = client.judge(item(2))
    assert failed.score == -1.0 and f"parser {parser}:stars returned None, not a score" in failed.error


# ---------------------------------------------------------------------------------------------------------
# The check at the start of a run


def test_the_check_asks_for_the_models_and_one_token_and_keeps_the_model_it_found(server):
    with JudgeClient(JudgeConfig(base_url=server.url, backoff_base=0.01)) as client:
        client.check()
        assert server.model_requests == 1 and len(server.chat_requests) == 1
        (ping,) = server.chat_requests
        assert ping["model"] == "judge-72b" and ping["max_tokens"] == 1
        client.judge(item(1))
    assert server.model_requests == 1  # the judging that follows does not ask again


def test_a_check_that_cannot_reach_the_judge_names_the_url_and_what_failed(server):
    url = server.url
    server.stop()
    client = JudgeClient(JudgeConfig(base_url=url, max_attempts=2, backoff_base=0.01))
    with pytest.raises(JudgeError) as info:
        client.check()
    client.close()
    message = str(info.value)
    assert f"GET {url}/models failed after 2 attempt(s): APIConnectionError" in message
    assert "from host" in message and "check_at_start=false" in message


def test_a_check_whose_completion_is_refused_says_so(server):
    server.script = [("status", 401)]
    with make_client(server) as client, pytest.raises(JudgeError) as info:
        client.check()
    message = str(info.value)
    assert f"POST {server.url}/chat/completions (model 'judge'; it lists ['judge-72b']) failed" in message
    assert "after 1 attempt(s): HTTP 401" in message  # a 4xx is not retried


# ---------------------------------------------------------------------------------------------------------
# The judge's keys at load (offline: nothing is asked of the endpoint there)


def test_the_template_and_parser_keys_are_checked_at_load(tmp_path, monkeypatch):
    from rlstack.config import ConfigError, load_config

    monkeypatch.delenv("LLM_AS_A_JUDGE_BASE", raising=False)
    template = tmp_path / "grade.jinja"
    template.write_text("{{ question }} {{ response }}")
    with pytest.raises(ConfigError) as info:
        load_config(
            [
                "worker.reward.reward_function=builtin:judge",
                f"worker.reward.judge.template={template}",
                "worker.reward.judge.parser=score_1_5",
            ]
        )
    problems = str(info.value)
    assert "builtin:judge needs a judge endpoint: set worker.reward.judge.base_url" in problems
    assert (
        "worker.reward.judge.parser='score_1_5': must be one of judgement_0_1, true_false, yes_no" in problems
    )
    with pytest.raises(ConfigError) as info:
        load_config(["worker.reward.judge.template=likert", "worker.reward.judge.parser=missing.py:fn"])
    problems = str(info.value)
    assert (
        "worker.reward.judge.template='likert': neither a built-in (consistency, verifier, rubric) nor a file"
        in problems
    )
    assert "worker.reward.judge.parser: 'missing.py' does not exist (looked for" in problems
    with pytest.raises(ConfigError, match="is a file: name how the judge's reply is read as a score"):
        load_config([f"worker.reward.judge.template={template}"])
    cfg = load_config(
        [
            "worker.reward.reward_function=builtin:judge",
            "worker.reward.judge.base_url=http://judge:18901/v1",
            f"worker.reward.judge.template={template}",
            "worker.reward.judge.parser=yes_no",
        ]
    )
    assert cfg.worker.reward.judge.check_at_start  # on unless turned off


def test_a_loopback_judge_url_with_several_nodes_is_said_at_load(monkeypatch, capsys):
    from rlstack.config import load_config

    monkeypatch.delenv("LLM_AS_A_JUDGE_BASE", raising=False)
    ray = ["trainer.backend=ray", "trainer.nnodes=2", "worker.reward.reward_function=builtin:judge"]
    load_config([*ray, "worker.reward.judge.base_url=http://127.0.0.1:18901/v1"])
    err = capsys.readouterr().err
    assert (
        "[rlstack] note: worker.reward.judge.base_url=http://127.0.0.1:18901/v1 is this machine, but with "
        in err
    )
    assert "trainer.nnodes=2 the reward actors (worker.reward.num_workers=1) may run on other nodes" in err
    monkeypatch.setenv("LLM_AS_A_JUDGE_BASE", "http://localhost:18901/v1")
    load_config(ray)
    assert "note: LLM_AS_A_JUDGE_BASE=http://localhost:18901/v1 is this machine" in capsys.readouterr().err
    for quiet in (
        [*ray, "worker.reward.judge.base_url=http://10.0.0.5:18901/v1"],  # an address other nodes reach
        [*ray[1:], "trainer.backend=ray", "trainer.nnodes=1"],  # one node
        [*ray, "worker.reward.num_workers=0"],  # the driver scores
    ):
        load_config(quiet)
        assert "is this machine" not in capsys.readouterr().err, quiet
