"""Benchmark: throughput of the vmapped cost model, the current program against the int64-division
reference and the float64 program before it, side by side in one run.

Usage:  python experiments/bench/cost_throughput.py [--model ppocr_det] [--configs 2048]
            [--repeat 9] [--out FILE.json]

One *evaluation* is one (hardware configuration x layer x dataflow): the costs of one layer of the
model on one configuration at one dataflow. Each program evaluates ``configs`` random
configurations (array rows and columns 8-128, 1-4 cores, three SRAM sizes, DRAM bandwidth, all
traced) x every layer x the three dataflows, vmapped over the configurations, and returns the
``[configs, dataflows, layers]`` array of one output:

* ``compute``: ``compute_cycles`` (MAC-array and vector-unit cycles; XLA drops the rest);
* ``memory``: ``latency_cycles`` (compute plus the memory model: DRAM traffic, stalls, DMA).

Four programs per output, each traced from the same code in its mode (:func:`reference_mode`,
:func:`previous_mode`):

* ``reference``: int64 ``(a + b - 1) // b`` division (:func:`npujax._relax.integer_division`)
  and the mapping candidates stacked on an axis (:func:`npujax.systolic.mapping.
  stacked_search`); one jitted call per dataflow;
* ``previous``: float64 division corrected everywhere (:func:`npujax._relax.
  corrected_division`), candidates stacked; one call per dataflow (main before this change);
* ``new``: the one-rounding division where a static bound is known and the candidates
  unrolled (what npujax runs); one call per dataflow, as ``npujax sweep`` runs;
* ``new_fused``: the same, the three dataflows in one call
  (:func:`npujax.plan.layer_costs_by_dataflow`).

Every program's output is checked against the reference's: counts (``compute_cycles``) bit for
bit, float64 latencies to 1e-14 relative (XLA fuses the float arithmetic of two programs
differently and may turn ``x / y`` into ``x * (1 / y)``, which moves the last bit; the largest
difference is reported).

Time is CPU time (``time.process_time``: all threads of the process), the median of
``--repeat`` interleaved rounds (one call of each program per round): the machine this was
written on is shared by other jobs (load averages of 10-20 on 2 cores), under which wall-clock
times of the same call varied 3x from round to round; CPU time measures the work, not the
waiting. Wall-clock medians are reported too. Rates are evaluations per CPU-second; run under
``taskset -c 0`` to keep XLA's threads on one core.

Fraction of peak: ``operations per CPU-second / peak of one core``. Operations per evaluation are
the elementwise instructions XLA runs (arithmetic, comparisons, selects, conversions, inside
fusions too; one per output element) in the optimized HLO of the program's calls, divided by
configurations x layers x dataflows. A core's peak is ``clock x 16`` operations/s (Zen 4: four
256-bit floating-point pipes of 4 float64 lanes each; ``--ops-per-cycle`` to change), the clock
from ``/proc/cpuinfo``; the CPU's peak is that times its cores.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from npujax import _relax
from npujax.frontends.onnx import from_onnx
from npujax.hw import load_npu_spec
from npujax.ir.passes import optimize
from npujax.models.zoo import fetch_model
from npujax.plan import layer_costs, layer_costs_by_dataflow, workloads
from npujax.systolic import DATAFLOWS
from npujax.systolic.mapping import stacked_search

SHAPES = {"ppocr_det": (1, 3, 640, 640), "ppocr_cls": (1, 3, 48, 192)}
#: Elementwise HLO instructions counted as one operation per output element.
_OPS = {"add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "ceil",
        "floor", "round-nearest-even", "negate", "abs", "sign", "select", "convert", "compare",
        "and", "or", "not", "xor", "log", "exponential", "sqrt", "rsqrt", "power", "clamp",
        "shift-left", "shift-right-arithmetic", "shift-right-logical", "is-finite"}
_INSTR = re.compile(r"= (?:s|u|f|pred)(\d*)\[([\d,]*)\]\S* ([a-z-]+)\(")


def count_ops(hlo_text: str) -> int:
    """Elementwise operations (one per output element) XLA runs: the instructions of the
    optimized HLO module, inside fusions too."""
    n = 0
    for m in _INSTR.finditer(hlo_text):
        if m.group(3) in _OPS:
            n += math.prod(int(d) for d in m.group(2).split(",") if d) if m.group(2) else 1
    return n


def clock_hz() -> float:
    """The CPU clock from /proc/cpuinfo (``cpu MHz``), else 0."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":")[1]) * 1e6
    except OSError:
        pass
    return 0.0


def stacked_configs(spec: Any, n: int, seed: int = 0) -> Any:
    """``spec`` with ``[n]`` random array sizes, cores, SRAM sizes and DRAM bandwidths."""
    rng = np.random.default_rng(seed)
    hw = jax.tree.map(lambda v: np.broadcast_to(np.asarray(v), (n,)), spec)
    kib = lambda *c: rng.choice(c, n).astype(np.int64) * 1024  # noqa: E731
    return dataclasses.replace(
        hw,
        array=dataclasses.replace(
            hw.array, rows=rng.choice([8, 16, 32, 64, 128], n).astype(np.int64),
            cols=rng.choice([8, 16, 32, 64, 128], n).astype(np.int64),
            cores=rng.choice([1, 2, 4], n).astype(np.int64)),
        memory=dataclasses.replace(
            hw.memory, ifmap_sram_bytes=kib(32, 64, 128, 256, 512),
            filter_sram_bytes=kib(32, 64, 128, 256, 512), ofmap_sram_bytes=kib(32, 64, 128, 256),
            dram_bytes_per_s=rng.uniform(2e9, 5e10, n)))


def programs(layers: tuple, wb: np.ndarray, ab: np.ndarray, field: str
             ) -> dict[str, Callable[[Any], Any]]:
    """name -> a function of the stacked spec returning the D ``[configs, L]`` outputs; its
    ``mode`` is the context it must be traced in (the implementation it stands for)."""
    def separate(mode: Callable[[], Any]) -> Callable[[Any], Any]:
        calls = []
        for df in DATAFLOWS:
            fn = jax.jit(jax.vmap(lambda h, df=df: getattr(layer_costs(layers, h, wb, ab, df),
                                                           field)))
            calls.append(fn)

        def run(hw: Any) -> Any:
            return [c(hw) for c in calls]  # one call per dataflow, as npujax sweep runs
        run.calls = calls  # type: ignore[attr-defined]
        run.mode = mode  # type: ignore[attr-defined]
        return run

    def together(mode: Callable[[], Any]) -> Callable[[Any], Any]:
        fn = jax.jit(jax.vmap(lambda h: [getattr(c, field) for c in layer_costs_by_dataflow(
            layers, h, wb, ab, DATAFLOWS).values()]))

        def run(hw: Any) -> Any:
            return fn(hw)  # one call, the D outputs together
        run.calls = [fn]  # type: ignore[attr-defined]
        run.mode = mode  # type: ignore[attr-defined]
        return run

    return {"reference": separate(reference_mode), "previous": separate(previous_mode),
            "new": separate(contextlib.nullcontext),
            "new_fused": together(contextlib.nullcontext)}


@contextlib.contextmanager
def reference_mode() -> Any:
    """The implementation before the float64 division: int64 ``(a + b - 1) // b`` and the
    mapping candidates stacked on an axis."""
    with _relax.integer_division(), stacked_search():
        yield


@contextlib.contextmanager
def previous_mode() -> Any:
    """main before this change: float64 division with the correction everywhere, the mapping
    candidates stacked on an axis."""
    with _relax.corrected_division(), stacked_search():
        yield


def _ready(out: Any) -> np.ndarray:
    return np.stack(jax.block_until_ready(out), axis=1)  # [configs, D, L]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ppocr_det", choices=sorted(SHAPES))
    ap.add_argument("--npu", default="edge_16x16")
    ap.add_argument("--configs", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=9, help="interleaved rounds (median)")
    ap.add_argument("--ops-per-cycle", type=float, default=16.0,
                    help="float64 SIMD operations per core per cycle (peak; Zen 4: 16)")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    graph, params = from_onnx(fetch_model(args.model), {"x": SHAPES[args.model]},
                              unsupported="fallback")
    og = optimize(graph, params)[0]
    spec = load_npu_spec(args.npu)
    layers = tuple(workloads(og, spec))
    L, D, n = len(layers), len(DATAFLOWS), args.configs
    wb = np.full(L, 8.0, np.float32)
    ab = np.full(L, 8.0, np.float32)
    hw = stacked_configs(spec, n)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)  # the cores this process may run on (taskset)
    core_peak = clock_hz() * args.ops_per_cycle  # operations per CPU-second
    peak = cores * core_peak
    res: dict[str, Any] = {"model": args.model, "npu": spec.name, "layers": L, "dataflows": D,
                           "configs": n, "evaluations_per_round": n * L * D,
                           "backend": jax.default_backend(), "cpu_cores": cores,
                           "clock_hz": clock_hz(), "ops_per_cycle": args.ops_per_cycle,
                           "peak_ops_per_cpu_s": core_peak, "peak_ops_per_s": peak,
                           "repeat": args.repeat}
    with jax.enable_x64(True):  # the spec's numbers enter as int64/float64 (npujax._exact)
        for field, label in (("compute_cycles", "compute"), ("latency_cycles", "memory")):
            progs = programs(layers, wb, ab, field)
            outs, ops, compile_s = {}, {}, {}
            for name, run in progs.items():
                with run.mode():
                    t = time.perf_counter()
                    outs[name] = _ready(run(hw))  # traced (and compiled) in its mode
                    compile_s[name] = time.perf_counter() - t
                    ops[name] = sum(count_ops(c.lower(hw).compile().as_text())
                                    for c in run.calls) / (n * L * D)
            ref_out = outs["reference"]
            for name, out in outs.items():  # counts bit for bit; float64 to the last bits
                exact = np.issubdtype(ref_out.dtype, np.integer)
                if out.dtype != ref_out.dtype or not (
                        np.array_equal(out, ref_out) if exact
                        else np.allclose(out, ref_out, rtol=1e-14, atol=0)):
                    raise SystemExit(f"{label}: {name} differs from the reference")
                if not exact:
                    res.setdefault("max_relative_difference", {})[f"{label}/{name}"] = float(
                        np.max(np.abs(out - ref_out) / np.maximum(np.abs(ref_out), 1e-300)))
            cpu: dict[str, list[float]] = {k: [] for k in progs}
            wall: dict[str, list[float]] = {k: [] for k in progs}
            for _ in range(args.repeat):  # interleaved rounds: the same load for every program
                for name, run in progs.items():
                    t, c = time.perf_counter(), time.process_time()
                    jax.block_until_ready(run(hw))
                    cpu[name].append(time.process_time() - c)
                    wall[name].append(time.perf_counter() - t)
            ref = statistics.median(cpu["reference"])
            rows = {}
            for name in progs:
                med = statistics.median(cpu[name])
                rate = n * L * D / med  # per CPU-second (all threads of the process)
                frac = rate * ops[name] / core_peak if core_peak else None
                rows[name] = {"median_cpu_s": med, "median_wall_s": statistics.median(wall[name]),
                              "evaluations_per_cpu_s": rate,
                              "evaluations_per_s_wall": n * L * D / statistics.median(wall[name]),
                              "speedup": ref / med, "ops_per_evaluation": ops[name],
                              "fraction_of_peak": frac, "first_call_s": compile_s[name]}
                print(f"{label:8s} {name:15s} {med * 1e3:8.1f} ms CPU "
                      f"({statistics.median(wall[name]) * 1e3:7.1f} ms wall)  {rate:9.3g} "
                      f"evals/CPU-s  {ref / med:5.2f}x  {ops[name]:6.1f} ops/eval  "
                      + (f"{frac:6.2%} of peak" if frac is not None else ""))
            res[label] = rows
            target = 5.0 if label == "compute" else 3.0
            sp = rows["new"]["speedup"]
            print(f"{label}: new / reference = {sp:.2f}x [target >= {target:g}x: "
                  f"{'met' if sp >= target else 'NOT met'}]")
    if args.out:
        from npujax.report import write_json

        write_json(args.out, res)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
