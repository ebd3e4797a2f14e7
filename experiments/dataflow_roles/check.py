"""Compare experiments/dataflow_roles/roles.py with the static per-dataflow functions bit for
bit, and time the compilation of three static copies against one vmapped body.

    PYTHONPATH=. python3 experiments/dataflow_roles/check.py
"""

from __future__ import annotations

import resource
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import roles as R  # noqa: E402

from npujax._exact import exact  # noqa: E402
from npujax.systolic.dataflow import DATAFLOWS, gemm_cycles  # noqa: E402
from npujax.systolic.mapping import gemm_mapping  # noqa: E402
from npujax.systolic.memory import gemm_memory  # noqa: E402


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def inputs(n: int, seed: int):
    rng = np.random.default_rng(seed)
    big = lambda lo, hi: rng.integers(lo, hi, n).astype(np.int64)  # noqa: E731
    return dict(M=big(1, 200_000), K=big(1, 5000), N=big(1, 5000), rows=big(4, 257),
                cols=big(4, 257), sram_a=rng.choice([2.0**k for k in range(12, 24)], n),
                sram_b=rng.choice([2.0**k for k in range(12, 24)], n),
                sram_o=rng.choice([2.0**k for k in range(12, 24)], n),
                ea=rng.choice([0.5, 1.0, 2.0], n), eb=rng.choice([0.25, 0.5, 1.0], n),
                bw=rng.uniform(1.0, 64.0, n), uniq=big(1, 10**9).astype(np.float64))


def figures(x, df, bound, fns=(gemm_cycles, gemm_memory, gemm_mapping)):
    """gemm_cycles, gemm_memory and gemm_mapping of the GEMMs ``x`` at dataflow ``df`` (a name,
    or the roles as data)."""
    cycles, memory, mapping = fns
    dims = (x["M"], x["K"], x["N"], x["rows"], x["cols"], df)
    kw = dict(sram_bytes_a=x["sram_a"], sram_bytes_b=x["sram_b"], sram_bytes_out=x["sram_o"],
              elem_bytes_a=x["ea"], elem_bytes_b=x["eb"], elem_bytes_out=x["ea"],
              dram_bytes_per_cycle=x["bw"],
              unique_elems_a=jnp.minimum(x["uniq"], x["M"] * x["K"]), bound=bound)
    return cycles(*dims, bound=bound), memory(*dims, **kw), mapping(*dims, **kw)


def static(bound):
    @exact
    def f(x):
        return [figures(x, df, bound) for df in DATAFLOWS]
    return jax.jit(f, compiler_options=OPTS)


def unified(bound):
    @exact
    def f(x):
        def one(i, x):
            return figures(x, R.Roles(i), bound, (R.gemm_cycles, R.gemm_memory, R.gemm_mapping))
        if BARRIER:
            # a divisor broadcast along the new dataflow axis: XLA turns ``a / broadcast(b)``
            # into ``a * broadcast(1 / b)`` (not exact); behind a barrier it stays a division
            x = dict(x, bw=jax.lax.optimization_barrier(
                jnp.broadcast_to(x["bw"], (len(DATAFLOWS),) + x["bw"].shape)))
            return jax.vmap(one, in_axes=(0, {k: (0 if k == "bw" else None) for k in x}))(
                jnp.arange(len(DATAFLOWS), dtype=jnp.int32), x)
        return jax.vmap(one, in_axes=(0, None))(jnp.arange(len(DATAFLOWS), dtype=jnp.int32), x)
    return jax.jit(f, compiler_options=OPTS)


BARRIER = '--barrier' in sys.argv
OPTS = {'xla_cpu_use_fusion_emitters': False} if '--legacy' in sys.argv else None


def main() -> None:
    bad = 0
    for bound in (None, 2**20):
        for seed in range(3):
            x = inputs(20_000, seed)
            s = static(bound)(x)
            u = unified(bound)(x)
            for i, df in enumerate(DATAFLOWS):
                for part in (0, 1, 2):
                    for k, v in s[i][part].items():
                        w = np.asarray(u[part][k][i])
                        v = np.asarray(v)
                        same = (v.dtype == w.dtype and v.shape == w.shape
                                and np.array_equal(v.view(np.uint8), w.view(np.uint8)))
                        if not same:
                            bad += 1
                            print("DIFFER", bound, seed, df, k, v.dtype, w.dtype,
                                  int(np.sum(v != w)))
    print("bit-identical" if bad == 0 else f"{bad} fields differ")
    x = inputs(1000, 9)
    for rep in range(2):
        for name, make in (("static x3", static), ("unified vmap", unified)):
            t0 = cpu()
            exe = make(2**20 + rep).lower(x).compile()
            t1 = cpu()
            hlo = exe.as_text()
            ops = sum(1 for line in hlo.splitlines() if " = " in line and "ENTRY" not in line)
            fusions = hlo.count(" fusion(")
            exe(x)
            t2 = cpu()
            for _ in range(20):
                jax.block_until_ready(exe(x))
            print(f"{name}: compile {t1 - t0:.3f} s CPU, {ops} HLO instructions, "
                  f"{fusions} fusions, run {(cpu() - t2) / 20 * 1e3:.2f} ms CPU per call "
                  f"(1,000 GEMMs x 3 dataflows)")

if __name__ == "__main__":
    main()
