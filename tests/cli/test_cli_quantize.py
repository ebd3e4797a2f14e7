"""`npujax quantize` end to end on a tiny ONNX model whose answers are known by construction.

The model: ``x[:, 0]`` is a nuisance feature in [-1000, 1000] that no weight reads; the label is
the argmax of ``x[:, 1:4]`` (values in [-1, 1]). ``fc1`` copies those three features and their
negations (x10) through a ReLU, ``fc2`` subtracts them back (and adds the same amount of two
more channels to every class): float accuracy is 100 %. Quantizing
``fc1``'s *input* per tensor puts the three small features on a grid of step 2000 / 15 (4 bits)
or 2000 / 255 (8 bits), both far coarser than the features, so only float keeps the accuracy;
``fc1``'s weights and all of ``fc2`` quantize harmlessly.
"""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npujax.quantize.methods import PTQ_METHODS, PTQMethod, PTQStep
from tests.helpers import run_cli

CLASSES = 3


def _tiny_onnx(path):
    w1 = np.zeros((4, 8), np.float32)  # [in, out] (Gemm without transB)
    for k in range(3):
        w1[1 + k, k], w1[1 + k, 3 + k] = 10.0, -10.0
    w1[1:4, 6] = w1[1:4, 7] = (0.7, 0.3, 0.45)  # two more channels, not on the 4-bit grid
    w2 = np.zeros((8, CLASSES), np.float32)
    for k in range(3):
        w2[k, k], w2[3 + k, k] = 0.1, -0.1
    w2[6:] = 0.01  # the same for every class: moves the outputs, never the argmax
    b1 = np.zeros(8, np.float32)
    b1[6:] = 0.05  # biases that reach every class equally (int32 in the file)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
             numpy_helper.from_array(w2, "w2"),
             numpy_helper.from_array(np.full(CLASSES, 0.3, np.float32), "b2")]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2")]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                        [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, CLASSES])],
                          inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def _data(n=200, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, 4)).astype(np.float32)
    x[:, 0] = rng.choice([-1000.0, 1000.0], n) * rng.uniform(0.5, 1, n)
    return x, x[:, 1:4].argmax(1).astype(np.int32)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    _tiny_onnx(d / "m.onnx")
    x, y = _data()
    np.savez(d / "d.npz", x=x, y=y)
    return d


def _quantize(tiny, out, *extra):
    return run_cli("quantize", tiny / "m.onnx", "--data", tiny / "d.npz", "--out", out,
                   "--no-progress", "--calib-examples", "64", *extra)


def test_accuracy_control_returns_the_known_layer(tiny, tmp_path):
    """W4A4 loses the features at fc1's input (drop ~67 points): a 1-point bound must widen
    fc1 to 8 bits (not enough, by construction: 2.5 points left), then to float, then fc2 (whose
    4-bit input costs those 2.5 points) to 8 bits, and stop there, naming each layer."""
    r = _quantize(tiny, tmp_path / "q", "--weight-bits", "4", "--act-bits", "4",
                  "--max-drop", "1", "--no-ort-check", "--no-bias-correction", "--npu", "none")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "q" / "quantize.json").read_text())
    assert s["calibration"]["bias_correction"] is None
    # the final model against float, labels or not (the W4A4 start was far from it)
    assert s["vs_float"]["top1_agreement"] >= 90 and not s["vs_float"]["far"]
    c = s["accuracy_control"]
    assert [(s["layer"], s["before"], s["after"]) for s in c["steps"]] == [
        ("fc1", [4, 4], [8, 8]), ("fc1", [8, 8], None), ("fc2", [4, 4], [8, 8])]
    assert c["initial_accuracy"] < 80 and c["met"] and c["steps"][-1]["drop"] <= 1.0
    assert c["steps"][-2]["drop"] > 1.0  # fc2's step was needed
    first = c["steps"][0]  # why fc1: its inputs, not its weights
    assert first["act_sqnr_db"] < 10 < first["weight_sqnr_db"]
    assert "fc1->W8A8, fc1->float, fc2->W8A8" in r.stdout
    assert "on 40 held-out examples" in r.stdout and "too few" not in r.stdout


def test_too_few_held_out_examples_are_said_to_be_too_few(tiny, tmp_path):
    """A comparison with float on a handful of examples is printed with that warning (a new
    user's 2-example 'top-1 agreement 50.0 %' read as a verdict)."""
    x, y = _data(12)
    r = run_cli("quantize", tiny / "m.onnx", "--data", _bad(tmp_path, "few.npz", x=x, y=y),
                "--out", tmp_path / "q", "--no-progress", "--calib-examples", "8",
                "--no-ort-check", "--npu", "none", "--no-bias-correction")
    assert r.returncode == 0, r.stderr
    assert "on 2 held-out examples" in r.stdout and "too few to judge" in r.stdout


def test_a_users_file_in_out_is_refused_before_the_work(tiny, tmp_path):
    """A file of the user's where quantize writes one is refused at the start, not after the
    calibration (a new user's trial waited 7 s for the refusal); it is kept."""
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "layers.csv").write_text("mine\n")
    r = run_cli("quantize", tiny / "m.onnx", "--data", tmp_path / "missing.npz",
                "--out", tmp_path / "q", "--no-progress")
    assert r.returncode == 10 and "holds 'layers.csv', which npujax did not write" in r.stderr
    assert (tmp_path / "q" / "layers.csv").read_text() == "mine\n"


def _bad(tmp_path, name, **arrays):
    np.savez(tmp_path / name, **arrays)
    return tmp_path / name


@pytest.mark.parametrize("case,code,message", [
    ("shape", 7, "has examples of shape (5,), the model takes (4,)"),
    ("dtype", 2, "must be real numbers"),
    ("nan", 2, "NaN or inf"),
    ("empty", 2, "hold no examples"),
    ("labels", 7, "do not match the model's outputs"),
    ("label count", 7, "'y' must be int labels of shape (20,)"),
    ("float labels", 7, "'y' must be int labels of shape (20,)"),
])
def test_bad_data_gives_one_line_errors(tiny, tmp_path, case, code, message):
    x, y = _data(20)
    arrays = {
        "shape": {"x": np.zeros((20, 5), np.float32)},
        "dtype": {"x": x.astype(np.complex64)},
        "nan": {"x": np.where(np.arange(4) == 2, np.nan, x)},
        "empty": {"x": np.zeros((0, 4), np.float32)},
        "labels": {"x": x, "y": y + CLASSES},  # labels 3..5 for 3 classes
        "label count": {"x": x, "y": y[:-1]},  # 19 labels for 20 examples
        "float labels": {"x": x, "y": y.astype(np.float32)},  # scores, not class indices
    }[case]
    r = run_cli("quantize", tiny / "m.onnx", "--data", _bad(tmp_path, "d.npz", **arrays),
                "--out", tmp_path / "q", "--no-progress")
    assert r.returncode == code, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("npujax: error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "q").exists()  # created up front, removed again as the run failed


def test_precision_options_are_exclusive_and_rules_checked(tiny, tmp_path):
    r = _quantize(tiny, tmp_path / "q", "--weight-bits", "4", "--rule", ".*:w4a8")
    assert r.returncode == 2 and "one way" in r.stderr
    r = _quantize(tiny, tmp_path / "q", "--rule", "fc1=4")
    assert r.returncode == 2 and "REGEX:w4a8" in r.stderr
    r = _quantize(tiny, tmp_path / "q", "--rule", "nothing:w8a8")
    assert r.returncode == 2 and "match no layer" in r.stderr
    r = _quantize(tiny, tmp_path / "q", "--policy", tmp_path / "missing.json")
    assert r.returncode == 2 and "does not exist" in r.stderr
    # contradictory bias-correction flags (a new user's --no-bias-correction --bias-correction
    # weights ran without a word, the mode ignored)
    r = _quantize(tiny, tmp_path / "q", "--no-bias-correction", "--bias-correction", "weights")
    assert r.returncode == 2 and "give one of them" in r.stderr and not (tmp_path / "q").exists()


#: (stage, method name, whether it got calibrated states), appended as the methods run
CALLS: list[tuple[str, str, bool]] = []


class _Pre(PTQMethod):
    """test: scale fc1's output channels by 4 and fc2's input rows by 1/4 (ReLU is positively
    homogeneous, so the float function is unchanged)."""

    name = "test-pre"
    stage = "pre_calibration"

    def apply(self, graph, params, quant, batches, qstate):
        CALLS.append((self.stage, self.name, qstate is not None))
        p = {k: dict(v) for k, v in params.items()}
        p["fc1"]["kernel"] = np.asarray(p["fc1"]["kernel"]) * 4
        p["fc1"]["bias"] = np.asarray(p["fc1"]["bias"]) * 4
        p["fc2"]["kernel"] = np.asarray(p["fc2"]["kernel"]) / 4
        return PTQStep(graph, p, quant, None, ("fc1->fc2: scaled by 4",))


class _Post(PTQMethod):
    """test: records that it ran after calibration."""

    name = "test-post"
    stage = "post_calibration"

    def apply(self, graph, params, quant, batches, qstate):
        CALLS.append((self.stage, self.name, qstate is not None and "fc2" in qstate))
        return PTQStep(graph, params, quant, qstate, ("checked",))


def test_quantize_writes_a_checked_qdq_file_and_runs_ptq_methods_by_stage(tiny, tmp_path,
                                                                           monkeypatch):
    """One run: two PTQ methods registered by this test (given post first: the stages still
    run pre -> calibration -> post), fc1 weight-only, fc2 W8A8; the file is checked here
    independently of the command."""
    monkeypatch.setitem(PTQ_METHODS, "test-pre", _Pre)
    monkeypatch.setitem(PTQ_METHODS, "test-post", _Post)
    CALLS.clear()
    r = _quantize(tiny, tmp_path / "q", "--test-post", "--test-pre", "--rule", "fc1:w8",
                  "--rule", "fc2:w8a8")
    assert r.returncode == 0, r.stderr
    assert CALLS == [("pre_calibration", "test-pre", False),
                     ("post_calibration", "test-post", True)]
    s = json.loads((tmp_path / "q" / "quantize.json").read_text())
    assert s["methods"] == ["test-pre: fc1->fc2: scaled by 4", "test-post: checked"]
    # the run says how it was calibrated: the default observer and sequential bias correction
    # and what the bias-correction guard measured and kept (in report.md and on the terminal)
    guard = s["calibration"].pop("bias_correction_guard")
    assert s["calibration"] == {"observer": "minmax", "bias_correction": "model"}
    db = guard["calibration_output_sqnr_db"]
    assert guard["kept"] == ("corrected" if db["corrected"] >= db["uncorrected"]
                             else "uncorrected")
    line = "output SQNR against float on the calibration data"
    assert line in (tmp_path / "q" / "report.md").read_text() and line in r.stdout
    assert s["float_accuracy"] == 100.0 and s["accuracy"] >= 99.0  # the float function kept
    assert set(s["onnxruntime"]) == {"ORT_DISABLE_ALL", "ORT_ENABLE_BASIC",
                                     "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"}
    assert max(v["max_abs_diff"] for v in s["onnxruntime"].values()) < 1e-4
    assert s["latency_s"] > 0 and s["npu"] == "edge_16x16"
    rows = {r["name"]: r for r in s["layers"]}
    assert rows["fc1"]["act_bits"] is None and rows["fc1"]["act_sqnr_db"] is None  # float input
    assert rows["fc2"]["weight_bits"] == rows["fc2"]["act_bits"] == 8
    assert rows["fc2"]["sqnr_db"] > 30 and rows["fc2"]["act_sqnr_db"] > 30  # 8 bits: small noise
    model = onnx.load(tmp_path / "q" / "model.qdq.onnx")
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert len(model.graph.value_info) > 0
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("DequantizeLinear") >= 3 and ops.count("QuantizeLinear") == 1  # fc2's input
    # the rewritten weights are the ones exported: fc1's largest weight scale is 4 x 10 / 127
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    scales = [inits[n.input[1]] for n in model.graph.node if n.op_type == "DequantizeLinear"
              and n.input[0] in inits and inits[n.input[0]].dtype == np.int8
              and inits[n.input[1]].size == 8]
    np.testing.assert_allclose(scales[0].max(), 4 * 10.0 / 127, rtol=1e-6)
    # the file in onnxruntime at another batch size, on fresh data
    import onnxruntime as ort

    x, y = _data(50, seed=1)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]
                               ).run(None, {"x": x})[0]
    assert got.shape == (50, CLASSES) and np.mean(got.argmax(1) == y) >= 0.98
    csv_head = (tmp_path / "q" / "layers.csv").read_text().splitlines()[0]
    assert csv_head.startswith("name,op,weight_bits,act_bits,sqnr_db,weight_sqnr_db,act_sqnr_db")
    report = (tmp_path / "q" / "report.md").read_text()
    assert "onnxruntime, all 4 optimization levels" in report
    assert report.startswith("# m.onnx, rules fc1:w8 fc2:w8a8, minmax calibration, test-post, "
                             "test-pre, bias correction model\n")
    assert "examples, minmax observer, bias correction model" in report
