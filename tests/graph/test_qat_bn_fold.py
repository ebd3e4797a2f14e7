"""QAT through BN folding (running statistics frozen): a zero BN scale gives no NaN, and the
folded-on-the-fly training graph computes what the folded model computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.demo.model import DigitsCNN
from npujax.graph import calibrate, execute, fold_batchnorm, quant_spec, trace_flax
from npujax.train import train_graph

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
    trained = train_graph(graph, params, x, y, steps=3, learning_rate=1e-2, batch_size=32,
                          quant=q, qstate=qstate, fold_bn=True)
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
