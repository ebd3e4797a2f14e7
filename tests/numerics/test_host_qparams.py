"""weight_qparams of a concrete weight (numpy, on the host) equals the jnp code run op by op."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax.numerics import FP8_E4M3FN, FP8_E5M2, IntFormat
from npujax.numerics.qparams import _jnp_weight_qparams, weight_qparams

_FORMATS = [IntFormat(8, narrow_range=True), IntFormat(4, narrow_range=True),
            IntFormat(8, signed=False), FP8_E4M3FN, FP8_E5M2]
# (shape, axis, block_size): per channel, per tensor, one channel (eager XLA divides a
# one-element array exactly, a larger one by the reciprocal), per block, one block
_CASES = [((16, 3, 3, 3), 0, None), ((3, 3, 8, 24), -1, None), ((40, 10), 1, None),
          ((7, 5), None, None), ((1, 8, 3, 3), 0, None), ((64, 1), 1, None),
          ((24, 40, 3, 3), 1, 16), ((40, 24), 0, 32), ((1, 4), 1, 4)]


@pytest.mark.parametrize("fmt", _FORMATS, ids=str)
def test_host_weight_qparams_bit_equal_eager_jnp(fmt):
    rng = np.random.default_rng(0)
    for shape, axis, block in _CASES:
        for _ in range(8):
            w = (rng.standard_normal(shape) * rng.choice([1e-3, 0.3, 7.0])).astype(np.float32)
            w[tuple(0 for _ in shape)] = 0.0  # some zero channels: MIN_SCALE
            if len(shape) > 1:
                w[0] = 0.0
            host = weight_qparams(w, fmt, axis, block_size=block)
            eager = _jnp_weight_qparams(jnp.asarray(w), fmt, axis, block)
            for h, e in zip(host, eager):
                assert isinstance(h, jax.Array)
                assert h.dtype == e.dtype and h.shape == e.shape
                assert np.asarray(h).tobytes() == np.asarray(e).tobytes(), (shape, axis, block)


def test_traced_weight_qparams_still_traces():
    fmt = IntFormat(8, narrow_range=True)
    w = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)
    s, z = jax.jit(lambda v: weight_qparams(v, fmt, 0))(w)
    assert s.shape == (8,) and z.dtype == jnp.int32
    g = jax.grad(lambda v: jnp.sum(weight_qparams(v, fmt, 0)[0]))(w)  # stop_gradient kept
    assert not np.any(np.asarray(g))


def test_host_weight_qparams_rejects_bad_block():
    from npujax.errors import QuantizationError

    with pytest.raises(QuantizationError, match="needs the blocked axis"):
        weight_qparams(np.ones((4, 4), np.float32), FP8_E4M3FN, None, block_size=2)
    with pytest.raises(QuantizationError, match="positive int"):
        weight_qparams(np.ones((4, 4), np.float32), FP8_E4M3FN, 0, block_size=0)
