"""The systolic dataflows as data (:class:`npujax.systolic.dataflow.Roles`): each GEMM at its
own dataflow, chosen by a traced index, gets that dataflow's figures bit for bit."""

import jax
import numpy as np
import pytest

from npujax._exact import exact
from npujax.errors import ConfigError
from npujax.systolic import DATAFLOWS
from npujax.systolic.dataflow import Roles, gemm_cycles
from npujax.systolic.mapping import gemm_mapping
from npujax.systolic.memory import gemm_memory

N = 96


def _inputs():
    rng = np.random.default_rng(3)
    ints = lambda lo, hi: rng.integers(lo, hi, N).astype(np.int64)  # noqa: E731
    sram = lambda: rng.choice([2.0**k for k in range(10, 22)], N)  # noqa: E731
    return dict(M=ints(1, 100_000), K=ints(1, 3000), N=ints(1, 3000), rows=ints(4, 129),
                cols=ints(4, 129), sram_a=sram(), sram_b=sram(), sram_o=sram(),
                ea=rng.choice([0.5, 1.0, 2.0], N), eb=rng.choice([0.25, 0.5, 1.0], N),
                bw=rng.uniform(1.0, 64.0, N))


def _figures(x, df, mapping):
    kw = dict(sram_bytes_a=x["sram_a"], sram_bytes_b=x["sram_b"], sram_bytes_out=x["sram_o"],
              elem_bytes_a=x["ea"], elem_bytes_b=x["eb"], elem_bytes_out=x["ea"],
              dram_bytes_per_cycle=x["bw"], unique_elems_a=x["uniq"], bound=2**20)
    dims = (x["M"], x["K"], x["N"], x["rows"], x["cols"], df)
    if mapping is None:
        return {**gemm_cycles(*dims, bound=2**20), **gemm_memory(*dims, **kw)}
    return gemm_mapping(*dims, mapping=mapping, **kw)


@pytest.mark.parametrize("mapping", [None, "best"])
def test_roles_give_each_dataflows_figures_bit_for_bit(mapping):
    """One program with the dataflow per GEMM as data against the three static ones (the
    sweep's program before), every figure of gemm_cycles and gemm_memory (``None``) or of
    gemm_mapping's closed-form mapper, bit for bit."""
    x = _inputs()
    # distinct elements behind a: up to its M x K (a conv's overlapping windows: fewer)
    x["uniq"] = np.floor(x["M"] * x["K"] * np.random.default_rng(4).uniform(0.05, 1.0, N))
    idx = np.arange(N, dtype=np.int32) % 3

    @jax.jit
    @exact
    def static(x):
        return [_figures(x, df, mapping) for df in DATAFLOWS]

    @jax.jit
    @exact
    def data(x, idx):
        return _figures(x, Roles(idx), mapping)

    with jax.enable_x64(True):
        s, d = static(x), data(x, idx)
    assert set(s[0]) == set(d)
    for k in d:
        b = np.asarray(d[k])
        for i, df in enumerate(DATAFLOWS):
            a = np.asarray(s[i][k])[idx == i]
            assert a.dtype == b.dtype, k
            np.testing.assert_array_equal(a.view(np.uint8), b[idx == i].view(np.uint8),
                                          err_msg=f"{df} {k}")


def test_roles_of_names_and_its_errors():
    """``Roles.of`` maps an index into the caller's names (any order, short names) onto the
    dataflows; row stationary (its own closed form) is refused by name."""
    r = Roles.of(("is", "weight_stationary"), np.array([0, 1, 0]))
    np.testing.assert_array_equal(np.asarray(r.index), [2, 0, 2])
    with pytest.raises(ConfigError, match="row_stationary"):
        Roles.of(("ws", "rs"), np.array([0]))


def test_stacked_reference_search_refuses_roles():
    """The stacked mapping search (the reference implementation, static dataflows only) names
    its limit instead of mixing output stationary's two candidates with the others' eight."""
    from npujax.systolic.mapping import stacked_search

    x = {k: v[:4] for k, v in _inputs().items()}
    x["uniq"] = (x["M"] * x["K"]).astype(np.float64)
    with stacked_search(), jax.enable_x64(True), pytest.raises(ConfigError, match="static"):
        _figures(x, Roles(np.arange(4, dtype=np.int32) % 3), "best")
