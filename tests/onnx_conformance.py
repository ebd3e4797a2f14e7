"""Run onnx's backend node test cases through from_onnx + execute (for the conformance tests)."""

from __future__ import annotations

import functools

import numpy as np
import onnx


@functools.cache
def node_cases() -> dict:
    """``{case name: TestCase}`` of all onnx's backend node tests (built in memory by onnx: this
    runs every case's reference computation, ~10-20 s; :func:`node_case` builds one)."""
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():  # onnx's case builders overflow casts on purpose
        warnings.simplefilter("ignore")
        return {c.name: c for c in load_model_tests(kind="node")}


@functools.cache
def _case_sources() -> dict[str, str]:
    """``{module name: source}`` of onnx's node-case modules (read, not imported)."""
    import pkgutil

    import onnx.backend.test.case.node as pkg

    out = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.ispkg:
            spec = info.module_finder.find_spec(info.name)  # type: ignore[call-arg]
            with open(spec.origin, encoding="utf-8") as f:
                out[f"{pkg.__name__}.{info.name}"] = f.read()
    return out


def node_case(name: str):
    """The backend node test case ``name``, building only the onnx module(s) that name it (an
    import runs a module's reference computations); all of them when no module names it
    literally (names built at run time)."""
    import importlib
    import re
    import warnings

    from onnx.backend.test.case.node import _NodeTestCases

    def found():
        return next((c for c in _NodeTestCases if c.name == name), None)

    sources = _case_sources()
    base = re.sub(r"_expanded(_ver\d+)?$", "", name)
    named = [m for m, src in sources.items() if f'"{base}"' in src or f"'{base}'" in src]
    # names built at run time: the module of the op, e.g. test_layer_normalization_2d_axis0 in
    # .../node/layernormalization.py
    words = base.removeprefix("test_").split("_")
    pkg = "onnx.backend.test.case.node"
    by_op = [f"{pkg}.{''.join(words[:k])}" for k in range(len(words), 0, -1)]
    for module in named + [m for m in by_op if m in sources]:
        with warnings.catch_warnings():  # onnx's case builders overflow casts on purpose
            warnings.simplefilter("ignore")
            importlib.import_module(module)
        if (case := found()) is not None:
            return case
    return node_cases()[name]


def load_case(case):
    """``(model, inputs, outputs)`` of one backend test case, read from its folder."""
    from onnx import numpy_helper

    model = case.model if isinstance(case.model, onnx.ModelProto) else onnx.load(case.model)
    if case.data_sets:
        inputs, outputs = case.data_sets[0]
        return model, list(inputs), list(outputs)
    import glob
    import os

    d = sorted(glob.glob(os.path.join(case.model_dir, "test_data_set_*")))[0]

    def read(prefix):
        out = []
        for f in sorted(glob.glob(os.path.join(d, f"{prefix}_*.pb")),
                        key=lambda p: int(p.rsplit("_", 1)[1][:-3])):
            t = onnx.TensorProto()
            with open(f, "rb") as fh:
                t.ParseFromString(fh.read())
            out.append(numpy_helper.to_array(t))
        return out

    return model, read("input"), read("output")


#: Inputs (by position) that npujax requires to be constants (weights, shapes, quantization
#: parameters): the harness turns these graph inputs of a test case into initializers.
CONST_INPUTS = {
    "Conv": {1, 2}, "ConvTranspose": {1, 2}, "Gemm": {1, 2}, "BatchNormalization": {1, 2, 3, 4},
    "Clip": {1, 2}, "Reshape": {1}, "Slice": {1, 2, 3, 4}, "Split": {1}, "Squeeze": {1},
    "Unsqueeze": {1}, "Pad": {1, 2, 3}, "Resize": {1, 2, 3}, "ReduceMean": {1},
    "QuantizeLinear": {1, 2}, "DequantizeLinear": {1, 2}, "LayerNormalization": {1, 2},
    "RMSNormalization": {1}, "Expand": {1}, "ReduceSum": {1}, "ReduceMax": {1},
    "LSTM": {1, 2, 3, 7}, "GRU": {1, 2, 3},
}


def freeze_inputs(model, inputs):
    """Move the inputs listed in :data:`CONST_INPUTS` into initializers; return the rest."""
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    frozen = {n.input[i] for n in model.graph.node for i in CONST_INPUTS.get(n.op_type, ())
              if i < len(n.input) and n.input[i]}
    init = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in init]
    keep_vi, rest = [], []
    values = dict(zip(names, inputs))
    for vi in model.graph.input:
        if vi.name in frozen and vi.name in values:
            model.graph.initializer.append(numpy_helper.from_array(values[vi.name], vi.name))
        else:
            keep_vi.append(vi)
            if vi.name in values:
                rest.append(values[vi.name])
    del model.graph.input[:]
    model.graph.input.extend(keep_vi)
    return model, rest


def run_case(case) -> None:
    """Import and execute one case; raise AssertionError if an output differs from onnx's."""
    import jax

    from npujax.frontends.onnx import from_onnx
    from npujax.ir.execute import execute

    model, inputs, outputs = load_case(case)
    model, inputs = freeze_inputs(model, inputs)
    init = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in init]
    shapes = {n: np.shape(v) for n, v in zip(names, inputs)}
    graph, params = from_onnx(model, shapes)
    env = dict(zip(graph.inputs, inputs))
    # one compiled program per case, as a user runs a model (eagerly, each of its operations
    # compiled on its own: 524 programs for the claimed cases); the weights stay constants
    # (numpy inputs: jnp.asarray of each would compile a program per shape)
    ys = jax.jit(lambda xs: execute(graph, params, xs))([env[n] for n in graph.inputs])
    ys = ys if isinstance(ys, tuple) else (ys,)
    assert len(ys) == len(outputs)
    for y, want in zip(ys, outputs):
        y = np.asarray(y)
        assert y.shape == want.shape, (y.shape, want.shape)
        assert y.dtype == want.dtype, (y.dtype, want.dtype)
        np.testing.assert_allclose(y, want, rtol=max(case.rtol, 1e-5), atol=max(case.atol, 1e-6))
