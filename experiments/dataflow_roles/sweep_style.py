"""The sweep's use (a dataflow index per configuration): three static copies and a select
against the one formula of roles.py with the index as data. Bit for bit, compile and run time.

    PYTHONPATH=. python3 experiments/dataflow_roles/sweep_style.py
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import check  # noqa: E402
import roles as R  # noqa: E402

from npujax._exact import exact  # noqa: E402
from npujax.systolic.dataflow import DATAFLOWS  # noqa: E402
from npujax.systolic.mapping import gemm_mapping  # noqa: E402

OPTS = {"xla_cpu_use_fusion_emitters": False}


def kw(x, bound=2**20):
    return dict(sram_bytes_a=x["sram_a"], sram_bytes_b=x["sram_b"], sram_bytes_out=x["sram_o"],
                elem_bytes_a=x["ea"], elem_bytes_b=x["eb"], elem_bytes_out=x["ea"],
                dram_bytes_per_cycle=x["bw"],
                unique_elems_a=jnp.minimum(x["uniq"], x["M"] * x["K"]), bound=bound)


@exact
def static(x, idx, bound=2**20):
    outs = [gemm_mapping(x["M"], x["K"], x["N"], x["rows"], x["cols"], df, **kw(x, bound))
            for df in DATAFLOWS]

    def pick(*leaves):
        out = leaves[0]
        for i, leaf in enumerate(leaves[1:], 1):
            out = jnp.where(idx == i, leaf, out)
        return out
    return jax.tree.map(pick, *outs)


@exact
def unified(x, idx, bound=2**20):
    return R.gemm_mapping(x["M"], x["K"], x["N"], x["rows"], x["cols"], R.Roles(idx),
                          **kw(x, bound))


def main() -> None:
    bad = 0
    for seed in range(3):
        x = check.inputs(20_000, seed)
        idx = np.random.default_rng(seed).integers(0, 3, 20_000).astype(np.int32)
        s = jax.jit(static, compiler_options=OPTS)(x, idx)
        u = jax.jit(unified, compiler_options=OPTS)(x, idx)
        for k in s:
            if not np.array_equal(np.asarray(s[k]).view(np.uint8), np.asarray(u[k]).view(np.uint8)):
                bad += 1
                print("DIFFER", seed, k, int(np.sum(np.asarray(s[k]) != np.asarray(u[k]))))
    print("bit-identical" if bad == 0 else f"{bad} fields differ")
    x = check.inputs(3000, 9)
    idx = np.random.default_rng(9).integers(0, 3, 3000).astype(np.int32)
    for rep in range(2):
        for name, f in (("static x3 + select", static), ("unified, index as data", unified)):
            t0 = check.cpu()
            # a new bound each repetition: a new program, compiled afresh
            g = functools.partial(f, bound=2**20 + rep)
            exe = jax.jit(g, compiler_options=OPTS).lower(x, idx).compile()
            t1 = check.cpu()
            exe(x, idx)
            t2 = check.cpu()
            for _ in range(20):
                jax.block_until_ready(exe(x, idx))
            print(f"{name}: compile {t1 - t0:.3f} s CPU, run {(check.cpu() - t2) / 20 * 1e3:.2f}"
                  f" ms CPU per call (3,000 GEMMs, each at its own dataflow)")


if __name__ == "__main__":
    main()
