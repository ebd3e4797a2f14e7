"""Screen the per-inference instruction stream of the Edge TPU (candidate 5 of fidelity.md).

Step 1 of 2. For every row pickled by ``build.py`` (in ``CACHE``), the shipped preset's latency
(``coral_edgetpu``: one SRAM split per model) at 13 off-chip rates, 250-800 MB/s, as
``screen.py`` computes its variants, plus the counts the candidate needs: the NPU operations
(layers on the NPU that are not fused into another layer's output stage) and the graph input's
bytes. ``loo_instr.py`` adds the candidate and runs the leave-one-out.

    PYTHONPATH=. python3 experiments/fidelity/coral_screen/screen_instr.py [CACHE] [shipped]

The preset is evaluated without the candidate (``memory.instruction_bytes_per_op = 0``); with
``shipped``, as shipped (the ``instruction_stream`` pass in the cost program), into
``res_shipped_NAME.npy``: ``loo_instr.py`` checks that it equals the screened candidate.

Writes ``CACHE/res_preset_NAME.npy`` (seconds, one per rate), ``CACHE/layers_preset_NAME.npy``
(each layer's seconds, ``[rates, layers]``), ``CACHE/keys_preset.npy`` and
``CACHE/counts_instr.json`` (``npu_mask``: which layers are NPU operations).
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

from npujax.hw import fields, load_npu_spec
from npujax.hw.spec import stack_specs
from npujax.plan.passes.base import LATENCY
from npujax.plan.program import program_cost

CACHE = sys.argv[1] if len(sys.argv) > 1 else "/work/coral-cache"
TAG = "shipped" if "shipped" in sys.argv[2:] else "preset"
RATES = np.geomspace(2.5e8, 8e8, 13)


def counts(layers, row) -> dict:
    """NPU operations (unfused NPU layers) and the graph input's bytes (int8) of one row."""
    npu = [w for w in layers if w.device == "npu" and not w.fused_into]
    h, w, c = row.input_hwc
    return {"npu_ops": len(npu), "npu_layers": sum(x.device == "npu" for x in layers),
            "layers": len(layers), "input_bytes": int(h * w * c),
            "gemm_ops": sum(x.kind == "gemm" for x in npu),
            "npu_mask": [int(w.device == "npu" and not w.fused_into) for w in layers]}


def main() -> None:
    jax.config.update("jax_compilation_cache_dir", os.path.join(CACHE, "jaxcache"))
    base = load_npu_spec("coral_edgetpu")
    if TAG == "preset":
        base = fields.replace(base, {"memory.instruction_bytes_per_op": 0.0})
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
        if os.path.exists(res) and (TAG == "shipped" or os.path.exists(per_layer)):
            continue
        t = time.time()
        with jax.enable_x64(True):
            wb = jnp.full(len(layers), 8.0, jnp.float32)
            fn = jax.jit(jax.vmap(lambda s, layers=layers, wb=wb, chains=chains: (
                program_cost(layers, s, wb, wb, chains=chains, mode=LATENCY).costs.latency_cycles
                / s.array.clock_hz)))
            y = np.asarray(fn(stacked), np.float64)  # [rates, layers] seconds
        np.save(res, y.sum(axis=1))
        if TAG == "preset":
            np.save(per_layer, y)
        print(name, len(layers), {k: v for k, v in allc[name].items() if k != "npu_mask"},
              f"{time.time() - t:.0f}s", flush=True)
    json.dump(allc, open(path, "w"), indent=1)
    np.save(os.path.join(CACHE, "keys_preset.npy"), RATES)


if __name__ == "__main__":
    main()
