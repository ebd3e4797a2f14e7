"""The contract every quantizer meets: calibration gives its typed state; fake-quant of the input
and the kernel is jit-able, finite and differentiable; the deployed grid is the one fake-quant
used; the state survives the model file; QAT's learned fields are its state's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax.ir.graph import Graph, Node, TensorType
from npujax.numerics import IntFormat, dequantize, quantize
from npujax.quantize import QUANTIZERS, LayerQuant, calibrate, execute, load_graph, save_graph
from npujax.quantize.quantizers import merge_learned, split_learned

W4, A8 = IntFormat(4, narrow_range=True), IntFormat(8, signed=False)
LAYER = {
    "ste": LayerQuant(weight=W4, act=A8),
    "lsq": LayerQuant(weight=W4, act=A8, quantizer="lsq"),
    "lsq+": LayerQuant(weight=W4, act=A8, quantizer="lsq+"),
    "fixed": LayerQuant(weight=W4, act=A8, quantizer="fixed"),
    "mixture": LayerQuant(weight=(IntFormat(2, narrow_range=True), W4), act=A8,
                          act_candidates=(IntFormat(4, signed=False), A8)),
}


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(0)
    node = Node("fc", "Gemm", ("x",), ("y",), {}, ("kernel", "bias"))
    graph = Graph((node,), ("x",), ("y",), {"x": TensorType((1, 12), "float32"),
                                              "y": TensorType((1, 5), "float32")})
    params = {"fc": {"kernel": jnp.asarray(rng.normal(size=(12, 5)), jnp.float32),
                     "bias": jnp.asarray(rng.normal(size=5), jnp.float32)}}
    x = jnp.asarray(rng.uniform(-1, 2, (16, 12)), jnp.float32)
    return graph, params, x


def test_every_registered_quantizer_is_covered():
    assert set(QUANTIZERS) == set(LAYER)
    for name, lq in LAYER.items():
        assert lq.quantizer.name == name


@pytest.mark.parametrize("name", sorted(LAYER))
def test_quantizer_contract(model, name, tmp_path):
    graph, params, x = model
    quant = {"fc": LAYER[name]}
    q = quant["fc"].quantizer
    qstate = calibrate(graph, params, [x], quant)
    state = qstate["fc"]
    assert isinstance(state, q.state_type)
    run = jax.jit(lambda p, s, v: execute(graph, p, v, quant=quant, qstate=s))
    y = run(params, qstate, x)
    assert y.shape == (16, 5) and np.all(np.isfinite(np.asarray(y)))
    # differentiable w.r.t. the weights and every learned field of the state
    learned, full = split_learned(quant, qstate)
    assert set(learned.get("fc", {})) == {f for f in q.learned_fields
                                          if getattr(state, f) is not None}
    g = jax.grad(lambda p, s: jnp.sum(run(p, merge_learned(s, full), x) ** 2),
                 argnums=(0, 1))(params, learned)
    assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree.leaves(g))
    assert np.any(np.asarray(g[0]["fc"]["kernel"]) != 0)
    if learned:
        assert any(np.any(np.asarray(v) != 0) for v in jax.tree.leaves(g[1]))
    # the deployed weight grid is the one fake-quant used (single-format quantizers)
    node, lq = graph.nodes[0], quant["fc"]
    w = params["fc"]["kernel"]
    if len(lq.weight_candidates) == 1:
        s, z, axis, _ = q.weight_grid(node, lq, w, state)
        deployed = dequantize(quantize(w, s, z, W4, axis), s, z, axis)
        np.testing.assert_allclose(np.asarray(q.quantize_kernel(node, lq, w, state)),
                                   np.asarray(deployed), rtol=1e-6, atol=1e-7)
        scale, zp = q.act_grid(lq, state)
        assert float(scale) > 0 and zp.dtype == jnp.int32
    # the typed state survives the model file
    save_graph(tmp_path / "m.npz", graph, params, qstate)
    back = load_graph(tmp_path / "m.npz")[2]["fc"]
    assert type(back) is type(state)
    for a, b in zip(back, state):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
