"""Lowering from shapes only never materialises a weight (issue 28): an ONNX model whose
external-data files are absent imported its missing weights as zeros (a 637 MB weight peaked
at 1.6 GB, an LLM's lm_head was refused by the 1 GiB tensor limit), and a decoder lowered
without weights was traced with float32 zeros (2.9 GB of memory for Qwen2.5-0.5B)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from npujax.errors import GraphError
from npujax.frontends.onnx import from_onnx
from npujax.ir.absent import AbsentArray
from npujax.ir.execute import execute
from tests import hostile_inputs as hi

HEAD = 2**23  # a [64, 2**23] float32 head: 2 GiB, over the 1 GiB tensor limit


def _absent(name, dims, data_type=T.FLOAT):
    t = hi.external_tensor(name, f"{name}.bin", n=int(np.prod(dims)))
    t.data_type = data_type
    del t.dims[:]
    t.dims.extend(dims)
    del t.external_data[:]
    for k, v in {"location": f"{name}.bin", "offset": "0",
                 "length": str(int(np.prod(dims)) * (1 if data_type == T.INT8 else 4))}.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


@pytest.fixture(scope="module")
def model_without_data(tmp_path_factory):
    """Conv+BN+Relu, pooled, a QDQ int8 MatMul and a 2 GiB head: every weight's external
    file absent (none is written)."""
    inits = [_absent("w", [64, 3, 3, 3]), _absent("b", [64]),
             *(_absent(f"bn_{k}", [64]) for k in ("scale", "bias", "mean", "var")),
             _absent("wq", [64, 64], T.INT8), nh.from_array(np.float32(0.02), "wq_scale"),
             _absent("head", [64, HEAD]),
             nh.from_array(np.array([1, 64], np.int64), "flat")]
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("BatchNormalization", ["c", "bn_scale", "bn_bias", "bn_mean",
                                                "bn_var"], ["n"]),
             h.make_node("Relu", ["n"], ["r"]),
             h.make_node("GlobalAveragePool", ["r"], ["p"]),
             h.make_node("Reshape", ["p", "flat"], ["f"]),
             h.make_node("DequantizeLinear", ["wq", "wq_scale"], ["wd"]),
             h.make_node("MatMul", ["f", "wd"], ["m"]),
             h.make_node("MatMul", ["m", "head"], ["y"])]
    path = tmp_path_factory.mktemp("shapes") / "m.onnx"
    onnx.save(hi.model(nodes, [hi.vi("x", [1, 3, 16, 16])], [hi.vi("y", None)], inits), path)
    return path


def test_lowering_from_shapes_allocates_no_weight(model_without_data):
    from npujax.plan import lower
    from npujax.workflows.lowering import import_onnx_for_lowering

    tracemalloc.start()
    try:
        graph = import_onnx_for_lowering(model_without_data, None, None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak  # the head alone is 2 GiB; the smallest weight 256 bytes
    s = lower(graph, "edge_16x16")
    assert s.macs == 16 * 16 * 64 * 27 + 64 * 64 + 64 * HEAD
    # BatchNormalization and Relu folded into the conv, abstractly
    assert [r.name for r in s.layers] == ["x:in", "Conv_0", "GlobalAveragePool_3", "MatMul_6",
                                          "MatMul_7"]


def test_absent_weights_are_shapes_and_refuse_what_needs_values(model_without_data):
    graph, params = from_onnx(model_without_data, weights="shapes")
    kernels = {k: v["kernel"] for k, v in params.items() if "kernel" in v}
    assert all(isinstance(v, AbsentArray) for v in kernels.values())
    assert sorted(v.shape for v in kernels.values()) == sorted([(64, 64), (64, 3, 3, 3),
                                                                (64, HEAD)])
    with pytest.raises(GraphError, match="shapes only"):
        execute(graph, params, np.ones((1, 3, 16, 16), np.float32))
    with pytest.raises(GraphError, match=r"initializer 'head'.*shape only"):
        np.asarray(kernels[next(k for k, v in kernels.items() if v.shape == (64, HEAD))])


def test_a_flax_model_traced_by_its_weights_shapes_allocates_none():
    import jax
    from flax import nnx

    from npujax.frontends.flax import trace_flax
    from npujax.plan import lower

    class Head(nnx.Module):  # an LLM's last layers: a norm and a 2 GiB lm_head
        def __init__(self, rngs):
            self.norm = nnx.RMSNorm(64, rngs=rngs)
            self.lm_head = nnx.Linear(64, HEAD, use_bias=False, rngs=rngs)

        def __call__(self, x):
            return self.lm_head(self.norm(x))

    model = nnx.eval_shape(lambda: Head(nnx.Rngs(0)))  # nothing allocated
    before = sum(a.nbytes for a in jax.live_arrays())
    tracemalloc.start()
    try:
        graph, params = trace_flax(model, np.ones((1, 4, 64), np.float32), weights="shapes")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20 and sum(a.nbytes for a in jax.live_arrays()) - before < 2**20
    kernel = params["lm_head"]["kernel"]
    assert isinstance(kernel, AbsentArray) and kernel.shape == (64, HEAD)
    assert lower(graph, "edge_16x16").macs == 4 * 64 * HEAD
    with pytest.raises(GraphError, match="shapes only"):
        execute(graph, params, np.ones((1, 4, 64), np.float32))
