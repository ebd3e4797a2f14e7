"""Host-side bookkeeping compiles nothing: every eager jnp op on a new shape compiles an XLA
program of its own (20-50 ms each on CPU), so ``evaluate`` counts correct predictions with
numpy and compiles only its forward program."""

import jax
import numpy as np
from flax import nnx

import npujax
from npujax.quantize.train import evaluate, to_device
from tests.helpers import programs


class _Odd(nnx.Module):  # shapes no other test uses, so no eager program is compiled already
    def __init__(self, rngs):
        self.fc = nnx.Linear(5, 7, rngs=rngs)

    def __call__(self, x):
        return self.fc(x)


def test_evaluate_compiles_only_its_forward():
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(13, 5)).astype(np.float32)
    y = (np.arange(13) % 7).astype(np.int64)
    graph, params = npujax.trace_flax(_Odd(nnx.Rngs(0)), x[:1])
    with programs() as names:
        acc = evaluate(graph, params, x, y, batch_size=8)  # batches of 8 and 5
    assert names and set(names) == {"jit(<lambda>)"}, names
    logits = np.asarray(jax.jit(lambda p, v: npujax.execute(graph, p, v))(params, x))
    assert acc == np.mean(np.argmax(logits, -1) == y)


def test_to_device_compiles_nothing_and_keeps_values():
    a = np.random.default_rng(1).normal(size=(3, 11)).astype(np.float32)
    with programs() as names:
        d = to_device(a)
        same = to_device(d)
    assert names == [] and same is d
    np.testing.assert_array_equal(np.asarray(d), a)
    assert to_device(np.arange(3, dtype=np.int64)).dtype == jax.numpy.asarray(
        np.arange(3, dtype=np.int64)).dtype
