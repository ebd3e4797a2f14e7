"""Output folders as transactions (:mod:`npujax._atomic`, issue 28 item 7): a user's own files in
an output folder are never deleted or changed; a kill (SIGKILL) or Ctrl-C at every write step
leaves the complete old set of npujax's files or the complete new one; no debris is left beside
the folder, and what a kill leaves inside it is cleaned by the next run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from npujax._atomic import MANIFEST, WORK, check_output_dir, refuse_foreign, run_kind, staged_dir
from npujax.errors import OutputError

OLD = {"a.txt": "old a", "b.txt": "old b", "sub/c.txt": "old c"}
NEW = {"a.txt": "new a", "d.txt": "new d", "sub/c.txt": "new c"}
USER = {"notes.txt": "my notes", "mine/plan.txt": "my plan"}


def _run(out: Path, files: dict[str, str]) -> None:
    with staged_dir(out) as stage:
        for rel, text in files.items():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            (stage / rel).write_text(text)


def _write(folder: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones included) by relative path."""
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _ours(folder: Path) -> dict[str, str]:
    """The files the manifest lists, checked to be present."""
    listed = json.loads((folder / MANIFEST).read_text())["files"]
    return {rel: (folder / rel).read_text() for rel in listed}


def _listed_or_none(folder: Path) -> dict[str, str] | None:
    try:
        return _ours(folder)
    except OSError:  # a listed file missing: a mix
        return None


def _earlier_run_with_user_files(out: Path) -> None:
    _run(out, OLD)
    _write(out, USER)


def test_a_run_keeps_the_users_files(tmp_path):
    """The issue's case: an earlier run's output plus the user's notes.txt (and a folder of
    theirs); the run replaces npujax's files and leaves the user's alone."""
    out = tmp_path / "o"
    _earlier_run_with_user_files(out)
    _run(out, NEW)
    assert _ours(out) == NEW
    assert _tree(out) == {**NEW, **USER, MANIFEST: (out / MANIFEST).read_text()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]  # nothing beside it


def test_a_folder_holding_another_commands_run_is_refused(tmp_path):
    """`npujax lower --out` into a `quantize` run's folder would remove its model.qdq.onnx:
    refused before the work (and at the publish) naming both commands; the same command, or
    a run from Python, replaces the earlier run as before."""
    out = tmp_path / "o"
    with run_kind("quantize"):
        _run(out, OLD)
    assert json.loads((out / MANIFEST).read_text())["command"] == "quantize"
    with run_kind("lower"):
        with pytest.raises(OutputError, match="npujax quantize.*a.txt.*npujax lower"):
            check_output_dir(out)
        with pytest.raises(OutputError, match="npujax quantize"):
            _run(out, NEW)
    assert _ours(out) == OLD
    with run_kind("quantize"):
        _run(out, NEW)
    assert _ours(out) == NEW
    _run(out, OLD)  # from Python: no command
    assert _ours(out) == OLD and "command" not in json.loads((out / MANIFEST).read_text())
    (out / "a.txt").write_text("edited by the user")
    with pytest.raises(OutputError, match="'a.txt', changed since npujax wrote it"):
        refuse_foreign(out, ["a.txt"])


def test_a_folder_of_the_users_receives_a_run(tmp_path):
    _write(tmp_path, USER)
    _run(tmp_path, NEW)
    assert _ours(tmp_path) == NEW and {k: _tree(tmp_path)[k] for k in USER} == USER


@pytest.mark.parametrize("case", ["user file", "edited", "user folder", "symlink"])
def test_a_users_file_in_the_way_is_refused_and_nothing_changes(tmp_path, case):
    """A name the run writes holds a file npujax did not write (or one it wrote that the user
    changed since, or a folder, or a symlink): the run is refused naming it, nothing changes."""
    out = tmp_path / "o"
    _earlier_run_with_user_files(out)
    if case == "user file":
        (out / "d.txt").write_text("the user's d")
    elif case == "edited":
        (out / "a.txt").write_text("old a, edited by the user")
    elif case == "user folder":
        (out / "d.txt").mkdir()
    else:
        (out / "d.txt").symlink_to(tmp_path / "elsewhere.txt")
    before = {p.relative_to(out).as_posix(): p.lstat().st_mtime_ns for p in out.rglob("*")}
    want = "'d.txt'" if case != "edited" else "'a.txt'"
    with pytest.raises(OutputError, match=f"{want}.*npujax did not write"):
        _run(out, NEW)
    assert {p.relative_to(out).as_posix(): p.lstat().st_mtime_ns for p in out.rglob("*")} \
        == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


def test_a_file_npujax_wrote_and_the_user_changed_is_kept(tmp_path):
    """Not written again by the new run: the user's version stays and leaves the manifest."""
    out = tmp_path / "o"
    _run(out, OLD)
    (out / "b.txt").write_text("old b, edited")
    _run(out, NEW)
    assert (out / "b.txt").read_text() == "old b, edited" and _ours(out) == NEW


def test_a_manifest_naming_files_outside_the_folder_deletes_nothing(tmp_path):
    """A hostile manifest (``../victim``, an absolute path, through a symlink) with the right
    sizes and hashes: npujax only ever removes files inside the folder."""
    import hashlib

    out = tmp_path / "o"
    _run(out, OLD)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (out / "link").symlink_to(tmp_path)
    digest = {"bytes": 4, "sha256": hashlib.sha256(b"keep").hexdigest()}
    manifest = json.loads((out / MANIFEST).read_text())
    for rel in ("../victim.txt", str(victim), "link/victim.txt"):
        manifest["files"][rel] = digest
    (out / MANIFEST).write_text(json.dumps(manifest))
    _run(out, NEW)
    assert victim.read_text() == "keep" and _ours(out) == NEW


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError, OSError])
def test_an_error_while_staging_keeps_everything(tmp_path, exc):
    out = tmp_path / "o"
    _earlier_run_with_user_files(out)
    before = _tree(out)
    with pytest.raises(OutputError if exc is OSError else exc):
        with staged_dir(out) as stage:
            (stage / "a.txt").write_text("half")
            raise exc("stop")
    assert _tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["o"]


def test_a_new_folder_is_removed_again_when_the_run_fails(tmp_path):
    with pytest.raises(RuntimeError):
        with staged_dir(tmp_path / "o"):
            raise RuntimeError
    assert not (tmp_path / "o").exists()


# --- kills (SIGKILL) and Ctrl-C (SIGINT) at every step that changes the file system

_DRIVER = textwrap.dedent("""
    import json, os, signal, sys
    from pathlib import Path
    import npujax._atomic as atomic

    root, sig = Path(sys.argv[1]), sys.argv[2]
    OLD, NEW, USER = (json.loads(a) for a in sys.argv[3:6])

    def run(out, files):
        with atomic.staged_dir(out) as stage:
            for rel, text in files.items():
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                atomic.atomic_write_text(stage / rel, text)

    steps = []
    for k in range(1, 200):
        base = root / f"k{k}"
        run(base / "o", OLD)
        for rel, text in USER.items():
            (base / "o" / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / "o" / rel).write_text(text)
        pid = os.fork()
        if pid == 0:  # the run, stopped at its k-th step
            atomic._steps = 0
            os.environ[atomic.KILL_STEP_ENV] = str(k)
            os.environ[atomic.KILL_SIGNAL_ENV] = sig
            try:
                run(base / "o", NEW)
            except KeyboardInterrupt:
                os._exit(130)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        steps.append(os.waitstatus_to_exitcode(status))
        if steps[-1] == 0:  # k is past the last step: the run completed
            break
    print(json.dumps(steps))
""")


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_a_kill_at_every_step_leaves_the_old_or_the_new_set(tmp_path, sig):
    """For every k, a run is stopped just before its k-th file-system change
    (``NPUJAX_TEST_KILL_AT_STEP``, test-only; 24 steps here). SIGKILL: nothing beside the
    folder, the user's files intact, the complete old or new set unless the publish was
    committed (its journal is there), and after the next run's check (which finishes a
    committed publish) the complete old or new set and no debris. SIGINT (Ctrl-C): the same
    without any check (the run cleans up, or completes a publish it had started)."""
    r = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(tmp_path), sig,
         *(json.dumps(x) for x in (OLD, NEW, USER))],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert r.returncode == 0, r.stderr
    steps = json.loads(r.stdout)
    stopped = -9 if sig == "SIGKILL" else 130
    assert steps[-1] == 0 and set(steps[:-1]) <= {stopped, 0} and len(steps) > 15
    outcomes = []
    for k in range(1, len(steps)):
        base = tmp_path / f"k{k}"
        out = base / "o"
        assert sorted(p.name for p in base.iterdir()) == ["o"], k  # nothing beside it
        assert {rel: (out / rel).read_text() for rel in USER} == USER, k
        if sig == "SIGKILL":
            if not (out / WORK / "journal.json").exists():  # not committed, or finished
                assert _listed_or_none(out) in (OLD, NEW), k
            check_output_dir(out)  # what the next run does first: finishes a committed publish
        ours = _ours(out)
        assert ours in (OLD, NEW), (k, ours)
        assert _tree(out) == {**ours, **USER, MANIFEST: (out / MANIFEST).read_text()}, k
        outcomes.append("new" if ours == NEW else "old")
    # each k stops the run later: old until the publish is committed, new after it
    assert outcomes == sorted(outcomes, key=("old", "new").index) and "old" in outcomes
