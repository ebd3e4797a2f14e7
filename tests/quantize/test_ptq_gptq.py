"""GPTQ (Frantar et al. 2023, arXiv:2210.17323): exactly Algorithm 1 of the paper (a direct
numpy transcription, without lazy batches), a lower layer error than round-to-nearest on the
same grid, and the blocked DequantizeLinear export (partial last block) run by onnxruntime."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from npujax.backends.onnx_export import QDQ_EXTENDED_OPSET, to_onnx
from npujax.errors import ConfigError
from npujax.ir.execute import execute
from npujax.ir.graph import Graph, Node, TensorType
from npujax.numerics import IntFormat
from npujax.quantize import load_graph, save_graph
from npujax.quantize.methods import PTQ_METHODS
from npujax.quantize.methods._common import waves
from npujax.quantize.methods.gptq import GPTQ, gptq_quantize, group_scales
from npujax.quantize.quantizers.fixed import FixedGrid
from npujax.quantize.spec import quant_spec
from tests.onnx_models import ort_run
from tests.quantize.ptq_graphs import correlated_inputs, gemm, linear

INT4 = IntFormat(4, narrow_range=True)


def _algorithm_1(w, h, fmt, group, percdamp=0.01):
    """The paper's Algorithm 1 column by column (block size 1), with a group's min-max scale
    taken from its current weights at its first column."""
    w, h = w.copy(), h.copy()
    cols = w.shape[1]
    h += percdamp * np.mean(np.diag(h)) * np.eye(cols)
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # H^-1 = U^T U, U upper
    q = np.zeros_like(w)
    s = np.zeros((w.shape[0], -(-cols // group)), np.float32)
    for j in range(cols):
        if j % group == 0:
            amax = np.abs(w[:, j:j + group]).max(axis=1)
            s[:, j // group] = np.maximum(amax / 7.0, np.finfo(np.float32).eps)
        sj = s[:, j // group].astype(np.float64)
        q[:, j] = np.clip(np.round(w[:, j] / sj), -7, 7)
        e = (w[:, j] - q[:, j] * sj) / u[j, j]
        w[:, j:] -= np.outer(e, u[j, j:])
    return q, s


@pytest.mark.parametrize("group, block", [(6, 4), (8, 128), (20, 7)])
def test_gptq_is_algorithm_1(group, block):
    rng = np.random.default_rng(group)
    w = rng.normal(size=(6, 20))
    x = correlated_inputs(rng, 200, 20).astype(np.float64)
    h = 2 * x.T @ x / len(x)
    codes, scales = gptq_quantize(w, h, INT4, group_size=group, block_size=block)
    ref_codes, ref_scales = _algorithm_1(w, h, INT4, group)
    np.testing.assert_array_equal(codes, ref_codes)
    np.testing.assert_allclose(scales, ref_scales, rtol=1e-6)


def _layer_error(w, codes, scales, x, group):
    wq = codes * np.repeat(scales, group, axis=1)[:, :w.shape[1]]
    return np.linalg.norm(x @ w.T - x @ wq.T)


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_beats_round_to_nearest(act_order):
    rng = np.random.default_rng(3)
    w = rng.normal(size=(16, 40))
    x = correlated_inputs(rng, 256, 40).astype(np.float64)
    h = 2 * x.T @ x / len(x)
    codes, scales = gptq_quantize(w, h, INT4, group_size=16, act_order=act_order)
    rtn_scales = group_scales(w, INT4, 16)
    rtn = np.clip(np.round(w / np.repeat(rtn_scales, 16, axis=1)[:, :40]), -7, 7)
    gptq, nearest = (_layer_error(w, c, s, x, 16) for c, s in ((codes, scales),
                                                                  (rtn, rtn_scales)))
    assert gptq < 0.8 * nearest, (gptq, nearest)


def test_gptq_layer_exports_blocked_dequantize_linear_equal_in_onnxruntime(tmp_path):
    rng = np.random.default_rng(0)
    k, n = 40, 8  # 40 = 2 x 16 + 8: the last block is partial
    graph = linear(k, n)
    params = {"fc": {"kernel": (rng.normal(size=(k, n)) / np.sqrt(k)).astype(np.float32),
                     "bias": (0.1 * rng.normal(size=n)).astype(np.float32)}}
    x = correlated_inputs(rng, 128, k)
    step = PTQ_METHODS["gptq"](group_size=16).apply(graph, params, quant_spec(graph, 8, 8),
                                                    [x], None)
    lq, state = step.quant["fc"], step.qstate["fc"]
    assert isinstance(lq.quantizer, FixedGrid) and lq.act is None  # weight-only int4
    assert lq.weight == INT4 and lq.weight_block_size == 16
    assert state.weight_scale.shape == (3, n)
    wq = np.asarray(step.params["fc"]["kernel"])
    s = np.repeat(np.asarray(state.weight_scale), 16, axis=0)[:k]
    np.testing.assert_array_equal(np.round(wq / s) * s, wq)  # on its grid
    assert np.abs(np.round(wq / s)).max() <= 7
    # "fc: int4, groups of 16, output SQNR a dB (nearest b dB)"
    sqnr, nearest = (float(v) for v in re.findall(r"([-\d.]+) dB", step.notes[0]))
    assert sqnr > nearest + 1, step.notes
    save_graph(tmp_path / "m.npz", step.graph, step.params, step.qstate)  # the grid is kept
    back = load_graph(tmp_path / "m.npz")[2]["fc"]
    assert type(back) is type(state)
    np.testing.assert_array_equal(back.weight_scale, state.weight_scale)
    fq = np.asarray(jax.jit(lambda v: execute(step.graph, step.params, v, quant=step.quant,
                                              qstate=step.qstate))(jnp.asarray(x[:8])))
    model = to_onnx(step.graph, step.params, step.quant, step.qstate, int32_bias=False,
                    requantize_outputs=False)
    onnx.checker.check_model(model)
    assert model.opset_import[0].version == QDQ_EXTENDED_OPSET
    dq = next(d for d in model.graph.node if d.name == "fc/weight_dequant")
    assert {a.name: a.i for a in dq.attribute} == {"axis": 0, "block_size": 16}
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert inits["fc.kernel_scale"].shape == (3, n) and inits["fc.kernel_q"].dtype == np.int8
    blob = model.SerializeToString()
    (plain,) = ort_run(blob, {"x": x[:8]}, disable_optimizations=True)
    np.testing.assert_allclose(plain, fq, rtol=0, atol=1e-6)  # measured 4.8e-7
    # optimized, ORT fuses DequantizeLinear -> Gemm into com.microsoft MatMulNBits, which by
    # default (accuracy_level 4) quantizes the activations to int8 (0.02 off here); at
    # accuracy level 1 it computes in float32, as npujax's fake-quant does
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    sess = ort.InferenceSession(blob, opts, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": x[:8]})[0], fq, rtol=0, atol=1e-6)


@pytest.mark.parametrize("field, value", [("bits", 1), ("group_size", 0), ("percdamp", 0.0),
                                          ("block_size", 0), ("act_order", "yes")])
def test_gptq_config_errors_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"GPTQ.{field}"):
        GPTQ(**{field: value})


def test_gptq_keeping_the_input_format_needs_and_keeps_the_calibrated_grid():
    rng = np.random.default_rng(2)
    graph = linear(8, 4)
    params = {"fc": {"kernel": rng.normal(size=(8, 4)).astype(np.float32),
                     "bias": np.zeros(4, np.float32)}}
    x = correlated_inputs(rng, 32, 8)
    quant = quant_spec(graph, 8, 8)
    with pytest.raises(ConfigError, match="after calibration"):
        GPTQ(weight_only=False).apply(graph, params, quant, [x], None)
    qstate = {"fc": quant["fc"].quantizer.init_state(graph.node("fc"), quant["fc"], None,
                                                      act_range=(0.0, 4.0))}
    step = GPTQ(weight_only=False, group_size=None).apply(graph, params, quant, [x], qstate)
    assert step.quant["fc"].act == quant["fc"].act and step.quant["fc"].weight_block_size is None
    assert step.qstate["fc"].act_scale == qstate["fc"].act_scale
    assert step.qstate["fc"].weight_scale.shape == (4,)  # one scale per output channel


def test_layers_that_do_not_feed_each_other_share_a_wave():
    t = {n: TensorType((1, 4), "float32") for n in ("x", "q", "k", "v", "s", "y")}
    graph = Graph((gemm("q", "x", "q"), gemm("k", "x", "k"), gemm("v", "x", "v"),
                   Node("add", "Add", ("q", "k"), ("s",)), gemm("out", "s", "y")),
                  ("x",), ("y",), t)
    assert waves(graph, ["q", "k", "v", "out"]) == [["q", "k", "v"], ["out"]]
    assert waves(graph, ["k", "out"]) == [["k"], ["out"]]
