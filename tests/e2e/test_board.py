"""`rlstack board` over finished runs, looked at in headless Chromium: the curves render, an agent
trajectory's turns, code, output and images appear, and the filters filter. Screenshots of each view
are saved under `outputs/board_screenshots/` for a person to look at.

A folder of written-out runs (`outputs`, below) holds what a real run leaves in odd corners: forty-odd
metrics in groups, a run from before metrics.jsonl had timestamps, a tool reply dropped for length and
an answer of newlines.

Without a Chromium the browser test is skipped with the reason (pytest prints it: `-rs` in the
project's pytest options); `.ci/run` installs Debian's `chromium` package so that CI runs it.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from urllib.request import urlopen

import pytest
from digits_run import digits_run

from rlstack.board import Board
from rlstack.errors import RLStackError
from rlstack.trainer import Trainer

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
SHOTS = Path(__file__).resolve().parents[2] / "outputs" / "board_screenshots"
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="the board's browser test was NOT run: no Chromium on this machine (Debian: apt-get install chromium)",
)


def browse(url: str, screenshot: str | None = None) -> str:
    """The page's DOM after its scripts ran (and a screenshot of it under SHOTS)."""
    args = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000"]
    args += ["--window-size=1400,1800", "--hide-scrollbars"]
    if screenshot:  # taken in the same visit as the DOM
        SHOTS.mkdir(parents=True, exist_ok=True)
        args.append(f"--screenshot={SHOTS / screenshot}")
    out = subprocess.run([*args, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert 'data-ready="true"' in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    assert not screenshot or (SHOTS / screenshot).is_file(), out.stderr[-2000:]
    return out.stdout


@pytest.fixture(scope="module")
def runs(agent_run, tiny_model_dir, tmp_path_factory):
    """The finished agent run (images, turns) and a text run beside it, to overlay."""
    text = digits_run(tiny_model_dir, tmp_path_factory.mktemp("text_run"), "text", steps=3)
    Trainer(text).fit()
    return [agent_run[0].run_dir, text.run_dir]


@pytest.fixture(scope="module")
def board(runs):
    board = Board(runs, port=0).start()
    yield board
    board.stop()


def rows_of(run_dir: Path, step: int) -> list[dict]:
    lines = (run_dir / "generations" / f"train_step_{step}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_the_api_serves_the_runs_files(board, runs):
    runs_listed = json.load(urlopen(board.url + "api/runs"))
    assert [r["path"] for r in runs_listed] == [str(r) for r in runs]
    metrics = json.load(urlopen(board.url + "api/run/0/metrics"))
    assert [m["step"] for m in metrics] == [1, 2]
    files = json.load(urlopen(board.url + "api/run/0/generations"))
    assert [(f["kind"], f["step"]) for f in files] == [("train", 1), ("train", 2)]
    image = next(p for r in rows_of(runs[0], 1) for p in r.get("tool_images", []))
    assert urlopen(f"{board.url}run/0/{image}").read()[:4] == b"\x89PNG"
    with pytest.raises(Exception, match="404"):
        urlopen(board.url + "run/0/../metrics.jsonl")


def test_a_folder_that_is_not_a_run_is_refused_with_the_fix(tmp_path: Path):
    with pytest.raises(RLStackError, match="neither metrics.jsonl nor generations"):
        Board([tmp_path], port=0)


def test_a_port_in_use_is_one_clear_message(board, runs):
    port = board.server.server_address[1]
    with pytest.raises(RLStackError, match=f"cannot listen on 127.0.0.1:{port}.*another --port"):
        Board(runs, port=port)


@needs_chromium
def test_curves_render_with_the_runs_overlaid(board):
    dom = browse(board.url + "?tab=curves", screenshot="curves.png")
    charts = re.findall(r'data-metric="([^"]+)"', dom)
    assert "critic/score/mean" in charts and "agent/tool_calls/mean" in charts
    assert dom.count('class="scatterlayer mlayer"') >= len(charts)  # Plotly drew each chart
    score_chart = dom.split('data-metric="critic/score/mean"')[1].split('data-metric="')[0]
    assert score_chart.count('class="trace scatter') == 2  # both runs on one chart
    filtered = browse(board.url + "?tab=curves&metrics=actor/")
    logged = {
        k for run in (0, 1) for row in json.load(urlopen(f"{board.url}api/run/{run}/metrics")) for k in row
    }
    assert set(re.findall(r'data-metric="([^"]+)"', filtered)) == {k for k in logged if "actor/" in k}


@needs_chromium
def test_an_agent_trajectory_shows_its_turns_code_output_and_images(board, runs):
    rows = rows_of(runs[0], 2)
    dom = browse(board.url + "?tab=rollouts&run=0&kind=train&step=2", screenshot="rollouts.png")
    assert f"{len(rows)} of {len(rows)} trajectories" in dom
    assert dom.count('class="card trajectory"') == len(rows)
    assert 'class="turn assistant"' in dom and 'class="turn tool' in dom
    code = next(
        t["tool_call"]["arguments"]["code"]
        for r in rows
        for t in r["turns"]
        if "name" in t.get("tool_call", {}) and "code" in t["tool_call"]["arguments"]
    )
    assert _html(code.strip().splitlines()[0]) in dom  # the program the model wrote
    output = next(t["text"] for r in rows for t in r["turns"] if t["role"] == "tool" and t["text"].strip())
    assert _html(output.strip().splitlines()[0]) in dom  # what the tool printed
    shown = set(re.findall(r'<img class="shot" src="/run/0/(images/[0-9a-f]+\.png)"', dom))
    made = {p for r in rows for p in r.get("tool_images", [])}
    given = {p for r in rows for p in r.get("images", [])}
    assert made and made <= shown and given <= shown  # the tools' pictures and the prompts'
    assert any(p.startswith("/run/0/images/") for p in board.requests)  # the browser fetched them


@needs_chromium
def test_filters_select_trajectories(board, runs):
    rows = rows_of(runs[0], 2)
    reason = rows[0]["end_reason"]
    dom = browse(board.url + f"?tab=rollouts&run=0&kind=train&step=2&end_reason={reason}")
    expected = sum(r["end_reason"] == reason for r in rows)
    assert f"{expected} of {len(rows)} trajectories" in dom
    assert set(re.findall(r'data-end-reason="([^"]*)"', dom)) == {reason}
    cut = sorted(r["score"] for r in rows)[len(rows) // 2]
    dom = browse(
        board.url + f"?tab=rollouts&run=0&kind=train&step=2&min_score={cut}", screenshot="filtered.png"
    )
    expected = sum(r["score"] >= cut for r in rows)
    assert 0 < expected < len(rows) or cut == min(r["score"] for r in rows)
    assert f"{expected} of {len(rows)} trajectories" in dom
    dom = browse(board.url + "?tab=rollouts&run=0&kind=train&step=2&min_score=1000")
    assert f"0 of {len(rows)} trajectories" in dom


@needs_chromium
def test_the_config_tab_shows_the_runs_config(board, runs):
    dom = browse(board.url + "?tab=config", screenshot="config.png")
    assert "worker:" in dom and "builtin:visual@test" in dom


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@needs_chromium
def test_the_page_follows_a_run_as_it_is_written(runs):
    """The page polls: a metrics file that grows after the page loaded shows its new step."""
    from rlstack.board import _json, read_jsonl

    board = Board(runs[:1], port=0)
    calls = []
    answer = board._run

    def growing(prefix, run_dir, rest):
        if rest == ["metrics"]:  # the first read sees step 1 only, later reads the whole file
            calls.append(1)
            rows = read_jsonl(run_dir / "metrics.jsonl")
            return _json(rows[:1] if len(calls) == 1 else rows)
        return answer(prefix, run_dir, rest)

    board._run = growing
    board.start()
    try:
        dom = browse(board.url + "?tab=curves&metrics=critic/score/mean")
    finally:
        board.stop()
    assert len(calls) >= 2
    chart = dom.split('data-metric="critic/score/mean"')[1]
    assert chart.count('class="point"') == 2  # steps 1 and 2: the poll redrew the curve


def test_each_metrics_row_records_when_it_was_written(runs):
    rows = [json.loads(line) for line in (runs[1] / "metrics.jsonl").read_text().splitlines()]
    times = [r["timestamp"] for r in rows]
    assert all(isinstance(t, float) for t in times) and times == sorted(times)
    assert abs(times[-1] - (runs[1] / "metrics.jsonl").stat().st_mtime) < 60


# --------------------------------------------------------------------------------------------------
# A folder of written-out runs

GROUPS = {
    "actor": ["entropy", "grad_norm", "lr", "pg_clipfrac", "pg_loss", "ppo_kl"],
    "critic": ["score/mean", "score/max", "score/min", "advantages/mean"],
    "reward": ["accuracy", "overall", "format"],
    "response_length": ["mean", "max", "clip_ratio"],
    "val": ["reward_score", "addition/accuracy"],
    "timing_s": ["gen", "reward", "adv", "update_actor", "step", "sync"],
    "perf": ["throughput", "max_rss_gb", "time_per_step"],
    "prompt_length": ["mean", "max", "min"],
    "rollout": ["weight_sync_max_diff"],
}
METRICS = [f"{g}/{m}" for g, names in GROUPS.items() for m in names]
OPEN = {"actor", "critic", "reward", "response_length", "val"}


def _metrics_rows(timestamps: bool, shift: float) -> list[dict]:
    rows = []
    for step in range(1, 13):
        row: dict = {"step": step, "timestamp": 1.7e9 + 30.0 * step} if timestamps else {"step": step}
        for i, name in enumerate(METRICS):
            if name.startswith("val/") and step not in (10, 12):
                continue
            row[name] = shift + math.sin(step + i) + 0.1 * step
        row["actor/lr"] = 10.0 ** (step / 2 - 7)  # 1e-6.5 .. 1e-1: six decades
        rows.append(row)
    return rows


def _write_run(d: Path, rows: list[dict], generations: list[dict] | None = None) -> Path:
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "config.yaml").write_text("trainer:\n  max_steps: 12\n")
    if generations is not None:
        (d / "generations").mkdir()
        text = "".join(json.dumps(r) + "\n" for r in generations)
        (d / "generations" / "train_step_12.jsonl").write_text(text)
    return d


def _row(uid: str, end_reason: str, **fields) -> dict:
    row = {"step": 12, "uid": uid, "prompt": "12+30=", "ground_truth": "42", "score": 0.0}
    return row | {"reward_components": {"overall": 0.0}, "end_reason": end_reason} | fields


CALL = {"name": "python", "arguments": {"code": "print(open('log.txt').read())"}}
GENERATIONS = [
    # a tool reply too long for what was left of the response: kept in the turns, marked dropped
    _row(
        "dropped",
        "over_length",
        response="<code>print(open('log.txt').read())</code>",
        num_turns=1,
        tool_calls=1,
        tool_errors=0,
        num_images=0,
        tool_images=[],
        turns=[
            {"role": "assistant", "text": "<code>print(open('log.txt').read())</code>", "tool_call": CALL},
            {
                "role": "tool",
                "text": "line 1\n" * 40,
                "ok": True,
                "images": [],
                "dropped": {"reason": "over_length", "tokens": 287, "room": 35},
            },
        ],
    ),
    # the same written before turns recorded it: the call is the last turn
    _row(
        "unrecorded",
        "over_length",
        response="<code>print(1)</code>",
        num_turns=1,
        tool_calls=1,
        tool_errors=0,
        num_images=0,
        tool_images=[],
        turns=[{"role": "assistant", "text": "<code>print(1)</code>", "tool_call": CALL}],
    ),
    _row("newlines", "done", response="\n\n\n"),
    _row("empty", "done", response=""),
]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    """`outputs/` with two runs of a project, the older without timestamps, and a folder that is no run."""
    root = tmp_path_factory.mktemp("outputs")
    _write_run(root / "project" / "new", _metrics_rows(timestamps=True, shift=0.0), GENERATIONS)
    _write_run(root / "project" / "old", _metrics_rows(timestamps=False, shift=1.0))
    (root / "project" / "notes").mkdir()
    return root


@pytest.fixture(scope="module")
def folder_board(outputs):
    board = Board([outputs], port=0).start()
    yield board
    board.stop()


def _groups(dom: str) -> dict[str, bool]:
    """Group -> open, in the page's order."""
    return {g: bool(o) for o, g in re.findall(r'class="group( open)?" data-group="([^"]*)"', dom)}


def _charts(dom: str) -> list[str]:
    return re.findall(r'data-metric="([^"]+)"', dom)


def _chart(dom: str, name: str) -> str:
    return dom.split(f'data-metric="{name}"')[1].split('data-metric="')[0]


def _ticks(chart: str, axis: str) -> list[str]:
    labels = re.findall(rf'class="{axis}tick"><text[^>]*>(.*?)</text>', chart)
    return [re.sub(r"<[^>]+>", " ", t) for t in labels]


@needs_chromium
def test_a_folder_of_runs_overlays_them_with_a_legend(folder_board):
    assert [r["name"] for r in json.load(urlopen(folder_board.url + "api/runs"))] == ["new", "old"]
    dom = browse(folder_board.url + "?tab=curves&metrics=critic/score/mean")
    chart = _chart(dom, "critic/score/mean")
    assert chart.count('class="trace scatter') == 2
    assert re.findall(r'class="legendtext"[^>]*>([^<]+)<', chart) == ["new", "old"]


@needs_chromium
def test_every_metric_shows_in_groups_the_common_ones_open(folder_board):
    dom = browse(folder_board.url + "?tab=curves", screenshot="groups.png")
    groups = _groups(dom)
    assert list(groups)[:5] == ["reward", "critic", "actor", "response_length", "val"]  # common first
    assert set(groups) == set(GROUPS) and {g for g, o in groups.items() if o} == OPEN
    drawn = [m for m in METRICS if m.split("/")[0] in OPEN]
    assert sorted(_charts(dom)) == sorted(drawn)  # every metric of the open groups, reward/* and actor/lr too
    closed = len(METRICS) - len(drawn)
    assert f"showing {len(drawn)} of {len(METRICS)} metrics; {closed} in closed groups" in dom
    assert re.search(r"▸ timing_s/ · 6 metrics", dom)  # a closed group says what it holds
    # a click on a group's name flips it (the page's address keeps which)
    dom = browse(folder_board.url + "?tab=curves&toggled=timing_s,actor")
    assert {g for g, o in _groups(dom).items() if o} == OPEN - {"actor"} | {"timing_s"}
    assert "timing_s/sync" in _charts(dom) and "actor/lr" not in _charts(dom)


@needs_chromium
def test_a_filter_says_how_many_metrics_it_hides(folder_board):
    dom = browse(folder_board.url + "?tab=curves&metrics=_length/")
    shown = [m for m in METRICS if "_length/" in m]
    assert sorted(_charts(dom)) == sorted(shown)
    assert set(_groups(dom)) == {"response_length", "prompt_length"}  # the closed group it matches opens
    hidden = len(METRICS) - len(shown)
    assert f"showing {len(shown)} of {len(METRICS)} metrics; {hidden} hidden by the filter" in dom


@needs_chromium
def test_charts_past_the_cap_are_counted_and_can_all_be_drawn(tmp_path):
    rows = [{"step": s} | {f"actor/layer_{i:02d}/grad_norm": i + s for i in range(75)} for s in (1, 2)]
    board = Board([_write_run(tmp_path / "wide", rows)], port=0).start()
    try:
        dom = browse(board.url + "?tab=curves")
        assert len(_charts(dom)) == 60
        assert "showing 60 of 75 metrics; 15 not drawn" in dom
        assert "The open groups hold 75 charts; the first 60 are drawn" in dom and 'id="draw-all"' in dom
        dom = browse(board.url + "?tab=curves&all=1")
        assert len(_charts(dom)) == 75 and "not drawn" not in dom
    finally:
        board.stop()


@needs_chromium
def test_smoothing_draws_an_average_over_the_faint_raw_curve(folder_board):
    raw = _chart(browse(folder_board.url + "?tab=curves&metrics=actor/entropy"), "actor/entropy")
    assert raw.count('class="trace scatter') == 2 and "opacity: 0.25" not in raw
    url = folder_board.url + "?tab=curves&metrics=actor/entropy&smoothing=0.9"
    dom = browse(url, screenshot="smoothed.png")
    chart = _chart(dom, "actor/entropy")
    assert chart.count('class="trace scatter') == 4  # per run: the raw values and their average
    assert chart.count("opacity: 0.25") == 2  # the raw ones faint
    assert re.findall(r'class="legendtext"[^>]*>([^<]+)<', chart) == ["new", "old"]  # one entry a run
    assert 'value="0.9"' in dom or "0.90" in dom


@needs_chromium
def test_log_scale_spans_decades(folder_board):
    def spread(url: str) -> float:
        values = [_number(t) for t in _ticks(_chart(browse(url), "actor/lr"), "y")]
        positive = [v for v in values if v > 0]
        return max(positive) / min(positive)

    assert spread(folder_board.url + "?tab=curves&metrics=actor/lr") < 100  # linear: 0.02, 0.04, ... 0.1
    assert spread(folder_board.url + "?tab=curves&metrics=actor/lr&log=1") >= 1e4


@needs_chromium
def test_steps_are_whole_numbers_and_time_is_an_axis(folder_board):
    dom = browse(folder_board.url + "?tab=curves&metrics=val/reward_score")  # logged at steps 10 and 12
    ticks = _ticks(_chart(dom, "val/reward_score"), "x")
    assert ticks and all(re.fullmatch(r"\d+", t) for t in ticks), ticks
    dom = browse(folder_board.url + "?tab=curves&metrics=critic/score/mean&x=relative")
    chart = _chart(dom, "critic/score/mean")
    assert "time since the run's first row (min)" in chart  # 12 rows 30 s apart
    minutes = [_number(t) for t in _ticks(chart, "x")]
    assert minutes[0] == 0 and minutes == sorted(minutes) and max(minutes) <= 5.5
    assert "No time axis for old: its metrics.jsonl has no timestamps" in dom
    dom = browse(folder_board.url + "?tab=curves&metrics=critic/score/mean&x=wall")
    chart = _chart(dom, "critic/score/mean")
    assert "wall clock" in chart and any(re.search(r"\d\d:\d\d", t) for t in _ticks(chart, "x"))


def _number(tick: str) -> float:
    """A Plotly tick label as a number: `−0.5`, `10.2k`, `100μ`."""
    si = {"k": 1e3, "M": 1e6, "m": 1e-3, "μ": 1e-6, "n": 1e-9, "p": 1e-12}
    tick = tick.strip().replace("−", "-")
    return float(tick[:-1]) * si[tick[-1]] if tick[-1] in si else float(tick)


@needs_chromium
def test_a_tool_reply_dropped_for_length_says_so(folder_board):
    dom = browse(folder_board.url + "?tab=rollouts&run=0&step=12", screenshot="dropped.png")
    assert "4 of 4 trajectories" in dom
    assert (
        "tool output dropped: the response reached its maximum length (data.max_response_length), "
        "287 tokens cut (35 were left); the model never read it"
    ) in dom
    assert dom.count("line 1") == 40  # what the tool said, unread
    assert "no tool output: the response reached its maximum length (data.max_response_length) before" in dom


@needs_chromium
def test_a_response_of_blanks_shows_what_it_holds(folder_board):
    dom = browse(folder_board.url + "?tab=rollouts&run=0&step=12")
    assert "⏎⏎⏎ (3 newlines, no text)" in dom
    assert "∅ (empty, no text)" in dom


@needs_chromium
def test_a_programs_test_results_are_shown_beside_its_score(tmp_path):
    """What the reward function said of an answer (`reward_info`: builtin:code's test status and first
    failure) is on its card; a card without it has none."""
    run = tmp_path / "code_run"
    (run / "generations").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "critic/score/mean": 0.5}) + "\n")
    failed = {"status": "wrong_answer", "reason": "test 2: assert add_three([1]) == [4] failed", "passed": 1}
    rows = [
        {"step": 1, "uid": "0", "prompt": "p", "response": "```python\ndef add_three(xs): ...\n```", "score": 0.25,
         "ground_truth": "", "reward_components": {"accuracy": 0.0}, "reward_info": failed, "end_reason": "done"},
        {"step": 1, "uid": "1", "prompt": "p", "response": "r", "score": 1.0, "ground_truth": "",
         "reward_components": {"accuracy": 1.0}, "reward_info": {}, "end_reason": "done"},
    ]  # fmt: skip
    (run / "generations" / "train_step_1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    board = Board([run], port=0).start()
    try:
        dom = browse(board.url + "?tab=rollouts&run=0&kind=train&step=1")
    finally:
        board.stop()
    assert dom.count('class="reward-info"') == 1
    assert (
        _html("status: wrong_answer · reason: test 2: assert add_three([1]) == [4] failed · passed: 1") in dom
    )
