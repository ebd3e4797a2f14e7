"""Atomic outputs: a reader sees the old file (set of files) or the complete new one, never a part.

* :func:`atomic_open` / :func:`atomic_write_text` / :func:`atomic_write_bytes`: one file, written
  to a temporary file next to it, fsynced and renamed over it.
* :func:`staged_dir`: a run's files in an output folder as a transaction. The folder may hold
  other files (the user's notes, an earlier run's plots the user kept): npujax never deletes or
  changes a file it did not write. What it wrote is listed in the folder's manifest
  (:data:`MANIFEST`: every file's relative path, size and sha256, written last), with the
  command that wrote it (:func:`run_kind`): another command's run there is refused, since a
  publish removes the earlier run's files it does not write.

How a run is published. Its files are written into a staging folder *inside* the output folder
(``.npujax-work/stage-<pid>-<random>/``); nothing beside the output folder is ever created.
Then, holding a lock on the folder:

1. every file the run writes is checked: absent, or a file of the previous manifest still as
   npujax wrote it (same sha256). A user's file (or folder, or symlink) in the way refuses the
   run (:class:`~npujax.errors.OutputError` naming it) and nothing is changed;
2. the new manifest is written into the staging folder, then the journal
   (``.npujax-work/journal.json``: the staging folder, the files to move in, the previous run's
   files to remove, each with the sha256 it must still have). Writing the journal (a rename) is
   the commit: before it the previous run's files are untouched, after it the new set is
   complete on disk and the journal says how to finish;
3. the files are renamed into place, the previous run's files the new run does not write are
   removed (only if still as npujax wrote them), the manifest is renamed into place, the journal
   and the staging folder are removed. Ctrl-C is held during these steps.

A kill (SIGKILL, power loss of the process) at any instant therefore leaves the complete old set
(before the commit) or the complete new set, finished from the journal by the next npujax run
into that folder (or :func:`check_output_dir`, which every command calls first). Staging
folders of dead processes are removed then too. Old npujax versions staged beside the folder
(``.<name>.staging-*``, ``.<name>.old-*``); those are cleaned (and a cut swap restored) as well.

Test-only fault injection: with ``NPUJAX_TEST_KILL_AT_STEP=k`` in the environment the process
sends itself ``SIGKILL`` (or the signal named by ``NPUJAX_TEST_KILL_SIGNAL``) just before its
k-th file-system change of an output (``tests/test_atomic.py`` stops a run at every step). Unset
(always, outside that test) it does nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import IO, Any

from npujax.errors import ConfigError, OutputError

__all__ = ["file_sha256", "atomic_open", "atomic_write_text", "atomic_write_bytes", "staged_dir",
           "check_output_dir", "foreign_files", "refuse_foreign", "run_kind", "MANIFEST"]

#: The command whose run this process publishes (``npujax lower``: ``"lower"``), set by the
#: command line (:func:`run_kind`) and written into the manifest; None from Python.
_run_kind: str | None = None


@contextlib.contextmanager
def run_kind(command: str | None) -> Iterator[None]:
    """Within the block, runs published here are ``command``'s: a folder holding another
    command's run is refused (:func:`check_output_dir`), and the manifest names ``command``."""
    global _run_kind
    before, _run_kind = _run_kind, command
    try:
        yield
    finally:
        _run_kind = before


#: The file listing what npujax wrote in a run folder, written last:
#: ``{"files": {relative/path: {"bytes", "sha256"}}}``.
MANIFEST = "npujax-manifest.json"
#: npujax's own hidden folder inside an output folder: staging folders and the journal.
WORK = ".npujax-work"
_JOURNAL = "journal.json"
_STAGE = re.compile(r"stage-(?P<pid>\d+)-[A-Za-z0-9_]+")
_JOURNAL_TMP = re.compile(re.escape(f".{_JOURNAL}.") + r"(?P<pid>\d+)\..*\.tmp")

#: Test-only (see the module docstring): stop the process before its k-th file-system change.
KILL_STEP_ENV = "NPUJAX_TEST_KILL_AT_STEP"
#: Test-only: the signal that stops it (default ``SIGKILL``).
KILL_SIGNAL_ENV = "NPUJAX_TEST_KILL_SIGNAL"
_steps = 0


def _step() -> None:
    """A file-system change of an output is next: the test-only kill point (a no-op unless
    :data:`KILL_STEP_ENV` is set)."""
    at = os.environ.get(KILL_STEP_ENV)
    if not at:
        return
    global _steps
    _steps += 1
    if _steps == int(at):
        os.kill(os.getpid(), getattr(signal, os.environ.get(KILL_SIGNAL_ENV, "SIGKILL")))


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
        _step()
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
        _step()
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
    is never cut half-way by Ctrl-C (a kill is finished from the journal)."""
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


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB blocks.

    Raises:
      OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def glob_escape(name: str) -> str:
    """``name`` with glob metacharacters escaped."""
    return re.sub(r"([*?\[])", r"[\1]", name)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` (``flock`` of the folder itself) for a publish or a
    recovery; other processes wait. (Where there is no ``fcntl`` or the file system has no
    locks, no lock: runs into one folder at the same time are then the user's to avoid.)"""
    try:
        import fcntl
    except ImportError:  # pragma: no cover  (not POSIX)
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # a file system without locks: go on unlocked
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _plain(rel: Any) -> bool:
    """``rel`` is a plain relative path: not absolute, no ``..``/``.``/empty parts, no
    backslash or NUL, not npujax's own manifest or work folder."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\0" in rel:
        return False
    path = PurePosixPath(rel)
    return not path.is_absolute() and all(p not in ("", ".", "..") for p in rel.split("/")) \
        and path.parts[0] not in (WORK, MANIFEST)


def _inside(out: Path, rel: Any) -> Path | None:
    """``out / rel`` for a :func:`_plain` ``rel`` whose folders below ``out`` are real folders
    or absent (no symlinks, no files), else None: a manifest or journal (files anyone could
    edit) never reaches outside the folder."""
    if not _plain(rel):
        return None
    parts = rel.split("/")
    folder = out
    for part in parts[:-1]:
        folder = folder / part
        try:
            if not stat.S_ISDIR(folder.lstat().st_mode):
                return None
        except FileNotFoundError:
            break
    return out.joinpath(*parts)


def _is_ours(path: Path | None, sha256: Any) -> bool:
    """``path`` is a regular file (not a symlink) whose contents have ``sha256``."""
    if path is None or not isinstance(sha256, str):
        return False
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return False
        return file_sha256(path) == sha256
    except OSError:
        return False


def _read_manifest(out: Path) -> dict[str, Any]:
    """The folder's manifest (``{}`` without one, or an unreadable one)."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _manifest(out: Path) -> dict[str, dict[str, Any]]:
    """The files the folder's manifest lists (``{}`` without one, or an unreadable one: then
    no file there counts as npujax's)."""
    files = _read_manifest(out).get("files", {})
    return files if isinstance(files, dict) else {}


def _refuse_other_command(out: Path) -> None:
    """Refuse a run of :data:`_run_kind` into a folder holding another command's run, whose
    files the publish would remove (``npujax lower --out`` into a ``quantize`` run's folder
    took its ``model.qdq.onnx``).

    Raises:
      OutputError: naming both commands and some of the files.
    """
    if _run_kind is None:
        return
    manifest = _read_manifest(out)
    previous, files = manifest.get("command"), manifest.get("files")
    # (a manifest from Python, or from an npujax before 2026-12-03, names no command)
    if not isinstance(previous, str) or previous == _run_kind or not isinstance(files, dict) \
            or not files:
        return
    files = list(files)
    shown = ", ".join(files[:8]) + (f" and {len(files) - 8} more" if len(files) > 8 else "")
    raise OutputError(f"output folder {str(out)!r} holds the files of an `npujax {previous}` "
                      f"run ({shown}), which a run of `npujax {_run_kind}` there would replace "
                      "or remove: pass another --out, or move those files away first (nothing "
                      "there was changed).")


def _remove_empty_parents(out: Path, path: Path) -> None:
    """Remove the folders between ``path`` and ``out`` that are now empty."""
    folder = path.parent
    while folder != out and out in folder.parents:
        try:
            _step()
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _apply(out: Path, journal: dict[str, Any], verify: bool = True) -> None:
    """Finish a committed publish (idempotent: a step already done is skipped). Moves each
    staged file in, removes the previous run's files the new run does not write, puts the
    manifest in place and removes the journal and the staging folder. With ``verify`` (a
    recovery: time has passed since the commit) a file is only replaced or removed while it is
    still as the journal recorded it; a user's file that has taken a place since stays (and
    leaves the manifest)."""
    work = out / WORK
    name = journal.get("stage")
    if not (isinstance(name, str) and _STAGE.fullmatch(name)):
        raise ValueError(f"a journal naming staging folder {name!r}")
    stage = work / name
    kept: list[str] = []
    for rel, before in dict(journal.get("write", {})).items():
        src = _inside(stage, rel)
        if src is None or not src.is_file():
            continue  # (moved already)
        target = _inside(out, rel)
        if target is None or (verify and os.path.lexists(target)
                              and not _is_ours(target, before)):
            kept.append(rel)
            continue
        _step()
        target.parent.mkdir(parents=True, exist_ok=True)
        _step()
        os.replace(src, target)
    for rel, sha in dict(journal.get("remove", {})).items():
        target = _inside(out, rel)
        if target is not None and (_is_ours(target, sha) if verify else target.is_file()):
            _step()
            target.unlink()
            _remove_empty_parents(out, target)
    staged = stage / MANIFEST
    if staged.is_file():
        if kept:
            doc = json.loads(staged.read_text())
            for rel in kept:
                doc["files"].pop(rel, None)
            atomic_write_text(staged, json.dumps(doc, indent=2) + "\n")
        _step()
        os.replace(staged, out / MANIFEST)
    _step()
    with contextlib.suppress(FileNotFoundError):
        (work / _JOURNAL).unlink()
    _step()
    shutil.rmtree(stage, ignore_errors=True)
    _step()
    with contextlib.suppress(OSError):
        work.rmdir()  # (only when empty: another live run may be staging)


def _recover(out: Path) -> None:
    """Finish a publish a kill cut (the journal), remove staging folders of dead processes and
    npujax's empty work folder. Call with the folder locked."""
    work = out / WORK
    if not work.is_dir() or work.is_symlink():
        return
    journal = work / _JOURNAL
    if journal.is_file():
        try:
            _apply(out, json.loads(journal.read_text()))
        except (ValueError, TypeError, AttributeError):  # not a journal npujax wrote: dropped
            _step()
            journal.unlink()
    if not work.is_dir():  # (the finished publish removed it)
        return
    for entry in list(work.iterdir()):
        m = _STAGE.fullmatch(entry.name) or _JOURNAL_TMP.fullmatch(entry.name)
        if m and not _alive(int(m.group("pid"))):
            _step()
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        work.rmdir()


def _recover_legacy(out: Path) -> None:
    """What npujax < 0.2 left beside the folder: a swap a kill cut between its two renames
    (the previous run's folder, ``.<name>.old-*``, is put back) and staging folders."""
    parent = out.parent
    if not out.exists():
        for old in sorted(parent.glob(f".{glob_escape(out.name)}.old-*")):
            with contextlib.suppress(OSError):
                old.rename(out)
                break
    _remove_stale(parent, re.compile(re.escape(f".{out.name}.") + r"(staging|old)-(?P<pid>\d+)-.*"))


def check_output_dir(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` can receive a run (:func:`staged_dir`): absent or a folder (any
    files in it are kept) not holding another command's run (:func:`run_kind`). Finishes a
    publish a kill cut there and removes staging folders of dead processes (also those older
    npujax versions left beside it).

    Raises:
      OutputError: a file of that name; a folder holding the run of another command, whose
        files this run would replace.
    """
    out = Path(path)
    _recover_legacy(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"output folder {str(out)!r} is a file; pass a folder.")
    if out.is_dir():
        with _locked(out):
            _recover(out)
        _refuse_other_command(out)
    return out


def _staged_files(stage: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"bytes", "sha256"}}`` of every file a run staged.

    Raises:
      OutputError: a symlink or another special file, or a file named like npujax's own.
    """
    files = {}
    for p in sorted(stage.rglob("*")):
        rel = p.relative_to(stage).as_posix()
        mode = p.lstat().st_mode
        if stat.S_ISDIR(mode):
            continue
        if not stat.S_ISREG(mode) or not _plain(rel):
            raise OutputError(f"a run wrote {rel!r}, which is not a regular file or takes a "
                              f"name npujax keeps for itself ({MANIFEST}, {WORK}).")
        files[rel] = {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
    return files


def foreign_files(path: str | os.PathLike[str], rels: list[str]) -> list[str]:
    """Those of ``rels`` (relative paths a run will write into the folder ``path``) that a
    publish (:func:`staged_dir`) would refuse: taken by a file, folder or symlink npujax did
    not write there, or changed since. A long run checks this first, so that it is refused
    before the work, not after it.

    Returns:
      The refused paths, in the order given (empty when the run may go ahead).
    """
    out = Path(path)
    previous = {rel: info.get("sha256") for rel, info in _manifest(out).items()
                if isinstance(info, dict)}
    refused = []
    for rel in rels:
        target = _inside(out, rel)
        if target is not None and (not os.path.lexists(target)
                                   or _is_ours(target, previous.get(rel))):
            continue
        refused.append(rel)
    return refused


def refuse_foreign(path: str | os.PathLike[str], rels: Sequence[str]) -> None:
    """Refuse now, before the work, a run whose publish would be refused: one of ``rels`` (the
    files it writes into the folder ``path``) taken by a file npujax did not write there
    (:func:`foreign_files`).

    Raises:
      OutputError: naming the first such file (nothing is changed).
    """
    refused = foreign_files(path, list(rels))
    if refused:
        changed = refused[0] in _manifest(Path(path))
        what = (f"{refused[0]!r}, changed since npujax wrote it" if changed else
                f"{refused[0]!r}, which npujax did not write")
        raise OutputError(f"output folder {str(path)!r} holds {what}; a run never replaces such "
                          "a file: move it away or pass another folder (nothing there was "
                          "changed).")


def _publish(out: Path, stage: Path, files: dict[str, dict[str, Any]]) -> None:
    """Steps 1-3 of the module docstring, with ``out`` locked.

    Raises:
      OutputError: a file the run writes is in the way (named); nothing is changed.
    """
    _refuse_other_command(out)
    previous = {rel: info.get("sha256") for rel, info in _manifest(out).items()
                if isinstance(info, dict)}
    write: dict[str, str | None] = {}
    for rel in files:
        target = _inside(out, rel)
        if target is not None and not os.path.lexists(target):
            write[rel] = None
            continue
        if target is not None and _is_ours(target, previous.get(rel)):
            write[rel] = previous[rel]
            continue
        if target is None:  # a file or symlink where the run needs a folder
            what = f"a file or symlink in place of a folder of {rel!r}, which npujax did not write"
        elif rel in previous:
            what = f"{rel!r}, changed since npujax wrote it (so npujax did not write it as it is)"
        else:
            what = f"{rel!r}, which npujax did not write"
        raise OutputError(f"output folder {str(out)!r} holds {what}; a run never replaces such a "
                          "file: move it away or pass another folder (nothing there was changed).")
    remove = {rel: sha for rel, sha in previous.items()
              if rel not in files and _is_ours(_inside(out, rel), sha)}
    manifest: dict[str, Any] = {"files": files}
    if _run_kind is not None:
        manifest["command"] = _run_kind
    atomic_write_text(stage / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    journal = {"stage": stage.name, "write": write, "remove": remove}
    atomic_write_text(out / WORK / _JOURNAL, json.dumps(journal, indent=2) + "\n")  # commit
    _apply(out, journal, verify=False)


@contextlib.contextmanager
def staged_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A run's files in the folder ``path`` as a transaction: yields a staging folder (inside
    ``path``) to write into; on success publishes them (module docstring): npujax's files of an
    earlier run are replaced or removed, every other file there is kept, and :data:`MANIFEST`
    lists the new run's files. On any exception (Ctrl-C included) before the publish commits,
    the staging folder is removed and ``path`` is left as it was (a folder created for the run
    is removed again).

    Raises:
      ConfigError: the folder cannot be created.
      OutputError: ``path`` is a file; a file the run writes would replace one npujax did not
        write (named; nothing is changed); writing fails (the previous contents are kept).
    """
    out = check_output_dir(path)
    created = not out.exists()
    stage: Path | None = None
    committed = False
    try:
        try:
            _step()
            out.mkdir(parents=True, exist_ok=True)
            _step()
            (out / WORK).mkdir(exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create output folder {str(out)!r}: {e.strerror}.") \
                from None
        _step()
        stage = Path(tempfile.mkdtemp(prefix=f"stage-{os.getpid()}-", dir=out / WORK))
        yield stage
        files = _staged_files(stage)
        with _interrupts_deferred(), _locked(out):
            _recover(out)  # (a run into the same folder that was killed meanwhile)
            committed = True  # a failure once the journal exists is finished by a recovery
            _publish(out, stage, files)
    except BaseException as e:
        if not (committed and (out / WORK / _JOURNAL).exists()):
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)
            with contextlib.suppress(OSError):
                (out / WORK).rmdir()
            if created:
                with contextlib.suppress(OSError):
                    out.rmdir()
        if isinstance(e, OSError) and not isinstance(e, OutputError):
            raise _output_error(out, e) from None
        raise
