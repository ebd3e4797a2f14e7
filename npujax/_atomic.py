"""Atomic outputs: a reader sees the old file (folder) or the complete new one, never a part.

* :func:`atomic_open` / :func:`atomic_write_text` / :func:`atomic_write_bytes`: one file, written
  to a temporary file next to it, fsynced and renamed over it.
* :func:`staged_dir`: a run's output folder as a transaction. Its files are written into a
  sibling staging folder; on success a manifest (:data:`MANIFEST`: every file with its size and
  sha256) is written last and the staging folder replaces the output folder by renames, so the
  folder holds all of the new run's files or (after an error, Ctrl-C or a kill) all of the
  previous run's. A folder is replaced only if it is empty or an earlier npujax run's (it holds
  a manifest): npujax never deletes files it did not write.

Temporary files and staging folders carry the id of the process that made them; one left by a
killed process is removed by the next write to the same place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from npujax.errors import ConfigError, OutputError

__all__ = ["atomic_open", "atomic_write_text", "atomic_write_bytes", "staged_dir", "MANIFEST"]

#: The file a published run folder holds, written last: ``{"files": {name: {"bytes", "sha256"}}}``.
MANIFEST = "npujax-manifest.json"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _remove_stale(folder: Path, pattern: re.Pattern[str]) -> None:
    """Remove entries of ``folder`` matching ``pattern`` (group ``pid``) whose process is gone."""
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            m = pattern.fullmatch(entry.name)
            if m and not _alive(int(m.group("pid"))):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        entry.unlink()


def _output_error(path: Path, e: OSError) -> OutputError:
    return OutputError(f"cannot write {str(path)!r}: {e.strerror or e}; nothing of a previous "
                       "output there was changed.")


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", **kwargs) -> Iterator[IO]:
    """Open a temporary file next to ``path``; on success fsync it and rename it over ``path``.

    On an exception the temporary file is removed and ``path`` is untouched. The file gets the
    permissions of an ordinary new file (``0o666`` less the umask).

    Raises:
      ConfigError: the folder cannot be created (e.g. a file of that name exists).
      OutputError: the file cannot be written (a folder of that name, full disk, permissions).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"cannot create output folder {str(path.parent)!r}: {e.strerror}."
        ) from None
    if path.is_dir():
        raise OutputError(f"cannot write {str(path)!r}: it is a folder; pass a file name.")
    _remove_stale(path.parent, re.compile(re.escape(f".{path.name}.") + r"(?P<pid>\d+)\..*\.tmp"))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp",
                                   dir=path.parent)
    except OSError as e:
        raise _output_error(path, e) from None
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, OutputError):
            raise _output_error(path, e) from None
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically.

    Raises:
      OutputError: it cannot be written.
    """
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically.

    Raises:
      OutputError: it cannot be written.
    """
    with atomic_open(path, "wb") as f:
        f.write(data)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT (Ctrl-C) until the block is done (main thread only), so that a publish
    is never cut between its two renames."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda *a: got.append(a))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if got and callable(previous):
            previous(*got[0])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_output_dir(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` can receive a run (:func:`staged_dir`): not a file, and empty, absent
    or an earlier npujax run folder; restores a folder a killed publish left aside.

    Raises:
      OutputError: a file of that name, or a folder holding files npujax did not write.
    """
    out = Path(path)
    parent = out.parent
    if not out.exists():  # a publish killed between its renames: put the previous run back
        for old in sorted(parent.glob(f".{glob_escape(out.name)}.old-*")):
            with contextlib.suppress(OSError):
                old.rename(out)
                break
    if out.exists() and not out.is_dir():
        raise OutputError(f"output folder {str(out)!r} is a file; pass a folder.")
    if out.is_dir():
        entries = [e.name for e in out.iterdir()]
        if entries and MANIFEST not in entries:
            raise OutputError(
                f"output folder {str(out)!r} holds files npujax did not write ({entries[0]!r}, "
                "...); a run replaces its whole folder, so pass a new or empty folder (or an "
                "earlier run's).")
    return out


def glob_escape(name: str) -> str:
    """``name`` with glob metacharacters escaped."""
    return re.sub(r"([*?\[])", r"[\1]", name)


@contextlib.contextmanager
def staged_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A run's output folder as a transaction: yields a staging folder to write into; on
    success writes :data:`MANIFEST` last and puts the staging folder in place of ``path``
    (replacing an earlier run's folder); on any exception (Ctrl-C included) removes it and
    leaves ``path`` as it was.

    Raises:
      ConfigError: the parent folder cannot be created.
      OutputError: ``path`` is a file or a folder npujax did not write, or writing fails (the
        previous contents of ``path`` are kept).
    """
    out = check_output_dir(path)
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create output folder {str(parent)!r}: {e.strerror}.") from None
    _remove_stale(parent, re.compile(re.escape(f".{out.name}.") + r"(staging|old)-(?P<pid>\d+)-.*"))
    try:
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-{os.getpid()}-", dir=parent))
    except OSError as e:
        raise _output_error(out, e) from None
    try:
        yield stage
        files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                 for p in sorted(stage.iterdir()) if p.is_file()}
        atomic_write_text(stage / MANIFEST, json.dumps({"files": files}, indent=2) + "\n")
        os.chmod(stage, 0o777 & ~_umask())
        with _interrupts_deferred():
            old = None
            if out.exists():
                old = parent / f".{out.name}.old-{os.getpid()}-{stage.name[-8:]}"
                os.rename(out, old)
            try:
                os.rename(stage, out)
            except OSError:
                if old is not None:
                    os.rename(old, out)  # the previous run goes back in place
                raise
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(stage, ignore_errors=True)
        if isinstance(e, OSError) and not isinstance(e, OutputError):
            raise _output_error(out, e) from None
        raise
