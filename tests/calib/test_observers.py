import jax.numpy as jnp
import numpy as np
import pytest

from npujax.calib import check_finite_state, ema_minmax_observer, minmax_observer
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
