"""Benchmark (issue 30, targets 1 and 4): command-line start-up, the Pareto front and the README's
sweep cold and from the compile cache, each side by side with the code before, from one run.

Usage:  python experiments/bench/startup_and_sweep.py [--before OTHER_CHECKOUT] [--rounds 5]
            [--rows 1000000] [--no-sweep] [--out RESULT.json] [--plot FIGURE.png]

Prints:
  (1) CPU seconds (user + system, ``resource.getrusage(RUSAGE_CHILDREN)`` around each
      subprocess) of ``python -c "import onnxruntime"`` against ``npujax --help``,
      ``npujax --version`` and ``npujax sweep --help`` (``python -m npujax``, this checkout, and
      with ``--before`` the other checkout), interleaved, median of ``--rounds``; the target is
      <= 2x onnxruntime's import;
  (2) CPU seconds of the Pareto front of ``--rows`` random rows: the row-by-row scan npujax used
      before (copied below, the reference) against :func:`npujax.explore.pareto_front`, two
      objectives (the sweep's default, latency against PEs) and three (new only: the scan would
      take hours); the target is <= 2 s for 10^6 rows;
  (3) CPU seconds of the README's sweep (``zoo:ppocr_cls``, 162 configurations x 164 layers) in
      a fresh process: cold (an empty compile cache) and a second run (the cache the first
      filled), with the persistent-cache hits and misses (XLA compilations) counted through
      ``jax.monitoring``; with ``--before`` the same for the other checkout.

The machine's load average is printed before and after: on a shared machine the ratios (each
pair measured back to back) are steadier than the absolute seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[2]

README_SWEEP = ["sweep", "zoo:ppocr_cls", "--input-shape", "x=1,3,48,192", "--npu", "edge_16x16",
                "--grid", "array.rows=8,16,32", "--grid", "array.cols=8,16,32",
                "--grid", "memory.dram_bytes_per_s=3.2e9,6.4e9,12.8e9",
                "--grid", "dataflow=ws,os,is", "--bits", "4,8", "--no-progress"]

# `npujax ARGS` with the persistent compilation cache's hits and misses printed on stderr.
_COUNTED = """
import sys
from jax import monitoring
seen = {}
monitoring.register_event_listener(lambda e, **k: seen.__setitem__(e, seen.get(e, 0) + 1))
from npujax.cli import main
code = main(sys.argv[1:])
print("CACHE", seen.get("/jax/compilation_cache/cache_hits", 0),
      seen.get("/jax/compilation_cache/cache_misses", 0),
      seen.get("/jax/compilation_cache/compile_requests_use_cache", 0), file=sys.stderr)
sys.exit(code)
"""


def child_cpu(cmd: list[str], checkout: Path = HERE) -> tuple[float, str]:
    """CPU seconds (user + system) of one subprocess run in ``checkout`` (``python -m`` and
    ``-c`` put the working folder first on the path), and its stderr."""
    return _child_cpu(cmd, env_for(checkout), checkout)


def _child_cpu(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), r.stderr


def env_for(checkout: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(checkout), **extra}


def startup(checkouts: dict[str, Path], rounds: int) -> dict[str, dict[str, float]]:
    """Median CPU seconds per command and checkout (and onnxruntime's import)."""
    commands = {"--help": ["--help"], "--version": ["--version"],
                "sweep --help": ["sweep", "--help"]}
    samples: dict[str, list[float]] = {"import onnxruntime": []}
    for _ in range(rounds):  # interleaved: load changes hit every command alike
        samples["import onnxruntime"].append(
            child_cpu([sys.executable, "-c", "import onnxruntime"])[0])
        for label, checkout in checkouts.items():
            for name, argv in commands.items():
                samples.setdefault(f"{label}: npujax {name}", []).append(
                    child_cpu([sys.executable, "-m", "npujax", *argv], checkout)[0])
    return {k: {"median_s": statistics.median(v), "min_s": min(v)} for k, v in samples.items()}


def pareto_row_by_row(objectives: np.ndarray) -> np.ndarray:
    """npujax's Pareto front before the vectorised one (explore/sweep.py), verbatim."""
    obj = np.asarray(objectives, np.float64)
    order = np.lexsort(obj.T[::-1])
    front: list[int] = []
    for i in order:
        if front:
            f = obj[front]
            dominated = np.all(f <= obj[i], axis=1) & np.any(f < obj[i], axis=1)
            if dominated.any():
                continue
        front.append(int(i))
    return np.asarray(front, np.int64)


def pareto(rows: int) -> dict[str, float]:
    sys.path.insert(0, str(HERE))
    from npujax.explore import pareto_front

    rng = np.random.default_rng(0)
    out = {}
    two = rng.random((rows, 2))
    t = time.process_time()
    new = pareto_front(two)
    out["new, 2 objectives"] = time.process_time() - t
    t = time.process_time()
    old = pareto_row_by_row(two)
    out["row by row, 2 objectives"] = time.process_time() - t
    assert new.tolist() == old.tolist(), "the fronts differ"
    three = rng.random((rows, 3))
    t = time.process_time()
    pareto_front(three)
    out["new, 3 objectives"] = time.process_time() - t
    out["front size, 2 objectives"] = float(len(new))
    return out


def sweep(checkouts: dict[str, Path]) -> dict[str, dict[str, float]]:
    out = {}
    for label, checkout in checkouts.items():
        with tempfile.TemporaryDirectory() as tmp:
            env = env_for(checkout, NPUJAX_COMPILE_CACHE=str(Path(tmp) / "cache"))
            for run in ("cold", "second run"):
                cpu, err = _child_cpu([sys.executable, "-c", _COUNTED, *README_SWEEP, "--out",
                                       str(Path(tmp) / run.replace(" ", "_"))], env, checkout)
                line = next(x for x in err.splitlines() if x.startswith("CACHE"))
                hits, misses, requests = (int(v) for v in line.split()[1:])
                out[f"{label}: {run}"] = {"cpu_s": cpu, "cache_hits": hits,
                                          "compilations": requests - hits}
    return out


def plot(result: dict, path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    st = result["startup"]
    names = list(st)
    axes[0].barh(names, [st[n]["median_s"] for n in names], color="C0")
    axes[0].axvline(2 * st["import onnxruntime"]["median_s"], color="C3", ls="--",
                    label="2x import onnxruntime")
    axes[0].set_xlabel("CPU s (median)")
    axes[0].legend(loc="lower right", fontsize=7)
    axes[0].tick_params(axis="y", labelsize=7)
    p = {k: v for k, v in result["pareto"].items() if "size" not in k}
    axes[1].barh(list(p), list(p.values()), color="C1")
    axes[1].set_xscale("log")
    axes[1].set_xlabel(f"CPU s, Pareto of {result['rows']:,} rows")
    axes[1].tick_params(axis="y", labelsize=7)
    if result.get("sweep"):
        s = result["sweep"]
        axes[2].barh(list(s), [v["cpu_s"] for v in s.values()], color="C2")
        axes[2].set_xlabel("CPU s, README sweep")
        axes[2].tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="another checkout of npujax (e.g. a worktree of main "
                    "before these changes), measured side by side")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--out", help="write the figures as JSON")
    ap.add_argument("--plot", help="write a bar chart (PNG)")
    args = ap.parse_args()
    checkouts = {"after": HERE}
    if args.before:
        checkouts = {"before": Path(args.before).resolve(), **checkouts}
    result: dict = {"load_before": os.getloadavg(), "cpus": os.cpu_count(), "rows": args.rows}
    result["startup"] = startup(checkouts, args.rounds)
    ort = result["startup"]["import onnxruntime"]["median_s"]
    print(f"(1) start-up, CPU s, median of {args.rounds} (ratio to import onnxruntime; target "
          "<= 2)")
    for k, v in result["startup"].items():
        print(f"    {k:32s} {v['median_s']:7.3f}   {v['median_s'] / ort:5.2f}x")
    result["pareto"] = pareto(args.rows)
    print(f"(2) Pareto front of {args.rows:,} random rows, CPU s (target <= 2)")
    for k, v in result["pareto"].items():
        print(f"    {k:32s} {v:9.3f}")
    if not args.no_sweep:
        result["sweep"] = sweep(checkouts)
        print("(3) README sweep in a fresh process, CPU s (persistent compile cache)")
        for k, v in result["sweep"].items():
            print(f"    {k:32s} {v['cpu_s']:7.2f}   {v['compilations']:3d} compilations, "
                  f"{v['cache_hits']:3d} cache hits")
    result["load_after"] = os.getloadavg()
    print(f"load average before {result['load_before'][0]:.1f}, after "
          f"{result['load_after'][0]:.1f} on {result['cpus']} CPUs")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
