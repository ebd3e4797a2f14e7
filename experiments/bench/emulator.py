"""Benchmarks of the systolic models, printed side by side in one run.

(a) The same GEMM layers (13 shapes x 3 dataflows x 4 square arrays) through SCALE-Sim 3.0.0,
    run live in this run once per layer, and through npujax's closed form
    (``scalesim_report``), with every cycle count compared. Two comparisons, reported apart:
    *one layer per call* (each SCALE-Sim run against one jitted npujax call for that layer,
    dispatch included; the ratio's median and range over the layers) and *batched throughput*
    (all layers in one jitted npujax call against the sum of SCALE-Sim's runs). ``--conv`` adds
    ResNet-18's conv layers at 64x64 (SCALE-Sim steps them cycle by cycle: 10-20 minutes).
    Needs SCALE-Sim's own venv (``experiments/scalesim_reference/make_reference.sh`` makes it,
    or ``SCALESIM_VENV``); without it (a) is skipped: peer timings are never read from
    another run.
(b) Analytical cycles for every layer of ResNet-50 across 10,000 hardware configurations in one
    vmapped, jitted call: compute cycles alone, and with the memory model.
(c) Bit-exact emulation of a ResNet-18 conv layer (3x3, 64->64, 56x56, int8) vs a plain ``jnp``
    int32 matmul of the same GEMM shape.
(d) Bit-exact square GEMMs (n = 512, 1024, int8) on 16x16 and 128x128 arrays: the emulator vs
    a plain int32 ``jnp.matmul`` vs the previous emulator (all K-folds' partial sums materialised
    by one batched ``dot_general``, then summed), interleaved medians (target <= 1.5x matmul).
(e) Compilations over 24 random GEMM shapes on one array: the previous emulator (one per shape),
    the shape-bucketed one and the tiled one (the default: one per array): count and
    compile+first-run seconds.

Usage: PYTHONPATH=. python experiments/bench/emulator.py [--quick]
CPU only here (no GPU in this environment).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))

from networks import resnet  # noqa: E402

import npujax.systolic.emulator as emulator_mod  # noqa: E402
from npujax.systolic import emulate_conv, emulate_gemm, gemm_cycles, gemm_memory  # noqa: E402,E501
from npujax.systolic.emulator import k_fold_size  # noqa: E402
from npujax.systolic.scalesim import scalesim_report  # noqa: E402

DF = {"ws": "weight_stationary", "os": "output_stationary", "is": "input_stationary"}


def _best_time(f, n=10):
    """Fastest of ``n`` runs after compilation (the machine is shared: the minimum is the
    least disturbed measurement)."""
    jax.block_until_ready(f())
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        jax.block_until_ready(f())
        ts.append(time.perf_counter() - t0)
    return float(np.min(ts))


def _interleaved_medians(fns: dict, rounds: int = 15) -> dict:
    """Median seconds of each callable, run in turn round after round (so load on the shared
    machine hits every side alike); each is compiled and checked first."""
    for f in fns.values():
        jax.block_until_ready(f())
    ts: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f())
            ts[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in ts.items()}


@functools.partial(jax.jit, static_argnames=("rows", "cols", "dataflow"))
def _previous_emulate_gemm(a, b, rows, cols, dataflow):
    """The emulator before shape buckets and the fold loop (kept here as the reference): every
    K-fold's partial sums materialised by one batched ``dot_general``, then summed in int32."""
    M, K = a.shape
    N = b.shape[1]
    tk = k_fold_size(K, rows, cols, dataflow)
    fk = -(-K // tk)
    a = jnp.pad(a, ((0, 0), (0, fk * tk - K))).reshape(M, fk, tk)
    b = jnp.pad(b, ((0, fk * tk - K), (0, 0))).reshape(fk, tk, N)
    partial = jax.lax.dot_general(a, b, (((2,), (1,)), ((1,), (0,))),
                                  preferred_element_type=jnp.int32)
    return jnp.sum(partial, axis=0, dtype=jnp.int32), gemm_cycles(M, K, N, rows, cols, dataflow)


def bench_square_gemms(sizes=(512, 1024), arrays=(16, 128), rounds=15):
    rng = np.random.default_rng(0)
    mm = jax.jit(jnp.matmul)
    out = []
    for n in sizes:
        a8 = jnp.asarray(rng.integers(-128, 128, (n, n)), jnp.int8)
        b8 = jnp.asarray(rng.integers(-128, 128, (n, n)), jnp.int8)
        a32, b32 = a8.astype(jnp.int32), b8.astype(jnp.int32)
        ref = np.asarray(mm(a32, b32))
        for r in arrays:
            for df in ("ws", "os", "is"):
                fns = {"matmul": functools.partial(mm, a32, b32),
                       "emulate": lambda a=a8, b=b8, r=r, df=df: emulate_gemm(a, b, r, r, df)[0],
                       "buckets": lambda a=a8, b=b8, r=r, df=df: emulate_gemm(
                           a, b, r, r, df, shapes="buckets")[0],
                       "previous": lambda a=a8, b=b8, r=r, df=df: _previous_emulate_gemm(
                           a, b, rows=r, cols=r, dataflow=DF[df])[0]}
                exact = all(np.array_equal(np.asarray(f()), ref) for f in fns.values())
                t = _interleaved_medians(fns, rounds)
                out.append({"n": n, "array": f"{r}x{r}", "dataflow": df, **t, "bit_exact": exact,
                            "ratio": t["emulate"] / t["matmul"],
                            "buckets_ratio": t["buckets"] / t["matmul"],
                            "previous_ratio": t["previous"] / t["matmul"]})
    return out


def bench_compiles(n_shapes=24, rows=16):
    """Compile count and seconds (compile + first run) for ``n_shapes`` random GEMM shapes."""
    rng = np.random.default_rng(3)
    shapes = [tuple(int(v) for v in rng.integers(32, 700, 3)) for _ in range(n_shapes)]
    ops = [(jnp.asarray(rng.integers(-128, 128, (m, k)), jnp.int8),
            jnp.asarray(rng.integers(-128, 128, (k, n)), jnp.int8)) for m, k, n in shapes]
    runs = {"previous": (lambda a, b: _previous_emulate_gemm(a, b, rows, rows, DF["ws"]),
                         _previous_emulate_gemm),
            "bucketed": (lambda a, b: emulate_gemm(a, b, rows, rows, "ws", shapes="buckets"),
                         emulator_mod._emulate_gemm),
            "tiled": (lambda a, b: emulate_gemm(a, b, rows, rows, "ws"), emulator_mod._tile_step)}
    gemm_cycles(1, 1, 1, rows, rows, "ws")  # the eager statistics' one-time warm-up per process
    for _, fn in runs.values():  # count every compilation, also of programs (d) compiled
        fn.clear_cache()
    before = {k: fn._cache_size() for k, (_, fn) in runs.items()}
    secs = dict.fromkeys(runs, 0.0)
    for a, b in ops:  # interleaved shape by shape
        for k, (run, _) in runs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(run(a, b))
            secs[k] += time.perf_counter() - t0
    res = {k: {"compiles": fn._cache_size() - before[k], "seconds": secs[k]}
           for k, (_, fn) in runs.items()}
    return {"shapes": n_shapes, "array": f"{rows}x{rows}", **res}


def _scalesim_python() -> Path | None:
    """The python of SCALE-Sim's venv, or None when it is not installed."""
    venv = Path(os.environ.get("SCALESIM_VENV", ROOT / "experiments/scalesim_reference/.venv"))
    py = venv / "bin" / "python"
    return py if py.exists() else None


def _scalesim_per_layer(py: Path, kinds: str, arrays: str) -> dict:
    """SCALE-Sim's results document, run live now, one run per layer (each case's
    ``seconds``)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "s.json"
        subprocess.run([str(py), str(ROOT / "experiments/scalesim_reference/run_scalesim.py"),
                        str(out), "--kinds", kinds, "--arrays", arrays, "--per-layer"],
                       check=True, capture_output=True)
        return json.loads(out.read_text())


def compare_per_layer(doc: dict, calls: int = 20):
    """One layer per call: each layer's SCALE-Sim run against one jitted npujax call for the
    same layer (compiled once per dataflow; the median of ``calls`` calls, dispatch and the
    transfer of the five scalars included), and every cycle count compared."""
    fns = {df: jax.jit(functools.partial(
        lambda M, K, N, r, c, df: scalesim_report(M, K, N, r, c, df)["total_cycles"], df=df))
        for df in DF}
    ratios, ss, nj, equal = [], [], [], True
    for case in doc["cases"]:
        args = [np.int32(case[k]) for k in ("M", "K", "N", "rows", "cols")]
        f = fns[case["dataflow"]]
        equal &= int(f(*args)) == case["total_cycles"]  # (the first call compiles)
        ts = []
        for _ in range(calls):
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            ts.append(time.perf_counter() - t0)
        t = float(np.median(ts))
        ss.append(case["seconds"])
        nj.append(t)
        ratios.append(case["seconds"] / t)
    return {"cases": len(ratios), "scalesim_s_median": float(np.median(ss)),
            "npujax_s_median": float(np.median(nj)), "ratio_min": float(np.min(ratios)),
            "ratio_median": float(np.median(ratios)), "ratio_max": float(np.max(ratios)),
            "cycles_equal": bool(equal)}


def compare_batched(doc: dict):
    """Batched throughput: every layer of ``doc`` in one jitted npujax call against the sum of
    SCALE-Sim's runs on them, and every cycle count compared."""
    cases = doc["cases"]
    ss_seconds = sum(c["seconds"] for c in cases)
    by_df = {}
    for df in ("ws", "os", "is"):
        sel = [c for c in cases if c["dataflow"] == df]
        by_df[df] = {k: jnp.asarray([c[k] for c in sel], jnp.int32)
                     for k in ("M", "K", "N", "rows", "cols")}

    @jax.jit
    def all_cycles(d):
        return {df: scalesim_report(v["M"], v["K"], v["N"], v["rows"], v["cols"], df)[
            "total_cycles"] for df, v in d.items()}

    t = _best_time(lambda: all_cycles(by_df), n=50)
    got = jax.tree.map(np.asarray, all_cycles(by_df))
    equal = all(
        np.array_equal(got[df], [c["total_cycles"] for c in cases if c["dataflow"] == df])
        for df in by_df)
    return {"cases": len(cases), "scalesim_s": ss_seconds, "npujax_s": t,
            "ratio": ss_seconds / t, "cycles_equal": equal}


def bench_scalesim(arrays: str, conv: bool) -> dict | None:
    """(a): ``{kind: {"per_layer": ..., "batched": ...}}`` for the GEMMs (and the ResNet-18
    conv layers with ``conv``), SCALE-Sim run live now; None without SCALE-Sim's venv."""
    py = _scalesim_python()
    if py is None:
        return None
    out = {}
    for kind in ("gemm", "conv") if conv else ("gemm",):
        doc = _scalesim_per_layer(py, kind, arrays)
        out[kind] = {"per_layer": compare_per_layer(doc), "batched": compare_batched(doc)}
    return out


def _hw_configs(n, seed=0):
    rng = np.random.default_rng(seed)
    rows = jnp.asarray(2 ** rng.integers(2, 9, n), jnp.int32)      # 4 .. 256
    cols = jnp.asarray(2 ** rng.integers(2, 9, n), jnp.int32)
    sram = jnp.asarray(2.0 ** rng.integers(12, 22, n), jnp.float32)  # 4 KiB .. 2 MiB
    bw = jnp.asarray(2.0 ** rng.uniform(0, 7, n), jnp.float32)       # 1 .. 128 B/cycle
    return rows, cols, sram, bw


def bench_sweep(n_configs: int):
    layers = resnet(50)
    L = len(layers)
    M, K, N, G, U = (jnp.asarray([lay[i] for lay in layers], jnp.int32) for i in range(1, 6))
    rows, cols, sram, bw = _hw_configs(n_configs)

    # (The model's counts are int64 and its memory cycles float64, under its own x64 scope:
    # the layer multiplicity is applied in that scope too, so nothing is truncated to 32 bits.)
    @jax.jit
    def compute(rows, cols):
        def f(r, c):
            cycles = gemm_cycles(M, K, N, r, c, "weight_stationary")["compute_cycles"]
            return G.astype(jnp.int64) * cycles
        with jax.enable_x64(True):
            return jax.vmap(f)(rows, cols)

    @jax.jit
    def with_memory(rows, cols, sram, bw):
        def f(r, c, s, b):
            m = gemm_memory(M, K, N, r, c, "weight_stationary", sram_bytes_a=s, sram_bytes_b=s,
                            sram_bytes_out=s, dram_bytes_per_cycle=b, unique_elems_a=U)
            return G.astype(jnp.float64) * m["total_cycles"]
        with jax.enable_x64(True):
            return jax.vmap(f)(rows, cols, sram, bw)

    t_c = _best_time(lambda: compute(rows, cols))
    t_m = _best_time(lambda: with_memory(rows, cols, sram, bw))
    evals = n_configs * L
    return {"layers": L, "configs": n_configs, "compute_s": t_c, "compute_eval_per_s": evals / t_c,
            "memory_s": t_m, "memory_eval_per_s": evals / t_m}


def bench_emulation(rows: int, dataflow: str):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(-128, 128, (1, 56, 56, 64)), jnp.int8)
    w = jnp.asarray(rng.integers(-128, 128, (3, 3, 64, 64)), jnp.int8)
    a = jnp.asarray(rng.integers(-128, 128, (3136, 576)), jnp.int32)
    b = jnp.asarray(rng.integers(-128, 128, (576, 64)), jnp.int32)
    mm = jax.jit(jnp.matmul)
    emu = lambda: emulate_conv(x, w, rows, rows, dataflow, padding=1)[0]  # noqa: E731
    t = _interleaved_medians({"matmul": lambda: mm(a, b), "emulate": emu})
    t_ref, t_emu = t["matmul"], t["emulate"]
    return {"array": f"{rows}x{rows}", "dataflow": dataflow, "emulate_s": t_emu,
            "matmul_s": t_ref, "slowdown": t_emu / t_ref}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer SCALE-Sim arrays")
    p.add_argument("--conv", action="store_true",
                   help="(a) also on ResNet-18's conv layers (SCALE-Sim: 10-20 minutes)")
    p.add_argument("--configs", type=int, default=10_000)
    p.add_argument("--only-emulator", action="store_true",
                   help="run only (d) and (e), the emulator against matmul and its compilations")
    args = p.parse_args(argv)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} "
          f"({os.cpu_count()} CPUs visible); no GPU run in this environment.\n")

    if not args.only_emulator:
        a = bench_scalesim("32,128" if args.quick else "8,16,32,128", args.conv)
        b = bench_sweep(args.configs)
        c = [bench_emulation(r, df) for r in (16, 128) for df in ("ws", "os", "is")]
    d = bench_square_gemms()
    e = bench_compiles()
    if args.only_emulator:
        _print_emulator(d, e)
        return {"square_gemms": d, "compiles": e}

    _print_scalesim(a)
    print(f"(b) ResNet-50 ({b['layers']} layers) x {b['configs']:,} hardware configs, one call")
    print(f"    compute cycles     {b['compute_s'] * 1e3:8.2f} ms  "
          f"{b['compute_eval_per_s']:.3e} evals/s (target 1e7)")
    print(f"    + memory model     {b['memory_s'] * 1e3:8.2f} ms  "
          f"{b['memory_eval_per_s']:.3e} evals/s (target 1e6)")
    print("(c) bit-exact conv emulation (ResNet-18 3x3 64->64 @56x56, int8) vs jnp int32 matmul "
          "[3136,576]x[576,64]")
    for r in c:
        print(f"    {r['array']:>7s} {r['dataflow']:2s}  emulate {r['emulate_s'] * 1e3:7.2f} ms  "
              f"matmul {r['matmul_s'] * 1e3:7.2f} ms  -> {r['slowdown']:.2f}x (target <= 1.5x)")
    _print_emulator(d, e)
    return {"scalesim": a, "sweep": b, "emulation": c, "square_gemms": d, "compiles": e}


def _print_scalesim(a):
    if a is None:
        print("(a) skipped: SCALE-Sim is not installed (experiments/scalesim_reference/"
              "make_reference.sh makes its venv, or set SCALESIM_VENV); no stored timings used")
        return
    names = {"gemm": "GEMM layers", "conv": "ResNet-18 conv layers (64x64)"}
    for kind, r in a.items():
        p, b = r["per_layer"], r["batched"]
        print(f"(a) SCALE-Sim 3.0.0 (live, one run per layer) vs npujax, {p['cases']} "
              f"{names[kind]}; cycles equal: {p['cycles_equal'] and b['cycles_equal']}")
        print(f"    one layer per call: SCALE-Sim median {p['scalesim_s_median'] * 1e3:9.1f} ms "
              f"| npujax median {p['npujax_s_median'] * 1e6:7.1f} us | ratio median "
              f"{p['ratio_median']:,.0f}x (range {p['ratio_min']:,.0f}x-{p['ratio_max']:,.0f}x)")
        print(f"    batched throughput: SCALE-Sim {b['scalesim_s']:8.2f} s for its {b['cases']} "
              f"runs | npujax {b['npujax_s'] * 1e6:8.1f} us for all in one call | ratio "
              f"{b['ratio']:,.0f}x")


def _print_emulator(d, e):
    print("(d) bit-exact square int8 GEMMs vs jnp int32 matmul (interleaved medians of 15): "
          "emulate (tiles, the default), shape buckets, previous")
    for r in d:
        print(f"    n={r['n']:4d} {r['array']:>7s} {r['dataflow']:2s}  matmul "
              f"{r['matmul'] * 1e3:7.2f} ms  emulate {r['emulate'] * 1e3:7.2f} ms "
              f"-> {r['ratio']:.2f}x (target <= 1.5x)  buckets {r['buckets'] * 1e3:7.2f} ms "
              f"-> {r['buckets_ratio']:.2f}x  previous {r['previous'] * 1e3:7.2f} ms "
              f"-> {r['previous_ratio']:.2f}x  bit-exact {r['bit_exact']}")
    print(f"(e) compilations for {e['shapes']} random GEMM shapes (M, K, N in 32..699) on "
          f"{e['array']} ws")
    for k in ("previous", "bucketed", "tiled"):
        print(f"    {k:9s} {e[k]['compiles']:3d} compilations, {e[k]['seconds']:6.2f} s "
              "(compile + first run)")


if __name__ == "__main__":
    main()
