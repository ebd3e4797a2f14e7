"""npujax._jaxpr_numpy: traced programs run with numpy give XLA's numbers (each primitive's
semantics: truncating integer division, saturating conversions, clamped indices, NaN
propagation, scans), survive a round trip through JSON, and refuse what they cannot run
(``lower``'s programs against the compiled ones, on every preset and pass:
tests/plan/test_program_agreement.py)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from npujax import _program_cache
from npujax._jaxpr_numpy import Program, Unsupported, flatten


def _both(fn, *args):
    """``fn(*args)`` compiled by XLA and run by the flattened numpy program, as flat lists."""
    with jax.enable_x64(True):
        program = flatten(jax.make_jaxpr(fn)(*args))
        want = [np.asarray(x) for x in jax.tree.leaves(jax.jit(fn)(*args))]
    return want, program(*jax.tree.leaves(args))


def _assert_same(want, got):
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert w.dtype == g.dtype and w.shape == g.shape
        np.testing.assert_array_equal(g, w)


_F = np.array([-7.5, -2.5, -0.5, -0.0, 0.5, 1.5, 2.5, 3.7, 1e20, np.inf, -np.inf, np.nan])
_I = np.array([-7, -6, -1, 0, 1, 5, 7, 2**40], np.int64)
_J = np.array([2, -4, 3, 5, -2, 3, -7, 3], np.int64)


@pytest.mark.parametrize("name,fn,args", [
    ("arithmetic", lambda x, y: (x + y, x - y, x * y, x / y, jnp.maximum(x, y),
                                 jnp.minimum(x, y), lax.sqrt(jnp.abs(x)), lax.square(x),
                                 -x, jnp.sign(x)), (_F, _F[::-1].copy())),
    ("rounding", lambda x: (jnp.floor(x), jnp.ceil(x), lax.round(x),
                            lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN)), (_F,)),
    ("powers", lambda x, y: (lax.pow(jnp.abs(x), y), lax.integer_pow(x, 3),
                             lax.integer_pow(x, -2), lax.integer_pow(x, 0)),
     (np.linspace(0.1, 9.0, 7), np.linspace(-2.0, 2.5, 7))),
    ("integer division", lambda i, j: (lax.div(i, j), lax.rem(i, j), i * j, i - j), (_I, _J)),
    ("float remainder", lambda x, y: lax.rem(x, y), (np.array([7.5, -7.5, 5.0]),
                                                     np.array([2.0, 2.0, -3.0]))),
    ("conversions", lambda x: (x.astype(jnp.int32), x.astype(jnp.int64), x.astype(jnp.uint8),
                               x.astype(jnp.float32), x.astype(bool),
                               x.astype(jnp.int32).astype(jnp.float64)), (_F,)),
    ("comparisons and logic", lambda x, y: (x < y, x <= y, x == y, x != y, x > y, x >= y,
                                            (x < y) & (x > 0), (x < y) | ~(x > 0),
                                            jnp.isfinite(x)), (_F, _F[::-1].copy())),
    ("select and clamp", lambda p, i, x, y: (lax.select_n(p, x, y), lax.select_n(i, x, y, -x),
                                             lax.clamp(-1.0, x, 2.0)),
     (_F > 0, np.arange(12) % 3, _F, _F[::-1].copy())),
    ("shapes", lambda x: (jnp.broadcast_to(x[:, None], (12, 3)), lax.iota(np.int64, 5),
                          x.reshape(3, 4).T, lax.rev(x, (0,)), x[2:9:3],
                          jnp.concatenate([x, x[:2]]), jnp.squeeze(x[None, :3], 0),
                          jnp.stack([x, -x]), jnp.stack([x, x * 2.0], axis=-1),
                          lax.pad(x.reshape(3, 4), -1.0, [(1, 2, 0), (-1, 1, 2)]),
                          lax.pad(x[:0], 0.0, [(2, 1, 3)])), (_F,)),
    ("indexing", lambda x, i, s: (x[i], lax.dynamic_slice(x, (s,), (4,))),
     (_F, np.array([0, 11, 3, -1, 40]), np.int32(10))),
    ("gathers", lambda m, i, j, s: (
        m[i], m[:, j], jax.vmap(lambda r: r[i])(m), jax.vmap(lambda r: r[:, j], 1)(m[:, :, None]),
        m[i[0], j[:2]], m[j[:2], 1:3],  # two indices per element; an index and a window
        jax.vmap(lambda r, k: lax.dynamic_slice(r, (k,), (2,)))(m, s),  # batching dims
        jax.vmap(lambda r, k: r[k])(m, s)),
     (_F.reshape(3, 4), np.array([[2, 0], [5, -1]]), np.array([3, 0, 9]),
      np.array([-4, 1, 7]))),
    ("reductions", lambda x, i: (jnp.sum(i), jnp.max(x), jnp.min(x), jnp.argmin(x),
                                 jnp.argmax(x), jnp.cumsum(i), lax.cummax(x, reverse=True)),
     (np.array([3.0, -1.0, 7.0, -1.0, 7.0]), _I)),
    ("any and all", lambda b, i: (jnp.any(b), jnp.all(b, axis=1), jnp.any(b, axis=(0, 1)),
                                  lax.reduce_or(i, (0,)), lax.reduce_and(i, (1,))),
     (np.array([[True, False, False], [False, False, False]]), _I.reshape(2, 4))),
    ("nan extremes", lambda x: (jnp.argmin(x), jnp.argmax(x), jnp.max(x)),
     (np.array([1.0, np.nan, -3.0]),)),
    ("custom derivative", lambda x: jax.nn.relu(x) * 2.0, (_F,)),
])
def test_primitives_equal_xla(name, fn, args):
    _assert_same(*_both(fn, *args))


def test_exp_and_log_within_one_ulp_of_xla():
    """numpy's exp and log against XLA:CPU's own (whose float64 exp is not correctly rounded:
    e = 2.7182818284590455): at most one unit in the last place apart, and the same at the
    edges (0, 1, negative, overflow, infinities, NaN)."""
    x = np.concatenate([np.random.default_rng(0).uniform(-700.0, 700.0, 4000),
                        [0.0, 1.0, -1.0, 710.0, -746.0, np.inf, -np.inf, np.nan]])
    want, got = _both(lambda v: (jnp.exp(v), jnp.log(v)), x)
    for w, g in zip(want, got):
        assert w.dtype == g.dtype and w.shape == g.shape
        both_finite = np.isfinite(w) & np.isfinite(g)
        np.testing.assert_array_equal(g[~both_finite], w[~both_finite])
        assert np.abs(g[both_finite].view(np.int64) - w[both_finite].view(np.int64)).max() <= 1


def test_scan_and_nested_jit_equal_xla():
    @jax.jit
    def step(c, x):
        total, best = c
        return (total + x, jnp.minimum(best, x / (total + 1.0))), total * x

    def fn(xs, c0):
        fwd = lax.scan(step, (c0, jnp.inf), xs)
        back = lax.scan(step, (c0, jnp.inf), xs, reverse=True)
        return fwd, back

    _assert_same(*_both(fn, np.linspace(-1.0, 3.0, 9), 0.5))


def test_float_sum_adds_from_the_first_element():
    """A float reduction adds left to right (XLA:CPU's loop), not pairwise as numpy's sum."""
    x = np.array([1e16, 1.0, -1e16, 1.0] * 40)
    with jax.enable_x64(True):
        program = flatten(jax.make_jaxpr(jnp.sum)(x))
    want = 0.0
    for v in x:
        want += v
    assert program(x)[0] == want


def test_program_round_trips_through_json_and_refuses_unknown_primitives():
    fn = lambda x, i: (x[i] * 2.0, lax.scan(lambda c, v: (c + v, c), 0.0, x))  # noqa: E731
    args = (np.linspace(0.0, 1.0, 5), np.array([4, 0, 2]))
    with jax.enable_x64(True):
        program = flatten(jax.make_jaxpr(fn)(*args))
    again = Program.from_json(json.loads(json.dumps(program.to_json())))
    _assert_same(program(*args), again(*args))
    d = program.to_json()
    d["steps"][0][0] = "os_system"
    with pytest.raises(ValueError, match="unknown primitive 'os_system'"):
        Program.from_json(d)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        program(args[0])


def test_unsupported_programs_go_to_the_compiled_fallback():
    with pytest.raises(Unsupported, match="tanh"):
        flatten(jax.make_jaxpr(jnp.tanh)(1.0))
    with pytest.raises(Unsupported, match="empty axis"):  # XLA's -inf, numpy's ValueError
        flatten(jax.make_jaxpr(lambda x: lax.reduce_max(x, (1,)))(np.ones((2, 0))))
    with pytest.raises(Unsupported, match="length 0"):
        flatten(jax.make_jaxpr(lambda x: lax.scan(lambda c, v: (c, v * 2.0), 0.0, x))(
            np.ones((0, 3))))
    with pytest.raises(Unsupported, match="gather"):  # out-of-range rows filled, not clamped
        flatten(jax.make_jaxpr(lambda x, i: x.at[i].get(mode="fill"))(np.ones(4), np.ones(2, int)))
    calls = []
    out = _program_cache.evaluate(jnp.tanh, (np.float32(1.0),),
                                  lambda: calls.append(1) or np.float32(np.tanh(1.0)),
                                  name="test_tanh")
    assert calls == [1] and out == np.float32(np.tanh(1.0))
    assert _program_cache.numpy_fallbacks[-1] == ("test_tanh", "primitive 'tanh'")
    _program_cache.numpy_fallbacks.pop()
