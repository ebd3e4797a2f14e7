"""Progress of long runs, the one place that shows it: a rich bar on a terminal, plain lines off it.

Every helper shows something only when its caller asks (``enabled``: the command line's default,
off with ``--no-progress``; the library's own default is off), on stderr, so stdout keeps only
the results:

* **stderr is a terminal** (a person watches): a transient rich bar or spinner that leaves no
  residue.
* **stderr is not a terminal** (a log, a pipe, CI): plain lines, at most one every
  :data:`INTERVAL_S` seconds, plus a line when a phase or loop starts and when it ends with its
  time, so a cold ``npujax lower`` (60-120 s of import and compilation on a loaded machine) or a
  sweep is never silent. A phase with no steps of its own (a compilation) says it is still
  running every ``3 x INTERVAL_S`` seconds.

Lines look like ``npujax: QAT: 120/300 (40 %), loss 0.1234, 12 s``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO, TypeVar

__all__ = ["progress_bar", "track", "phase", "note", "INTERVAL_S"]

T = TypeVar("T")

#: The shortest time between two progress lines off a terminal (s).
INTERVAL_S = 5.0

#: The clock (monotonic seconds; replaced by the tests).
clock: Callable[[], float] = time.monotonic


def _stream() -> TextIO:
    return sys.stderr


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _say(stream: TextIO, text: str) -> None:
    try:
        print(f"npujax: {text}", file=stream, flush=True)
    except (OSError, ValueError):  # a closed pipe or stream: progress is never worth an error
        pass


class _Heartbeat:
    """A line ``<description>: still running, <t> s`` every ``3 x INTERVAL_S`` seconds in which
    nothing else was said (a daemon thread; :meth:`stop` ends it)."""

    def __init__(self, stream: TextIO, description: str) -> None:
        self.stream, self.description = stream, description
        self.start = self.last = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="npujax-progress", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(3 * INTERVAL_S):
            now = clock()
            if now - self.last >= 3 * INTERVAL_S:
                self.last = now
                _say(self.stream, f"{self.description}: still running, "
                                  f"{now - self.start:.0f} s")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class _Lines(_Heartbeat):
    """Plain progress lines of one loop: the start, at most one per :data:`INTERVAL_S` (and a
    heartbeat while a step takes long: a first step that compiles), the end."""

    def __init__(self, stream: TextIO, description: str, total: int | None,
                 unit: str = "steps") -> None:
        self.total, self.done = total, 0
        _say(stream, f"{description}: started" + (f", {total} {unit}" if total else ""))
        super().__init__(stream, description)

    def _count(self) -> str:
        if not self.total:
            return f"{self.done}"
        return f"{self.done}/{self.total} ({100 * self.done // self.total} %)"

    def advance(self, n: int = 1, field: str = "", value: Any = None) -> None:
        """``n`` more steps; ``value`` (e.g. a loss, read only when a line is due: reading a
        device value waits for it) is shown as ``field``."""
        self.done += n
        now = clock()
        if now - self.last < INTERVAL_S:
            return
        self.last = now
        extra = "" if value is None else f", {field} {_fmt(value)}"
        _say(self.stream, f"{self.description}: {self._count()}{extra}, "
                          f"{now - self.start:.0f} s")

    def end(self, failed: bool = False) -> None:
        self.stop()
        took = clock() - self.start
        _say(self.stream, f"{self.description}: {'stopped at' if failed else 'done,'} "
                          f"{self._count()} in {took:.1f} s")


def track(items: Iterable[T], description: str, enabled: bool) -> Iterable[T]:
    """``items``, with their progress on stderr when ``enabled``: a transient bar on a terminal,
    plain lines off it (see the module docstring)."""
    if not enabled:
        return items
    stream = _stream()
    if _is_tty(stream):
        from rich.progress import track as rich_track

        return rich_track(items, description=description, transient=True, console=_console())
    return _track_lines(items, description, stream)


def _track_lines(items: Iterable[T], description: str, stream: TextIO) -> Iterator[T]:
    total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
    lines = _Lines(stream, description, total)
    ok = False
    try:
        for item in items:
            yield item
            lines.advance()
        ok = True
    finally:
        lines.end(failed=not ok)


class progress_bar:
    """Context manager: the progress of ``total`` steps with the running loss.

    ``with progress_bar(enabled, "QAT", steps) as advance: advance(loss)`` per step. When
    ``enabled``: a transient rich bar on a terminal (stderr), plain lines off it (the module
    docstring); ``advance(loss=None, n=1)`` also takes a step count and no loss. ``unit``
    names what is counted in the plain lines (``"configurations"`` for a sweep).
    """

    def __init__(self, enabled: bool, description: str, total: int | None, *,
                 field: str = "loss", unit: str = "steps") -> None:
        self.enabled = enabled
        self.description, self.total, self.field, self.unit = description, total, field, unit
        self._stream = _stream()
        self.tty = enabled and _is_tty(self._stream)

    def __enter__(self) -> Any:
        if not self.enabled:
            return lambda value=None, n=1: None
        if not self.tty:
            self._lines = _Lines(self._stream, self.description, self.total, self.unit)

            return lambda value=None, n=1: self._lines.advance(n, self.field, value)
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn(f"{self.field} {{task.fields[value]}}"),
                             TimeRemainingColumn(), transient=True, console=_console())
        self._bar.__enter__()
        task = self._bar.add_task(self.description, total=self.total, value="-")
        pending = [0]

        def advance(value: Any = None, n: int = 1) -> None:
            # the terminal is redrawn every 10 steps (a redraw per step slowed short steps)
            pending[0] += n
            if pending[0] >= 10 or self._bar.tasks[0].completed + pending[0] == self.total:
                if value is None:
                    self._bar.update(task, advance=pending[0])
                else:
                    self._bar.update(task, advance=pending[0], value=_fmt(value))
                pending[0] = 0

        return advance

    def __exit__(self, *exc: Any) -> None:
        if not self.enabled:
            return
        if self.tty:
            self._bar.__exit__(*exc)
        else:
            self._lines.end(failed=exc[0] is not None)


def _fmt(value: Any) -> str:
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return str(value)


@contextlib.contextmanager
def phase(description: str, enabled: bool) -> Iterator[None]:
    """A phase of a command without steps of its own (an import, a compilation): on a terminal a
    transient spinner; off it a line when it starts, ``still running`` every
    ``3 x INTERVAL_S`` seconds, and a line when it ends with its time (see the module
    docstring)."""
    if not enabled:
        yield
        return
    stream = _stream()
    if _is_tty(stream):
        with _console().status(description):
            yield
        return
    _say(stream, f"{description} ...")
    beat = _Heartbeat(stream, description)
    ok = False
    try:
        yield
        ok = True
    finally:
        beat.stop()
        _say(stream, f"{description}: {'done' if ok else 'stopped'} in "
                     f"{clock() - beat.start:.1f} s")


def note(text: str, enabled: bool) -> None:
    """One progress line on stderr (a stage of a long command), terminal or not, when
    ``enabled``."""
    if enabled:
        _say(_stream(), text)
