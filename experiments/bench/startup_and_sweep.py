"""Benchmark (issue 30, targets 1 and 4): command-line start-up, the Pareto front, the README's
sweep cold and from the compile cache, and a 10^6-configuration sweep against its program's own
steady throughput, each side by side with the code before, from one run.

Usage:  python experiments/bench/startup_and_sweep.py [--before OTHER_CHECKOUT] [--rounds 5]
            [--sweep-rounds 3] [--rows 1000000] [--no-startup] [--no-pareto] [--no-sweep]
            [--big 1000000] [--steady-rounds 0] [--out RESULT.json] [--plot FIGURE.png]

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
      a fresh process: cold (an empty compile cache), warm (a second process on the cache
      the first filled) and warm at another input width (the same layers' count, other
      shapes), with the persistent-cache hits and misses (XLA compilations) counted
      through ``jax.monitoring``, and where each run's CPU goes (imports, the ONNX import,
      tracing and lowering or loading the cost program, XLA compiling it, evaluating, the
      CSV/Parquet files, the two plots); with ``--before`` the same for the other checkout,
      interleaved, median of ``--sweep-rounds`` rounds; the target is <= 3 s cold;
  (4) ``--big`` configurations (default 10^6: 10 values each of array.rows, array.cols,
      memory.dram_bytes_per_s, array.clock_hz and memory.filter_sram_bytes, bits 2,4,6,8,16 and
      dataflows ws,os) of ``zoo:ppocr_cls`` swept end to end by ``npujax.workflows.run_sweep``
      (chunks, results.csv/parquet, Pareto front, plots: all the command does after the import),
      in layer evaluations per CPU second, against the same compiled program's steady throughput
      (a batch of one chunk, 4096 configurations, already on the device, called again and
      again); the target is >= 30 %. ``--big 0`` skips it;
  (4s) with ``--steady-rounds N``: that program's steady throughput alone for each checkout,
      each measurement in a fresh process, the checkouts interleaved, median of N rounds.

The machine's load average is printed before and after: on a shared machine the ratios (each
pair measured back to back) are steadier than the absolute seconds.

Every checkout is measured as installed, with its bytecode written first
(``experiments/bench/_bytecode.py``: a shell with ``PYTHONDONTWRITEBYTECODE=1`` would otherwise
compile npujax's modules in every process, 0.15-0.3 CPU s that no user pays).
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

# The README's sweep, with the CPU seconds of each phase (process_time, this process's threads)
# and the persistent compilation cache's hits and compile requests (jax.monitoring) printed on
# stderr: the wrapped functions are npujax's, found by name so the same child runs on the
# checkout before.
_PHASES = """
import sys, time, resource
t0 = time.process_time()
import jax, jax._src.compiler as comp
from jax import monitoring
seen = {}
monitoring.register_event_listener(lambda e, **k: seen.__setitem__(e, seen.get(e, 0) + 1))
spent, active = {}, []
def timed(name, f):
    def g(*a, **k):
        t = time.process_time()
        active.append(name)
        try:
            return f(*a, **k)
        finally:
            active.pop()
            spent[name] = spent.get(name, 0.0) + time.process_time() - t
    return g
def compiled(f):
    def g(*a, **k):
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            key = "XLA compile in " + (active[-1] if active else "other")
            spent[key] = spent.get(key, 0.0) + time.process_time() - t
    return g
comp.backend_compile_and_load = compiled(comp.backend_compile_and_load)
import npujax.cli.sweep as cs, npujax.workflows.sweep as ws
spent["imports (jax, npujax)"] = time.process_time() - t0
cs._load_model = timed("ONNX import + optimize", cs._load_model)
ws.evaluate_configs = timed("evaluate (trace, lower, compile, run)", ws.evaluate_configs)
ws.write_table_csv = timed("CSV", ws.write_table_csv)
ws.write_table_parquet = timed("Parquet", ws.write_table_parquet)
ws.plot_sweep = timed("plots (matplotlib)", ws.plot_sweep)
from npujax.cli import main
sys.argv[0] = "npujax"
code = main()  # (as the program runs it: its own process's start-up, npujax.cli.main)
r = resource.getrusage(resource.RUSAGE_SELF)
spent["total"] = r.ru_utime + r.ru_stime
print("PHASES", repr(spent), file=sys.stderr)
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
    floors = {"import onnxruntime": "import onnxruntime",
              # what every computing command pays: ml_dtypes 0.7.0 alone took 0.75 s of it
              # (pyproject.toml excludes that release)
              "import numpy, ml_dtypes": "import numpy, ml_dtypes", "import jax": "import jax"}
    samples: dict[str, list[float]] = {k: [] for k in floors}
    for _ in range(rounds):  # interleaved: load changes hit every command alike
        for name, code in floors.items():
            samples[name].append(child_cpu([sys.executable, "-c", code])[0])
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


RUNS = ("cold", "warm", "warm, other shape")
#: The third run: the same model at another input width (the same 164 layers, other shapes),
#: on the cache the first two filled.
OTHER_SHAPE = "x=1,3,48,320"


def sweep(checkouts: dict[str, Path], rounds: int) -> dict:
    """The README sweep in fresh processes, per checkout: cold (an empty compile cache), warm
    (a second process on the cache the first filled) and warm at another input shape
    (:data:`OTHER_SHAPE`), ``rounds`` times, the checkouts interleaved in every round. Per
    checkout and run: the median CPU seconds, compilations and cache hits, and the median CPU
    seconds of each phase; whether every run of one command wrote the same ``results.csv``
    bytes within each checkout, and across the checkouts."""
    samples: dict[str, list[dict]] = {}
    csvs: dict[tuple[str, bool], set[bytes]] = {}
    for _ in range(rounds):
        for label, checkout in checkouts.items():
            with tempfile.TemporaryDirectory() as tmp:
                env = env_for(checkout, NPUJAX_COMPILE_CACHE=str(Path(tmp) / "cache"))
                for run in RUNS:
                    folder = Path(tmp) / run.replace(" ", "_").replace(",", "")
                    argv = README_SWEEP if run != RUNS[2] else [
                        OTHER_SHAPE if a == "x=1,3,48,192" else a for a in README_SWEEP]
                    cpu, err = _child_cpu([sys.executable, "-c", _PHASES, *argv,
                                           "--out", str(folder)], env, checkout)
                    samples.setdefault(f"{label}: {run}", []).append(
                        {"cpu_s": cpu, **_parse_child(err)})
                    csvs.setdefault((label, argv is README_SWEEP), set()).add(
                        (folder / "results.csv").read_bytes())
    out: dict = {}
    for key, runs in samples.items():
        phases = {k: statistics.median(r["phases"].get(k, 0.0) for r in runs)
                  for k in runs[0]["phases"]}
        out[key] = {"cpu_s": statistics.median(r["cpu_s"] for r in runs),
                    "cpu_s_all": [r["cpu_s"] for r in runs],
                    "compilations": int(statistics.median(r["compilations"] for r in runs)),
                    "cache_hits": int(statistics.median(r["cache_hits"] for r in runs)),
                    "phases": phases}
    out["results.csv identical"] = all(len(v) == 1 for v in csvs.values())
    out["results.csv identical across checkouts"] = all(
        len(set().union(*(v for (_, readme), v in csvs.items() if readme == r))) == 1
        for r in (True, False))
    return out


def _parse_child(err: str) -> dict:
    """The phases (CPU s; each without the XLA compilations inside it, reported as their own
    lines), compilations and cache hits that :data:`_PHASES` printed."""
    import ast

    spent = ast.literal_eval(next(x for x in err.splitlines()
                                  if x.startswith("PHASES"))[len("PHASES "):])
    line = next(x for x in err.splitlines() if x.startswith("CACHE"))
    hits, _, requests = (int(v) for v in line.split()[1:])
    for phase in ("ONNX import + optimize", "evaluate (trace, lower, compile, run)"):
        spent[phase] -= spent.get(f"XLA compile in {phase}", 0.0)
    spent["evaluate: trace, lower or load, run"] = spent.pop(
        "evaluate (trace, lower, compile, run)")
    spent["XLA compile: the sweep's program(s)"] = spent.pop(
        "XLA compile in evaluate (trace, lower, compile, run)", 0.0)
    spent["XLA compile: ONNX import's folds"] = spent.pop(
        "XLA compile in ONNX import + optimize", 0.0)
    spent["XLA compile: other"] = spent.pop("XLA compile in other", 0.0)
    spent["other (imports in run, spec, grid)"] = spent["total"] - sum(
        v for k, v in spent.items() if k != "total")
    return {"phases": spent, "cache_hits": hits, "compilations": requests - hits}


BIG_GRID = {"array.rows": [4, 6, 8, 12, 16, 24, 32, 48, 64, 96],
            "array.cols": [4, 6, 8, 12, 16, 24, 32, 48, 64, 96],
            "memory.dram_bytes_per_s": [float(x) * 1e9 for x in range(1, 21, 2)],
            "array.clock_hz": [float(x) * 1e8 for x in range(2, 22, 2)],
            "memory.filter_sram_bytes": [1 << k for k in range(12, 22)],
            "bits": [2, 4, 6, 8, 16], "dataflow": ["ws", "os"]}


def _big_setup():
    """The classifier's graph, the base spec, :data:`BIG_GRID` and the network."""
    from npujax.explore.grid import Grid
    from npujax.frontends.onnx import parse_input_shapes
    from npujax.hw import load_npu_spec
    from npujax.models.zoo import fetch_model
    from npujax.plan.program import network
    from npujax.workflows.lowering import import_onnx_for_lowering

    graph = import_onnx_for_lowering(fetch_model("ppocr_cls"),
                                     parse_input_shapes(["x=1,3,48,192"]), None)
    base = load_npu_spec("edge_16x16")
    return graph, base, Grid.build(BIG_GRID, base), network(graph, base)


def steady(seconds: float = 20.0) -> float:
    """Layer evaluations per CPU second of the sweep's compiled program alone: one chunk's
    batch of :data:`BIG_GRID` configurations (drawn at random), on the device, called until
    ``seconds`` CPU seconds have passed (the first call, which compiles, not counted). Runs
    the npujax on the path (part 4, and each checkout's child in part 4s)."""
    import importlib

    import jax

    from npujax._exact import exact
    from npujax.explore.grid import configurations
    from npujax.hw import fields
    from npujax.plan.program import needs_static_layers
    from npujax.plan.table import layer_table
    from npujax.systolic.dataflow import get_dataflow
    from npujax.workflows.sweep import DEFAULT_CHUNK

    sw = importlib.import_module("npujax.explore.sweep")
    _, base, grid, (layers, chains) = _big_setup()
    cfg = configurations(grid, DEFAULT_CHUNK, "random", 1)
    vals = {name: np.asarray(v)[cfg[:, j]] for j, (name, v) in enumerate(grid.axes)}
    dfs = tuple(get_dataflow(d).name for d in BIG_GRID["dataflow"])
    table = hasattr(sw, "_table_program") and not needs_static_layers(base, chains)
    spec = sw._program_spec(base) if table else base  # (the program the sweep runs)
    stacked = fields.stack(spec, {k: v for k, v in vals.items()
                                  if k not in ("bits", "array.dataflow")}, DEFAULT_CHUNK)
    index = np.asarray([dfs.index(d) for d in vals["array.dataflow"]], np.int32)
    with jax.enable_x64(True):
        args = (stacked, vals["bits"].astype(np.float64), index)
        if table:
            program = sw._table_program(dfs, sw._mesh(None))
            args += (layer_table(layers, sw._table_length(len(layers))),)
        else:
            program = sw._program(tuple(layers), dfs, sw._mesh(None), tuple(chains))
        f = exact(program)
        args = jax.device_put(args)
        jax.block_until_ready(f(*args))
        calls, t = 0, time.process_time()
        while time.process_time() - t < seconds or calls < 3:
            jax.block_until_ready(f(*args))
            calls += 1
        return calls * DEFAULT_CHUNK * len(layers) / (time.process_time() - t)


def steady_interleaved(checkouts: dict[str, Path], rounds: int, seconds: float
                       ) -> dict[str, dict]:
    """:func:`steady` of each checkout in a fresh process (its npujax first on the path),
    ``rounds`` times, the checkouts interleaved in every round: median and all samples."""
    code = (f"import sys; sys.path.insert(1, {str(Path(__file__).resolve().parent)!r}); "
            f"import startup_and_sweep as b; print('STEADY', b.steady({seconds!r}))")
    samples: dict[str, list[float]] = {label: [] for label in checkouts}
    for _ in range(rounds):
        for label, checkout in checkouts.items():
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               env=env_for(checkout), cwd=checkout)
            if r.returncode != 0:
                raise SystemExit(f"steady ({label}) failed:\n{r.stderr[-3000:]}")
            samples[label].append(float(next(x for x in r.stdout.splitlines()
                                             if x.startswith("STEADY")).split()[1]))
    return {label: {"median": statistics.median(v), "all": v} for label, v in samples.items()}


def big_sweep(limit: int) -> dict[str, float]:
    """Layer evaluations per CPU second of a ``limit``-configuration sweep of zoo:ppocr_cls end
    to end (``run_sweep``: chunks, result files, Pareto front, plots) and of its compiled
    program alone (:func:`steady`), in this process."""
    sys.path.insert(0, str(HERE))
    from npujax.workflows.sweep import run_sweep

    graph, base, grid, (layers, _) = _big_setup()
    sample = None if limit >= grid.size else limit
    n = grid.size if sample is None else sample
    out: dict[str, float] = {"configurations": float(n), "layers": float(len(layers))}
    steady_rate = steady()
    out["program steady (layer evals/CPU s)"] = steady_rate
    with tempfile.TemporaryDirectory() as tmp:
        t = time.process_time()
        r = run_sweep(graph, base, grid, Path(tmp) / "big", model="ppocr_cls", sample=sample,
                      progress=False)
        cpu = time.process_time() - t
    out["end to end CPU s"] = cpu
    out["end to end (layer evals/CPU s)"] = n * r.result.layers / cpu
    out["end to end / steady"] = out["end to end (layer evals/CPU s)"] / steady_rate
    return out


def plot(result: dict, path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sweep_only = "startup" not in result or "pareto" not in result
    fig = Figure(figsize=(13, 5.2) if sweep_only else (10, 3.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    if sweep_only:
        _plot_sweep(fig, result)
        fig.savefig(path, dpi=110)
        return
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


def _plot_sweep(fig, result: dict) -> None:
    """Parts 3 and 4 only: the README sweep before/after, cold and warm, with the phases of
    each; the 10^6 rates."""
    axes = fig.axes
    s = result.get("sweep", {})
    names = list(s)
    axes[0].barh(names, [v["cpu_s"] for v in s.values()], color="C2")
    for i, v in enumerate(s.values()):
        axes[0].text(v["cpu_s"], i, f" {v['compilations']} compiles", va="center", fontsize=7)
    axes[0].axvline(3.0, color="C3", ls="--", label="target 3 s")
    axes[0].set_xlabel("CPU s, README sweep (fresh process)")
    axes[0].legend(loc="lower right", fontsize=7)
    axes[0].tick_params(axis="y", labelsize=7)
    # each run's phases stacked in one bar
    left = np.zeros(len(names))
    phases = [k for k in (s[names[0]]["phases"] if names else {}) if k != "total"]
    for j, ph in enumerate(phases):
        w = np.asarray([s[n]["phases"].get(ph, 0.0) for n in names])
        axes[1].barh(names, w, left=left, color=f"C{j % 10}", label=ph)
        left += w
    axes[1].set_xlabel("CPU s per phase (median)")
    axes[1].tick_params(axis="y", labelsize=7)
    if phases:
        axes[1].legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=6)
    b = result.get("big")
    if b:
        labels = ["program alone (steady)", "sweep end to end"]
        vals = [b["program steady (layer evals/CPU s)"], b["end to end (layer evals/CPU s)"]]
        axes[2].barh(labels, vals, color=["C1", "C4"])
        axes[2].axvline(0.3 * vals[0], color="C3", ls="--", label="30 % of steady")
        axes[2].set_xlabel("layer evaluations / CPU s")
        axes[2].set_title(f"{int(b['configurations']):,} configurations", fontsize=9)
        axes[2].legend(loc="lower right", fontsize=7)
        axes[2].tick_params(axis="y", labelsize=7)
    elif result.get("steady"):  # part 4s: each checkout's program alone
        st = result["steady"]
        axes[2].barh(list(st), [v["median"] for v in st.values()], color="C1")
        axes[2].set_xlabel("layer evals / CPU s (program, steady)")
        axes[2].tick_params(axis="y", labelsize=7)
    fig.tight_layout()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="another checkout of npujax (e.g. a worktree of main "
                    "before these changes), measured side by side")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sweep-rounds", type=int, default=3,
                    help="interleaved rounds of part (3) (a cold and a warm run each)")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--no-startup", action="store_true")
    ap.add_argument("--no-pareto", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--big", type=int, default=1_000_000,
                    help="configurations of part (4) (0 skips it)")
    ap.add_argument("--steady-rounds", type=int, default=0,
                    help="part (4s): the sweep program's steady throughput per checkout, each "
                    "in a fresh process, interleaved, this many rounds (0 skips it)")
    ap.add_argument("--steady-seconds", type=float, default=20.0,
                    help="CPU seconds each part (4s) measurement calls the program")
    ap.add_argument("--out", help="write the figures as JSON")
    ap.add_argument("--keep", help="an earlier --out JSON: its parts this run skips are kept "
                    "in --out and the plot (e.g. a long part 4 measured once)")
    ap.add_argument("--plot", help="write a bar chart (PNG)")
    args = ap.parse_args()
    checkouts = {"after": HERE}
    if args.before:
        checkouts = {"before": Path(args.before).resolve(), **checkouts}
    from _bytecode import as_installed

    as_installed(checkouts.values())
    from importlib.metadata import version
    result: dict = {"load_before": os.getloadavg(), "cpus": os.cpu_count(), "rows": args.rows,
                    "versions": {p: version(p) for p in ("jax", "jaxlib", "ml_dtypes", "numpy")}}
    print(f"load average at the start {result['load_before'][0]:.1f} on {result['cpus']} CPUs; "
          + ", ".join(f"{k} {v}" for k, v in result["versions"].items()), flush=True)
    if not args.no_startup:
        result["startup"] = startup(checkouts, args.rounds)
        ort = result["startup"]["import onnxruntime"]["median_s"]
        print(f"(1) start-up, CPU s, median of {args.rounds} (ratio to import onnxruntime; "
              "target <= 2)")
        for k, v in result["startup"].items():
            print(f"    {k:32s} {v['median_s']:7.3f}   {v['median_s'] / ort:5.2f}x")
    if not args.no_pareto:
        result["pareto"] = pareto(args.rows)
        print(f"(2) Pareto front of {args.rows:,} random rows, CPU s (target <= 2)")
        for k, v in result["pareto"].items():
            print(f"    {k:32s} {v:9.3f}")
    if not args.no_sweep:
        result["sweep"] = sweep(checkouts, args.sweep_rounds)
        print(f"(3) README sweep in a fresh process, CPU s, median of {args.sweep_rounds} "
              "interleaved rounds (cold: empty compile cache; warm: the cache cold filled)")
        same = result["sweep"].pop("results.csv identical")
        across = result["sweep"].pop("results.csv identical across checkouts")
        for k, v in result["sweep"].items():
            print(f"    {k:32s} {v['cpu_s']:7.2f}   {v['compilations']:3d} compilations, "
                  f"{v['cache_hits']:3d} cache hits   (all: "
                  + ", ".join(f"{x:.2f}" for x in v["cpu_s_all"]) + ")")
        result["results_csv_identical"] = same
        result["results_csv_identical_across_checkouts"] = across
        print(f"    results.csv of every run of a command byte for byte the same: {same} "
              f"(within each checkout), {across} (across them)")
        if len(checkouts) > 1:
            for run in RUNS:
                b, a = (result["sweep"][f"{c}: {run}"]["cpu_s"] for c in checkouts)
                print(f"    {run}: after / before = {a / b:.2f}")
        runs = list(result["sweep"])
        print("    where the CPU goes (median per phase), s:")
        print(f"      {'phase':38s} " + " ".join(f"{k[:14]:>14s}" for k in runs))
        for phase in result["sweep"][runs[0]]["phases"]:
            print(f"      {phase:38s} " + " ".join(
                f"{result['sweep'][k]['phases'].get(phase, 0.0):14.2f}" for k in runs))
        print("      (columns: " + "; ".join(runs) + ")")
    if args.big:
        result["big"] = big_sweep(args.big)
        print(f"(4) a {int(result['big']['configurations']):,}-configuration sweep end to end "
              "against its program's steady throughput (target >= 30 %)")
        for k, v in result["big"].items():
            print(f"    {k:38s} {v:11.4g}")
    if args.steady_rounds:
        result["steady"] = steady_interleaved(checkouts, args.steady_rounds,
                                              args.steady_seconds)
        print(f"(4s) the sweep program alone (the part 4 grid, one chunk of 4,096), layer "
              f"evaluations per CPU s, fresh process per checkout, median of "
              f"{args.steady_rounds} interleaved rounds")
        for label, v in result["steady"].items():
            print(f"    {label:8s} {v['median']:11.4g}   (all: "
                  + ", ".join(f"{x:.4g}" for x in v["all"]) + ")")
        if len(checkouts) > 1:
            b, a = (result["steady"][c]["median"] for c in checkouts)
            print(f"    after / before = {a / b:.2f}")
    result["load_after"] = os.getloadavg()
    if args.keep:
        earlier = json.loads(Path(args.keep).read_text())
        for part in ("startup", "pareto", "sweep", "big", "steady"):
            if part not in result and part in earlier:
                result[part] = earlier[part]
                result.setdefault("kept_from_earlier_run", []).append(part)
    print(f"load average before {result['load_before'][0]:.1f}, after "
          f"{result['load_after'][0]:.1f} on {result['cpus']} CPUs")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
