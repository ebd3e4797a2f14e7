import jax.numpy as jnp
import numpy as np
import pytest

from npujax.calib import (
    check_finite_state,
    ema_minmax_observer,
    get_observer,
    mean_minmax_observer,
    minmax_observer,
)
from npujax.errors import CalibrationError


def test_minmax_over_batches():
    obs = minmax_observer()
    a = jnp.asarray([[1.0, -2.0], [3.0, 0.5]], jnp.float32)
    b = jnp.asarray([[7.0, -1.0]], jnp.float32)
    s = obs.update(obs.update(obs.init(a), a), b)
    assert float(s["min"]) == -2.0 and float(s["max"]) == 7.0


def test_minmax_per_channel():
    obs = minmax_observer(axis=1)
    x = jnp.asarray([[1.0, -2.0, 0.0], [3.0, 0.5, 0.0]], jnp.float32)
    s = obs.update(obs.init(x), x)
    np.testing.assert_array_equal(np.asarray(s["min"]), [1.0, -2.0, 0.0])
    np.testing.assert_array_equal(np.asarray(s["max"]), [3.0, 0.5, 0.0])


def test_ema_first_batch_then_average():
    obs = ema_minmax_observer(decay=0.5)
    x1 = jnp.asarray([0.0, 4.0], jnp.float32)
    x2 = jnp.asarray([-2.0, 2.0], jnp.float32)
    s = obs.update(obs.update(obs.init(x1), x1), x2)
    assert float(s["max"]) == 3.0 and float(s["min"]) == -1.0


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_data_names_the_layer(bad):
    obs = minmax_observer()
    x = jnp.asarray([1.0, bad], jnp.float32)
    s = obs.update(obs.init(x), x)
    with pytest.raises(CalibrationError, match="conv7"):
        check_finite_state(s, "conv7")


def test_bad_decay():
    with pytest.raises(CalibrationError):
        ema_minmax_observer(decay=1.0)


def test_mean_minmax_averages_per_example_extremes_whatever_the_batching():
    # NNCF's MEAN_MINMAX: per example (axis 0) min and max, averaged over the examples
    x = np.asarray([[[1.0, -2.0]], [[3.0, 0.5]], [[9.0, -6.0]]], np.float32)  # [3, 1, 2]
    want_lo, want_hi = np.mean([-2.0, 0.5, -6.0]), np.mean([1.0, 3.0, 9.0])
    obs = get_observer("mean_minmax")
    for parts in ([x], [x[:1], x[1:]], [x[:1], x[1:2], x[2:]]):
        s = obs.init(parts[0])
        for b in parts:
            s = obs.update(s, jnp.asarray(b))
        assert np.isclose(float(s["min"]), want_lo) and np.isclose(float(s["max"]), want_hi)
    # the global min-max of the same data is wider
    m = minmax_observer()
    s = m.update(m.init(x), jnp.asarray(x))
    assert float(s["min"]) == -6.0 and float(s["max"]) == 9.0


def test_mean_minmax_per_channel_and_bad_axis():
    x = jnp.asarray([[1.0, -2.0], [3.0, 4.0]], jnp.float32)  # [examples, channels]
    obs = mean_minmax_observer(axis=1)
    s = obs.update(obs.init(x), x)
    np.testing.assert_allclose(np.asarray(s["min"]), [2.0, 1.0])
    np.testing.assert_allclose(np.asarray(s["max"]), [2.0, 1.0])
    with pytest.raises(CalibrationError, match="axis 0 is the batch"):
        mean_minmax_observer(axis=0)
