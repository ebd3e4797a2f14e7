"""The sweep with the dataflow as data inside the formulas (npujax.systolic.Roles) against the
program of each dataflow alone: every column, bit for bit, over presets that exercise group
packing, double-buffered stationary tiles and both DRAM mappings.

    PYTHONPATH=. python3 experiments/dataflow_roles/sweep_equal.py [PRESET ...]
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from npujax.explore.sweep import COLUMNS, evaluate
from npujax.hw import load_npu_spec
from npujax.plan import network
from npujax.systolic import DATAFLOWS

PRESETS = ("edge_16x16", "tpu_v1", "coral_edgetpu", "rk3588_npu", "bitfusion_16x16",
           "gemmini_16x16", "datacenter_128x128", "edge_transformer_16x16", "coral_devboard")


def graphs():
    from flax import nnx

    from npujax.frontends.flax import trace_flax
    from npujax.ir.passes import optimize
    from npujax.models.cnn import DigitsCNN

    with jax.numpy_dtype_promotion("standard"):
        g, p = trace_flax(DigitsCNN(rngs=nnx.Rngs(0)), jnp.zeros((1, 8, 8, 1), jnp.float32))
    yield "DigitsCNN", optimize(g, p)[0]


def main() -> None:
    bad = checked = 0
    for name, graph in graphs():
        for preset in sys.argv[1:] or PRESETS:
            spec = load_npu_spec(preset)
            for mapping in ("best", "scalesim"):
                s = spec.with_fields({"memory.mapping": mapping})
                layers, chains = network(graph, s)
                n = 12
                rng = np.random.default_rng(0)
                rows = rng.choice([4, 8, 16, 32, 64], n)
                bits = rng.choice([2.0, 4.0, 8.0, 16.0], n)
                idx = np.arange(n, dtype=np.int32) % 3
                one = evaluate(layers, s, {"array.rows": rows}, bits, None, chains,
                               dataflows=DATAFLOWS, dataflow=idx)
                for i, df in enumerate(DATAFLOWS):
                    sel = idx == i
                    alone = evaluate(layers, s.with_fields({"array.dataflow": df}),
                                     {"array.rows": rows[sel]}, bits[sel], None, chains)
                    for k in COLUMNS:
                        checked += 1
                        a, b = np.asarray(one[k])[sel], np.asarray(alone[k])
                        if not np.array_equal(a.view(np.uint8), b.view(np.uint8)):
                            bad += 1
                            print("DIFFER", name, preset, mapping, df, k,
                                  int(np.sum(a != b)), file=sys.stderr)
    print(f"{checked} columns compared, {bad} differ")


if __name__ == "__main__":
    main()
