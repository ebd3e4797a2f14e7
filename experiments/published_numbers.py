"""Record, or check, the numbers the NPU model publishes through each of its consumers.

``--record FILE`` writes an ``.npz`` of every figure below; ``--check FILE`` recomputes them with
the npujax on ``sys.path`` and lists every array that is not bit for bit the same. The file
``tests/data/published_numbers.npz`` was recorded on main before the one cost program (issue 26)
and ``tests/plan/test_published_numbers.py`` checks a sample of it in the suite; this script
checks all of it (about two minutes on 2 cores).

Figures, for four model kinds (DigitsCNN, a residual CNN, a ViT block, a decoder step) on every
shipped preset at every fusion level:

* ``lower``: per-layer latency, compute, DRAM bytes and energy at every dataflow, and the
  schedule's totals;
* ``table``: the precision search's latency table (candidates 4 and 8 bits);
* ``sweep``: the design-space sweep at the preset's own point (totals);
* ``fit``: the fit's exact per-layer prediction and a 3-step fit's fitted values and losses.

Usage::

    python experiments/published_numbers.py --record tests/data/published_numbers.npz
    python experiments/published_numbers.py --check tests/data/published_numbers.npz
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

FUSIONS = ("none", "elementwise", "residual", "layer")


def models() -> dict:
    """``{kind: optimized graph}`` of the four model kinds (seeded, no training)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from npujax.frontends.flax import trace_flax
    from npujax.ir.passes import optimize
    from npujax.models.cnn import DigitsCNN, SmallResNet
    from npujax.models.transformer import ViT

    def traced(model, shape):
        with jax.numpy_dtype_promotion("standard"):
            g, p = trace_flax(model, jnp.zeros(shape, jnp.float32))
        return optimize(g, p)[0]

    out = {
        "digits_cnn": traced(DigitsCNN(rngs=nnx.Rngs(0)), (1, 8, 8, 1)),
        "resnet": traced(SmallResNet(rngs=nnx.Rngs(0), in_shape=(28, 28, 1), width=16),
                         (1, 28, 28, 1)),
        "vit": traced(ViT(image=8, patch=4, d_model=16, heads=2, d_ff=32, layers=1,
                          rngs=nnx.Rngs(0)), (1, 8, 8, 1)),
    }
    from npujax.models.decoders import decoder_graph
    out["decoder"] = decoder_graph("tiny", phase="decode", seq_len=1, kv_len=16, batch=1)
    return out


def figures(only: set[str] | None = None) -> dict[str, np.ndarray]:
    """Every figure, keyed ``consumer/model/preset/fusion/...`` (``only``: keys' prefixes)."""
    import npujax
    from npujax.hw.spec import list_presets, load_npu_spec
    from npujax.plan.lower import lower_by_dataflow
    from npujax.plan.workload import workloads
    from npujax.search.cost import latency_table

    out: dict[str, np.ndarray] = {}

    def want(key: str) -> bool:
        return only is None or any(key.startswith(p) for p in only)

    graphs = models()
    for kind, graph in graphs.items():
        for preset in list_presets():
            # as recorded: tpu_v1 double-buffers its weight tiles since (a preset change)
            base = load_npu_spec(preset).with_fields({"array.stationary_buffering": "single"})
            for fusion in FUSIONS:
                spec = base.with_fields({"ops.fusion": fusion})
                key = f"{kind}/{preset}/{fusion}"
                if want(f"lower/{key}"):
                    for df, s in lower_by_dataflow(graph, spec).items():
                        k = f"lower/{key}/{df}"
                        out[f"{k}/latency_cycles"] = np.asarray(
                            [r.costs.latency_cycles for r in s.layers], np.float64)
                        out[f"{k}/compute_cycles"] = np.asarray(
                            [r.costs.compute_cycles for r in s.layers], np.int64)
                        out[f"{k}/dram_bytes"] = np.asarray(
                            [r.costs.dram_bytes for r in s.layers], np.float64)
                        out[f"{k}/energy_j"] = np.asarray([r.energy_j for r in s.layers],
                                                          np.float64)
                        out[f"{k}/totals"] = np.asarray(
                            [s.latency_s, s.energy_j, s.dram_bytes], np.float64)
                if want(f"table/{key}"):
                    t = latency_table(graph, spec, (4, 8))
                    out[f"table/{key}/seconds"] = np.asarray(t.seconds, np.float32)
                    out[f"table/{key}/fixed_s"] = np.asarray([t.fixed_s])
                if want(f"sweep/{key}") and fusion != "layer":  # layer: fixed by issue 26
                    r = npujax.sweep(graph, spec, {"array.rows": [spec.array.rows]})
                    out[f"sweep/{key}/totals"] = np.asarray(
                        [r.columns["latency_s"][0], r.columns["energy_j"][0],
                         r.columns["dram_bytes"][0]], np.float64)
            if want(f"fit/{kind}/{preset}") and base.ops.fusion != "layer":
                from npujax.plan.fit import FitConfig, fit_spec, predict_latency_s

                layers = workloads(graph, base)
                pred = predict_latency_s(layers, base)
                out[f"fit/{kind}/{preset}/predict_s"] = pred
                idx = np.arange(len(layers))
                f = fit_spec(layers, base, idx, pred * 1.3, ("clock_hz", "dram_bytes_per_s"),
                             config=FitConfig(steps=3, chunk=3))
                out[f"fit/{kind}/{preset}/fitted"] = np.asarray(list(f.fitted.values()))
                out[f"fit/{kind}/{preset}/loss"] = np.asarray(f.loss)
    return out


def compare(recorded: dict[str, np.ndarray], now: dict[str, np.ndarray]) -> list[str]:
    """Keys of ``recorded`` whose arrays differ from ``now`` (not bit for bit), with the first
    difference."""
    bad = []
    for k, v in recorded.items():
        if k not in now:
            bad.append(f"{k}: missing")
            continue
        w = now[k]
        if v.shape != w.shape or not np.array_equal(v, w):
            if v.shape != w.shape:
                bad.append(f"{k}: shape {v.shape} -> {w.shape}")
            else:
                i = int(np.flatnonzero(v != w)[0])
                bad.append(f"{k}[{i}]: {v.flat[i]!r} -> {w.flat[i]!r}")
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--record", metavar="FILE")
    g.add_argument("--check", metavar="FILE")
    p.add_argument("--only", nargs="*", help="key prefixes to compute (default: all)")
    a = p.parse_args(argv)
    only = set(a.only) if a.only else None
    if a.record:
        figs = figures(only)
        np.savez_compressed(a.record, **figs)
        print(f"recorded {len(figs)} arrays to {a.record}")
        return 0
    with np.load(a.check) as f:
        recorded = {k: f[k] for k in f.files
                    if only is None or any(k.startswith(p) for p in only)}
    bad = compare(recorded, figures(only))
    for line in bad:
        print(line)
    print(f"{len(recorded) - len(bad)} of {len(recorded)} arrays bit for bit the same")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
