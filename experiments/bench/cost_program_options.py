"""Check candidate XLA compiler options for ``lower``'s cost program: compile time side by side
with the base options, and every output compared bit for bit.

Usage:  python experiments/bench/cost_program_options.py
            [--options '{"xla_cpu_use_fusion_emitters": false}'] [--models digits,ppocr_cls]
            [--presets edge_16x16,...] [--rounds 3]

(1) Compile time: ``lower``'s cost program (the energy total summed on the host) at
    ``_ONCE`` (LLVM -O0, XLA's default emitters: "base") and at ``_ONCE`` plus ``--options``
    ("candidate"; by default the option ``lower`` adds,
    ``npujax._xla_options.LEGACY_EMITTERS``), one and three dataflows, on edge_16x16; fresh
    traces, only ``.compile()`` timed, the two interleaved
    (order alternating per round), median of ``--rounds``; the load average is printed.
(2) Exactness: for every model x preset (every preset by default), the three-dataflow program
    and the preset-dataflow program at both option sets, each run at the preset's widths
    (8 bits), three random width vectors and one changed spec (DRAM bandwidth, ifmap SRAM);
    every output array (costs, energy with the host-summed total, area, attention decisions)
    compared with ``np.array_equal`` and dtype equality. Prints each differing array.

``--program lower`` (default) checks the programs ``lower`` runs (``_costs_program``: the shared
program of traced layer tables, ``_jitted_table_costs``, or with attention chains the program of
the layer list, ``_jitted_costs``); ``--program list`` the program of the layer list everywhere
(what ``lower`` ran before the layer tables).

The models come from ``npujax.models`` (DigitsCNN) and the zoo (PP-OCR, downloaded once).
Measured 2026-12-01 (jaxlib 0.10.2, 2 loaded cores), ``--program list``:
``xla_cpu_use_fusion_emitters=false`` compiles in x0.47-0.57 of the time but changes 40 of 11,880
arrays in their last bit (the PP-OCRv4 recogniser's transfer and latency cycles on tpu_v1).
2026-12-02, ``--program lower``: see ``docs/results/bench_lowering.md``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from npujax.hw import DATAFLOWS, as_spec, list_presets
from npujax.plan import workloads

L = importlib.import_module("npujax.plan.lower")
SHAPES = {"ppocr_cls": (1, 3, 48, 192), "ppocr_det": (1, 3, 640, 640),
          "ppocr_rec": (1, 3, 48, 320)}


def graph(name: str):
    """The optimized graph of ``digits`` (DigitsCNN at 8x8x1) or a zoo model."""
    from npujax.ir.passes import optimize

    if name == "digits":
        from flax import nnx

        from npujax.frontends.flax import trace_flax
        from npujax.models.cnn import DigitsCNN

        with jax.numpy_dtype_promotion("standard"):
            g, p = trace_flax(DigitsCNN(rngs=nnx.Rngs(0)), jnp.zeros((1, 8, 8, 1), jnp.float32))
        return optimize(g, p)[0]
    from npujax.frontends.onnx import from_onnx
    from npujax.models.zoo import fetch_model

    return optimize(*from_onnx(fetch_model(name), {"x": SHAPES[name]}))[0]


def program(layers, dataflows, chains, options, kind="lower"):
    """The cost program of ``layers`` compiled with ``options``, not cached: ``(run, trace)``,
    both taking ``(spec, wb, ab)``; ``run`` returns ``lower``'s outputs (the energy total summed
    on the host, the layer table's padding rows dropped)."""
    if chains or kind == "list":
        jitted = jax.jit(L._jitted_costs.__wrapped__(layers, dataflows, chains).__wrapped__,
                         compiler_options=options)
        return jitted, jitted.trace
    jitted = jax.jit(L._jitted_table_costs.__wrapped__(dataflows).__wrapped__,
                     compiler_options=options)
    n = len(layers)
    table = L.layer_table(list(layers), L.table_length(n))
    pad = np.full(len(table) - n, float(L.DEFAULT_BITS), np.float32)

    def args(spec, wb, ab):
        return (L._program_spec(spec), np.concatenate([wb, pad]), np.concatenate([ab, pad]),
                table)

    def run(spec, wb, ab):
        out = jax.tree.map(np.asarray, jitted(*args(spec, wb, ab)))
        return jax.tree.map(lambda x: x[:n] if x.ndim else x, out)
    return run, lambda spec, wb, ab: jitted.trace(*args(spec, wb, ab))


def outputs(prog, spec, wb, ab):
    by_df, energy, area, att = jax.tree.map(np.asarray, prog(spec, wb, ab))
    return by_df, {df: L._with_total(e) for df, e in energy.items()}, area, att


def settings(layers, spec, rng):
    wb, ab = L.layer_bits(list(layers), None)
    yield spec, wb, ab
    for _ in range(3):
        yield (spec, rng.choice([2.0, 3.0, 4.0, 6.0, 8.0], len(layers)).astype(wb.dtype),
               rng.choice([2.0, 4.0, 5.0, 8.0, 16.0], len(layers)).astype(ab.dtype))
    yield spec.with_fields({"memory.dram_bytes_per_s": float(spec.memory.dram_bytes_per_s) * 0.37,
                            "memory.ifmap_sram_bytes": int(spec.memory.ifmap_sram_bytes) // 3 + 17
                            }), wb, ab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--options", default='{"xla_cpu_use_fusion_emitters": false}')
    ap.add_argument("--models", default="digits,ppocr_cls,ppocr_rec,ppocr_det")
    ap.add_argument("--presets", default=",".join(list_presets()))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--program", choices=("lower", "list"), default="lower")
    args = ap.parse_args()
    new = {**L._ONCE, **json.loads(args.options)}
    variants = {"base": L._ONCE, "candidate": new}
    graphs = {m: graph(m) for m in args.models.split(",")}
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        spec = as_spec("edge_16x16")
        times: dict = {}
        for r in range(args.rounds):
            for m, g in graphs.items():
                layers = tuple(workloads(g, spec))
                wb, ab = L.layer_bits(list(layers), None)
                for dfs in (("weight_stationary",), DATAFLOWS):
                    for v in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                        trace = program(layers, dfs, (), variants[v], args.program)[1]
                        lowered = trace(spec, wb, ab).lower()
                        t = time.perf_counter()
                        lowered.compile()
                        times.setdefault((m, len(dfs), v), []).append(time.perf_counter() - t)
        print(f"compile seconds, median of {args.rounds}; load {os.getloadavg()}")
        for (m, n, v), ts in sorted(times.items()):
            if v == "candidate":
                t0 = np.median(times[(m, n, "base")])
                print(f"  {m:10s} {n} dataflow(s): base {t0:.2f}  candidate "
                      f"{np.median(ts):.2f}  (x{np.median(ts) / t0:.2f})")
        compared = differing = 0
        for m, g in graphs.items():
            for p in args.presets.split(","):
                spec = as_spec(p)
                if spec.ops.fusion == "layer":  # the unfused program (layer fusion is another)
                    spec = spec.with_fields({"ops.fusion": "elementwise"})
                layers = tuple(workloads(g, spec))
                chains = (L.attention_chains(g, list(layers))
                          if spec.ops.attention_fusion != "none" else ())
                for dfs in ((spec.array.dataflow,), DATAFLOWS):
                    a, b = (program(layers, dfs, chains, o, args.program)[0]
                            for o in variants.values())
                    for s, wb, ab in settings(layers, spec, rng):
                        want = jax.tree_util.tree_flatten_with_path(outputs(a, s, wb, ab))[0]
                        got = jax.tree.leaves(outputs(b, s, wb, ab))
                        assert len(want) == len(got)
                        for (path, x), y in zip(want, got):
                            compared += 1
                            if x.dtype != y.dtype or not np.array_equal(x, y):
                                differing += 1
                                print(f"  DIFF {m} {p} {dfs} {jax.tree_util.keystr(path)}")
        print(f"exactness: {compared} arrays compared, {differing} differing")


if __name__ == "__main__":
    main()
