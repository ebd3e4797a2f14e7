"""Screen double-buffered weight tiles on the Edge TPU (candidate 7 of fidelity.md).

Step 1 of 2 (``loo_tag.py`` second). For every row pickled by ``build.py`` (in ``CACHE``), the
shipped ``coral_edgetpu`` preset with ``array.stationary_buffering = "double"`` (the next
fold's weight tile shifts in while the current fold streams, as TPU v1's matrix unit does:
Jouppi et al., ISCA 2017, section 2), evaluated by the cost program at 13 off-chip rates,
250-800 MB/s, as ``screen_instr.py`` evaluates the shipped preset (``res_shipped_NAME.npy``).

    PYTHONPATH=. python3 experiments/fidelity/coral_screen/screen_dbuf.py [CACHE]
    python3 experiments/fidelity/coral_screen/loo_tag.py [CACHE] shipped dbuf

Writes ``CACHE/res_dbuf_NAME.npy`` (seconds, one per rate) and ``CACHE/layers_dbuf_NAME.npy``
(each layer's seconds, ``[rates, layers]``). About 3 minutes of CPU on 2 shared cores.
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
from screen_instr import counts  # (this folder: the script's own directory is on sys.path)

from npujax.hw import fields, load_npu_spec
from npujax.hw.spec import stack_specs
from npujax.plan.passes.base import LATENCY
from npujax.plan.program import program_cost

CACHE = sys.argv[1] if len(sys.argv) > 1 else "/work/coral-cache"
TAG = "dbuf"  # the files this screen writes
RATES = np.geomspace(2.5e8, 8e8, 13)


def main() -> None:
    jax.config.update("jax_compilation_cache_dir", os.path.join(CACHE, "jaxcache"))
    base = load_npu_spec("coral_edgetpu")
    base = fields.replace(base, {"array.stationary_buffering": "double"})
    stacked = stack_specs([fields.replace(base, {"memory.dram_bytes_per_s": float(r)})
                           for r in RATES])
    path = os.path.join(CACHE, "counts_instr.json")
    allc = json.load(open(path)) if os.path.exists(path) else {}
    for f in sorted(glob.glob(os.path.join(CACHE, "*.pkl"))):
        name = os.path.basename(f)[:-4]
        d = pickle.loads(open(f, "rb").read())
        layers, chains = tuple(d["layers"]), tuple(d["chains"])
        allc[name] = counts(layers, d["row"])
        res = os.path.join(CACHE, f"res_{TAG}_{name}.npy")
        per_layer = os.path.join(CACHE, f"layers_{TAG}_{name}.npy")
        if os.path.exists(res) and os.path.exists(per_layer):
            continue
        t = time.time()
        with jax.enable_x64(True):
            wb = jnp.full(len(layers), 8.0, jnp.float32)
            fn = jax.jit(jax.vmap(lambda s, layers=layers, wb=wb, chains=chains: (
                program_cost(layers, s, wb, wb, chains=chains, mode=LATENCY).costs.latency_cycles
                / s.array.clock_hz)))
            y = np.asarray(fn(stacked), np.float64)  # [rates, layers] seconds
        np.save(res, y.sum(axis=1))
        np.save(per_layer, y)
        print(name, len(layers), {k: v for k, v in allc[name].items() if k != "npu_mask"},
              f"{time.time() - t:.0f}s", flush=True)


if __name__ == "__main__":
    main()
