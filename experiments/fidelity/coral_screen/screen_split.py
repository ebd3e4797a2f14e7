"""Screen candidate 6: the Edge TPU compiler reserves activation memory first (step 1 of 2).

Public fact (``fidelity.md``, "Public facts about the timed models' compiled files"): Coral's
compiled Inception v1 caches 6,581,440 B of parameters and streams 393,664 B on every inference
although its 6.98 MB of compiled parameters are below the ~8 MB on chip; MobileNet v1 and v2
cache all of theirs (4,464,000 and 3,947,392 B) and stream nothing. The candidate: the
compiler reserves the model's activation working set first and caches parameters in what is
left of the SRAM beside the filter buffer. The reserve: ``k x`` the peak live activation bytes
(``k = 1``: the largest set of tensors alive at once; ``k = 2``: double-buffered), twice the
largest tensor (a ping-pong pair, ``2xT``), or the larger of the peak and twice the largest
tensor (``max``). The cache is filled in whole layers in schedule order up to the first that
does not fit (``prefix``, the ``weight_stream`` pass as shipped) or to the byte, the overflow
streamed (``fill``: what the Inception v1 file shows, a cache filled to its last byte beside
394 kB streamed, fewer than its last layer's 1.03 MB). Each variant is the shipped preset with
the split made (``onchip_split.split_spec`` at the reserve's share); ``fill`` swaps the
``weight_stream`` pass for ``_fill_apply`` in the composer's registry for that variant.

Peak live activation bytes (``live_bytes``): over the schedule, the bytes of every tensor
alive at each step (the graph input, and each layer's output from its producer to its last
consumer), int8; an elementwise layer fused into a GEMM's output stage is that GEMM's output,
and a Pad is no tensor of its own (the compiler pads inside the convolution that reads it;
TF Lite's convolutions pad ``SAME`` themselves), so its consumers keep its input alive.

    PYTHONPATH=. python3 experiments/fidelity/coral_screen/screen_split.py [CACHE]

For every row pickled by ``build.py``, each variant's latency at the 13 rates of
``screen_instr.py`` (the shipped preset otherwise: instruction stream included), into
``CACHE/res_split_VARIANT_NAME.npy``; also the shipped preset again (``res_split_shipped_*``,
to check the rows against ``res_shipped_*``), and ``CACHE/split_facts.json`` (per model: the
parameter bytes, the peak live bytes, and what each variant caches and streams).
``loo_split.py`` runs the leave-one-out.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from npujax._exact import real
from npujax.hw import fields, load_npu_spec
from npujax.hw.spec import stack_specs
from npujax.plan import program
from npujax.plan.passes import onchip_split, weight_stream
from npujax.plan.passes.base import LATENCY
from npujax.plan.program import program_cost
from npujax.plan.recombine import repriced

CACHE = sys.argv[1] if len(sys.argv) > 1 else "/work/coral-cache"
RATES = np.geomspace(2.5e8, 8e8, 13)
#: name: (k, fill to the byte, basis: "live" peak live bytes, "tensor" the largest tensor,
#: "max" the larger of the peak live bytes and twice the largest tensor)
VARIANTS = {"1x_prefix": (1.0, False, "live"), "2x_prefix": (2.0, False, "live"),
            "1x_fill": (1.0, True, "live"), "2x_fill": (2.0, True, "live"),
            "2xT_prefix": (2.0, False, "tensor"), "2xT_fill": (2.0, True, "tensor"),
            "max_fill": (1.0, True, "max")}


def live_bytes(layers, largest: bool = False):
    """float ``[L]``: the activation bytes alive at each step of the schedule (int8); with
    ``largest``, the largest single tensor's bytes instead (float)."""
    name = {w.name: i for i, w in enumerate(layers)}
    tail = {name[w.fused_into]: j for j, w in enumerate(layers) if w.fused_into}

    def src(p):
        while p >= 0 and layers[p].op == "Pad":
            p = layers[p].inputs[0][0]
        return p

    size, start, end = {}, {}, {}
    size[-1] = max(e for w in layers for p, e in w.inputs if p < 0)
    start[-1] = end[-1] = 0
    for i, w in enumerate(layers):
        if w.fused_into or w.op == "Pad" or w.device != "npu":
            continue
        t = tail.get(i, i)
        size[t], start[t], end[t] = w.out_elems, i, t
    for i, w in enumerate(layers):
        for p, _ in w.inputs:
            s = src(p)
            if s in end:
                end[s] = max(end[s], i)
    if largest:
        return float(max(size.values()))
    live = np.zeros(len(layers))
    for t in size:
        live[start[t]:end[t] + 1] += size[t]
    return live


def param_bytes(layers) -> np.ndarray:
    return np.asarray([w.weight_elems + 4 * w.bias_elems
                       if w.device == "npu" and w.kind == "gemm" else 0 for w in layers], float)


def _fill_apply(inp, state):
    """``weight_stream``'s pass with the cache filled to the byte (a layer may be cached in
    part; its uncached part streams): only for ``streams_from_dram``, as Coral's preset."""
    spec, costs = inp.spec, state.costs
    w = weight_stream.weight_bytes(inp)
    before = jnp.cumsum(w) - w
    frac = jax.lax.stop_gradient(jnp.where(
        w > 0, jnp.clip((real(spec.memory.parameter_cache_bytes) - before) / jnp.maximum(w, 1.0),
                        0.0, 1.0), 0.0))
    w_traffic = real(state.unfused.weight_dram_bytes)
    dram = jnp.maximum(real(costs.dram_bytes) - frac * w_traffic, 0.0)
    out = repriced(costs, spec, frac > 0, dram)
    out = out._replace(weight_dram_bytes=(1.0 - frac) * real(out.weight_dram_bytes))
    return state._replace(costs=out, streamed_weight_bytes=jnp.zeros_like(w))


def main() -> None:
    jax.config.update("jax_compilation_cache_dir", os.path.join(CACHE, "jaxcache"))
    import dataclasses

    from npujax.plan import passes
    base = load_npu_spec("coral_edgetpu")
    free = base.memory.onchip_sram_bytes - base.memory.filter_sram_bytes
    facts = {}
    fill_pass = dataclasses.replace(weight_stream.PASS, apply=_fill_apply)
    shipped_passes = passes.registered()
    fill_passes = tuple(fill_pass if p.name == "weight_stream" else p for p in shipped_passes)
    for f in sorted(glob.glob(os.path.join(CACHE, "*.pkl"))):
        name = os.path.basename(f)[:-4]
        d = pickle.loads(open(f, "rb").read())
        layers, chains = tuple(d["layers"]), tuple(d["chains"])
        peak = float(live_bytes(layers).max())
        big = live_bytes(layers, largest=True)
        P = param_bytes(layers)
        c = np.cumsum(P)
        facts[name] = {"params": float(P.sum()), "peak_live": peak, "largest_tensor": big}
        t = time.time()
        for tag, (k, fill, basis) in [("shipped", (None, False, ""))] + list(VARIANTS.items()):
            res = os.path.join(CACHE, f"res_split_{tag}_{name}.npy")
            act = None if k is None else k * {"live": peak, "tensor": big,
                                               "max": max(peak, 2 * big)}[basis]
            if k is not None:
                cache = max(free - act, 0.0)
                pre = P.sum() - (c[c <= cache][-1] if (c <= cache).any() else 0.0)
                facts[name][tag] = {"reserve": act, "cache": cache,
                                    "streamed": max(P.sum() - cache, 0.0) if fill else pre}
            if os.path.exists(res):
                continue
            if k is None:
                specs = [fields.replace(base, {"memory.dram_bytes_per_s": float(r)})
                         for r in RATES]
            else:
                share = min(act / free, 1.0)
                with jax.enable_x64(True):  # the split's byte counts in float64
                    specs = [onchip_split.split_spec(
                        fields.replace(base, {"memory.dram_bytes_per_s": float(r)}), share)
                        for r in RATES]
            stacked = stack_specs(specs)
            orig = program.registered
            if fill:
                program.registered = lambda: fill_passes  # noqa: E731
            try:
                with jax.enable_x64(True):
                    wb = jnp.full(len(layers), 8.0, jnp.float32)
                    fn = jax.jit(jax.vmap(lambda s, layers=layers, wb=wb, chains=chains: jnp.sum(
                        program_cost(layers, s, wb, wb, chains=chains,
                                     mode=LATENCY).costs.latency_cycles) / s.array.clock_hz))
                    y = np.asarray(fn(stacked), np.float64)
            finally:
                program.registered = orig
            np.save(res, y)
        print(name, {k_: (round(v["streamed"] / 1e3) if isinstance(v, dict) else round(v / 1e3))
                     for k_, v in facts[name].items()}, f"{time.time() - t:.0f}s", flush=True)
    json.dump(facts, open(os.path.join(CACHE, "split_facts.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
