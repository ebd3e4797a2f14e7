"""The differentiable mode of the cost model (issue 13): exact values, useful gradients."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.hw import differentiable_spec, list_presets, load_npu_spec
from npujax.plan import layer_costs
from npujax.plan.gradcheck import secant_check
from npujax.plan.workload import Workload


def _gemm(M, K, N, groups=1):
    return Workload(name="g", op="Conv", kind="gemm", M=M, K=K, N=N, groups=groups,
                    macs=M * K * N * groups, weight_elems=K * N * groups, bias_elems=N * groups,
                    in_elems=M * K * groups, out_elems=M * N * groups, cpu_ops=2 * M * K * N)


def _vector(e, ops_per_elem=1):
    return Workload(name="v", op="Add", kind="vector", in_elems=2 * e, out_elems=e,
                    vector_ops=e * ops_per_elem, cpu_ops=e)


def _layers(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.8:
            M, K, N = (int(np.exp(rng.uniform(0, np.log(hi)))) for hi in (2**16, 2**12, 2**11))
            out.append(_gemm(M, K, N, int(rng.choice([1, 1, 2, 4]))))
        else:
            out.append(_vector(int(np.exp(rng.uniform(np.log(16), np.log(2**20))))))
    return out


def _bits(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(2, 9, n).astype(np.float32), rng.integers(2, 9, n).astype(np.float32))


@pytest.mark.parametrize("preset", list_presets())
def test_relaxed_values_equal_the_exact_ones_bit_for_bit(preset):
    spec = load_npu_spec(preset)
    layers = _layers(24, 1)
    wb, ab = _bits(24, 2)
    exact = layer_costs(layers, spec, wb, ab)
    relaxed = layer_costs(layers, spec, wb, ab, relaxed=True)
    for k, v in exact._asdict().items():
        r = np.asarray(getattr(relaxed, k))
        np.testing.assert_array_equal(np.asarray(v).astype(r.dtype), r, err_msg=k)


def test_bitserial_weight_width_slope_is_the_streaming_time_per_bit():
    # the example: exact-mode grad 0.31 cycles/bit; one bit less saves ~2,048 cycles
    spec = load_npu_spec("bitserial_16x16")
    layers = [_gemm(1024, 64, 64)]
    a = jnp.full(1, 8.0)

    @functools.partial(jax.jit, static_argnums=1)  # (eagerly: a compilation per op)
    def lat(w, relaxed):
        return layer_costs(layers, spec, w, a, relaxed=relaxed).latency_cycles.sum()

    w8 = jnp.full(1, 8.0)
    secant = float(lat(w8, False) - lat(jnp.full(1, 7.0), False))
    assert secant > 2000
    assert abs(float(jax.grad(lat)(w8, False)[0])) < 1.0  # the exact mode: steps, no slope
    g = float(jax.grad(lat)(w8, True)[0])
    assert 0.8 * secant < g < 1.25 * secant


def test_hardware_gradients_through_integer_fields():
    spec = differentiable_spec(load_npu_spec("edge_16x16"))
    layers = [_gemm(4096, 576, 64), _vector(100_000, ops_per_elem=100)]  # compute-bound
    w = jnp.full(2, 8.0)

    @jax.jit  # (eagerly: a compilation per op)
    def lat(s):
        return (layer_costs(layers, s, w, w, relaxed=True).latency_cycles.sum()
                / s.array.clock_hz)

    g = jax.grad(lat)(spec)
    # one unit more (the forward difference of the folds): a 17th row saves 15 of the 256
    # folds of M = 4096; a 17th column saves none of the 4 folds of N = 64, only adds drain
    base = load_npu_spec("edge_16x16")
    for field, sign in (("rows", -1.0), ("cols", 1.0)):
        step = base.with_fields({f"array.{field}": getattr(base.array, field) + 1})
        secant = float(lat(differentiable_spec(step)) - lat(spec))
        pred = float(getattr(g.array, field))
        assert np.sign(secant) == np.sign(pred) == sign, (field, pred, secant)
        assert 0.5 <= pred / secant <= 2.0, (field, pred, secant)
    assert float(g.vector.lanes) < 0
    assert float(g.memory.dram_bytes_per_s) < 0
    assert all(np.isfinite(np.asarray(x)) for x in jax.tree.leaves(g))


def test_secant_agreement_on_random_layers():
    # the check on a small sample, every parameter (the bench runs 8 presets x 40)
    layers = _layers(16, 3)
    wb, ab = _bits(16, 4)
    r = secant_check(layers, load_npu_spec("edge_16x16"), wb, ab).rates()
    assert r["all"]["cases"] >= 60
    assert r["all"]["sign"] >= 0.95
    assert r["all"]["magnitude"] >= 0.8
    # array geometry: with the mean slope of the fold staircase a 17th row or column that
    # saves no fold got a negative gradient where it only adds fill and drain (~75 % sign)
    geo = [r[p] for p in ("array.rows", "array.cols")]
    assert sum(g["sign"] * g["cases"] for g in geo) / sum(g["cases"] for g in geo) >= 0.9


def test_ceil_div_gradients_straight_through_and_one_unit_more():
    from npujax import _relax

    def f(a, b):
        with _relax.relaxed():
            return _relax.ceil_div(a, b)

    with jax.enable_x64(True):
        for a, b in ((100.0, 16.0), (100.0, 19.0), (64.0, 16.0), (9.0, 16.0), (83.0, 1.0)):
            da, db = jax.grad(f, argnums=(0, 1))(a, b)
            assert float(f(a, b)) == np.ceil(a / b)  # the exact value
            assert float(db) == np.ceil(a / (b + 1)) - np.ceil(a / b)  # one unit more of b
            assert float(da) == (1.0 / b if a / b > 1 else 0.0)  # the straight-through slope
        # 100 / 16 -> 100 / 17 saves a fold (7 -> 6); 100 / 19 -> 100 / 20 does too (6 -> 5)
        assert float(jax.grad(f, argnums=1)(100.0, 16.0)) == -1.0
        assert float(jax.grad(f, argnums=1)(100.0, 17.0)) == 0.0  # 6 -> 6: a plateau

    def mean(a, b):  # the staircase's mean slope, for descents (codesign, fit)
        with _relax.relaxed(slope="mean"):
            return _relax.ceil_div(a, b)

    with jax.enable_x64(True):
        assert float(mean(100.0, 17.0)) == 6.0
        assert float(jax.grad(mean, argnums=1)(100.0, 17.0)) == pytest.approx(-100.0 / 17**2)


def test_split_over_cores_at_a_tie_follows_the_split_one_more_core_takes():
    # at one core both splits are the whole layer (M first on the tie); with M = 1 only the
    # N split gains from a second core, and the gradient must say so (it was 0)
    spec = load_npu_spec("edge_16x16")
    layers = [_gemm(1, 839, 1011)]
    w = jnp.full(1, 8.0)

    def compute(s):
        return layer_costs(layers, s, w, w, relaxed=True).compute_cycles.sum()

    with jax.enable_x64(True):
        g = float(jax.jit(jax.grad(compute))(differentiable_spec(spec, jnp.float64)).array.cores)
        secant = float(layer_costs(layers, spec.with_fields({"array.cores": 2}), w, w)
                       .compute_cycles.sum() - layer_costs(layers, spec, w, w)
                       .compute_cycles.sum())
    assert secant < 0
    assert 0.5 <= g / secant <= 2.0


def test_secant_check_fails_for_gradients_that_are_zero():
    # the check can fail: with no relaxation the bit-width slopes on a bit-serial array are lost
    layers = [_gemm(1024, 64, 64), _gemm(256, 288, 32)]
    chk = secant_check(layers, load_npu_spec("bitserial_16x16"), [8.0, 6.0], [8.0, 6.0],
                       params=("weight_bits",), temperature=0.05)
    assert chk.rates()["all"]["magnitude"] == 1.0
    bad = chk.__class__(chk.params, chk.predicted * 0.0 + 1e-3 * chk.secant, chk.secant,
                        chk.latency)
    assert bad.rates()["all"]["magnitude"] == 0.0


def test_bad_temperature_and_parameter_are_config_errors():
    spec = load_npu_spec("edge_16x16")
    w = jnp.full(1, 8.0)
    with pytest.raises(ConfigError, match="temperature"):
        layer_costs([_gemm(8, 8, 8)], spec, w, w, relaxed=True, temperature=0.0)
    with pytest.raises(ConfigError, match="count slope"):
        layer_costs([_gemm(8, 8, 8)], spec, w, w, relaxed=True, count_slope="median")
    with pytest.raises(ConfigError, match="unknown secant-check"):
        secant_check([_gemm(8, 8, 8)], spec, [8.0], [8.0], params=("array.nope",))


@pytest.mark.parametrize("kind,preset", [("resnet", "edge_16x16"),
                                         ("vit", "edge_transformer_16x16")])
def test_bit_gradients_of_the_cost_program_in_the_default_float32_config(model_kinds, kind,
                                                                         preset):
    # issue 28: grad w.r.t. activation bits raised "lax.scatter ... float32, float64" (a gather
    # of a float64 width, transposed after the 64-bit scope had closed), exact and relaxed
    from npujax.plan import CostMode, network, program_cost

    spec = load_npu_spec(preset)
    net = network(model_kinds[kind], spec)
    n = len(net.layers)
    bits = np.linspace(3.0, 8.0, n).round().astype(np.float32)
    for relaxed in (False, True):
        mode = CostMode(relaxed=relaxed)  # the energy pass too

        def cost(w, a, mode=mode):
            p = program_cost(net.layers, spec, w, a, chains=net.chains, mode=mode)
            return p.costs.latency_cycles.sum() + 1e9 * p.energy.total_j.sum()

        gw, ga = jax.jit(jax.grad(cost, argnums=(0, 1)))(bits, bits)
        assert gw.dtype == ga.dtype == jnp.float32
        assert np.any(np.asarray(ga) != 0) and np.any(np.asarray(gw) != 0)
    if kind != "vit":  # (the attention kernels' indexing is the one to compare)
        return
    with jax.enable_x64(True):  # the relaxed gradient a caller with 64-bit types gets
        gw64, ga64 = jax.jit(jax.grad(cost, argnums=(0, 1)))(bits.astype(np.float64),
                                                             bits.astype(np.float64))
    np.testing.assert_allclose(ga, ga64, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(gw, gw64, rtol=1e-5, atol=1e-3)
