"""A design-space sweep written to a folder: chunks kept as they finish, resumption, the results
table (Parquet and CSV), the Pareto front and plots, all published together (used by
``npujax sweep``).

A finished sweep's folder holds ``sweep.json`` (what is swept: model, base preset, grid, sample,
chunk size), ``chunks/chunk-NNNNNN.npz`` (the :data:`~npujax.explore.COLUMNS` of ``chunk_size``
consecutive configurations), ``results.csv`` (and ``results.parquet`` where pyarrow is
installed), ``pareto.csv`` and the plots, published as one transaction
(``npujax._atomic.staged_dir``): a file npujax did not write is never replaced (one in the
way is refused before the work starts) and a crash leaves the folder's files as they were.
While the sweep runs, its finished chunks are kept inside npujax's work folder of the output
folder (``.npujax-work/sweep/``, each written atomically), so an interrupted sweep resumes where
it stopped; a rerun of a finished sweep resumes from its published chunks.

The inputs are keyed by their contents, not their names: the model file's
sha256 (when there is a file), a digest of the model's costed layers, of the NPU spec (every
field, not the preset's name), the grid, the sampling, the chunk size and the npujax version.
A rerun whose inputs differ is refused with a one-line error naming what changed (never a
silent restart: the folder may hold hours of results); pass a new ``--out`` for the new sweep.
Each chunk also records the key of its sweep and is only resumed under the same key.

Several processes (``jax.distributed``, one per host or GPU group) share the work: process
``p`` of ``P`` evaluates the chunks ``i`` with ``i % P == p`` on its local devices and writes
them into the shared folder; after a barrier, process 0 merges them. Without a coordinator
(a scheduler's job array), ``--shard I/N`` evaluates slice I of N (the chunks ``i`` with
``i % N == I``) into its own folder, and :func:`merge_sweeps` checks that N folders are the N
slices of one sweep and joins them into the files one run writes, byte for byte (chunk files
are written with fixed zip timestamps for that).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import time
import tomllib
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from npujax._atomic import (
    WORK,
    atomic_write_bytes,
    atomic_write_text,
    check_output_dir,
    refuse_foreign,
    staged_dir,
)
from npujax._progress import progress_bar
from npujax._version import __version__
from npujax.errors import ConfigError, OutputError
from npujax.explore.grid import Grid, configurations
from npujax.explore.pareto import pareto_front
from npujax.explore.sweep import COLUMNS, SweepResult, evaluate_configs, runs_with_numpy
from npujax.hw.spec import NpuSpec, spec_to_toml
from npujax.ir.graph import Graph
from npujax.report.plots import new_figure, save_figure

__all__ = ["run_sweep", "merge_sweeps", "parse_shard", "kept_chunks", "SweepRun",
           "write_results", "write_table_csv", "write_table_parquet", "plot_sweep", "file_sha256",
           "DEFAULT_CHUNK", "DEFAULT_OBJECTIVES"]

log = logging.getLogger(__name__)

#: Configurations per chunk file (and per progress step).
DEFAULT_CHUNK = 4096
#: The Pareto front's objectives (minimised): latency against the array's size.
DEFAULT_OBJECTIVES = ("latency_s", "pes")
_META = "sweep.json"


class SweepRun:
    """What :func:`run_sweep` did: the result (None on a process other than 0 of several),
    chunks evaluated now and skipped (finished before), and the evaluation rate."""

    def __init__(self, result: SweepResult | None, evaluated: int, skipped: int,
                 evaluations_per_s: float, files: list[str]) -> None:
        self.result, self.evaluated, self.skipped = result, evaluated, skipped
        self.evaluations_per_s, self.files = evaluations_per_s, files


#: What a sweep's key holds, in the order a mismatch names them: (key, how it reads). The
#: model's and the preset's names (also in ``sweep.json``) are not part of it: contents are.
_KEY_FIELDS = (("model_sha256", "the model file's contents"),
               ("layers_sha256", "the model's layers"), ("npu_sha256", "the NPU spec"),
               ("grid", "the grid"), ("sample", "the sample size"),
               ("method", "the sampling method"), ("seed", "the seed"),
               ("chunk_size", "the chunk size"), ("configs", "the configuration count"),
               ("npujax", "the npujax version"))
_NAMES = ("model", "npu")
#: Not part of a sweep's key: every slice of a sweep (``--shard I/N``) has the same chunks.
_SLICE = "shard"


def file_sha256(path: str | os.PathLike[str]) -> str | None:
    """The sha256 of a file's bytes, or None when ``path`` is not a file (a Keras spec)."""
    from npujax._atomic import file_sha256 as sha256_of

    return sha256_of(path) if Path(path).is_file() else None


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _sweep_key(sweep: dict[str, Any]) -> str:
    """One digest of everything a sweep's chunks depend on (recorded in every chunk)."""
    return _sha256_text(json.dumps({k: v for k, v in sweep.items()
                                    if k not in _NAMES and k != _SLICE}, sort_keys=True))


class _Absent:
    """An entry one of two sweeps' mappings lacks, as a message shows it."""

    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()
#: The longest value a "different sweep" message shows whole.
_SHOWN = 160


def _shown(value: Any) -> str:
    """``value`` for a one-line message: a sha256 by its first 12 digits, anything longer than
    :data:`_SHOWN` characters cut with an ellipsis."""
    text = str(value)
    if isinstance(value, str) and len(value) == 64:
        return text[:12] + "…"
    return text if len(text) <= _SHOWN else text[:_SHOWN - 1] + "…"


def _changes(before: dict[str, Any], now: dict[str, Any]) -> tuple[str, str]:
    """What differs between two sweeps' inputs: the labels (``"the grid and the seed"``) and
    the values (``"grid {...} then, {...} now"``), for a one-line message."""
    changed = [(key, label) for key, label in _KEY_FIELDS if before.get(key) != now.get(key)]
    if not changed:  # (a field of a later npujax's key)
        changed = [(k, k) for k in sorted(set(before) | set(now))
                   if k not in _NAMES and before.get(k) != now.get(k)]
    labels = [label for _, label in changed]
    what = labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]
    def differing(b: Any, n: Any) -> tuple[Any, Any]:
        # of two mappings (the grid, the options), only the entries that differ
        if isinstance(b, dict) and isinstance(n, dict):
            keys = [k for k in {**b, **n} if b.get(k) != n.get(k)]
            return ({k: b.get(k, _ABSENT) for k in keys}, {k: n.get(k, _ABSENT) for k in keys})
        return b, n

    detail = "; ".join(f"{key} {_shown(b)} then, {_shown(n)} now" for key, _ in changed
                       for b, n in [differing(before.get(key), now.get(key))])
    return what, detail


def _same(before: dict[str, Any], now: dict[str, Any]) -> bool:
    return _sweep_key(before) == _sweep_key(now) and before.get("shard") == now.get("shard")


def _previous_rate(out: Path, default: float) -> float:
    """The ``evaluations_per_s`` an earlier run of this sweep recorded in ``out/sweep.json``
    (``default`` when there is none)."""
    try:
        rate = json.loads((out / _META).read_text()).get("evaluations_per_s")
    except (OSError, ValueError, AttributeError):
        return default
    return float(rate) if isinstance(rate, (int, float)) and rate > 0 else default


def _check_meta(path: Path, out: Path, now: dict[str, Any]) -> None:
    """Refuse ``path`` (a ``sweep.json``) if it records another sweep, naming what changed."""
    if not path.is_file():
        return
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise OutputError(f"{str(path)!r} is unreadable ({e}); pass a new folder.") from None
    before = old.get("sweep") if isinstance(old, dict) else None
    if isinstance(before, dict) and _same(before, now):
        return
    if isinstance(before, dict) and _sweep_key(before) == _sweep_key(now):
        def part(sweep: dict[str, Any]) -> str:
            return f"slice {sweep[_SLICE]} of this sweep" if sweep.get(_SLICE) else \
                "this whole sweep"

        raise ConfigError(f"{str(out)!r} holds {part(before)}, not {part(now)}; pass another "
                          "--out for each slice (--shard I/N) and for the whole sweep.")
    if not isinstance(before, dict) or "npujax" not in before:
        raise ConfigError(f"{str(out)!r} holds a sweep written by an earlier npujax, which did "
                          "not record its inputs' contents, so it cannot be resumed safely; "
                          "pass a new --out (or delete the folder).")
    what, detail = _changes(before, now)
    raise ConfigError(f"{str(out)!r} holds a different sweep: {what} changed ({detail}); "
                      "resume it with the same inputs, or pass a new --out for this sweep.")


def _check_folder(out: Path, meta: dict[str, Any]) -> None:
    """Refuse a folder holding another sweep, finished (``sweep.json``) or under way (in
    npujax's work folder), naming what changed. Other files in it are the user's and are
    kept (``npujax._atomic.staged_dir``)."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {str(out)!r} is a file; pass a folder.")
    _check_meta(out / _META, out, meta["sweep"])
    _check_meta(_work(out) / _META, out, meta["sweep"])


def _work(out: Path) -> Path:
    """Where a sweep under way keeps its finished chunks (and ``sweep.json``) until it
    publishes them: inside npujax's own work folder of ``out``, so a crash leaves the folder's
    visible files as they were and a rerun resumes from here."""
    return out / WORK / "sweep"


def _chunk_name(i: int) -> str:
    return f"chunks/chunk-{i:06d}.npz"


def _chunk_path(out: Path, i: int) -> Path:
    return out / _chunk_name(i)


_CHUNK_KEY = "_sweep_key"


def _read_chunk(path: Path, n: int, key: str) -> dict[str, np.ndarray] | None:
    """A finished chunk's columns, or None if it is absent or not this sweep's (another key,
    another length, unreadable)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z[_CHUNK_KEY]) != key:
                return None
            cols = {k: z[k] for k in COLUMNS}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None
    return cols if all(v.shape == (n,) for v in cols.values()) else None


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """``np.savez`` of ``arrays``, byte for byte the same for the same arrays (numpy's own
    stamps each member with the time it was written)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, value in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with z.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)
    return buf.getvalue()


def _write_chunk(path: Path, cols: dict[str, np.ndarray], key: str) -> None:
    atomic_write_bytes(path, _npz_bytes({**cols, _CHUNK_KEY: np.array(key)}))


def _finished_chunk(out: Path, i: int, n: int, key: str) -> Path | None:
    """The file of chunk ``i`` of the sweep ``key`` already evaluated into ``out``: under way
    (:func:`_work`) or published by an earlier run; None if there is none."""
    for path in (_chunk_path(_work(out), i), _chunk_path(out, i)):
        if _read_chunk(path, n, key) is not None:
            return path
    return None


def _barrier(name: str) -> None:
    """Wait for every process of a ``jax.distributed`` job."""
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)  # (a chunk is never modified in place: renames only)
    except OSError:
        shutil.copyfile(src, dst)


#: Files every finished whole sweep publishes (``results.parquet`` only with pyarrow).
_RESULT_FILES = ("results.csv", "results.parquet", "pareto.csv", "pareto.png", "axes.png")


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` (``--shard``) as ``(I, N)``: slice I (0 .. N-1) of N.

    Raises:
      ConfigError: not two whole numbers ``I/N`` with ``0 <= I < N``.
    """
    i, sep, n = text.partition("/")
    try:
        index, count = int(i), int(n)
    except ValueError:
        index, count = -1, 0
    if not sep or not 0 <= index < count:
        raise ConfigError(f"--shard takes I/N with 0 <= I < N (slice I of N, e.g. 0/4 ... 3/4), "
                          f"got {text!r}.")
    return index, count


def run_sweep(graph: Graph, base: NpuSpec, grid: Grid, out: str | Path, *,
              model: str = "", sample: int | None = None, method: str = "random",
              seed: int = 0, chunk_size: int = DEFAULT_CHUNK,
              objectives: Sequence[str] = DEFAULT_OBJECTIVES, progress: bool = True,
              devices: Sequence[Any] | None = None,
              model_sha256: str | None = None,
              shard: tuple[int, int] | None = None) -> SweepRun:
    """Evaluate a sweep into ``out`` chunk by chunk, resuming a previous run, and write the
    results, the Pareto front and plots, all together (``npujax._atomic.staged_dir``).

    Under ``jax.distributed`` (``jax.process_count() > 1``) each process evaluates its share of
    the chunks on its local devices; ``out`` must be a folder every process can write (a shared
    file system); process 0 merges after a barrier and writes the results.

    With ``shard=(I, N)`` only slice ``I`` of ``N`` is evaluated: the chunks ``c`` with
    ``c % N == I``, with no coordinator (a scheduler's job array). ``out`` then gets the
    slice's chunks and ``sweep.json``; :func:`merge_sweeps` joins the N slices' folders into the
    files one whole run writes, byte for byte.

    Args:
      graph: the optimized graph.
      base: the NPU the grid's axes change.
      grid: the axes.
      out: the sweep's folder (new, an earlier run of the same sweep, or any folder: files npujax
        did not write are kept, and refused where the sweep writes one).
      model: the model's name, recorded in ``sweep.json`` (a resumed run must match).
      sample: None for every configuration, else how many to draw
        (:func:`npujax.explore.configurations`).
      method: ``random`` or ``lhs``.
      seed: the sampling seed.
      chunk_size: configurations per chunk file.
      objectives: columns the Pareto front minimises.
      progress: show a progress bar (on a terminal).
      devices: devices to shard each chunk over (default: the local devices).
      model_sha256: the sha256 of the model file's bytes (:func:`file_sha256`; the command
        line passes it), part of the sweep's key with a digest of the model's layers.
      shard: ``(I, N)``: evaluate slice I of N only (:func:`parse_shard`).

    Returns:
      A :class:`SweepRun` (its ``result`` is None for a slice and on processes other than 0).

    Raises:
      ConfigError: bad arguments, an unknown objective, or ``out`` holding another sweep (the
        message names what changed: the model file's contents, its layers, the NPU spec, the
        grid, the sampling, the chunk size, the slice or the npujax version).
      OutputError: ``out`` is a file, or holds a file npujax did not write where the sweep
        writes one (named; checked before the work).
    """
    import jax

    if chunk_size < 1:
        raise ConfigError(f"--chunk-size must be >= 1, got {chunk_size}.")
    _check_objectives(objectives)
    out = Path(out)
    configs = configurations(grid, sample, method, seed)
    n = len(configs)
    nchunks = -(-n // chunk_size)
    from npujax.plan.workload import workloads

    sweep = {"model": model, "model_sha256": model_sha256,
             "layers_sha256": _sha256_text(repr(workloads(graph, base))),
             "npu": base.name, "npu_sha256": _sha256_text(spec_to_toml(base)),
             "grid": grid.to_json(), "sample": sample,
             "method": method if sample else None, "seed": seed,
             "chunk_size": chunk_size, "configs": n, "npujax": __version__}
    if shard is not None:
        if not (0 <= shard[0] < shard[1]):
            raise ConfigError(f"shard {shard} is not (I, N) with 0 <= I < N.")
        sweep["shard"] = f"{shard[0]}/{shard[1]}"
    meta = {"sweep": sweep}
    key = _sweep_key(sweep)
    index, count = shard or (0, 1)
    ours = [i for i in range(nchunks) if i % count == index]  # this slice's chunks
    rank, procs = jax.process_index(), jax.process_count()
    if rank == 0:
        check_output_dir(out)  # (finishes a publish a kill cut; clears dead staging folders)
        _check_folder(out, meta)
        refuse_foreign(out, [_META, *(_chunk_name(i) for i in ours),
                              *(() if shard else _RESULT_FILES)])
        atomic_write_text(_work(out) / _META, json.dumps(meta, indent=2) + "\n")
    if procs > 1:
        _barrier("npujax-sweep-start")
    mine = [i for j, i in enumerate(ours) if j % procs == rank]
    todo, skipped = [], 0
    for i in mine:
        rows = min(chunk_size, n - i * chunk_size)
        if _finished_chunk(out, i, rows, key) is None:
            todo.append(i)
        else:
            skipped += 1
    layers = 0
    cache: dict[Any, Any] = {}
    t0 = time.perf_counter()
    done = 0
    total = sum(min(chunk_size, n - i * chunk_size) for i in todo)
    # (nothing to evaluate, a resumed sweep: no progress lines, the summary says so)
    with progress_bar(progress and total > 0, "sweep", total, field="evaluations/s",
                      unit="configurations") as advance:
        for i in todo:
            sl = configs[i * chunk_size:(i + 1) * chunk_size]
            cols = evaluate_configs(graph, base, grid, sl, devices, cache,
                                    numpy=runs_with_numpy(n))  # (the whole sweep's n)
            _write_chunk(_chunk_path(_work(out), i), cols, key)
            layers = len(next(iter(cache.values()))[1].layers)
            done += len(sl)
            advance(done * layers / max(time.perf_counter() - t0, 1e-9), len(sl))
    seconds = time.perf_counter() - t0
    rate = done * layers / seconds if done else 0.0
    if todo:
        # (debug: the command line prints its own summary of the same run)
        log.debug("sweep: %d configurations x %d layers in %.2f s (%.3g evaluations/s; process "
                  "%d/%d), %d chunk(s) already done", done, layers, seconds, rate, rank, procs,
                  skipped)
    if procs > 1:
        _barrier("npujax-sweep-done")
        if rank != 0:
            return SweepRun(None, len(todo), skipped, rate, [])
    chunks = {}
    for i in ours:
        rows = min(chunk_size, n - i * chunk_size)
        path = _finished_chunk(out, i, rows, key)
        if path is None:
            raise OutputError(f"chunk {i} of the sweep in {str(out)!r} is missing after the "
                              "run (was the folder shared by every process?); rerun to resume.")
        chunks[i] = path
    if not cache:  # everything was resumed: count the layers once
        layers = len(workloads(graph, base))
    if not done:  # nothing evaluated now: the rate stays the one the evaluating run measured
        rate = _previous_rate(out, rate)
    result = None
    with staged_dir(out) as stage:
        for i, path in chunks.items():
            _link_or_copy(path, _chunk_path(stage, i))
        if shard is None:
            whole = SweepResult(grid, configs, _join_chunks([chunks[i] for i in ours]), layers,
                                seconds)
            files = write_results(stage, whole, base, objectives,
                                  {**meta, "evaluations_per_s": rate, "processes": procs})
            result = whole
        else:  # a slice: what merge_sweeps needs to rebuild the whole sweep's files
            atomic_write_text(stage / _META, json.dumps(
                {**meta, "layers": layers, "seconds": seconds, "evaluations": done,
                 "processes": procs, "npu_toml": spec_to_toml(base)}, indent=2) + "\n")
            files = [_META]
    _drop_work(out)
    return SweepRun(result, len(todo), skipped, rate, [*files, "chunks/"])


def _check_objectives(objectives: Sequence[str]) -> None:
    unknown = [o for o in objectives if o not in (*COLUMNS, "pes", "sram_bytes")]
    if unknown:
        raise ConfigError(f"unknown Pareto objective(s) {unknown}; use columns such as "
                          f"latency_s, sustained_latency_s, energy_j, edp_js, area_mm2, pes, "
                          "sram_bytes, dram_bytes.")


def _join_chunks(paths: Sequence[Path]) -> dict[str, np.ndarray]:
    parts = []
    for path in paths:
        with np.load(path, allow_pickle=False) as z:
            parts.append({k: z[k] for k in COLUMNS})
    return {k: np.concatenate([p[k] for p in parts]) for k in COLUMNS}


def kept_chunks(out: str | Path) -> int:
    """How many finished chunks a sweep into ``out`` keeps for a rerun to resume (under way
    or published)."""
    names = {p.name for folder in (_work(Path(out)), Path(out))
             for p in (folder / "chunks").glob("chunk-*.npz")}
    return len(names)


def _drop_work(out: Path) -> None:
    """Remove a published sweep's work folder (its chunks are in ``chunks/`` now)."""
    shutil.rmtree(_work(out), ignore_errors=True)
    with contextlib.suppress(OSError):
        (out / WORK).rmdir()


def merge_sweeps(folders: Sequence[str | Path], out: str | Path, *,
                 objectives: Sequence[str] = DEFAULT_OBJECTIVES) -> SweepRun:
    """Join the slices of one sweep (``npujax sweep --shard I/N`` runs) into the files one whole
    run writes: the same chunks, results, Pareto front and plots, byte for byte (``sweep.json``
    differs only in the measured rate and the process count).

    Args:
      folders: the N slices' output folders, in any order.
      out: the folder to write the whole sweep to (as :func:`run_sweep`).
      objectives: columns the Pareto front minimises.

    Returns:
      A :class:`SweepRun` of the whole sweep (no chunk evaluated now).

    Raises:
      ConfigError: a folder that holds no slice; slices of different sweeps (the message names
        what differs: the model file's contents, its layers, the NPU spec, the grid, the
        sampling, the chunk size or the npujax version), of different splits, a slice given
        twice or missing, or a slice missing one of its chunks.
      OutputError: as :func:`run_sweep`.
    """
    from npujax.hw.spec import npu_spec_from_dict

    _check_objectives(objectives)
    if not folders:
        raise ConfigError("--merge takes the folders of the N slices (npujax sweep --shard I/N "
                          "--out DIR runs).")
    slices = [_read_slice(Path(f)) for f in folders]
    first_dir, first = slices[0]
    counts = {m["sweep"]["shard"].split("/")[1] for _, m in slices}
    if len(counts) > 1:
        raise ConfigError("the slices come from different splits: " + ", ".join(
            f"{str(d)!r} is {m['sweep']['shard']}" for d, m in slices) + "; merge the N slices "
            "of one --shard I/N split.")
    whole = {k: v for k, v in first["sweep"].items() if k != _SLICE}
    for d, m in slices[1:]:
        if _sweep_key(m["sweep"]) != _sweep_key(whole):
            what, detail = _changes(whole, {k: v for k, v in m["sweep"].items() if k != _SLICE})
            detail = detail.replace(" then,", f" in {str(first_dir)!r},").replace(
                " now", f" in {str(d)!r}")
            raise ConfigError(f"{str(d)!r} and {str(first_dir)!r} are slices of different "
                              f"sweeps, which differ in {what} ({detail}); merge the slices of "
                              "one sweep.")
    count = int(counts.pop())
    by_index: dict[int, Path] = {}
    for d, m in slices:
        i = int(m["sweep"]["shard"].split("/")[0])
        if i in by_index:
            raise ConfigError(f"slice {i}/{count} is given twice ({str(by_index[i])!r} and "
                              f"{str(d)!r}); pass each slice's folder once.")
        by_index[i] = d
    missing = [f"{i}/{count}" for i in range(count) if i not in by_index]
    if missing:
        raise ConfigError(f"slice(s) {', '.join(missing)} missing: pass the folders of all "
                          f"{count} slices (npujax sweep --shard I/{count} runs).")
    sweep = whole
    toml = first.get("npu_toml")
    if not isinstance(toml, str) or _sha256_text(toml) != sweep["npu_sha256"]:
        raise ConfigError(f"{str(first_dir / _META)!r} does not hold the NPU spec its sweep "
                          "was run with (npu_toml); rerun that slice.")
    base = npu_spec_from_dict(tomllib.loads(toml), f"{first_dir / _META}")
    grid = Grid.build(sweep["grid"], base)
    configs = configurations(grid, sweep["sample"], sweep["method"] or "random", sweep["seed"])
    n, size = len(configs), int(sweep["chunk_size"])
    if n != sweep["configs"]:
        raise ConfigError(f"the slices' grid gives {n} configurations, not {sweep['configs']}; "
                          "merge with the npujax version that ran them.")
    key = _sweep_key(sweep)
    chunks = {}
    for i in range(-(-n // size)):
        d = by_index[i % count]
        path = _chunk_path(d, i)
        if _read_chunk(path, min(size, n - i * size), key) is None:
            raise ConfigError(f"slice {i % count}/{count} in {str(d)!r} lacks chunk {i} "
                              f"({_chunk_name(i)}); rerun that slice to finish it.")
        chunks[i] = path
    out = Path(out)
    meta = {"sweep": sweep}
    check_output_dir(out)
    _check_folder(out, meta)
    refuse_foreign(out, [_META, *(_chunk_name(i) for i in chunks), *_RESULT_FILES])
    layers = int(first["layers"])
    seconds = sum(float(m["seconds"]) for _, m in slices)
    evaluations = sum(int(m["evaluations"]) for _, m in slices)
    rate = evaluations * layers / seconds if seconds > 0 else 0.0
    cols = _join_chunks([chunks[i] for i in sorted(chunks)])
    result = SweepResult(grid, configs, cols, layers, seconds)
    with staged_dir(out) as stage:
        for i, path in chunks.items():
            _link_or_copy(path, _chunk_path(stage, i))
        files = write_results(stage, result, base, objectives, {
            **meta, "evaluations_per_s": rate,
            "processes": sum(int(m.get("processes", 1)) for _, m in slices)})
    _drop_work(out)
    return SweepRun(result, 0, len(chunks), rate, [*files, "chunks/"])


def _read_slice(folder: Path) -> tuple[Path, dict[str, Any]]:
    """A slice's folder and its ``sweep.json``."""
    path = folder / _META
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        raise ConfigError(f"{str(folder)!r} holds no sweep slice ({_META} is missing or "
                          "unreadable); pass the --out folders of npujax sweep --shard I/N "
                          "runs.") from None
    sweep = meta.get("sweep") if isinstance(meta, dict) else None
    if not isinstance(sweep, dict) or "npujax" not in sweep:
        raise ConfigError(f"{str(folder)!r} holds no sweep slice of this npujax; pass the --out "
                          "folders of npujax sweep --shard I/N runs.")
    if not isinstance(sweep.get("shard"), str):
        raise ConfigError(f"{str(folder)!r} holds a whole sweep, not a slice; --merge joins the "
                          "folders of npujax sweep --shard I/N runs.")
    if not all(k in meta for k in ("layers", "seconds", "evaluations")):
        raise ConfigError(f"{str(path)!r} lacks the slice's figures (layers, seconds); rerun "
                          "that slice.")
    return folder, meta


def write_results(out: Path, result: SweepResult, base: NpuSpec, objectives: Sequence[str],
                  meta: dict[str, Any]) -> list[str]:
    """Write ``results.csv`` (+ ``results.parquet`` with pyarrow), ``pareto.csv``, the plots and
    ``sweep.json`` with the summary; returns the names written."""
    table = result.table(base)
    front = pareto_front(np.stack([np.asarray(table[o], np.float64) for o in objectives], 1))
    names = ["results.csv", "pareto.csv"]
    write_table_csv(out / "results.csv", table)
    write_table_csv(out / "pareto.csv", {k: v[front] for k, v in table.items()})
    if write_table_parquet(out / "results.parquet", table):
        names.append("results.parquet")
    names += plot_sweep(out, result, table, front, objectives)
    best = int(np.argmin(table["latency_s"]))
    summary = {**meta, "pareto_objectives": list(objectives), "pareto_size": int(front.size),
               "fastest": {k: _plain(v[best]) for k, v in table.items()}}
    atomic_write_text(out / _META, json.dumps(summary, indent=2) + "\n")
    return [*names, _META]


def _plain(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v


def write_table_csv(path: Path, table: dict[str, np.ndarray]) -> None:
    """Columns as CSV (floats with full precision, so a reread gives the same numbers)."""
    import csv

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(list(table))
    cols = [v.tolist() for v in table.values()]
    w.writerows(zip(*cols))
    atomic_write_text(path, buf.getvalue())


def write_table_parquet(path: Path, table: dict[str, np.ndarray]) -> bool:
    """Columns as Parquet when pyarrow is installed (``pip install npujax[sweep]``); returns
    whether it was written."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        log.info("pyarrow is not installed: results.parquet skipped (pip install pyarrow)")
        return False
    t = pa.table({k: (v.astype(str) if v.dtype == object else v) for k, v in table.items()})
    buf = pa.BufferOutputStream()
    pq.write_table(t, buf)
    atomic_write_bytes(path, buf.getvalue().to_pybytes())
    return True


def _scale(ax: Any, which: str, values: np.ndarray) -> None:
    """The scale of ``ax``'s ``which`` axis (``"x"`` or ``"y"``) for ``values``: logarithmic
    where the positive values span at least a decade, labelled in plain text (``0.001``, as
    ``LogFormatter`` writes them: matplotlib's default labels, ``10^-3``, go through its
    mathtext parser, which takes 0.2-0.4 CPU s in a process's first plot, a tenth of a cold
    ``npujax sweep``); linear otherwise, where a log axis has one decade tick or none and
    ``LogFormatter`` labels the fallback ticks to one significant figure (``3e-02`` on every
    tick of a 30.09-30.13 ms range)."""
    from matplotlib.ticker import LogFormatter

    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size or v.max() < 10.0 * v.min():
        return  # linear, matplotlib's ScalarFormatter (plain text)
    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_formatter(LogFormatter())
    axis.set_minor_formatter(LogFormatter())


def plot_sweep(out: Path, result: SweepResult, table: dict[str, np.ndarray],
               front: np.ndarray, objectives: Sequence[str]) -> list[str]:
    """``pareto.png`` (the first two objectives, the front highlighted) and ``axes.png`` (the
    best and median of the first objective per value of each axis); returns the names written.
    """
    x, y = (objectives[1], objectives[0]) if len(objectives) > 1 else ("pes", objectives[0])
    fig, ax = new_figure(6.5, 4.5)
    ax.scatter(table[x], table[y], s=8, alpha=0.4, label="configurations")
    order = front[np.argsort(table[x][front], kind="stable")]
    ax.plot(table[x][order], table[y][order], "o-", color="C3", ms=4, label="Pareto front")
    _scale(ax, "x", table[x])
    _scale(ax, "y", table[y])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(f"{len(result)} configurations, {front.size} on the Pareto front")
    # the legend below the axes, where it covers no point (matplotlib's "best" is slow on many
    # points, and warns); fixed margins (inches) rather than tight_layout, which draws every
    # figure twice
    fig.legend(loc="lower center", ncol=2, frameon=False)
    fig.subplots_adjust(left=1.15 / 6.5, right=1 - 0.2 / 6.5, bottom=0.95 / 4.5, top=1 - 0.4 / 4.5)
    save_figure(fig, out / "pareto.png", tight=False)
    axes = result.grid.axes
    width = 3.2 * len(axes)
    fig, _ = new_figure(width, 3.7)
    fig.clear()
    fig.subplots_adjust(left=1.15 / width, right=1 - 0.2 / width, bottom=1.55 / 3.7,
                        top=1 - 0.15 / 3.7, wspace=0.45)
    metric = table[y]
    for j, (name, vals) in enumerate(axes):
        a = fig.add_subplot(1, len(axes), j + 1)
        best = [metric[result.configs[:, j] == k].min(initial=np.inf) for k in range(len(vals))]
        med = [np.median(metric[result.configs[:, j] == k]) if np.any(result.configs[:, j] == k)
               else np.nan for k in range(len(vals))]
        labels = [f"{v:g}" if isinstance(v, float) else str(v) for v in vals]
        a.plot(labels, best, "o-", label="best")
        a.plot(labels, med, "s--", label="median")
        # a long dotted field name on two lines (section, then key), so it fits its panel
        a.set_xlabel(name.replace(".", ".\n", 1) if len(name) > 24 else name)
        _scale(a, "y", metric)
        a.tick_params(axis="x", labelrotation=30)
        if j == 0:
            a.set_ylabel(y)
    # below the panels, where it covers no point
    fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="lower center", ncol=2,
               frameon=False)
    save_figure(fig, out / "axes.png", tight=False)
    return ["pareto.png", "axes.png"]
