"""Conformance suite every Dataflow must pass: exact integer results, int32 accumulation in the
jaxpr, no recompilation on new values, stats equal to the closed form, designed errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npujax.errors import ConfigError, NpujaxError, QuantizationError, ShapeError
from npujax.systolic import (
    DATAFLOWS,
    Dataflow,
    conv_gemm_shape,
    emulate_conv,
    emulate_gemm,
    gemm_cycles,
    get_dataflow,
)
from npujax.systolic import emulator as emulator_mod

ALL_DATAFLOWS = [get_dataflow(name) for name in DATAFLOWS]  # every registered dataflow
INT_DTYPES = [jnp.int8, jnp.uint8, jnp.int16, jnp.uint16]


def _rand(rng, shape, dtype):
    info = np.iinfo(np.dtype(dtype))
    return jnp.asarray(rng.integers(info.min, int(info.max) + 1, shape), dtype)


def _ref(a, b):
    # the exact product (int64 numpy): the emulator never wraps
    return np.asarray(a, np.int64) @ np.asarray(b, np.int64)


@pytest.fixture(params=ALL_DATAFLOWS, ids=lambda d: d.name)
def dataflow(request) -> Dataflow:
    return request.param


def test_dataflow_states_its_mapping(dataflow):
    assert sorted(dataflow.layout) == ["K", "M", "N"]
    s_r, s_c, t = dataflow.map_gemm(2, 3, 5)
    assert sorted((s_r, s_c, t)) == [2, 3, 5]
    assert int(dataflow.fold_cycles(4, 4, 10)) == int(dataflow.fill_cycles(4, 4)) + 10 + 6


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_exact_against_matmul(dataflow, dtype):
    rng = np.random.default_rng(1)
    for M, K, N, R, C in [(37, 50, 23, 8, 4), (1, 1, 1, 8, 8), (16, 16, 16, 16, 16),
                          (9, 300, 5, 4, 8), (64, 9, 17, 32, 32)]:
        a, b = _rand(rng, (M, K), dtype), _rand(rng, (K, N), dtype)
        out, _ = emulate_gemm(a, b, R, C, dataflow)
        info = np.iinfo(np.dtype(dtype))
        fits = max(-int(info.min), int(info.max)) ** 2 * K <= 2**31 - 1
        assert out.dtype == (jnp.int32 if fits else np.dtype("int64"))
        np.testing.assert_array_equal(np.asarray(out), _ref(a, b))


@given(M=st.integers(1, 40), K=st.integers(1, 70), N=st.integers(1, 40),
       R=st.integers(1, 9), C=st.integers(1, 9), seed=st.integers(0, 2**16))
@settings(max_examples=25, deadline=None)
def test_exact_property(M, K, N, R, C, seed):
    rng = np.random.default_rng(seed)
    a, b = _rand(rng, (M, K), jnp.int8), _rand(rng, (K, N), jnp.int8)
    for df in ALL_DATAFLOWS:
        out, stats = emulate_gemm(a, b, R, C, df)
        np.testing.assert_array_equal(np.asarray(out), _ref(a, b))
        assert int(stats["compute_cycles"]) == int(gemm_cycles(M, K, N, R, C, df)["compute_cycles"])


def test_int16_accumulation_widens_or_refuses_never_wraps(dataflow):
    """int16 x int16 with K = 300 wrapped int32 silently (issue #11): now exact in int64, or
    refused with the bound when a 32-bit accumulator is asked for."""
    a = jnp.full((2, 300), 32767, jnp.int16)
    b = jnp.full((300, 3), -32768, jnp.int16)
    out, _ = emulate_gemm(a, b, 4, 4, dataflow)
    assert out.dtype == np.dtype("int64")
    np.testing.assert_array_equal(np.asarray(out), np.full((2, 3), 32767 * -32768 * 300))
    with pytest.raises(QuantizationError, match="int32 accumulator"):
        emulate_gemm(a, b, 4, 4, dataflow, accumulator="int32")
    x = jnp.full((1, 4, 4, 300), 32767, jnp.int16)
    w = jnp.full((1, 1, 300, 2), 32767, jnp.int16)
    y, _ = emulate_conv(x, w, 4, 4, dataflow)
    np.testing.assert_array_equal(np.asarray(y), np.full((1, 4, 4, 2), 32767**2 * 300))
    small, _ = emulate_gemm(a[:, :1], b[:1], 4, 4, dataflow, accumulator="int32")  # K=1 fits
    assert small.dtype == jnp.int32


def test_mixed_widths_are_widened_exactly(dataflow):
    rng = np.random.default_rng(3)
    a, b = _rand(rng, (5, 7), jnp.uint8), _rand(rng, (7, 4), jnp.int8)
    out, _ = emulate_gemm(a, b, 4, 4, dataflow)
    np.testing.assert_array_equal(np.asarray(out), _ref(a, b))


def _subjaxprs(params):
    for v in params.values():
        for item in v if isinstance(v, (tuple, list)) else (v,):
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
                yield item.jaxpr


def _eqns(jaxpr):
    for e in jaxpr.eqns:
        yield e
        for sub in _subjaxprs(e.params):
            yield from _eqns(sub)


def test_jaxpr_int8_operands_accumulate_in_int32(dataflow):
    a = jnp.zeros((33, 20), jnp.int8)
    b = jnp.zeros((20, 9), jnp.int8)
    jaxpr = jax.make_jaxpr(lambda x, y: emulate_gemm(x, y, 8, 8, dataflow)[0])(a, b).jaxpr
    dots = [e for e in _eqns(jaxpr) if e.primitive.name == "dot_general"]
    assert dots, "no dot_general in the emulator"
    for e in dots:
        assert [v.aval.dtype for v in e.invars] == [jnp.int8, jnp.int8]
        assert e.params["preferred_element_type"] == jnp.int32
        assert e.outvars[0].aval.dtype == jnp.int32
    # the operands are never widened before the multiply
    widen = [e for e in _eqns(jaxpr) if e.primitive.name == "convert_element_type"
             and e.invars[0].aval.dtype == jnp.int8]
    assert not widen


def test_no_recompilation_when_only_values_change(dataflow):
    rng = np.random.default_rng(4)
    shapes = ((21, 13), (13, 6))
    for mode, fn in (("tiles", emulator_mod._tile_step), ("buckets", emulator_mod._emulate_gemm)):
        emulate_gemm(_rand(rng, shapes[0], jnp.int8), _rand(rng, shapes[1], jnp.int8), 4, 4,
                     dataflow, shapes=mode)
        before = fn._cache_size()
        for _ in range(3):
            emulate_gemm(_rand(rng, shapes[0], jnp.int8), _rand(rng, shapes[1], jnp.int8), 4, 4,
                         dataflow, shapes=mode)
        assert fn._cache_size() == before, mode


def test_stats_are_the_closed_form(dataflow):
    a = jnp.ones((30, 20), jnp.int8)
    b = jnp.ones((20, 10), jnp.int8)
    _, stats = emulate_gemm(a, b, 8, 4, dataflow)
    want = gemm_cycles(30, 20, 10, 8, 4, dataflow)
    assert set(stats) == set(want)
    for k in want:
        np.testing.assert_array_equal(np.asarray(stats[k]), np.asarray(want[k]))


def _conv_ref(x, w, stride, pads, dilation, groups):
    # float32 is exact here: |sum| < 2**24 for these sizes and int8 values
    out = jax.lax.conv_general_dilated(
        x.astype(jnp.float32), w.astype(jnp.float32), stride, pads, rhs_dilation=dilation,
        dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups)
    return np.asarray(out).astype(np.int32)


CONV_CASES = [
    # (x shape, w shape, stride, padding, dilation, groups)
    ((1, 9, 9, 4), (3, 3, 4, 8), 1, 1, 1, 1),
    ((2, 10, 7, 6), (3, 2, 2, 9), (2, 1), ((1, 0), (2, 1)), (1, 2), 3),
    ((1, 12, 12, 8), (3, 3, 1, 8), 2, "SAME", 1, 8),           # depthwise
    ((1, 8, 8, 4), (3, 3, 1, 8), 1, 2, 2, 4),                  # depthwise, multiplier 2, dilated
    ((1, 7, 7, 3), (7, 7, 3, 5), 1, "VALID", 1, 1),
    ((1, 8, 8, 16), (1, 1, 16, 4), 2, 0, 1, 1),                # 1x1 stride-2 downsample
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_conv_exact(dataflow, case):
    xs, ws, stride, padding, dilation, groups = case
    rng = np.random.default_rng(5)
    x, w = _rand(rng, xs, jnp.int8), _rand(rng, ws, jnp.int8)
    out, stats = emulate_conv(x, w, 8, 8, dataflow, stride=stride, padding=padding,
                              dilation=dilation, groups=groups)
    from npujax.systolic.conv import normalize_conv_args
    s, pads, d = normalize_conv_args(ws[:2], stride, padding, dilation, xs[1:3])
    np.testing.assert_array_equal(np.asarray(out), _conv_ref(x, w, s, pads, d, groups))
    shp = conv_gemm_shape(xs, ws, stride=stride, padding=padding, dilation=dilation,
                          groups=groups)
    g = gemm_cycles(shp["M"], shp["K"], shp["N"], 8, 8, dataflow)
    assert int(stats["compute_cycles"]) == groups * int(g["compute_cycles"])
    assert int(stats["folds"]) == groups * int(g["folds"])


def test_depthwise_is_per_channel_gemms():
    shp = conv_gemm_shape((1, 56, 56, 32), (3, 3, 1, 32), padding=1, groups=32)
    assert (shp["M"], shp["K"], shp["N"], shp["groups"]) == (3136, 9, 1, 32)


BAD = [
    (lambda: emulate_gemm(jnp.ones((2, 3)), jnp.ones((3, 2), jnp.int8), 4, 4, "ws"),
     ShapeError, "integers"),
    (lambda: emulate_gemm(jnp.ones((2, 3), jnp.int32), jnp.ones((3, 2), jnp.int32), 4, 4, "ws"),
     ShapeError, "at most 16 bits"),
    (lambda: emulate_gemm(jnp.ones((2, 3), jnp.int8), jnp.ones((4, 2), jnp.int8), 4, 4, "ws"),
     ShapeError, "same K"),
    (lambda: emulate_gemm(jnp.ones((2, 3, 1), jnp.int8), jnp.ones((3, 2), jnp.int8), 4, 4, "ws"),
     ShapeError, r"\[M, K\]"),
    (lambda: emulate_gemm(jnp.ones((2, 3), jnp.int8), jnp.ones((3, 2), jnp.int8), 0, 4, "ws"),
     ConfigError, "positive"),
    (lambda: emulate_gemm(jnp.ones((2, 3), jnp.int8), jnp.ones((3, 2), jnp.int8), 4, -2, "ws"),
     ConfigError, "cols"),
    (lambda: emulate_gemm(jnp.ones((2, 3), jnp.int8), jnp.ones((3, 2), jnp.int8), 4.5, 4, "ws"),
     ConfigError, "rows"),
    (lambda: emulate_gemm(jnp.ones((2, 3), jnp.int8), jnp.ones((3, 2), jnp.int8), 4, 4,
                          "row_stationary"), ConfigError, "weight_stationary"),
    (lambda: emulate_conv(jnp.ones((1, 4, 4, 3), jnp.int8), jnp.ones((3, 3, 2, 4), jnp.int8), 4,
                          4, "os"), ShapeError, "C_in/groups"),
    (lambda: emulate_conv(jnp.ones((1, 4, 4, 4), jnp.int8), jnp.ones((3, 3, 2, 4), jnp.int8), 4,
                          4, "os", groups=3), ShapeError, "divide"),
    (lambda: emulate_conv(jnp.ones((1, 2, 2, 1), jnp.int8), jnp.ones((3, 3, 1, 1), jnp.int8), 4,
                          4, "os"), ShapeError, "add padding"),
    (lambda: emulate_conv(jnp.ones((1, 4, 4, 1), jnp.int8), jnp.ones((3, 3, 1, 1), jnp.int8), 4,
                          4, "os", stride=0), ConfigError, "stride"),
    (lambda: emulate_conv(jnp.ones((1, 4, 4, 1), jnp.int8), jnp.ones((3, 3, 1, 1), jnp.int8), 4,
                          4, "os", padding="FULL"), ConfigError, "VALID"),
]


@pytest.mark.parametrize("call,err,msg", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_raises_designed_errors(call, err, msg):
    with pytest.raises(err, match=msg) as info:
        call()
    assert isinstance(info.value, NpujaxError)


def test_shape_buckets_share_one_compilation_and_stay_exact():
    # (21, 13, 9) and (23, 14, 10) fall in the same bucket (24, 16, 10) on a 4x4 ws array
    rng = np.random.default_rng(7)
    shapes = [(21, 13, 9), (23, 14, 10)]
    ops = [(_rand(rng, (m, k), jnp.int8), _rand(rng, (k, n), jnp.int8)) for m, k, n in shapes]
    emulate_gemm(*ops[0], 4, 4, "ws", shapes="buckets")
    before = emulator_mod._emulate_gemm._cache_size()
    for (a, b), (m, k, n) in zip(ops, shapes):
        out, stats = emulate_gemm(a, b, 4, 4, "ws", shapes="buckets")
        assert out.shape == (m, n)
        np.testing.assert_array_equal(np.asarray(out), _ref(a, b))
        assert int(stats["folds"]) == int(gemm_cycles(m, k, n, 4, 4, "ws")["folds"])
    assert emulator_mod._emulate_gemm._cache_size() == before
    assert [emulator_mod.shape_bucket(v) for v in (4, 5, 9, 21, 24, 25, 1000)] == \
        [4, 5, 10, 24, 24, 28, 1024]


def test_tiles_compile_once_per_array_whatever_the_gemm_shapes():
    """The default tiled path: a dozen random GEMM shapes (and a 1x1x1 one) on one array and
    dataflow add one compilation; another array edge adds one more; output stationary, whose
    fold is all of K, also one; every result exact."""
    rng = np.random.default_rng(11)
    shapes = [tuple(int(v) for v in rng.integers(1, 300, 3)) for _ in range(12)] + [(1, 1, 1)]
    ops = [(_rand(rng, (m, k), jnp.int8), _rand(rng, (k, n), jnp.int8)) for m, k, n in shapes]
    step = emulator_mod._tile_step
    for rows, df in ((5, "ws"), (7, "is"), (5, "os")):
        before = step._cache_size()
        for a, b in ops:
            out, _ = emulate_gemm(a, b, rows, rows, df)
            assert out.dtype == jnp.int32
            np.testing.assert_array_equal(np.asarray(out), _ref(a, b))
        assert step._cache_size() - before <= 1, (rows, df)
    before = step._cache_size()
    emulate_gemm(*ops[0], 13, 13, "ws")  # a new array edge: one more program
    assert step._cache_size() == before + 1
    with pytest.raises(ConfigError, match="tiles"):
        emulate_gemm(*ops[0], 4, 4, "ws", shapes="per_call")
