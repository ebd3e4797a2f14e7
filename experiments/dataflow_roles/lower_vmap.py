"""Would ``lower``'s table program (every layer at the three systolic dataflows) compile faster
with the dataflow as data, vmapped over the three (npujax.systolic.dataflow.Roles), than with
one static copy of the formulas per dataflow? Compile CPU seconds of both, interleaved, and
whether the figures agree bit for bit.

    PYTHONPATH=. python3 experiments/dataflow_roles/lower_vmap.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import resource

import jax
import jax.numpy as jnp
import numpy as np

from npujax.hw import load_npu_spec
from npujax.plan.lower import _cost_options, _program_spec
from npujax.plan.program import program_costs
from npujax.plan.table import layer_table, table_length
from npujax.plan.workload import Workload
from npujax.systolic import DATAFLOWS
from npujax.systolic.dataflow import Roles


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def layers(spec) -> list[Workload]:
    """DigitsCNN's workloads (the program depends on the table's length only)."""
    from flax import nnx

    from npujax.frontends.flax import trace_flax
    from npujax.ir.passes import optimize
    from npujax.models.cnn import DigitsCNN
    from npujax.plan.workload import workloads

    with jax.numpy_dtype_promotion("standard"):
        g, p = trace_flax(DigitsCNN(rngs=nnx.Rngs(0)), jnp.zeros((1, 8, 8, 1), jnp.float32))
    return workloads(optimize(g, p)[0], spec)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    spec = _program_spec(load_npu_spec("edge_16x16"))
    wl = layers(spec)
    length = table_length(len(wl))
    table = layer_table(wl, length)
    w = np.full(length, 8.0, np.float32)

    def static(spec, w, a, table):
        return [o.costs for o in program_costs(table, spec, w, a, dataflows=DATAFLOWS)]

    def data(spec, w, a, table):
        def one(i):
            return program_costs(table, spec, w, a, dataflows=(Roles(i),))[0].costs
        return jax.vmap(one)(jnp.arange(3, dtype=jnp.int32))

    outs = {}
    for r in range(args.rounds):
        for name, f in (("static x3", static), ("roles vmapped", data)):
            g = jax.jit(lambda *a, f=f, r=r: f(*a), compiler_options=_cost_options())
            t0 = cpu()
            exe = g.lower(spec, w, w, table).compile()
            t1 = cpu()
            outs[name] = exe(spec, w, w, table)
            print(f"round {r}: {name}: compile {t1 - t0:.3f} s CPU")
    s, d = outs["static x3"], outs["roles vmapped"]
    bad = []
    for i, df in enumerate(DATAFLOWS):
        for k in s[i]._fields:
            a, b = np.asarray(getattr(s[i], k)), np.asarray(getattr(d, k))[i]
            if not np.array_equal(a, b):
                bad.append((df, k, int(np.sum(a != b))))
    print("bit-identical" if not bad else f"differ: {bad}")


if __name__ == "__main__":
    main()
