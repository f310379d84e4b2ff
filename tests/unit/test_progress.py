"""Progress shows whatever the loggers: a bar on a terminal, one line every few steps elsewhere."""

from __future__ import annotations

import io

from rlstack.tracking import Tracker


def test_without_a_terminal_a_line_every_few_steps_even_with_the_file_logger_alone(tmp_path, capsys):
    tracker = Tracker(tmp_path, ["file"], {}, "p", "e", total_steps=7, progress_every=3)
    assert tracker.progress.bar is None  # pytest's stderr is not a terminal
    for step in range(1, 8):
        tracker.log({"critic/score/mean": 0.5, "actor/pg_loss": 0.1}, step)
    tracker.close()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[2] for line in lines] == ["1/7", "3/7", "6/7", "7/7"]
    assert "score" not in lines[0]  # the metrics come with the console logger


def test_the_console_logger_adds_the_main_metrics_and_the_default_is_about_twenty_lines(tmp_path, capsys):
    tracker = Tracker(tmp_path, ["console"], {}, "p", "e", total_steps=100)
    for step in range(1, 101):
        tracker.log({"critic/score/mean": 0.25}, step)
    lines = capsys.readouterr().err.splitlines()
    assert 20 <= len(lines) <= 22 and "score=0.25" in lines[-1] and "100/100" in lines[-1]


def test_a_terminal_gets_a_progress_bar(tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    tracker = Tracker(tmp_path, ["file"], {}, "p", "exp", total_steps=4)
    tracker.log({"critic/score/mean": 1.0}, 1)
    tracker.close()
    assert (
        tracker.progress.bar is not None
        and "exp" in terminal.getvalue()
        and "[rlstack] step" not in terminal.getvalue()
    )
