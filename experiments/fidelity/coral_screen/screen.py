# The screening script as run (README.md); kept as run.
# ruff: noqa: E402, E501, E702, E741
"""Screen on-chip split candidates: per model, latency at a grid of (activation SRAM, link rate)."""
import glob
import os
import pickle
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_compilation_cache_dir", "/work/coral-cache/jaxcache")
from npujax.hw import fields, load_npu_spec
from npujax.hw.spec import stack_specs
from npujax.plan.passes.base import LATENCY
from npujax.plan.program import program_cost

MiB = 1 << 20
TOTAL = 8 * MiB
FILT = 131072
ACTS = [0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]   # MiB of activation SRAM (ifmap+ofmap)
RATES = np.geomspace(2.5e8, 8e8, 13)
tag = sys.argv[1] if len(sys.argv) > 1 else "split"
base = load_npu_spec("coral_edgetpu")
specs, keys = [], []
SHAPES = [(64, 64), (32, 128), (128, 32), (16, 256), (256, 16)]
for r in (RATES if tag == "shape" else []):
    for (ro, co) in SHAPES:
        specs.append(fields.replace(base, {"memory.dram_bytes_per_s": float(r),
                                           "array.rows": ro, "array.cols": co}))
        keys.append((ro + co / 1000, r))
LANES = [64, 32, 16, 8]
for r in (RATES if tag == "lanes" else []):
    for ln in LANES:
        specs.append(fields.replace(base, {"memory.dram_bytes_per_s": float(r), "vector.lanes": ln}))
        keys.append((-1.0, r, ln))
        for a in [0.5, 1.0, 1.5, 2.0, 3.0, 4.0]:
            abytes = int(a * MiB)
            specs.append(fields.replace(base, {
                "memory.dram_bytes_per_s": float(r), "vector.lanes": ln,
                "memory.ifmap_sram_bytes": abytes // 2, "memory.ofmap_sram_bytes": abytes // 2,
                "memory.parameter_cache_bytes": max(TOTAL - abytes - FILT, 0)}))
            keys.append((a, r, ln))
for r in (RATES if tag == "split" else []):
    # current preset (separate SRAMs): key act=-1
    specs.append(fields.replace(base, {"memory.dram_bytes_per_s": float(r)}))
    keys.append((-1.0, r))
    for a in ACTS:
        abytes = int(a * MiB)
        specs.append(fields.replace(base, {
            "memory.dram_bytes_per_s": float(r),
            "memory.ifmap_sram_bytes": abytes // 2, "memory.ofmap_sram_bytes": abytes // 2,
            "memory.parameter_cache_bytes": max(TOTAL - abytes - FILT, 0)}))
        keys.append((a, r))
stacked = stack_specs(specs)
out = {}
for f in sorted(glob.glob("/work/coral-cache/*.pkl")):
    name = os.path.basename(f)[:-4]
    res = f"/work/coral-cache/res_{tag}_{name}.npy"
    if os.path.exists(res):
        continue
    d = pickle.loads(open(f, "rb").read())
    layers, chains = tuple(d["layers"]), tuple(d["chains"])
    t = time.time()
    with jax.enable_x64(True):
        wb = jnp.full(len(layers), 8.0, jnp.float32)
        fn = jax.jit(jax.vmap(lambda s, layers=layers, wb=wb, chains=chains: jnp.sum(
            program_cost(layers, s, wb, wb, chains=chains, mode=LATENCY).costs.latency_cycles)
            / s.array.clock_hz))
        y = np.asarray(fn(stacked), np.float64)
    np.save(res, y)
    print(name, len(layers), f"{time.time()-t:.0f}s", flush=True)
np.save(f"/work/coral-cache/keys_{tag}.npy", np.asarray(keys))
