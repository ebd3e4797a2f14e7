"""Progress display for long runs: a rich progress bar, shown only on a terminal.

Libraries must not print into logs or pipes: both helpers show a bar only when asked and stderr
is a terminal (a person is watching); otherwise they are silent and the callers print their own
one-line summaries.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = ["progress_bar", "track"]

T = TypeVar("T")


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def track(items: Iterable[T], description: str, enabled: bool) -> Iterable[T]:
    """``items``, with a transient progress bar on stderr when ``enabled`` and stderr is a
    terminal."""
    if not (enabled and sys.stderr.isatty()):
        return items
    from rich.progress import track as rich_track

    return rich_track(items, description=description, transient=True, console=_console())


class progress_bar:
    """Context manager: a rich progress bar of ``total`` steps showing the running loss.

    ``with progress_bar(enabled, "QAT", steps) as advance: advance(loss)`` per step. Shown only
    when ``enabled`` and stderr is a terminal (logs get the callers' per-stage lines instead).
    """

    def __init__(self, enabled: bool, description: str, total: int | None) -> None:
        # A bar only where a person watches (a terminal on stderr); logs and pipes get the
        # per-stage summary lines the callers print instead of bar residue.
        self.enabled = enabled and sys.stderr.isatty()
        self.description, self.total = description, total

    def __enter__(self) -> Any:
        if not self.enabled:
            return lambda loss: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn(),
                             transient=True, console=_console())
        self._bar.__enter__()
        task = self._bar.add_task(self.description, total=self.total, loss="-")
        count = [0]

        def advance(loss):
            count[0] += 1
            if count[0] % 10 == 0 or count[0] == self.total:
                self._bar.update(task, advance=10 if count[0] % 10 == 0 else count[0] % 10,
                                 loss=f"{float(loss):.4f}")

        return advance

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._bar.__exit__(*exc)
