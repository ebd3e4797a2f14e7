"""Progress off a terminal (issue 28): long commands printed nothing when stderr was not a
terminal (a cold ``npujax lower`` of real models takes 60-120 s). Now: plain lines on stderr,
at most one per ``INTERVAL_S``, plus one when a phase or loop starts and ends."""

from __future__ import annotations

import io
import re
import time

import pytest

from npujax import _progress


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture()
def pipe(monkeypatch):
    """stderr as a pipe (not a terminal) and a clock the test moves. (The stream is patched
    where progress finds it: pytest puts its own sys.stderr back between setup and call.)"""
    stream, clock = io.StringIO(), _Clock()
    monkeypatch.setattr(_progress, "_stream", lambda: stream)
    monkeypatch.setattr(_progress, "clock", clock)
    return stream, clock


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_a_loop_says_when_it_starts_ends_and_at_most_every_interval(pipe):
    stream, clock = pipe
    for _ in _progress.track(range(200), "calibration", enabled=True):
        clock.t += 0.1  # 20 s in all
    lines = _lines(stream)
    assert lines[0] == "npujax: calibration: started, 200 steps"
    assert re.fullmatch(r"npujax: calibration: done, 200/200 \(100 %\) in 20\.0 s", lines[-1])
    middle = lines[1:-1]
    assert 3 <= len(middle) <= 4, lines  # 20 s at most one line per 5 s
    assert middle[0].startswith("npujax: calibration: 50/200 (25 %)")


def test_a_training_loop_reads_the_loss_only_for_its_lines(pipe):
    stream, clock = pipe
    read = []

    class Loss:
        def __float__(self):
            read.append(1)
            return 0.25

    with _progress.progress_bar(True, "QAT", 300) as advance:
        for _ in range(300):
            clock.t += 0.05
            advance(Loss())
    lines = _lines(stream)
    assert lines[0] == "npujax: QAT: started, 300 steps" and "done, 300/300" in lines[-1]
    assert any("loss 0.25" in line for line in lines)
    assert len(read) == len(lines) - 2 <= 3  # a device value waits: read once per line


def test_a_phase_without_steps_says_it_is_still_running(pipe, monkeypatch):
    stream, clock = pipe
    monkeypatch.setattr(_progress, "INTERVAL_S", 0.01)
    with _progress.phase("lower: compiling", enabled=True):
        deadline = time.monotonic() + 5
        while "still running" not in stream.getvalue() and time.monotonic() < deadline:
            clock.t += 1.0
            time.sleep(0.02)
        clock.t += 1.0
    lines = _lines(stream)
    assert lines[0] == "npujax: lower: compiling ..."
    assert any("lower: compiling: still running" in line for line in lines)
    assert re.fullmatch(r"npujax: lower: compiling: done in \d+\.\d s", lines[-1])
    with pytest.raises(KeyError):
        with _progress.phase("import", enabled=True):
            raise KeyError("x")
    assert _lines(stream)[-1].startswith("npujax: import: stopped in")


def test_disabled_progress_prints_nothing_and_a_terminal_gets_no_lines(pipe, monkeypatch):
    stream, _ = pipe
    assert list(_progress.track(range(3), "x", enabled=False)) == [0, 1, 2]
    with _progress.progress_bar(False, "x", 3) as advance, _progress.phase("y", False):
        advance(1.0)
    _progress.note("z", False)
    assert stream.getvalue() == ""
    monkeypatch.setattr(stream, "isatty", lambda: True, raising=False)
    assert list(_progress.track(range(3), "x", enabled=True)) == [0, 1, 2]
    assert "npujax: x" not in stream.getvalue()  # (a transient rich bar instead)


# (the command line off a terminal: tests/cli/test_cli.py,
# test_lower_format_csv_and_json_print_only_the_schedule)
