"""``npujax quantize``'s onnxruntime check beyond its end-to-end bound (issue 29): on a deep
model one rounding tie (float32 ``x / s`` exactly 47.5 in onnxruntime, 47.499985 in XLA)
compounds through the later layers, and the command refused its own, correct file (PP-OCR rec,
docs/results/quantization.md). Beyond the bound it now checks every Q/DQ pair teacher-forced
(:func:`npujax.backends.ort_check.qdq_pair_mismatches`): a correct file is written with the
drift recorded, a file with a wrong quantizer, or whose drift does not start as a rounding tie,
is refused naming the pair. The drift is forced here by a comparison that puts every example
beyond the bound, and the tie by moving one value of npujax's reference by one grid step (the
tiny model has no tie to flip)."""

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import npujax.backends.onnx_export as onnx_export
import npujax.backends.ort_check as ort_check
from npujax.errors import QuantizationError
from npujax.quantize.spec import quant_spec
from npujax.workflows import quantize as wq
from tests.quantize.ptq_graphs import separable_net

pytest.importorskip("onnxruntime")


@pytest.fixture()
def drifted(monkeypatch):
    """quantize_model on a 4-layer W4A4 net (Clips before its QuantizeLinears) whose every
    example is beyond the end-to-end bound, by 0.5."""
    monkeypatch.setattr(wq, "ort_outliers", lambda y, want, bound: (len(want), 1, 0.5))
    rng = np.random.default_rng(0)
    graph, params = separable_net(rng)
    x = rng.normal(size=(8, 8, 8, 3)).astype(np.float32)
    cfg = wq.QuantizeConfig(npu=None, bias_correction=False, ort_examples=8,
                            sensitivity_examples=8, batch_size=8, calib_examples=8)
    return lambda: wq.quantize_model(graph, params, quant_spec(graph, 4, 4), x, x, None, cfg)


def _corrupt(monkeypatch, change):
    """Make quantize_model export ``change(model)`` (checked by onnx)."""
    export = onnx_export.to_onnx

    def changed(*a, **k):
        m = export(*a, **k)
        change(m)
        onnx.checker.check_model(m)
        return m

    monkeypatch.setattr(onnx_export, "to_onnx", changed)


def _tie_at_pw(monkeypatch):
    """npujax's reference at pw's input: one value one grid step up (a flipped tie)."""
    check = ort_check.qdq_pair_mismatches

    def flipped(model, *a, reference, **k):
        m = onnx.load_from_string(model)
        (q,) = [n for n in m.graph.node if n.name == "pw/act_quant"]
        s = next(numpy_helper.to_array(i) for i in m.graph.initializer if i.name == q.input[1])
        ref = dict(reference)
        ref["pw/act_quant"] = ref["pw/act_quant"].copy()
        ref["pw/act_quant"].flat[5] += s
        return check(model, *a, reference=ref, **k)

    monkeypatch.setattr(ort_check, "qdq_pair_mismatches", flipped)


def test_drift_from_a_tie_with_every_pair_equal_teacher_forced_is_written_and_recorded(
        drifted, tmp_path, monkeypatch):
    _tie_at_pw(monkeypatch)
    r = drifted()
    assert r.ort_drift["starts_at"] == {"pair": "pw/act_quant", "values_differing": 1,
                                        "values": 2 * 8 * 8 * 8}
    tf = r.ort_drift["teacher_forced"]
    assert r.ort_drift["levels"] == list(r.ort)  # all four levels forced beyond the bound
    assert r.ort_drift["largest_difference"] == 0.5
    assert r.ort_drift["fraction_beyond_bound"] == 1.0
    # c1, dw, pw, fc: one input pair each, on the wq.TEACHER_FORCED_EXAMPLES examples
    assert (tf["pairs"], tf["mismatches"], tf["examples"]) == (4, 0, 2)
    assert tf["values"] == 2 * (8 * 8 * 3 + 8 * 8 * 8 + 8 * 8 * 8 + 16)
    wq.write_quantize_outputs(tmp_path, r, "t")
    assert json.loads((tmp_path / "quantize.json").read_text())["onnxruntime_drift"] == \
        r.ort_drift
    assert "rounding ties compounding" in (tmp_path / "report.md").read_text()


def test_a_file_with_a_wrong_quantize_scale_is_refused_naming_it(drifted, monkeypatch):
    def wrong_scale(m):  # dw's QuantizeLinear on a grid 1.5x coarser than its DQ's
        (q,) = [n for n in m.graph.node if n.name == "dw/act_quant"]
        s = numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == q.input[1]))
        m.graph.initializer.append(numpy_helper.from_array(s * np.float32(1.5), "bad_scale"))
        q.input[1] = "bad_scale"

    _corrupt(monkeypatch, wrong_scale)
    _tie_at_pw(monkeypatch)
    with pytest.raises(QuantizationError, match="Q/DQ pair 'dw/act_quant' differs") as e:
        drifted()
    assert "\n" not in str(e.value)


def test_drift_not_from_a_tie_is_refused(drifted, monkeypatch):
    """A wrong weight upstream of pw (its pairs still equal fake-quant teacher-forced) moves
    most of pw's inputs; a drift no pair shows is no rounding tie's either."""
    with pytest.raises(QuantizationError, match="no Q/DQ pair's output differs"):
        drifted()

    def wrong_weight(m):  # dw's weight codes reversed along the output channels
        (w,) = [i for i in m.graph.initializer if i.name == "dw.kernel_q"]
        a = numpy_helper.to_array(w)
        w.CopyFrom(numpy_helper.from_array(a[::-1].copy(), w.name))

    _corrupt(monkeypatch, wrong_weight)
    with pytest.raises(QuantizationError, match="starts at Q/DQ pair 'pw/act_quant'.*not as a "
                                                "rounding tie"):
        drifted()


def test_output_vs_float_flags_a_model_far_from_float():
    """The label-free comparison quantize reports: output SQNR and top-1 agreement (per step for
    sequence scores), "far" below 10 dB or 90 % (a new user's entropy-calibrated PP-OCR cls
    agreed with float on 37.5 % and the command said nothing)."""
    from npujax.workflows.quantize import output_vs_float

    rng = np.random.default_rng(0)
    f = rng.normal(size=(200, 10))
    near = output_vs_float(f + 0.01 * rng.normal(size=f.shape), f)
    assert near["output_sqnr_db"] > 35 and near["top1_agreement"] > 99 and not near["far"]
    far = output_vs_float(rng.normal(size=f.shape), f)
    assert far["top1_agreement"] < 50 and far["far"]
    same = output_vs_float(f, f)
    assert same["output_sqnr_db"] == float("inf") and same["top1_agreement"] == 100.0
    seq = output_vs_float(np.stack([f, f], 1), np.stack([f, -f], 1))  # [n, steps, classes]
    assert seq["far"] and 40 < seq["top1_agreement"] < 60
    assert output_vs_float(f[:, :1], f[:, :1])["top1_agreement"] is None  # one score: none
