"""Operators without an NPU model, always costed on the host CPU.

* ``CpuFallback``: an ONNX operator npujax does not implement, kept as a one-node ONNX model
  (inputs ``in0, in1, ...``, outputs ``out0, ...``; output types from ONNX shape inference at
  import) and run on the host by ``onnx.reference`` through ``jax.pure_callback`` (so it is not
  differentiable). ``onnx`` is imported only when such a node runs or is exported.
* ``JaxPrimitive``: an elementwise JAX primitive the Flax tracer kept as is (binding it is
  exact); it cannot be saved or exported.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from npujax.ops._onnx import reference_evaluator
from npujax.ops.registry import OpDef, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node


def _cpu_fallback(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    a = node.attrs
    out_specs = [jax.ShapeDtypeStruct(tuple(s), np.dtype(d)) for s, d in a["output_types"]]
    # checked when traced (a saved model file is as untrusted as an ONNX file), run per call
    sess = reference_evaluator(base64.b64decode(a["onnx_model"]),
                               f"CPU-fallback node {node.name!r}")

    def host(*arrays):
        feeds = {f"in{i}": np.asarray(v) for i, v in enumerate(arrays)}
        outs = sess.run(None, feeds)
        return tuple(np.asarray(o, s.dtype).reshape(s.shape) for o, s in zip(outs, out_specs))

    return list(jax.pure_callback(host, tuple(out_specs), *inputs))


def _export_cpu_fallback(w: Any, node: Node) -> None:
    """The original ONNX node, with the graph's tensor names restored."""
    import onnx

    ins, outs = list(node.inputs), list(node.outputs)
    sub = onnx.load_from_string(base64.b64decode(node.attrs["onnx_model"]))
    (orig,) = sub.graph.node
    rename = {f"in{k}": t for k, t in enumerate(ins)}
    rename.update({f"out{k}": t for k, t in enumerate(outs)})
    n = onnx.NodeProto()
    n.CopyFrom(orig)
    del n.input[:]
    n.input.extend(rename.get(t, "") for t in orig.input)
    del n.output[:]
    n.output.extend(rename[t] for t in orig.output)
    n.name = w.name(node.name)
    w.nodes.append(n)


def _primitive(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    out = node.attrs["primitive"].bind(*inputs, **node.attrs["primitive_params"])
    return list(out) if node.attrs["primitive"].multiple_results else [out]


register(
    OpDef(name="CpuFallback", run=_cpu_fallback, cost="host", export=_export_cpu_fallback,
          batch_dependent=True),
    OpDef(name="JaxPrimitive", run=_primitive, cost="host", batch_dependent=True),
)
