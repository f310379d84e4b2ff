"""`rlstack board` over finished runs, looked at in headless Chromium: the curves render, an agent
trajectory's turns, code, output and images appear, and the filters filter. Screenshots of each view
are saved under `outputs/board_screenshots/` for a person to look at.

Without a Chromium the browser test is skipped with the reason (pytest prints it: `-rs` in the
project's pytest options); `.ci/run` installs Debian's `chromium` package so that CI runs it.
"""

from __future__ import annotations

import json
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
    if screenshot:
        SHOTS.mkdir(parents=True, exist_ok=True)
        subprocess.run([*args, f"--screenshot={SHOTS / screenshot}", url], capture_output=True, timeout=120)
    out = subprocess.run([*args, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert 'data-ready="true"' in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
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
