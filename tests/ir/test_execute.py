"""Fake-quant execution of a traced model: error shrinks with bits, jit and grad, clear errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax.errors import ConfigError, ShapeError
from npujax.ir.execute import execute
from npujax.ir.passes import optimize
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
from tests.helpers import assert_close, traced_digits_cnn

pytestmark = pytest.mark.flax_model


@pytest.fixture(scope="module")
def traced():
    return traced_digits_cnn()


def test_quantized_error_shrinks_with_bits(traced):
    _, (graph, params) = traced
    g, p = optimize(graph, params)
    x = jnp.asarray(np.random.default_rng(2).uniform(size=(32, 8, 8, 1)), jnp.float32)
    ref = np.asarray(execute(g, p, x))
    errs = []
    for bits in (4, 6, 8):
        q = quant_spec(g, bits, 8)
        qs = calibrate(g, p, [x], q)
        errs.append(np.abs(np.asarray(execute(g, p, x, quant=q, qstate=qs)) - ref).mean())
    assert errs[0] > errs[1] > errs[2] > 0
    assert errs[2] < 0.05 * np.abs(ref).mean()


def test_execute_is_jittable_and_differentiable(traced):
    _, (graph, params) = traced
    g, p = optimize(graph, params)
    q = quant_spec(g, 8, 8)
    x = jnp.ones((4, 8, 8, 1), jnp.float32)
    qs = calibrate(g, p, [x], q)
    grads = jax.jit(jax.grad(lambda pp: jnp.sum(execute(g, pp, x, quant=q, qstate=qs))))(p)
    assert set(grads) == set(p)
    assert all(np.all(np.isfinite(np.asarray(v))) for d in grads.values() for v in d.values())


def test_execute_errors(traced):
    _, (graph, params) = traced
    with pytest.raises(ShapeError, match="batch, 8, 8, 1"):
        execute(graph, params, jnp.ones((2, 9, 8, 1), jnp.float32))
    g, p = optimize(graph, params)
    with pytest.raises(ConfigError, match="calibration"):
        execute(g, p, jnp.ones((1, 8, 8, 1), jnp.float32), quant=quant_spec(g, 8, 8))
    with pytest.raises(ConfigError, match="unknown"):
        quant_spec(g, {"conv1": 8, "nope": 4})


def test_batch_one_graph_with_a_folded_class_token_runs_any_batch_without_vmap():
    """A ViT traced at batch 1 concatenates its class token as a folded ``[1, 1, d]`` constant;
    at batch 3 the constant is broadcast (one batched program, no per-example ``vmap``), with
    the numbers of three batch-1 runs."""
    from onnx import TensorProto, helper, numpy_helper

    from npujax.frontends.onnx import from_onnx
    from npujax.ir.execute import _batch_folded

    cls = numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(1, 1, 4), "cls")
    g = helper.make_graph(
        [helper.make_node("Concat", ["cls", "x"], ["c"], axis=1),
         helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4])], [cls])
    graph, params = from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert "cls" in graph.constants and not _batch_folded(graph)
    x = np.random.default_rng(0).normal(size=(3, 2, 4)).astype(np.float32)
    y = execute(graph, params, x)
    assert y.shape == (3, 3, 4)
    np.testing.assert_array_equal(y, np.concatenate([execute(graph, params, x[i:i + 1])
                                                     for i in range(3)]))


def test_batchnorm_inv_std_at_once_equals_per_node(ppocr_cls):
    """execute computes every BatchNormalization's rsqrt(var + eps) in one operation (a kernel
    per node cost ~20 % of the classifier's forward pass): the values are the per-node ones."""
    import sys

    from jax import lax

    _, graph, params = ppocr_cls
    got = sys.modules["npujax.ir.execute"]._batchnorm_inv_std(graph, params)
    bns = [n for n in graph.nodes if n.op == "BatchNormalization"]
    assert set(got) == {n.name for n in bns} and len(bns) == 35
    for n in bns:
        want = lax.rsqrt(params[n.name]["var"] + n.attrs["epsilon"])
        np.testing.assert_array_equal(np.asarray(got[n.name]), np.asarray(want))


def test_inference_with_weights_as_constants_matches_execute_with_them_as_arguments(traced):
    """inference() builds the weights (and the quantizer state) into the program; its outputs
    equal those of execute() jitted with them as arguments, float and W8A8, and a graph
    without real weights is refused before anything compiles."""
    from npujax.errors import GraphError
    from npujax.ir.absent import AbsentArray
    from npujax.ir.execute import inference

    _, (graph, params) = traced
    g, p = optimize(graph, params)
    x = np.random.default_rng(3).uniform(size=(2, 8, 8, 1)).astype(np.float32)
    q = quant_spec(g, 8, 8)
    qs = calibrate(g, p, [x], q)
    want = jax.jit(lambda pp, s, v: (execute(g, pp, v), execute(g, pp, v, quant=q, qstate=s)))
    float_ref, quant_ref = (np.asarray(a) for a in want(p, qs, x))
    got_float = np.asarray(inference(g, p)(x))
    got_quant = np.asarray(inference(g, p, quant=q, qstate=qs)(x))
    np.testing.assert_allclose(got_float, float_ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got_quant, quant_ref, rtol=1e-6, atol=1e-6)
    # over the byte limit the weights are arguments: the same program as execute's
    np.testing.assert_array_equal(np.asarray(inference(g, p, max_constant_bytes=0)(x)), float_ref)
    name, roles = next(iter(p.items()))
    role = next(iter(roles))
    hollow = {**p, name: {**roles, role: AbsentArray(np.shape(roles[role]), "float32")}}
    with pytest.raises(GraphError, match="shapes only"):
        inference(g, hollow)


def test_inference_keeps_its_traced_program_in_jax_cache_folder(traced, tmp_path, monkeypatch,
                                                                  caplog):
    """Where JAX's persistent cache is a private folder, inference() keeps its traced program
    there, keyed by a digest of the graph and the weights: a later process (here: this one with
    its loaded programs forgotten) runs it without tracing, bit for bit as the first; another
    weight is another program; a folder other users can write is not used."""
    import logging

    from npujax import _program_cache
    from npujax.ir.execute import _program_digest, inference

    _, (graph, params) = traced
    g, p = optimize(graph, params)
    x = np.random.default_rng(4).uniform(size=(2, 8, 8, 1)).astype(np.float32)
    saved = jax.config.jax_compilation_cache_dir
    monkeypatch.setattr(_program_cache, "_loaded", {})
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
        first = np.asarray(inference(g, p)(x))
        kept = tmp_path / "jax" / _program_cache.SUBFOLDER
        assert [f.name[:10] for f in kept.iterdir()] == ["inference-"]
        _program_cache._loaded.clear()
        with monkeypatch.context() as m:
            m.setattr(_program_cache, "_export", lambda *a: pytest.fail("traced again"))
            np.testing.assert_array_equal(np.asarray(inference(g, p)(x)), first)
        name, roles = next((k, v) for k, v in p.items() if "kernel" in v)
        k = np.array(roles["kernel"])
        k.flat[0] = np.nextafter(k.flat[0], np.inf)
        other = {**p, name: {**roles, "kernel": k}}
        assert _program_digest(g, other) != _program_digest(g, p)
        inference(g, other)(x)
        assert len(list(kept.iterdir())) == 2
        assert _program_digest(g, p, lambda v: v) is None  # a value known only by identity
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o777)
        shared.chmod(0o777)
        jax.config.update("jax_compilation_cache_dir", str(shared / "jax"))
        with caplog.at_level(logging.WARNING):
            np.testing.assert_array_equal(np.asarray(inference(g, p)(x)), first)
        assert not (shared / "jax" / _program_cache.SUBFOLDER).exists()
        assert "other users can write its folder" in caplog.text
    finally:
        jax.config.update("jax_compilation_cache_dir", saved)


@pytest.mark.parametrize("folded", [False, True])  # True: the graph runs per example
def test_execute_nodes_in_pieces_equals_execute(folded):
    import functools

    from npujax.errors import GraphError
    from npujax.ir.execute import as_inputs, execute_nodes
    from tests.quantize.ptq_graphs import se_residual_net

    rng = np.random.default_rng(0)
    graph, params = se_residual_net(rng, folded=folded)
    x = rng.uniform(size=(5, 6, 6, 3)).astype(np.float32)
    q = quant_spec(graph, 4, 4)
    qs = calibrate(graph, params, [x], q)
    want = jax.jit(lambda p: execute(graph, p, x, quant=q, qstate=qs))(params)
    env = dict(zip(graph.inputs, as_inputs(graph, x)))
    # cut after the SE block's conv (t1 and g2 cross the cut) and after the Add
    pieces = [range(0, 3), range(3, 8), range(8, len(graph.nodes))]
    for piece, keep in zip(pieces, (("t1", "g2"), ("t1", "t3"), ("y",))):
        run = jax.jit(functools.partial(execute_nodes, graph, batch=5, keep=keep, quant=q,
                                        qstate=qs, nodes=piece))
        env = {**env, **run(params, env=env)[0]}
    # a per-example run holds activations stacked per example: (5, 1, 5)
    assert_close(np.asarray(env["y"]).reshape(want.shape), want)
    with pytest.raises(GraphError, match="pass them in env"):
        execute_nodes(graph, params, {}, range(3, 8), batch=5, keep=("t3",))


def test_inference_sums_a_pool_read_by_linear_layers_and_scales_their_products():
    """A squeeze-and-excitation block and a classifier head: inference() runs each global
    average pool read only by Convs and Gemms (through a Flatten) as a sum and scales those
    products instead; the outputs equal execute()'s to float rounding, at batch 1 and 2. A pool
    with a quantized reader keeps its mean."""
    from onnx import TensorProto, helper, numpy_helper

    from npujax.frontends.onnx import from_onnx
    from npujax.ir.execute import _mean_scaled_by_consumer, inference

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n) for n, s in [
        ("w1", (4, 16, 1, 1)), ("b1", (4,)), ("w2", (16, 4, 1, 1)), ("b2", (16,)),
        ("wf", (3, 16)), ("bf", (3,))]]
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["s"], name="gap1"),
        helper.make_node("Conv", ["s", "w1", "b1"], ["r"], name="fc1"),
        helper.make_node("Relu", ["r"], ["h"]),
        helper.make_node("Conv", ["h", "w2", "b2"], ["g"], name="fc2"),
        helper.make_node("HardSigmoid", ["g"], ["gs"]),
        helper.make_node("Mul", ["x", "gs"], ["u"]),
        helper.make_node("GlobalAveragePool", ["u"], ["v"], name="gap2"),
        helper.make_node("Flatten", ["v"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["z"], name="head", transB=1),
        helper.make_node("Softmax", ["z"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "se", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 16, 6, 6])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 3])], inits)
    graph, params = from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    head = next(n.name for n in graph.nodes if n.op == "Gemm")
    assert _mean_scaled_by_consumer(graph, {}) == {"gap1": None, "fc1": "x", "gap2": None,
                                                  head: "u"}
    assert set(_mean_scaled_by_consumer(graph, {"fc1": object()})) == {"gap2", head}
    run = jax.jit(lambda p, v: execute(graph, p, v))
    for batch in (1, 2):
        x = rng.uniform(-1, 1, (batch, 16, 6, 6)).astype(np.float32)
        assert_close(inference(graph, params)(x), run(params, x))
