"""The weight/activation sensitivity split against a numpy reference, the layers `npujax search
--pin sensitive` keeps wide, the accuracy loop's ladder, and `--data FOLDER` preprocessing."""

import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.numerics import IntFormat
from npujax.quantize.accuracy_control import accuracy_control, widen
from npujax.quantize.spec import LayerQuant
from tests.cli.test_cli_quantize import _data, _tiny_onnx


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from npujax.frontends.onnx import from_onnx
    from npujax.ir.passes import optimize

    path = tmp_path_factory.mktemp("tiny") / "m.onnx"
    _tiny_onnx(path)
    graph, params = optimize(*from_onnx(path))
    return graph, params, _data(64)[0]


def _np_model(params, x):
    h = np.maximum(x @ params["fc1"]["kernel"] + params["fc1"]["bias"], 0)
    return h @ params["fc2"]["kernel"] + params["fc2"]["bias"]


def _sqnr(ref, y):
    return 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((y - ref) ** 2.0))


def test_split_equals_the_numpy_reference_and_ranks_the_known_layer(tiny):
    from npujax.quantize.calibrate import calibrate
    from npujax.quantize.sensitivity import sensitivity_split
    from npujax.quantize.spec import quant_spec
    from npujax.search.sensitivity import most_sensitive_layers

    graph, params, x = tiny
    p = {k: {n: np.asarray(v) for n, v in d.items()} for k, d in params.items()}
    q = quant_spec(graph, 4, 4)
    qstate = calibrate(graph, params, [x], q)
    rows = {r.name: r for r in sensitivity_split(graph, params, q, qstate, [x])}
    ref = _np_model(p, x)
    # fc1's input alone on its calibrated unsigned 4-bit grid (ONNX QuantizeLinear semantics)
    s, z = float(qstate["fc1"].act_scale), int(qstate["fc1"].act_zero_point)
    xq = (np.clip(np.round(x / s) + z, 0, 15) - z) * s
    np.testing.assert_allclose(rows["fc1"].act_sqnr_db, _sqnr(ref, _np_model(p, xq)), atol=1e-3)
    # fc2's weights alone: signed narrow range, symmetric per output channel (axis 1 of [in, out])
    w = p["fc2"]["kernel"]
    sw = np.abs(w).max(0) / 7
    pw = {**p, "fc2": {**p["fc2"], "kernel": np.clip(np.round(w / sw), -7, 7) * sw}}
    np.testing.assert_allclose(rows["fc2"].weight_sqnr_db, _sqnr(ref, _np_model(pw, x)),
                               atol=1e-3)
    # weights already on the grid (as AdaRound or GPTQ leave them): measured against their own
    # rounded values they look lossless; against the float model, as the numpy reference
    on_grid = {**params, "fc2": {**params["fc2"], "kernel": pw["fc2"]["kernel"]}}
    blind = {r.name: r for r in sensitivity_split(graph, on_grid, q, qstate, [x])}
    assert blind["fc2"].weight_sqnr_db > rows["fc2"].weight_sqnr_db + 40
    seen = {r.name: r for r in sensitivity_split(graph, on_grid, q, qstate, [x],
                                                 reference_params=params)}
    np.testing.assert_allclose(seen["fc2"].weight_sqnr_db, rows["fc2"].weight_sqnr_db, atol=1e-3)
    np.testing.assert_allclose(seen["fc1"].act_sqnr_db, rows["fc1"].act_sqnr_db, atol=1e-3)
    # by construction fc1's inputs are the worst operand, by far
    worst = most_sensitive_layers(graph, params, x, 4, 4, 1)
    assert [(r.name, r.dominant) for r in worst] == [("fc1", "activations")]
    assert worst[0].act_sqnr_db < 10 < min(rows["fc1"].weight_sqnr_db, rows["fc2"].worst_db)


def test_widen_ladder_and_loop_arguments():
    lq = LayerQuant(weight=IntFormat(4, narrow_range=True), act=IntFormat(4, signed=False))
    w8 = widen(lq)
    assert w8.weight == IntFormat(8, narrow_range=True) and w8.act == IntFormat(8, signed=False)
    assert widen(w8) is None  # 8 -> float
    assert widen(w8, ladder=(8, 16)).act == IntFormat(16, signed=False)
    assert widen(LayerQuant(weight=IntFormat(4, narrow_range=True))).act is None  # weight-only
    with pytest.raises(ConfigError, match="max_drop"):
        accuracy_control({}, None, None, 90.0, -1.0)


def test_image_folder_preprocessing_and_labels(tmp_path):
    from PIL import Image

    from npujax.data.sources import load_inputs

    for label, value in (("0", 0), ("1", 255), ("1", 255), ("0", 0), ("1", 255)):
        (tmp_path / "d" / label).mkdir(parents=True, exist_ok=True)
        n = len(list((tmp_path / "d").rglob("*.png")))
        Image.new("RGB", (20, 12), (value,) * 3).save(tmp_path / "d" / label / f"{n}.png")
    xtr, ytr, xte, yte = load_inputs(str(tmp_path / "d"), (1, 3, 8, 8))  # NCHW model
    x, y = np.concatenate([xtr, xte]), np.concatenate([ytr, yte])
    assert x.shape == (5, 3, 8, 8) and sorted(y.tolist()) == [0, 0, 1, 1, 1]
    np.testing.assert_array_equal(x.reshape(5, -1).max(1), np.where(y == 1, 1.0, -1.0))
    xtr, ytr, *_ = load_inputs(str(tmp_path / "d"), (1, 8, 8, 1))  # grayscale channels-last
    assert xtr.shape[1:] == (8, 8, 1)
    Image.new("RGB", (8, 8)).save(tmp_path / "d" / "loose.png")
    with pytest.raises(ConfigError, match="class sub-folders"):
        load_inputs(str(tmp_path / "d"), (1, 3, 8, 8))
    (tmp_path / "e").mkdir()
    with pytest.raises(ConfigError, match="no image file"):
        load_inputs(str(tmp_path / "e"), (1, 3, 8, 8))


def test_split_of_an_attention_matmul_quantizes_its_second_operand(tmp_path):
    """A GEMM of two activations (attention's ``Q K^T``) has no params: its weight-only row
    quantizes its second operand alone (it raised KeyError on every transformer before)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from npujax.frontends.onnx import from_onnx
    from npujax.ir.passes import optimize
    from npujax.quantize.calibrate import calibrate
    from npujax.quantize.sensitivity import sensitivity_split
    from npujax.quantize.spec import quant_spec

    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Transpose", ["h"], ["t"], perm=[0, 2, 1], name="tr"),
             helper.make_node("MatMul", ["h", "t"], ["y"], name="scores")]
    g = helper.make_graph(nodes, "att", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 3, 3])], [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "att.onnx")
    graph, params = optimize(*from_onnx(tmp_path / "att.onnx"))
    x = rng.normal(size=(8, 3, 4)).astype(np.float32)
    q = quant_spec(graph, 4, 8)
    (mm,) = [n.name for n in graph.nodes if n.op == "MatMul"]
    qstate = calibrate(graph, params, [x], q)
    rows = {r.name: r for r in sensitivity_split(graph, params, q, qstate, [x])}
    # numpy: the second operand h^T alone on its calibrated grid (ONNX QuantizeLinear)
    h = x @ w
    t = h.transpose(0, 2, 1)
    fmt = q[mm].weight_candidates[0]
    s, z = float(qstate[mm].operand_scale), int(qstate[mm].operand_zero_point)
    tq = (np.clip(np.round(t / s) + z, fmt.qmin, fmt.qmax) - z) * s
    np.testing.assert_allclose(rows[mm].weight_sqnr_db, _sqnr(h @ t, h @ tq), atol=1e-2)
    assert rows[mm].weight_sqnr_db < 60  # its 8-bit operand: a real error, not a skipped run
