"""Before and after the one cost program (issue 26), in one run on the same machine.

Each measurement runs in a fresh Python process (so "cold" really compiles), alternately with
an earlier checkout (``--before``, e.g. ``git worktree add /tmp/before 22f61bb``) and with this
one, ``--repeats`` times, and reports the CPU seconds (user + system of the child) of:

* ``lower cold``: the first ``npujax.lower`` of SmallResNet (28x28, width 16) on a preset in a
  new process (compilation included, JAX's persistent cache off);
* ``lower warm``: the next ``lower`` of the same model at another DRAM bandwidth (the compiled
  program reused);
* ``sweep``: ``npujax.sweep`` of the same model over 3 x 3 x 2 = 18 configurations (array rows,
  DRAM bandwidth, bits), compilation included;
* ``fit``: ``fit_spec`` of ``clock_hz, dram_bytes_per_s`` to a synthetic profile, 100 Adam steps;
* ``codesign``: ``codesign`` with 40 Adam steps.

each on ``edge_16x16`` (per-layer model) and ``tpu_v1`` (layer fusion). It prints the median
CPU seconds per side and the ratio after / before (< 1: faster). The two checkouts must both
import (the script adapts to the fit API, which took a ``FitConfig`` after the change).

Usage::

    python experiments/bench/cost_program_before_after.py --before /tmp/before --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import json, os, resource, sys, time
import jax, numpy as np
from flax import nnx
import jax.numpy as jnp
task, preset = sys.argv[1], sys.argv[2]

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

from npujax.frontends.flax import trace_flax
from npujax.ir.passes import optimize
from npujax.models.cnn import SmallResNet
with jax.numpy_dtype_promotion("standard"):
    g, p = trace_flax(SmallResNet(rngs=nnx.Rngs(0), in_shape=(28, 28, 1), width=16),
                      jnp.zeros((1, 28, 28, 1), jnp.float32))
graph = optimize(g, p)[0]
import npujax
from npujax.hw.spec import load_npu_spec
spec = load_npu_spec(preset)
out = {}
if task == "lower":
    t = cpu(); npujax.lower(graph, spec); out["lower cold"] = cpu() - t
    t = cpu(); npujax.lower(graph, spec.with_fields({"memory.dram_bytes_per_s": 3.2e9}))
    out["lower warm"] = cpu() - t
elif task == "sweep":
    t = cpu()
    npujax.sweep(graph, spec, {"array.rows": [8, 16, 32],
                               "memory.dram_bytes_per_s": [3.2e9, 6.4e9, 12.8e9],
                               "bits": [4, 8]})
    out["sweep"] = cpu() - t
elif task == "fit":
    from npujax.plan import workloads
    from npujax.plan import fit as F
    layers = workloads(graph, spec)
    pred = F.predict_latency_s(layers, spec)
    idx = np.arange(len(layers))
    t = cpu()
    if hasattr(F, "FitConfig"):
        F.fit_spec(layers, spec, idx, pred * 1.3, ("clock_hz", "dram_bytes_per_s"),
                   config=F.FitConfig(steps=100))
    else:
        if spec.ops.fusion == "layer":
            spec = spec.with_fields({"ops.fusion": "residual"})  # refused before the change
            layers = workloads(graph, spec)
        F.fit_spec(layers, spec, idx, pred * 1.3, ("clock_hz", "dram_bytes_per_s"), steps=100)
    out["fit"] = cpu() - t
elif task == "codesign":
    from npujax.plan import workloads
    from npujax.search.codesign import CodesignConfig, codesign
    names = [w.name for w in workloads(graph, spec) if w.kind == "gemm"]
    sens = {n: {(w, a): 0.01 * (16 - w - a) for w in (4, 8) for a in (4, 8)} for n in names}
    t = cpu()
    codesign(graph, spec, sens, CodesignConfig(area_mm2=1e4, candidates=(4, 8), steps=40,
                                               max_loss_increase=1.0))
    out["codesign"] = cpu() - t
print("RESULT " + json.dumps(out))
'''


def run(checkout: Path, task: str, preset: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "NPUJAX_COMPILE_CACHE": "off",
           "JAX_ENABLE_COMPILATION_CACHE": "false"}
    r = subprocess.run([sys.executable, "-c", CHILD, task, preset], env=env, cwd="/tmp",
                       capture_output=True, text=True, timeout=1800)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode or not line:  # e.g. codesign on tpu_v1 before the NaN-gradient fix
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        print(f"  {checkout} {task} {preset} failed: {last}", file=sys.stderr)
        return {}
    return json.loads(line[0][7:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="an earlier checkout")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--presets", nargs="*", default=["edge_16x16", "tpu_v1"])
    a = ap.parse_args(argv)
    sides = {"before": a.before.resolve(), "after": ROOT}
    rows: dict[tuple[str, str], dict[str, list[float]]] = {}
    for _ in range(a.repeats):
        for preset in a.presets:
            for task in ("lower", "sweep", "fit", "codesign"):
                for side, path in sides.items():  # interleaved: the same load on both
                    for k, v in run(path, task, preset).items():
                        rows.setdefault((preset, k), {}).setdefault(side, []).append(v)
    print(f"{'preset':14s} {'measure':11s} {'before s':>9s} {'after s':>9s} {'after/before':>12s}")
    for (preset, k), d in rows.items():
        if "before" not in d or "after" not in d:
            print(f"{preset:14s} {k:11s} {'failed' if 'before' not in d else '':>9s} "
                  f"{'failed' if 'after' not in d else '':>9s}")
            continue
        b, f = statistics.median(d["before"]), statistics.median(d["after"])
        print(f"{preset:14s} {k:11s} {b:9.3f} {f:9.3f} {f / b:12.2f}")
    print(f"(median CPU seconds of {a.repeats} interleaved runs; children's user+system time; "
          f"this process {resource.getrusage(resource.RUSAGE_SELF).ru_utime:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
