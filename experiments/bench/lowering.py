"""Benchmark: ONNX import + lowering time, vmapped lowering over hardware configurations, and the
jitted JAX forward pass against onnxruntime — all measured side by side in one run.

Usage:  python experiments/bench/lowering.py [--configs 1000] [--model ppocr_det] [--rounds 3]
            [--only-end-to-end] [--before OTHER_CHECKOUT]

Prints (and writes as JSON with --out):
  (0) ``npujax lower MODEL`` end to end, CPU seconds after the imports, split into ONNX import,
      optimize (of which BN folding), the cost model of every dataflow (workloads, tracing,
      compilation, evaluation, reports) and printing the tables: the current pipeline side by
      side with the reference (the pipeline before: every ONNX node traced for its shapes, one
      ``lower`` and one compilation per dataflow, int64 division, stacked mapping candidates),
      each run in a fresh process (so every compilation is counted), interleaved, median of
      ``--rounds``; the current pipeline cold (empty compile cache) and warm (the command's
      compile cache holding the model's programs, as after a first run); the share of each
      phase; and the whole command as a user runs it (``python -m npujax lower``, imports
      included: CPU s and peak RSS), for both checkouts with ``--before``, with the ratios;
  (1) import + optimize + lower wall time for the model (first call, incl. compilation) and the
      steady-state lowering time, side by side with the steady time of the layer-fused schedule
      (``fusion="layer"``: activations kept on chip, depth-first pairs; target <= 2x);
  (2) the full lowering of the model vmapped across N hardware configurations (array size, SRAM
      sizes and DRAM bandwidth as traced numbers) in one jitted call: (configuration x layer)
      evaluations per second (target >= 1e6 on 2 CPU cores);
  (3) the jitted JAX forward pass vs onnxruntime on the same input, interleaved medians
      (target: <= 1.5x ORT's time on the classifier, <= 1x on the detector).

Every checkout is measured as installed, with its bytecode written first
(``experiments/bench/_bytecode.py``: a shell with ``PYTHONDONTWRITEBYTECODE=1`` would otherwise
compile npujax's modules in every process, 0.15-0.3 CPU s that no user pays).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from npujax.frontends.onnx import from_onnx
from npujax.hw import load_npu_spec
from npujax.ir.execute import execute
from npujax.ir.passes import optimize
from npujax.models.zoo import fetch_model
from npujax.plan import layer_costs, lower, workloads

SHAPES = {"ppocr_det": (1, 3, 640, 640), "ppocr_cls": (1, 3, 48, 192)}


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


#: The phases of ``npujax lower`` timed in (0), by the function that runs each (``cost_model``
#: holds ``cost_program``: tracing, compiling or loading and running the cost program, and
#: ``reports``: the per-layer reports built from its answers).
PHASES = {"onnx_import": ("npujax.workflows.lowering", "from_onnx"),
          "optimize": ("npujax.workflows.lowering", "optimize"),
          "fold_batchnorm": ("npujax.ir.passes", "fold_batchnorm"),
          "cost_model": ("npujax.plan.lower", "lower_by_dataflow"),
          "cost_program": ("npujax.plan.lower", "_costs_program"),
          "reports": ("npujax.plan.lower", "_schedule"),
          "print_tables": ("npujax.report.lowering", "print_lowering")}
#: Phases inside another (not added to ``other``).
NESTED = ("fold_batchnorm", "cost_program", "reports")


def _reference_pipeline() -> None:
    """Put the pipeline before back: every ONNX node traced for its shapes, one ``lower`` per
    dataflow (and the preset's, cached) compiled with LLVM's optimizations (not run with
    numpy), int64 division, the mapping candidates stacked on an axis."""
    import importlib

    from npujax import _program_cache

    _program_cache._use_numpy = False

    import npujax.frontends.onnx as onnx_frontend
    import npujax.plan.lower as plan_lower
    from npujax._relax import integer_division
    from npujax.systolic import DATAFLOWS
    from npujax.systolic.mapping import stacked_search

    onnx_frontend._signature = lambda *a: None  # type: ignore[assignment]
    # LLVM -O2 and the MLIR fusion emitters, as before
    importlib.import_module("npujax.plan.lower")._cost_options = lambda: {}

    def per_dataflow(graph, spec, quant=None, *, dataflows=DATAFLOWS, batch=None):
        with integer_division(), stacked_search():
            lower(graph, spec, quant, batch=batch)
            return {df: lower(graph, spec, quant, dataflow=df, batch=batch) for df in dataflows}
    plan_lower.lower_by_dataflow = per_dataflow  # type: ignore[assignment]


def end_to_end(model: str, npu: str, reference: bool) -> dict[str, float]:
    """CPU seconds of ``npujax lower MODEL --npu NPU`` in this process, after the imports, per
    phase (:data:`PHASES`) and in total."""
    import importlib

    import npujax.cli as cli

    cli.build_parser()  # imports every command's modules: not counted
    import npujax.plan  # noqa: F401
    import npujax.report.lowering  # noqa: F401
    import npujax.workflows.lowering  # noqa: F401

    if reference:
        _reference_pipeline()
    spent: dict[str, float] = {k: 0.0 for k in PHASES}
    for phase, (module, name) in PHASES.items():
        mod = importlib.import_module(module)
        fn = getattr(mod, name)

        def timed(*a, _fn=fn, _phase=phase, **k):
            t = time.process_time()
            try:
                return _fn(*a, **k)
            finally:
                spent[_phase] += time.process_time() - t
        setattr(mod, name, timed)
    shape = ",".join(str(d) for d in SHAPES[model])
    t = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        sys.argv = ["npujax", "lower", str(fetch_model(model)), "--input-shape", f"x={shape}",
                    "--npu", npu]
        code = cli.main()  # (as the program runs it: its own process's start-up)
    total = time.process_time() - t
    if code:
        raise SystemExit(f"npujax lower failed with exit code {code}")
    spent["optimize_other"] = spent.pop("optimize") - spent["fold_batchnorm"]
    spent["cost_model_other"] = (spent["cost_model"] - spent["cost_program"]
                                 - spent["reports"])
    spent["other"] = total - sum(v for k, v in spent.items()
                                 if k not in NESTED and k != "cost_model_other")
    return {**spent, "total": total}


def whole_command(tree: str, model: str, npu: str, cache: str) -> dict[str, float]:
    """CPU seconds (user + system) and peak RSS (MB) of ``python -m npujax lower MODEL`` run by
    a user, imports included, from checkout ``tree`` with compile cache ``cache``."""
    shape = ",".join(str(d) for d in SHAPES[model])
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(PYTHONPATH=tree, NPUJAX_COMPILE_CACHE=cache)
    cmd = [sys.executable, "-m", "npujax", "lower", str(fetch_model(model)), "--input-shape",
           f"x={shape}", "--npu", npu, "--no-progress"]
    # (run outside any checkout: ``python -m`` puts the working folder first on sys.path)
    proc = subprocess.Popen(cmd, env=env, cwd=cache, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if status:
        raise SystemExit(f"{' '.join(cmd)} failed in {tree}: {err[-2000:]}")
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024}


def compare_end_to_end(model: str, npu: str, rounds: int, before: str | None = None) -> dict:
    """(0): the reference pipeline, the current one with an empty compile cache (cold: what a
    first run pays) and with a warm one (a model lowered before: ``npujax.cli.compile_cache``),
    each in fresh processes, interleaved; with ``before`` (another checkout of npujax, e.g. a
    ``git worktree`` of the previous commit) also that checkout's current pipeline, cold and
    warm, run from its own tree."""
    import tempfile

    warm_dirs = {"new_warm": tempfile.mkdtemp(prefix="npujax-bench-warm-"),
                 "before_warm": tempfile.mkdtemp(prefix="npujax-bench-warm-before-")}
    base = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def run(variant: str) -> dict[str, float]:
        cache = warm_dirs.get(variant) or ("off" if variant == "reference" else
                                           tempfile.mkdtemp(prefix="npujax-bench-cold-"))
        tree = before if variant.startswith("before") else here
        paths = [tree] + [p for p in sys.path if os.path.abspath(p or ".") != here]
        out = subprocess.run(
            [sys.executable, os.path.join(tree, "experiments", "bench", "lowering.py"),
             "--model", model, "--npu", npu, "--end-to-end",
             "reference" if variant == "reference" else "new"], check=True,
            capture_output=True, text=True, cwd=tree,
            env={**base, "NPUJAX_COMPILE_CACHE": cache,
                 "PYTHONPATH": os.pathsep.join(paths)}).stdout
        return json.loads(out.strip().splitlines()[-1])

    def command(variant: str) -> dict[str, float]:
        cache = warm_dirs.get(variant) or tempfile.mkdtemp(prefix="npujax-bench-cold-")
        return whole_command(before if variant.startswith("before") else here, model, npu,
                             cache)

    variants = ["reference", *(("before", "before_warm") if before else ()), "new", "new_warm"]
    for v in warm_dirs:  # fill the warm caches
        if v in variants:
            run(v)
    load_start = os.getloadavg()
    print(f"(0) load average at start: {load_start}")
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    commands: dict[str, list[dict[str, float]]] = {v: [] for v in variants[1:]}
    for _ in range(rounds):
        for variant in runs:
            runs[variant].append(run(variant))
            if variant in commands:
                commands[variant].append(command(variant))
    load_end = os.getloadavg()
    med = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in runs.items()}
    whole = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
             for v, rs in commands.items()}
    ref = med["reference"]
    print(f"(0) npujax lower {model} on {npu}, CPU s after imports (median of {rounds}, fresh "
          "processes, interleaved):")
    keys = list(dict.fromkeys(k for m in med.values() for k in m))
    print(f"    {'phase':16s}" + "".join(f" {v:>12s}" for v in variants))
    for k in keys:
        print(f"    {k:16s}" + "".join(f" {med[v][k]:12.2f}" if k in med[v] else f" {'-':>12s}"
                                     for v in variants))
    print("    share of the total, new cold / new warm: " + ", ".join(
        f"{k} {100 * med['new'][k] / med['new']['total']:.0f} / "
        f"{100 * med['new_warm'][k] / med['new_warm']['total']:.0f} %"
        for k in keys if k in med["new"] and k in med["new_warm"] and k != "total"))
    for v in variants[1:]:
        print(f"    total, {v}: {ref['total']:.2f} -> {med[v]['total']:.2f} s = "
              f"{ref['total'] / med[v]['total']:.2f}x less")
    print("    the whole command (python -m npujax lower, imports included; CPU s, peak RSS):")
    for v in whole:
        target = 1.0 if v.endswith("warm") else 2.0
        print(f"    {v:12s} {whole[v]['cpu_s']:6.2f} s {whole[v]['peak_rss_mb']:6.0f} MB "
              f"[target <= {target:g} s: {'met' if whole[v]['cpu_s'] <= target else 'NOT met'}]")
    if before:
        for v in ("", "_warm"):
            b, n = whole[f"before{v}"]["cpu_s"], whole[f"new{v}"]["cpu_s"]
            bp, npr = med[f"before{v}"]["total"], med[f"new{v}"]["total"]
            print(f"    {'warm' if v else 'cold'}: whole command {b:.2f} -> {n:.2f} s = "
                  f"{b / n:.2f}x less; after imports {bp:.2f} -> {npr:.2f} s = "
                  f"{bp / npr:.2f}x less")
    print(f"(0) load average at end: {load_end}")
    return {"end_to_end_cpu_s": med, "whole_command": whole, "end_to_end_rounds": rounds,
            "load_average": [load_start, load_end]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ppocr_det", choices=sorted(SHAPES))
    ap.add_argument("--configs", type=int, default=1000)
    ap.add_argument("--npu", default="edge_16x16")
    ap.add_argument("--rounds", type=int, default=3, help="end-to-end rounds (median)")
    ap.add_argument("--end-to-end", choices=("new", "reference"),
                    help="(internal) time one `npujax lower` in this process, print JSON")
    ap.add_argument("--only-end-to-end", action="store_true", help="run (0) only")
    ap.add_argument("--before", metavar="CHECKOUT",
                    help="(0) also times this other npujax checkout's pipeline, cold and warm")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    if args.end_to_end:
        print(json.dumps(end_to_end(args.model, args.npu, args.end_to_end == "reference")))
        return
    from _bytecode import as_installed

    as_installed([Path(__file__).resolve().parents[2], *([args.before] if args.before else [])])
    res: dict = {"model": args.model, "input_shape": SHAPES[args.model], "npu": args.npu,
                 "backend": jax.default_backend()}
    res.update(compare_end_to_end(args.model, args.npu, args.rounds, args.before))
    if args.only_end_to_end:
        _write(args.out, res)
        return
    path = fetch_model(args.model)
    shape = SHAPES[args.model]
    spec = load_npu_spec(args.npu)
    res["npu"] = spec.name

    # (1) import + lowering
    t = time.perf_counter()
    graph, params = from_onnx(path, {"x": shape})
    t_import = time.perf_counter() - t
    t = time.perf_counter()
    og, op = optimize(graph, params)
    sched = lower(og, spec)
    t_lower_first = time.perf_counter() - t
    t_lower = _best(lambda: lower(og, spec), 3)
    res.update(import_s=t_import, optimize_and_first_lower_s=t_lower_first,
               lower_steady_s=t_lower, layers=len(sched.layers), latency_s=sched.latency_s,
               macs=sched.macs)
    print(f"(1) import {t_import:.2f} s; optimize + first lower {t_lower_first:.2f} s "
          f"(incl. compile); steady lower {t_lower * 1e3:.1f} ms; {len(sched.layers)} layers, "
          f"{sched.macs / 1e9:.2f} GMACs, {sched.latency_s * 1e3:.2f} ms on {spec.name}")
    t = time.perf_counter()
    fused = lower(og, spec, fusion="layer")
    t_fused_first = time.perf_counter() - t
    # interleaved, so both see the same load on a shared machine
    t_plain = min(_best(lambda: lower(og, spec), 1) for _ in range(5))
    t_fused = min(_best(lambda: lower(og, spec, fusion="layer"), 1) for _ in range(5))
    res.update(lower_steady_s=min(t_lower, t_plain), fused_first_lower_s=t_fused_first,
               fused_lower_steady_s=t_fused, fused_over_plain=t_fused / min(t_lower, t_plain),
               fused_latency_s=fused.latency_s, fused_dram_bytes=fused.dram_bytes,
               dram_bytes=sched.dram_bytes)
    ratio = t_fused / min(t_lower, t_plain)
    print(f"    layer fusion: first {t_fused_first:.2f} s; steady {t_fused * 1e3:.1f} ms = "
          f"{ratio:.2f}x the default [target <= 2x: {'met' if ratio <= 2 else 'NOT met'}]; "
          f"{fused.latency_s * 1e3:.2f} ms, DRAM {sched.dram_bytes / 1e6:.1f} -> "
          f"{fused.dram_bytes / 1e6:.1f} MB")

    # (2) vmapped lowering across hardware configurations
    layers = tuple(workloads(og, spec))
    n, L = args.configs, len(layers)
    rng = np.random.default_rng(0)
    sizes = rng.choice([8, 16, 32, 64, 128], n).astype(np.int32)
    # the spec itself is the vmapped pytree: one stacked spec with [n] leaves
    hw = jax.tree.map(lambda v: jnp.broadcast_to(jnp.asarray(v), (n,)), spec)
    hw = dataclasses.replace(
        hw, array=dataclasses.replace(hw.array, rows=jnp.asarray(sizes), cols=jnp.asarray(sizes)),
        memory=dataclasses.replace(
            hw.memory,
            ifmap_sram_bytes=jnp.asarray(rng.choice([32, 64, 128, 256, 512], n) * 1024, jnp.int32),
            filter_sram_bytes=jnp.asarray(rng.choice([32, 64, 128, 256, 512], n) * 1024,
                                          jnp.int32),
            ofmap_sram_bytes=jnp.asarray(rng.choice([32, 64, 128, 256], n) * 1024, jnp.int32),
            dram_bytes_per_s=jnp.asarray(rng.uniform(2e9, 5e10, n), jnp.float32)))
    wb = jnp.full(L, 8.0)
    ab = jnp.full(L, 8.0)
    sweep = jax.jit(jax.vmap(
        lambda h: jnp.sum(layer_costs(layers, h, wb, ab).latency_cycles)))
    t = time.perf_counter()
    out = sweep(hw).block_until_ready()
    t_compile = time.perf_counter() - t
    t_sweep = _best(lambda: sweep(hw).block_until_ready(), 5)
    rate = n * L / t_sweep
    clock = np.asarray(hw.array.clock_hz)
    i = int(np.argmin(np.asarray(out) / clock))
    res.update(configs=n, sweep_compile_s=t_compile, sweep_s=t_sweep,
               config_layer_evals_per_s=rate, best_config_index=i,
               best_config_latency_s=float(out[i] / clock[i]))
    print(f"(2) {n} configurations x {L} layers in one jitted vmapped call: {t_sweep * 1e3:.1f} ms "
          f"(compile {t_compile:.1f} s) = {rate:.3g} (configuration x layer)/s "
          f"[target >= 1e6: {'met' if rate >= 1e6 else 'NOT met'}]")

    # (3) jitted JAX forward vs onnxruntime
    import onnxruntime as ort

    x = np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)
    fwd = jax.jit(lambda p, v: execute(graph, p, v))
    y = np.asarray(fwd(params, x))
    so = ort.SessionOptions()
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    y_ort = sess.run(None, {"x": x})[0]
    # interleaved medians: the shared machine's load hits both sides alike
    t_jax_all, t_ort_all = [], []
    for _ in range(30 if args.model == "ppocr_cls" else 8):
        t = time.perf_counter()
        jax.block_until_ready(fwd(params, x))
        t_jax_all.append(time.perf_counter() - t)
        t = time.perf_counter()
        sess.run(None, {"x": x})
        t_ort_all.append(time.perf_counter() - t)
    t_jax, t_ort = statistics.median(t_jax_all), statistics.median(t_ort_all)
    err = float(np.max(np.abs(y - y_ort)))
    res.update(jax_forward_s=t_jax, ort_forward_s=t_ort, jax_over_ort=t_jax / t_ort,
               max_abs_diff_vs_ort=err)
    target = 1.5 if args.model == "ppocr_cls" else 1.0
    print(f"(3) forward (interleaved medians): JAX {t_jax * 1e3:.2f} ms vs onnxruntime "
          f"{t_ort * 1e3:.2f} ms = {t_jax / t_ort:.2f}x ORT [target <= {target:g}x: "
          f"{'met' if t_jax <= target * t_ort else 'NOT met'}]; max |diff| {err:.2e}")
    _write(args.out, res)


def _write(out: str | None, res: dict) -> None:
    if out:
        from npujax.report import write_json

        write_json(out, res)
    print(json.dumps({k: (round(v, 6) if isinstance(v, float) else v) for k, v in res.items()}))


if __name__ == "__main__":
    main()
