"""QAT through BN folding (running statistics frozen): a zero BN scale gives no NaN, and the
folded-on-the-fly training graph computes what the folded model computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.frontends.flax import trace_flax
from npujax.ir.execute import execute
from npujax.ir.passes import fold_batchnorm
from npujax.models.cnn import DigitsCNN
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
from npujax.quantize.train import TrainConfig, train_graph

pytestmark = pytest.mark.flax_model


def test_bn_folded_qat_zero_scale_no_nan_and_stats_frozen():
    m = DigitsCNN(rngs=nnx.Rngs(0))
    m.bn1.scale[...] = m.bn1.scale[...].at[:3].set(0.0)  # dead BN channels
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(64, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    graph, params = trace_flax(m, x[:1])
    fgraph, fparams = fold_batchnorm(graph, params)
    q = quant_spec(fgraph, 4, 8)
    qstate = calibrate(fgraph, fparams, [x], q)
    trained = train_graph(graph, params, x, y, quant=q, qstate=qstate, config=TrainConfig(
        steps=3, learning_rate=1e-2, batch_size=32, fold_bn=True)).params
    for leaf in jax.tree.leaves(trained):
        assert np.all(np.isfinite(np.asarray(leaf)))
    np.testing.assert_array_equal(np.asarray(trained["bn1"]["mean"]),
                                  np.asarray(params["bn1"]["mean"]))
    assert not np.allclose(np.asarray(trained["conv1"]["kernel"]),
                           np.asarray(params["conv1"]["kernel"]))
    folded = fold_batchnorm(graph, trained)[1]
    assert np.all(np.asarray(folded["conv1"]["kernel"])[..., :3] == 0.0)
    out = jax.jit(lambda v: execute(fgraph, folded, v, quant=q, qstate=qstate))(jnp.asarray(x))
    assert np.all(np.isfinite(np.asarray(out)))


def test_stochastic_rounding_in_qat_only_with_a_key():
    import dataclasses

    m = DigitsCNN(rngs=nnx.Rngs(2))
    rng = np.random.default_rng(2)
    x = rng.uniform(size=(32, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, 32).astype(np.int32)
    graph, params = fold_batchnorm(*trace_flax(m, x[:1]))
    q = {k: dataclasses.replace(v, stochastic_rounding=True)
         for k, v in quant_spec(graph, 4, 8).items()}
    qstate = calibrate(graph, params, [x], q)
    run = jax.jit(lambda k: execute(graph, params, jnp.asarray(x), quant=q, qstate=qstate, key=k))
    nearest = jax.jit(lambda: execute(graph, params, jnp.asarray(x), quant=q, qstate=qstate))()
    a, b = run(jax.random.key(0)), run(jax.random.key(1))
    assert not np.allclose(np.asarray(a), np.asarray(b))  # the key changes the rounding
    np.testing.assert_array_equal(np.asarray(run(jax.random.key(0))), np.asarray(a))
    assert np.all(np.isfinite(np.asarray(a))) and nearest.shape == a.shape
    trained = train_graph(graph, params, x, y, quant=q, qstate=qstate,
                          config=TrainConfig(steps=2, batch_size=16)).params
    assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree.leaves(trained))
