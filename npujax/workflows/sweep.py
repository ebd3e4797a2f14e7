"""A design-space sweep written to a folder: chunks written atomically, resumption, the results
table (Parquet and CSV), the Pareto front and plots (used by ``npujax sweep``).

The folder holds ``sweep.json`` (what is swept: model, base preset, grid, sample, chunk size),
``chunks/chunk-NNNNNN.npz`` (the :data:`~npujax.explore.COLUMNS` of ``chunk_size``
consecutive configurations, each written atomically), and, once every chunk is there,
``results.csv`` (and ``results.parquet`` where pyarrow is installed), ``pareto.csv`` and the
plots. A rerun with the same inputs skips the finished chunks, so an interrupted sweep resumes
where it stopped. The inputs are keyed by their contents, not their names: the model file's
sha256 (when there is a file), a digest of the model's costed layers, of the NPU spec (every
field, not the preset's name), the grid, the sampling, the chunk size and the npujax version.
A rerun whose inputs differ is refused with a one-line error naming what changed (never a
silent restart: the folder may hold hours of results); pass a new ``--out`` for the new sweep.
Each chunk also records the key of its sweep and is only resumed under the same key.

Several processes (``jax.distributed``, one per host or GPU group) share the work: process
``p`` of ``P`` evaluates the chunks ``i`` with ``i % P == p`` on its local devices and writes
them into the shared folder; after a barrier, process 0 merges them.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from npujax._atomic import atomic_write_bytes, atomic_write_text
from npujax._progress import progress_bar
from npujax._version import __version__
from npujax.errors import ConfigError, OutputError
from npujax.explore.grid import Grid, configurations
from npujax.explore.sweep import COLUMNS, SweepResult, evaluate_configs, pareto_front
from npujax.hw.spec import NpuSpec, spec_to_toml
from npujax.ir.graph import Graph
from npujax.report.plots import new_figure, save_figure

__all__ = ["run_sweep", "SweepRun", "write_results", "write_table_csv", "write_table_parquet",
           "plot_sweep", "file_sha256", "DEFAULT_CHUNK", "DEFAULT_OBJECTIVES"]

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


def file_sha256(path: str | os.PathLike[str]) -> str | None:
    """The sha256 of a file's bytes, or None when ``path`` is not a file (a Keras spec)."""
    from npujax._atomic import file_sha256 as sha256_of

    return sha256_of(path) if Path(path).is_file() else None


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _sweep_key(sweep: dict[str, Any]) -> str:
    """One digest of everything a sweep's chunks depend on (recorded in every chunk)."""
    return _sha256_text(json.dumps({k: v for k, v in sweep.items() if k not in _NAMES},
                                   sort_keys=True))


def _shown(value: Any) -> str:
    text = str(value)
    return text[:12] if isinstance(value, str) and len(value) == 64 else text[:40]


def _check_folder(out: Path, meta: dict[str, Any]) -> None:
    """Refuse a folder holding something other than this sweep, naming what changed."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {str(out)!r} is a file; pass a folder.")
    if not out.is_dir() or not any(out.iterdir()):
        return
    path = out / _META
    if not path.is_file():
        raise OutputError(f"output folder {str(out)!r} holds files npujax did not write for a "
                          "sweep; pass a new or empty folder (or an earlier sweep's, to resume).")
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise OutputError(f"{str(path)!r} is unreadable ({e}); pass a new folder.") from None
    before = old.get("sweep") if isinstance(old, dict) else None
    now = meta["sweep"]
    if isinstance(before, dict) and _sweep_key(before) == _sweep_key(now):
        return
    if not isinstance(before, dict) or "npujax" not in before:
        raise ConfigError(f"{str(out)!r} holds a sweep written by an earlier npujax, which did "
                          "not record its inputs' contents, so it cannot be resumed safely; "
                          "pass a new --out (or delete the folder).")
    changed = [(key, label) for key, label in _KEY_FIELDS if before.get(key) != now.get(key)]
    if not changed:  # (a field of a later npujax's key)
        changed = [(k, k) for k in sorted(set(before) | set(now))
                   if k not in _NAMES and before.get(k) != now.get(k)]
    labels = [label for _, label in changed]
    what = labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]
    detail = "; ".join(f"{key} {_shown(before.get(key))} then, {_shown(now.get(key))} now"
                       for key, _ in changed)
    raise ConfigError(f"{str(out)!r} holds a different sweep: {what} changed ({detail}); "
                      "resume it with the same inputs, or pass a new --out for this sweep.")


def _chunk_path(out: Path, i: int) -> Path:
    return out / "chunks" / f"chunk-{i:06d}.npz"


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
    except (OSError, ValueError, KeyError):
        return None
    return cols if all(v.shape == (n,) for v in cols.values()) else None


def _write_chunk(path: Path, cols: dict[str, np.ndarray], key: str) -> None:
    buf = io.BytesIO()
    # numpy's stubs type **kwds of savez as bool (allow_pickle); they are the arrays
    np.savez(buf, **cols, **{_CHUNK_KEY: np.array(key)})  # type: ignore[arg-type]
    atomic_write_bytes(path, buf.getvalue())


def _barrier(name: str) -> None:
    """Wait for every process of a ``jax.distributed`` job."""
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)


def run_sweep(graph: Graph, base: NpuSpec, grid: Grid, out: str | Path, *,
              model: str = "", sample: int | None = None, method: str = "random",
              seed: int = 0, chunk_size: int = DEFAULT_CHUNK,
              objectives: Sequence[str] = DEFAULT_OBJECTIVES, progress: bool = True,
              devices: Sequence[Any] | None = None,
              model_sha256: str | None = None) -> SweepRun:
    """Evaluate a sweep into ``out`` chunk by chunk, resuming a previous run, and write the
    results, the Pareto front and plots.

    Under ``jax.distributed`` (``jax.process_count() > 1``) each process evaluates its share of
    the chunks on its local devices; ``out`` must be a folder every process can write (a shared
    file system); process 0 merges after a barrier and writes the results.

    Args:
      graph: the optimized graph.
      base: the NPU the grid's axes change.
      grid: the axes.
      out: the sweep's folder (new, empty, or an earlier run of the same sweep).
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

    Returns:
      A :class:`SweepRun`.

    Raises:
      ConfigError: bad arguments, an unknown objective, or ``out`` holding another sweep (the
        message names what changed: the model file's contents, its layers, the NPU spec, the
        grid, the sampling, the chunk size or the npujax version).
      OutputError: ``out`` is a file or holds files npujax did not write.
    """
    import jax

    if chunk_size < 1:
        raise ConfigError(f"--chunk-size must be >= 1, got {chunk_size}.")
    unknown = [o for o in objectives if o not in (*COLUMNS, "pes", "sram_bytes")]
    if unknown:
        raise ConfigError(f"unknown Pareto objective(s) {unknown}; use columns such as "
                          f"latency_s, sustained_latency_s, energy_j, edp_js, area_mm2, pes, "
                          "sram_bytes, dram_bytes.")
    out = Path(out)
    configs = configurations(grid, sample, method, seed)
    n = len(configs)
    nchunks = -(-n // chunk_size)
    from npujax.plan.workload import workloads

    meta = {"sweep": {"model": model, "model_sha256": model_sha256,
                      "layers_sha256": _sha256_text(repr(workloads(graph, base))),
                      "npu": base.name, "npu_sha256": _sha256_text(spec_to_toml(base)),
                      "grid": grid.to_json(), "sample": sample,
                      "method": method if sample else None, "seed": seed,
                      "chunk_size": chunk_size, "configs": n, "npujax": __version__}}
    key = _sweep_key(meta["sweep"])
    rank, procs = jax.process_index(), jax.process_count()
    if rank == 0:
        _check_folder(out, meta)
        if not (out / _META).is_file():
            atomic_write_text(out / _META, json.dumps(meta, indent=2) + "\n")
    if procs > 1:
        _barrier("npujax-sweep-start")
    mine = [i for i in range(nchunks) if i % procs == rank]
    todo, skipped = [], 0
    for i in mine:
        rows = min(chunk_size, n - i * chunk_size)
        if _read_chunk(_chunk_path(out, i), rows, key) is None:
            todo.append(i)
        else:
            skipped += 1
    layers = 0
    cache: dict[Any, Any] = {}
    t0 = time.perf_counter()
    done = 0
    total = sum(min(chunk_size, n - i * chunk_size) for i in todo)
    with progress_bar(progress, "sweep", total, field="evaluations/s") as advance:
        for i in todo:
            sl = configs[i * chunk_size:(i + 1) * chunk_size]
            cols = evaluate_configs(graph, base, grid, sl, devices, cache)
            _write_chunk(_chunk_path(out, i), cols, key)
            layers = len(next(iter(cache.values()))[1].layers)
            done += len(sl)
            advance(done * layers / max(time.perf_counter() - t0, 1e-9), len(sl))
    seconds = time.perf_counter() - t0
    rate = done * layers / seconds if done else 0.0
    if todo:
        log.info("sweep: %d configurations x %d layers in %.2f s (%.3g evaluations/s; process "
                 "%d of %d), %d chunk(s) already done", done, layers, seconds, rate, rank + 1,
                 procs, skipped)
    if procs > 1:
        _barrier("npujax-sweep-done")
        if rank != 0:
            return SweepRun(None, len(todo), skipped, rate, [])
    parts = []
    for i in range(nchunks):
        rows = min(chunk_size, n - i * chunk_size)
        c = _read_chunk(_chunk_path(out, i), rows, key)
        if c is None:
            raise OutputError(f"chunk {i} of the sweep in {str(out)!r} is missing after the "
                              "run (was the folder shared by every process?); rerun to resume.")
        parts.append(c)
    cols = {k: np.concatenate([p[k] for p in parts]) for k in COLUMNS}
    if not cache:  # everything was resumed: count the layers once
        layers = len(workloads(graph, base))
    result = SweepResult(grid, configs, cols, layers, seconds)
    files = write_results(out, result, base, objectives, {**meta, "evaluations_per_s": rate,
                                                          "processes": procs})
    return SweepRun(result, len(todo), skipped, rate, files)


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


def plot_sweep(out: Path, result: SweepResult, table: dict[str, np.ndarray],
               front: np.ndarray, objectives: Sequence[str]) -> list[str]:
    """``pareto.png`` (the first two objectives, the front highlighted) and ``axes.png`` (the
    best and median latency per value of each axis); returns the names written."""
    x, y = (objectives[1], objectives[0]) if len(objectives) > 1 else ("pes", objectives[0])
    fig, ax = new_figure(6.5, 4.5)
    ax.scatter(table[x], table[y], s=8, alpha=0.4, label="configurations")
    order = front[np.argsort(table[x][front], kind="stable")]
    ax.plot(table[x][order], table[y][order], "o-", color="C3", ms=4, label="Pareto front")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(f"{len(result)} configurations, {front.size} on the Pareto front")
    ax.legend(loc="upper right")  # (matplotlib's "best" is slow on many points, and warns)
    save_figure(fig, out / "pareto.png")
    axes = result.grid.axes
    fig, _ = new_figure(3.2 * len(axes), 3.2)
    fig.clear()
    for j, (name, vals) in enumerate(axes):
        a = fig.add_subplot(1, len(axes), j + 1)
        lat = table["latency_s"]
        best = [lat[result.configs[:, j] == k].min(initial=np.inf) for k in range(len(vals))]
        med = [np.median(lat[result.configs[:, j] == k]) if np.any(result.configs[:, j] == k)
               else np.nan for k in range(len(vals))]
        labels = [str(v) for v in vals]
        a.plot(labels, best, "o-", label="best")
        a.plot(labels, med, "s--", label="median")
        a.set_xlabel(name)
        a.set_yscale("log")
        a.tick_params(axis="x", labelrotation=30)
        if j == 0:
            a.set_ylabel("latency_s")
            a.legend(loc="upper right")
    save_figure(fig, out / "axes.png")
    return ["pareto.png", "axes.png"]
