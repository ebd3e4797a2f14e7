"""FP8 (E4M3FN, E5M2) and per-block weight layers: calibration, fake-quant execute, ONNX QDQ
export (opset 21) run by onnxruntime, and the integer path's refusal."""

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from flax import nnx
from onnx import TensorProto, numpy_helper

from npujax.backends.integer import convert
from npujax.backends.onnx_export import QDQ_EXTENDED_OPSET, to_onnx
from npujax.errors import ConfigError, QuantizationError
from npujax.frontends.flax import trace_flax
from npujax.ir.execute import execute
from npujax.ir.passes import fold_batchnorm
from npujax.models.cnn import DigitsCNN
from npujax.numerics import FP8_E4M3FN, FP8_E5M2, IntFormat
from npujax.quantize.calibrate import calibrate
from npujax.quantize.rules import QuantRule, quant_spec_from_rules
from npujax.quantize.spec import quant_spec
from tests.onnx_models import ort_run

pytestmark = pytest.mark.flax_model


@pytest.fixture(scope="module")
def model():
    m = DigitsCNN(rngs=nnx.Rngs(1))
    x = np.random.default_rng(1).uniform(size=(32, 8, 8, 1)).astype(np.float32)
    graph, params = fold_batchnorm(*trace_flax(m, x[:1]))
    return graph, params, x


CASES = {
    "fp8_e4m3fn": dict(weight_format="fp8_e4m3fn", act_format="fp8_e4m3fn"),
    "fp8_e5m2": dict(weight_format="fp8_e5m2", act_format="fp8_e5m2"),
    "int8_block4": dict(weight_block_size=4),
    "fp8_block4": dict(weight_format="fp8_e4m3fn", weight_block_size=4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_onnxruntime_runs_the_export_like_fake_quant(model, case):
    graph, params, x = model
    q = quant_spec(graph, **CASES[case])
    qstate = calibrate(graph, params, [x], q)
    fq = np.asarray(jax.jit(lambda v: execute(graph, params, v, quant=q, qstate=qstate))(
        jnp.asarray(x[:4])))
    # requantize_outputs=False: the fake-quant model (no requantization of conv2's output
    # before the pool), for a like-for-like comparison
    exported = to_onnx(graph, params, q, qstate, int32_bias=False, requantize_outputs=False)
    assert exported.opset_import[0].version == QDQ_EXTENDED_OPSET
    inits = {t.name: t for t in exported.graph.initializer}
    conv2 = inits["conv2.kernel_q"]
    want = {"fp8_e4m3fn": TensorProto.FLOAT8E4M3FN, "fp8_e5m2": TensorProto.FLOAT8E5M2}
    assert conv2.data_type == want.get(CASES[case].get("weight_format"), TensorProto.INT8)
    if "weight_block_size" in CASES[case]:
        dq = next(n for n in exported.graph.node if n.name == "conv2/weight_dequant")
        assert {a.name: a.i for a in dq.attribute} == {"axis": 1, "block_size": 4}
        # OIHW kernel [32, 16, 3, 3]: 16 input channels in blocks of 4
        assert numpy_helper.to_array(inits["conv2.kernel_scale"]).shape == (32, 4, 3, 3)
    # ORT's extended optimizations (1.32) drop a Relu before an FP8 QuantizeLinear
    # (ReluQuantFusion treats the float8 zero point like uint8's 0), so compare unoptimized.
    blob = exported.SerializeToString()
    ort = np.concatenate([ort_run(blob, {graph.inputs[0]: x[i:i + 1]}, True)[0]
                          for i in range(4)])
    # measured: max |ORT - npujax| <= 1.5e-7 (float32 accumulation order only)
    np.testing.assert_allclose(ort, fq, atol=1e-5, rtol=0)
    onnx.checker.check_model(exported)


def test_fp8_calibration_scale_and_integer_path_refusal(model):
    graph, params, x = model
    q = quant_spec(graph, weight_format="fp8_e5m2", act_format="fp8_e4m3fn")
    assert q["conv1"].weight == FP8_E5M2 and q["conv1"].act == FP8_E4M3FN
    qstate = calibrate(graph, params, [x], q)
    np.testing.assert_allclose(qstate["conv1"].act_scale, x.max() / 448.0, rtol=1e-6)
    assert int(qstate["conv1"].act_zero_point) == 0
    with pytest.raises(QuantizationError, match="int-only.*fake-quant execute"):
        convert(graph, params, q, qstate)
    qb = quant_spec(graph, weight_block_size=8)
    with pytest.raises(QuantizationError, match="weight_block_size 8"):
        convert(graph, params, qb, calibrate(graph, params, [x], qb))


def test_format_arguments_and_rules(model):
    graph, *_ = model
    with pytest.raises(ConfigError, match="weight_format"):
        quant_spec(graph, weight_format="fp4")
    with pytest.raises(ConfigError, match="weight_block_size"):
        quant_spec(graph, weight_block_size=0)
    spec = quant_spec_from_rules(graph, [
        QuantRule(pattern="conv1", weight_format="fp8_e4m3fn", act_format="fp8_e4m3fn"),
        QuantRule(pattern=".*", weight_bits=4, weight_block_size=16, quantizer="ste")])
    assert spec["conv1"].weight == FP8_E4M3FN
    assert spec["fc1"].weight == IntFormat(4, narrow_range=True)
    assert spec["fc1"].weight_block_size == 16
    with pytest.raises(ConfigError, match="act_format"):
        QuantRule(pattern=".*", act_format="bf16")
