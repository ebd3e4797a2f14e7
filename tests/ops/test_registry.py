"""The operator registry is the one source of op knowledge: every definition is complete for
its cost class, every importer is a real ONNX operator, and exporters cover all but the ops
that have no ONNX form."""

import onnx
import pytest

from npujax.ops import ONNX_IMPORTERS, ONNX_WEIGHT_OPS, OPS, epilogue_ops, quantized_ops
from npujax.ops.registry import OpDef, register

#: Operators with no ONNX equivalent (a Flax window sum, a raw JAX primitive).
NOT_EXPORTABLE = {"SumPool", "JaxPrimitive"}


@pytest.mark.parametrize("name", sorted(OPS))
def test_definitions_are_complete(name):
    d = OPS[name]
    assert d.name == name
    assert d.cost in ("array", "elementwise", "vector", "free", "host")
    assert (d.array_work is not None) == (d.cost == "array")
    if d.epilogue:
        assert d.unary is not None and d.cost == "elementwise"
    if d.quantized:
        assert d.kernel_out_axis is not None and d.kernel_in_axis is not None
    assert d.codes in (None, "exact", "rounding")
    assert (d.export is None) == (name in NOT_EXPORTABLE)


def test_registry_tables():
    assert quantized_ops() == {"Conv", "Gemm"}
    assert epilogue_ops() == {"Relu", "Relu6", "Sigmoid", "Tanh"}
    assert ONNX_WEIGHT_OPS == {"Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization",
                               "LayerNormalization", "RMSNormalization", "LSTM", "GRU"}
    prims = [p for d in OPS.values() for p in d.jax_primitives]
    assert len(prims) == len(set(prims))  # one operator per JAX primitive
    for onnx_op in ONNX_IMPORTERS:
        assert onnx.defs.has(onnx_op), onnx_op


def test_names_are_registered_once():
    with pytest.raises(ValueError, match="twice"):
        register(OpDef(name="Conv", run=OPS["Conv"].run, cost="vector"))
    with pytest.raises(ValueError, match="array_work"):
        register(OpDef(name="NewGemm", run=OPS["Conv"].run, cost="array"))
    assert "NewGemm" not in OPS
