import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npujax.errors import ConfigError, QuantizationError
from npujax.search import (
    LatencyTable,
    PrecisionPolicy,
    allowed_mask,
    fastest_latency_s,
    fit_exact_budget,
    greedy_policy,
    hessian_traces,
    ilp_policy,
    load_policy,
    save_policy,
)


def table_from(lat, cands=((2, 8), (4, 8), (8, 8)), fixed=1e-6):
    names = tuple(f"l{i}" for i in range(len(lat)))
    return LatencyTable(names, tuple(cands), jnp.asarray(lat, jnp.float32), fixed)


@given(seed=st.integers(0, 10_000), frac=st.floats(0.0, 1.0))
@settings(max_examples=40, deadline=None)
def test_ilp_is_the_exact_optimum_and_greedy_is_feasible(seed, frac):
    rng = np.random.default_rng(seed)
    n = 4
    lat = np.sort(rng.uniform(1e-6, 1e-5, (n, 3)), axis=1)  # cheaper for narrower widths
    omega = np.sort(rng.uniform(0, 1, (n, 3)), axis=1)[:, ::-1]  # narrower = more sensitive
    table = table_from(lat)
    lat = np.asarray(table.seconds, np.float64)
    sens = {name: {c: float(omega[i, j]) for j, c in enumerate(table.candidates)}
            for i, name in enumerate(table.layers)}
    lo, hi = fastest_latency_s(table), table.latency_s({x: (8, 8) for x in table.layers})
    budget = lo + frac * (hi - lo)
    best = min(
        (sum(omega[i, c] for i, c in enumerate(choice)), choice)
        for choice in itertools.product(range(3), repeat=n)
        if lat[np.arange(n), choice].sum() + table.fixed_s <= budget * (1 + 1e-6)
    )
    ilp = ilp_policy(table, sens, budget)
    ilp_cost = sum(sens[k][v] for k, v in ilp.items())
    assert ilp_cost == pytest.approx(best[0], rel=1e-6, abs=1e-9)
    assert table.latency_s(ilp) <= budget * (1 + 1e-6)
    greedy = greedy_policy(table, sens, budget)
    assert table.latency_s(greedy) <= budget * (1 + 1e-6)
    assert sum(sens[k][v] for k, v in greedy.items()) >= ilp_cost - 1e-9


def test_infeasible_budget_is_a_clear_error():
    table = table_from([[1e-6, 2e-6, 3e-6]])
    sens = {"l0": {2: 3.0, 4: 2.0, 8: 1.0}}  # keyed by weight width works too
    with pytest.raises(ConfigError, match="below the fastest"):
        ilp_policy(table, sens, 1e-7)
    with pytest.raises(ConfigError, match="below the fastest"):
        greedy_policy(table, sens, 1e-7)
    assert ilp_policy(table, sens, 10e-6) == {"l0": (8, 8)}


def test_hutchinson_matches_exact_trace_of_a_quadratic():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, 6)).astype(np.float32)
    h = jnp.asarray(a @ a.T)  # PSD Hessian of 0.5 w^T H w for w = kernel.ravel()
    params = {"l": {"kernel": jnp.ones((2, 3), jnp.float32)}}

    def loss(p, batch):
        w = p["l"]["kernel"].reshape(-1)
        return 0.5 * w @ (batch @ w)

    est = hessian_traces(loss, params, h, ["l"], samples=4000, seed=1)["l"]
    assert est == pytest.approx(float(jnp.trace(h)) / 6, rel=0.05)


def test_policy_file_round_trip_and_errors(tmp_path):
    pol = PrecisionPolicy({"a": 4, "b": 8}, {"a": 8, "b": 8}, {"searcher": "ilp"})
    save_policy(tmp_path / "p.json", pol)
    back = load_policy(tmp_path / "p.json")
    assert back == pol
    with pytest.raises(QuantizationError, match=r"weight_bits\['a'\].*\[2, 16\]"):
        PrecisionPolicy({"a": 1}, {"a": 8})
    with pytest.raises(ConfigError, match="same layers"):
        PrecisionPolicy({"a": 4}, {"b": 8})
    (tmp_path / "x.json").write_text('{"weight_bits": {}}')
    with pytest.raises(ConfigError, match="not an npujax precision policy"):
        load_policy(tmp_path / "x.json")
    with pytest.raises(ConfigError, match="does not exist"):
        load_policy(tmp_path / "none.json")


def test_latency_table_columns_and_lookup(edge_spec):
    from flax import nnx

    from npujax.frontends.flax import trace_flax
    from npujax.ir.passes import optimize
    from npujax.models.cnn import DigitsCNN
    from npujax.plan import lower
    from npujax.quantize import quant_spec
    from npujax.search import latency_table

    with jax.numpy_dtype_promotion("standard"):
        g, _ = optimize(*trace_flax(DigitsCNN(rngs=nnx.Rngs(0)),
                                    jnp.zeros((1, 8, 8, 1), jnp.float32)))
    t = latency_table(g, edge_spec, (2, 4, 8), (4, 8))
    assert t.candidates == ((2, 4), (2, 8), (4, 4), (4, 8), (8, 4), (8, 8))
    pol = {"conv1": (8, 8), "conv2": (4, 8), "fc1": (2, 8), "fc2": (4, 8)}
    exact = lower(g, edge_spec, quant_spec(g, {k: v[0] for k, v in pol.items()},
                                           {k: v[1] for k, v in pol.items()}))
    assert t.latency_s(pol) == pytest.approx(exact.latency_s, rel=1e-6)
    with pytest.raises(ConfigError, match="matches 2 candidates"):
        t.column(4)


def test_pinned_layers_keep_their_choice_in_every_solver():
    rng = np.random.default_rng(3)
    cands = tuple(itertools.product((2, 4, 8), (4, 8)))
    cost = np.asarray([w * a for w, a in cands], np.float64)
    table = table_from(rng.uniform(1e-7, 1e-6, (5, 1)) * cost, cands)
    sens = {n: {c: float(rng.uniform(0.5, 1)) * (64 / (c[0] * c[1])) for c in table.candidates}
            for n in table.layers}
    pinned = {table.layers[0]: (8, 8), table.layers[-1]: (8, 8)}
    budget = 0.5 * (fastest_latency_s(table, pinned)
                    + table.latency_s({n: (8, 8) for n in table.layers}))
    assert fastest_latency_s(table, pinned) >= fastest_latency_s(table)
    for solver in (ilp_policy, greedy_policy):
        pol = solver(table, sens, budget, pinned)
        assert all(pol[n] == c for n, c in pinned.items())
        assert table.latency_s(pol) <= budget * (1 + 1e-6)
    with pytest.raises(ConfigError, match="below the fastest"):
        ilp_policy(table, sens, fastest_latency_s(table) * 1.0001, pinned)
    with pytest.raises(ConfigError, match="not a GEMM layer"):
        allowed_mask(table, {"nope": 8})
    # an int pin means W=A when activations vary
    assert allowed_mask(table, {table.layers[1]: 8})[1].sum() == 1


def test_fit_exact_budget_tightens_the_table_budget_until_the_exact_latency_fits():
    """The exact lowering adds costs the table leaves out (here a constant 1.5); the first
    table-feasible policy overshoots, the refit one meets the budget; an impossible budget
    returns the floor's policy for the caller to report."""
    table_latency = {"w8": 10.0, "w4": 8.0, "w2": 5.0}

    def solve(b):
        return {"l0": max((v, k) for k, v in table_latency.items() if v <= b)[1]}

    def exact(c):
        return table_latency[c["l0"]] + 1.5

    assert fit_exact_budget(solve, exact, 10.0, 5.0) == ({"l0": "w4"}, 9.5)
    assert fit_exact_budget(solve, exact, 11.5, 5.0) == ({"l0": "w8"}, 11.5)
    assert fit_exact_budget(solve, exact, 6.0, 5.0) == ({"l0": "w2"}, 6.5)  # best effort
