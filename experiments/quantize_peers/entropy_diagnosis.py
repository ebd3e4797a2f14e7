"""Which clipped tensors cost PP-OCR cls's output SQNR under entropy calibration (issue 29).

For each activation tensor that W8A8 quantizes (every quantized layer's input), this script
compares three clipping thresholds on the same calibration data (``WORK/MODEL/calib.npy``,
256 examples, written by ``compare.py prepare``):

- min-max (no clipping);
- npujax's entropy observer (:func:`npujax.calib.entropy_observer`);
- the reference: pytorch-quantization's ``HistogramCalibrator`` (TensorRT's
  ``tools/pytorch-quantization/pytorch_quantization/calib/histogram.py``) re-implemented in
  numpy below: a 2048-bin histogram of ``|x|`` over ``[0, max|x|]``, ``bins[0] = bins[1]``
  (the zero bin replaced by its neighbour), ``2^(bits-1+unsigned)`` levels (``unsigned``:
  the tensor has no negative value), thresholds from bin 128 on, a candidate whose ``Q`` is
  0 where ``P`` is not has an infinite KL, and ties go to the largest threshold.

It then measures the model's output SQNR against float on the evaluation split
(``eval.npz``) with every tensor at min-max, every tensor at npujax's entropy range, every
tensor at the reference's, and, one tensor at a time, that tensor alone at npujax's entropy
range (the others at min-max): the SQNR each clipped tensor costs. Weights are W8 per channel
throughout, no bias correction. Printed: the per-tensor rows worst first (threshold as a
fraction of ``max|x|``, the share of values clipped, the SQNR with that tensor alone clipped)
and the whole-model figures. CPU seconds and the load average are printed at the end.

Usage::

    PYTHONPATH=. python3 experiments/quantize_peers/entropy_diagnosis.py --work /work/qpeers2 \\
        [--model ppocr_cls] [--top 12] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import numpy as np


def reference_amax(hist: np.ndarray, edges: np.ndarray, bits: int, unsigned: bool,
                   start_bin: int = 128) -> float:
    """pytorch-quantization's ``_compute_amax_entropy`` (stride 1) in numpy, written from its
    description: the threshold (a bin edge) whose reference ``P`` (outliers added to the last
    kept bin) and candidate ``Q`` (the kept bins merged into ``nbins`` levels, each level's mass
    spread over its non-empty bins) have the least ``KL(P || Q)``."""
    bins = np.asarray(hist, np.float64).copy()
    bins[0] = bins[1]
    nbins = 1 << (bits - 1 + int(unsigned))
    best, best_i = np.inf, len(bins)
    for i in range(start_bin, len(bins) + 1):
        space = np.linspace(0, i, num=nbins + 1)
        level = np.digitize(np.arange(i), space) - 1
        nz = bins[:i] != 0
        sums = np.bincount(level[nz], weights=bins[:i][nz], minlength=nbins)
        counts = np.bincount(level[nz], minlength=nbins)
        q = np.where(nz, sums[level] / np.maximum(counts[level], 1), 0.0)
        p = bins[:i].copy()
        p[-1] += bins[i:].sum()
        p, q = p / p.sum(), q / q.sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = np.inf if np.any((p > 0) & (q == 0)) else float(
                np.sum(np.where(p > 0, p * np.log(p / q), 0.0)))
        if kl <= best:  # ties: the largest threshold (the reference's last argmin)
            best, best_i = kl, i
    return float(edges[best_i])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--model", default="ppocr_cls")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    import jax
    import jax.numpy as jnp
    from prepared import float_eval, load_prepared

    from npujax.calib import get_observer
    from npujax.ir.execute import execute, tap
    from npujax.ops import weight_role
    from npujax.quantize.calibrate import calibrate
    from npujax.workflows.quantize import output_vs_float

    graph, params, quant, cal, d = load_prepared(a.work, a.model, a.batch)
    xe, y_float = float_eval(d, graph, params, a.batch)

    names = [n for n, lq in quant.items() if lq.act is not None and lq.act_range is None]
    run = jax.jit(lambda p, x: {n: v[0] for n, v in execute(graph, p, x,
                                                             observe=tap(names))[1].items()})
    ent = get_observer("entropy")
    states: dict = {}
    lo = {n: np.inf for n in names}
    hi = {n: -np.inf for n in names}
    for x in cal:
        taps = run(params, jnp.asarray(x))
        for n in names:
            states[n] = ent.update(states[n] if n in states else ent.init(taps[n]), taps[n])
            v = np.asarray(taps[n])
            lo[n], hi[n] = min(lo[n], float(v.min())), max(hi[n], float(v.max()))
    # the reference's histogram: |x| over [0, max|x|] in 2048 bins (all batches, one range)
    amax = {n: max(abs(lo[n]), abs(hi[n])) for n in names}
    hists = {n: np.zeros(2048) for n in names}
    for x in cal:
        taps = run(params, jnp.asarray(x))
        for n in names:
            h, _ = np.histogram(np.abs(np.asarray(taps[n])), bins=2048, range=(0, amax[n]))
            hists[n] += h
    qs_min = calibrate(graph, params, cal, quant, observer="minmax")

    def state_for(n, r):
        lq, node = quant[n], graph.node(n)
        kernel = params.get(n, {}).get(weight_role(node))
        return lq.quantizer.init_state(node, lq, None if kernel is None else
                                       jnp.asarray(kernel, jnp.float32),
                                       act_range=tuple(jnp.float32(v) for v in r))

    ours, ref = {}, {}
    for n in names:
        r = ent.compute_range(states[n], quant[n].act, quant[n].act_symmetric)
        ours[n] = (float(r[0]), float(r[1]))
        edges = np.linspace(0, amax[n], 2049)
        t = reference_amax(hists[n], edges, quant[n].act.bits, lo[n] >= 0)
        ref[n] = (max(lo[n], -t), min(hi[n], t))

    fn = jax.jit(lambda p, s, xb: execute(graph, p, xb, quant=quant, qstate=s))

    def sqnr(qs):
        yq = np.concatenate([np.asarray(fn(params, qs, jnp.asarray(xe[i:i + a.batch])))
                             for i in range(0, len(xe), a.batch)])
        return output_vs_float(yq, y_float)

    whole = {"minmax": sqnr(qs_min),
             "entropy (npujax)": sqnr({**qs_min, **{n: state_for(n, ours[n]) for n in names}}),
             "entropy (reference)": sqnr({**qs_min, **{n: state_for(n, ref[n]) for n in names}})}
    rows = []
    for n in names:
        t_ours = max(-ours[n][0], ours[n][1])
        e = np.linspace(0, amax[n], 2049)  # the share of |x| beyond the threshold (to a bin)
        clipped = float(hists[n][np.searchsorted(e, t_ours):].sum() / hists[n].sum())
        vals = sqnr({**qs_min, n: state_for(n, ours[n])})
        t_ref = max(-ref[n][0], ref[n][1])
        rows.append({"tensor": n, "min": lo[n], "max": hi[n],
                     "t_ours_frac": t_ours / amax[n], "t_ref_frac": t_ref / amax[n],
                     "clipped_share": clipped, "sqnr_alone_db": vals["output_sqnr_db"]})
    rows.sort(key=lambda r: r["sqnr_alone_db"])
    print(f"{'tensor (input of)':34s} {'min':>8s} {'max':>8s} {'t/amax':>7s} {'ref':>7s} "
          f"{'clipped':>9s} {'SQNR alone':>10s}")
    for r in rows[:a.top]:
        print(f"{r['tensor'][:34]:34s} {r['min']:8.3f} {r['max']:8.3f} {r['t_ours_frac']:7.3f} "
              f"{r['t_ref_frac']:7.3f} {r['clipped_share']:9.2e} {r['sqnr_alone_db']:8.1f} dB")
    same = sum(abs(r["t_ours_frac"] - r["t_ref_frac"]) < 2 / 2048 for r in rows)
    print(f"{same} of {len(rows)} thresholds within 2 bins of the reference's")
    for k, v in whole.items():
        print(f"all tensors {k:20s}: output SQNR {v['output_sqnr_db']:.1f} dB, top-1 "
              f"agreement {v['top1_agreement']:.1f} %")
    r = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {r.ru_utime + r.ru_stime:.0f} "
          f"CPU s, load {os.getloadavg()[0]:.1f}")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "whole": whole}, indent=1, default=float))


if __name__ == "__main__":
    main()
