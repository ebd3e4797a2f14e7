"""Precision search on imported (unlabelled) ONNX models: distillation losses, batch-1 graphs run
per example, and the CLI's ``search``/``qat --policy`` on an .onnx file."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax
import pytest
from onnx import TensorProto, helper, numpy_helper

from npujax.data.images import photo_crops
from npujax.errors import CalibrationError, ConfigError, ShapeError
from npujax.frontends.onnx import from_onnx
from npujax.hw import load_npu_spec
from npujax.ir.execute import execute, tap
from npujax.ir.passes import optimize
from npujax.ops import gemm_nodes
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
from npujax.search import (
    SearchConfig,
    activation_sensitivity,
    load_policy,
    search_precision,
)
from npujax.search.objective import TaskLoss, fisher_targets, search_targets, task_loss
from tests.helpers import run_cli
from tests.onnx_models import ort_run

H = W = 32


def _classifier(batch_head: bool = True) -> onnx.ModelProto:
    """Conv-ReLU-Conv(stride 2)-ReLU-Conv-ReLU, flatten written as ``reshape(x.shape[0], -1)``
    (Shape/Gather/Concat, as PaddlePaddle exports it), Gemm, Softmax; input [N, 3, 32, 32]."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(size=(8, 3, 3, 3)).astype(np.float32) * 0.4
    w2 = rng.normal(size=(16, 8, 3, 3)).astype(np.float32) * 0.2
    w3 = rng.normal(size=(8, 16, 1, 1)).astype(np.float32) * 0.3
    fc = rng.normal(size=(8 * (H // 2) * (W // 2), 4)).astype(np.float32) * 0.05
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2],
                         name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], name="conv3"),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        helper.make_node("Shape", ["r3"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsqueeze"),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0, name="concat"),
        helper.make_node("Reshape", ["r3", "target"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc"], ["logits"], name="fc"),
        helper.make_node("Softmax", ["logits"], ["p"], axis=1, name="softmax"),
    ]
    inits = [numpy_helper.from_array(a, n) for a, n in [
        (w1, "w1"), (w2, "w2"), (w3, "w3"), (fc, "fc"), (np.array(0, np.int64), "zero"),
        (np.array([0], np.int64), "axes"), (np.array([-1], np.int64), "minus_one")]]
    g = helper.make_graph(nodes, "small_cls",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, H, W])],
                          [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 4])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _dense() -> onnx.ModelProto:
    """Conv-ReLU-Conv-Sigmoid: a 1-channel map like a detector's (dense output)."""
    rng = np.random.default_rng(1)
    w1 = rng.normal(size=(8, 3, 3, 3)).astype(np.float32) * 0.4
    w2 = rng.normal(size=(1, 8, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Sigmoid", ["c2"], ["map"], name="sigmoid"),
    ]
    g = helper.make_graph(nodes, "small_det",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, H, W])],
                          [helper.make_tensor_value_info("map", TensorProto.FLOAT, [1, 1, H, W])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def cls():
    model = _classifier()
    graph, params = optimize(*from_onnx(model, {"x": (1, 3, H, W)}))
    x = photo_crops(H, W, 48, seed=3)
    qs = calibrate(graph, params, [x[:16], x[16:32]], quant_spec(graph))
    return model, graph, params, x, qs


def test_batch_one_graph_runs_any_batch_per_example(cls):
    """The importer folds ``x.shape[0]`` into the flatten at batch 1; execute maps larger batches
    over examples, and the result equals onnxruntime's on the whole batch."""
    model, graph, params, x, _ = cls
    assert any(n.op == "Reshape" and n.attrs["shape"][0] == 1 for n in graph.nodes)
    y = np.asarray(jax.jit(lambda p, xb: execute(graph, p, xb))(params, x[:6]))
    (want,) = ort_run(model.SerializeToString(), {"x": x[:6]})
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    # jitted, as a user runs it (eagerly every op compiles its own program: ~25)
    out, taps = jax.jit(lambda p, xb: execute(graph, p, xb, observe=tap(["conv2"])))(params, x[:3])
    assert out.shape == (3, 4) and taps["conv2"][0].shape[0] == 3


def test_task_loss_is_inferred_from_the_output(cls):
    _, graph, *_ = cls
    assert task_loss(graph).kind == "probabilities"
    dense, _ = optimize(*from_onnx(_dense()))
    assert task_loss(dense).kind == "dense"
    with pytest.raises(ConfigError, match="loss kind"):
        task_loss(graph, "hinge")


def test_losses_match_their_references():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(5, 4)), jnp.float32)
    labels = jnp.asarray([0, 3, 1, 1, 2], jnp.int32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    np.testing.assert_allclose(TaskLoss("logits")(logits, labels), ce, rtol=1e-6)
    np.testing.assert_allclose(TaskLoss("probabilities")(jax.nn.softmax(logits), labels), ce,
                               rtol=1e-5)
    # a probability of exactly zero gives a large finite loss, never inf
    p0 = jnp.asarray([[1.0, 0.0]], jnp.float32)
    assert np.isfinite(TaskLoss("probabilities")(p0, jnp.asarray([1], jnp.int32)))
    t = jnp.asarray(rng.normal(size=(2, 1, 3, 3)), jnp.float32)
    np.testing.assert_allclose(TaskLoss("dense")(jnp.full_like(t, jnp.mean(t)), t), 1.0,
                               rtol=1e-5)
    assert float(TaskLoss("dense")(t, t)) == 0.0


def test_targets_pseudo_labels_and_fisher_samples(cls):
    _, graph, params, x, _ = cls
    task = task_loss(graph)
    y = search_targets(graph, params, x[:10], None, task)
    want = np.asarray(jax.jit(lambda p, xb: execute(graph, p, xb))(params, x[:10])).argmax(1)
    np.testing.assert_array_equal(y, want)
    assert y.dtype == np.int32
    with pytest.raises(ShapeError, match="labels must have shape"):
        search_targets(graph, params, x[:10], np.zeros(3, np.int32), task)
    dense, dparams = optimize(*from_onnx(_dense()))
    with pytest.raises(ConfigError, match="dense"):
        search_targets(dense, dparams, x[:4], np.zeros(4, np.int32), task_loss(dense))
    # at the teacher a distillation loss has zero gradient; sampled targets do not
    dtask = task_loss(dense)
    t = search_targets(dense, dparams, x[:8], None, dtask)
    xb = jnp.asarray(x[:8])
    zero = activation_sensitivity(dense, dparams, xb, jnp.asarray(t), ["conv2"], [4],
                                  loss_fn=dtask)
    assert zero["conv2"][4] == 0.0
    sampled = activation_sensitivity(dense, dparams, xb, jnp.asarray(fisher_targets(t, dtask)),
                                     ["conv2"], [2, 4, 8], loss_fn=dtask)["conv2"]
    assert sampled[2] > sampled[4] > sampled[8] > 0


@pytest.mark.parametrize("method", ["ilp", "gradient"])
def test_search_without_labels_distils_from_the_float_model(cls, method):
    _, graph, params, x, qs = cls
    spec = load_npu_spec("bitserial_16x16")
    # optax's Adam (python float ** int32 step count) is not strict-promotion clean
    with jax.numpy_dtype_promotion("standard"):
        rep = search_precision(graph, params, spec, x, None, qs, SearchConfig(
            method=method, budget_ratio=0.85, act_candidates=(4, 8), sensitivity_samples=2,
            sensitivity_batch=16, steps=10))
    assert rep.loss == "probabilities" and rep.distilled
    assert rep.policy.meta["labels"].startswith("float model")
    assert set(rep.policy.weight_bits) == {n.name for n in gemm_nodes(graph)}
    if method == "ilp":
        assert rep.latency_s <= 0.85 * rep.int8_latency_s * (1 + 1e-6)
    else:
        assert len(rep.details["probabilities"]["conv1"]) == 3


def test_search_on_a_dense_output_model():
    graph, params = optimize(*from_onnx(_dense()))
    x = photo_crops(H, W, 24, seed=4)
    qs = calibrate(graph, params, [x], quant_spec(graph))
    rep = search_precision(graph, params, load_npu_spec("bitfusion_16x16"), x, None, qs,
                           SearchConfig(method="greedy", budget_ratio=0.8, act_candidates=(4, 8),
                                        sensitivity_samples=2, sensitivity_batch=8))
    assert rep.loss == "dense"
    assert rep.latency_s <= 0.8 * rep.int8_latency_s * (1 + 1e-6)


def test_cli_search_and_qat_on_an_onnx_model(tmp_path):
    path = tmp_path / "cls.onnx"
    onnx.save(_classifier(), path)
    r = run_cli("search", str(path), "--input-shape", f"x=1,3,{H},{W}",
                "--data", "photos", "--examples", "40", "--npu", "bitserial_16x16",
                "--method", "greedy", "--budget-ratio", "0.85", "--act-candidates", "4,8",
                "--sensitivity-samples", "2", "--sensitivity-batch", "16",
                "--out", str(tmp_path / "pol.json"))
    assert r.returncode == 0, r.stderr
    assert "targets from the float model (distillation)" in r.stdout
    pol = load_policy(tmp_path / "pol.json")
    assert pol.meta["speedup_vs_int8"] >= 1 / 0.85 * (1 - 1e-6)
    q = run_cli("qat", "--policy", str(tmp_path / "pol.json"), "--model", str(path),
                "--input-shape", f"x=1,3,{H},{W}", "--data", "photos", "--examples", "40",
                "--npu", "bitserial_16x16", "--steps", "3", "--no-progress")
    assert q.returncode == 0, q.stderr
    assert "top-1 agreement with the float model" in q.stdout
    # an ONNX model without data, or data of the wrong size: clear errors, exit code 2 / 7
    no_data = run_cli("search", str(path), "--input-shape", f"x=1,3,{H},{W}")
    assert no_data.returncode == 2 and "needs calibration data" in no_data.stderr
    np.save(tmp_path / "bad.npy", np.zeros((4, 3, 8, 8), np.float32))
    bad = run_cli("search", str(path), "--input-shape", f"x=1,3,{H},{W}",
                  "--data", str(tmp_path / "bad.npy"))
    assert bad.returncode == 7 and "model takes (3, 32, 32)" in bad.stderr


def test_an_empty_calibration_batch_is_a_clear_error(cls):
    _, graph, params, x, _ = cls
    with pytest.raises(CalibrationError, match="batch 1 is empty"):
        calibrate(graph, params, [x[:4], x[48:]], quant_spec(graph))


def test_data_files_split_without_overlap(tmp_path):
    from npujax.data.sources import load_inputs

    for n in (2, 3, 10):
        x = np.arange(n * 3 * 8 * 8, dtype=np.float32).reshape(n, 3, 8, 8)
        np.savez(tmp_path / "d.npz", x=x, y=np.arange(n, dtype=np.int32))
        xtr, ytr, xte, yte = load_inputs(str(tmp_path / "d.npz"), (1, 3, 8, 8))
        assert len(xte) >= 1 and len(xtr) + len(xte) == n
        assert not set(ytr.tolist()) & set(yte.tolist())
        np.testing.assert_array_equal(xtr[:, 0, 0, 0], x[ytr][:, 0, 0, 0])
