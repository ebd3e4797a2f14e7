"""The model file: typed states round-trip, and files of format version 1 (npujax 0.1, states as
plain dicts without quantizer names) still load, with each state's quantizer inferred."""

import io
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax.errors import GraphError
from npujax.ir.execute import execute
from npujax.ir.graph import Graph, Node, TensorType
from npujax.ir.passes import optimize
from npujax.numerics import IntFormat
from npujax.quantize import LayerQuant, calibrate, load_graph, save_graph
from npujax.quantize.quantizers import LSQPlusState, LSQState, MixtureState, STEState
from tests.helpers import traced_digits_cnn


@pytest.fixture(scope="module")
def model():
    node = Node("fc", "Gemm", ("x",), ("y",), {}, ("kernel",))
    graph = Graph((node,), ("x",), ("y",), {"x": TensorType((1, 4), "float32"),
                                              "y": TensorType((1, 3), "float32")})
    params = {"fc": {"kernel": jnp.asarray(np.arange(12).reshape(4, 3), jnp.float32)}}
    return graph, params


def _as_version_1(path):
    """Rewrite a saved file as npujax 0.1 wrote it: format_version 1, no quantizer names."""
    data = dict(np.load(path, allow_pickle=False))
    doc = json.loads(bytes(data["__graph__"]).decode())
    doc["format_version"] = 1
    del doc["qstate_quantizers"]
    data["__graph__"] = np.frombuffer(json.dumps(doc).encode(), np.uint8)
    buf = io.BytesIO()
    np.savez_compressed(buf, **data)
    path.write_bytes(buf.getvalue())


@pytest.mark.parametrize("quantizer,state_type", [
    ("ste", STEState), ("lsq", LSQState), ("lsq+", LSQPlusState)])
def test_version_1_files_load_with_inferred_quantizers(model, tmp_path, quantizer, state_type):
    graph, params = model
    quant = {"fc": LayerQuant(weight=IntFormat(4, narrow_range=True),
                              act=IntFormat(8, signed=False), quantizer=quantizer)}
    qstate = calibrate(graph, params, [jnp.linspace(-1, 1, 8).reshape(2, 4)], quant)
    save_graph(tmp_path / "m.npz", graph, params, qstate, meta={"note": "v1"})
    _as_version_1(tmp_path / "m.npz")
    g2, p2, qs2, meta = load_graph(tmp_path / "m.npz")
    assert meta == {"note": "v1"} and [n.name for n in g2.nodes] == ["fc"]
    assert type(qs2["fc"]) is state_type
    for a, b in zip(qs2["fc"], qstate["fc"]):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_mixture_state_round_trips_and_unknown_versions_fail(model, tmp_path):
    graph, params = model
    quant = {"fc": LayerQuant(weight=(IntFormat(2, narrow_range=True),
                                      IntFormat(4, narrow_range=True)))}
    qstate = calibrate(graph, params, [jnp.ones((2, 4))], quant)
    assert isinstance(qstate["fc"], MixtureState) and qstate["fc"].weight_probs.shape == (2,)
    save_graph(tmp_path / "m.npz", graph, params, qstate)
    back = load_graph(tmp_path / "m.npz")[2]["fc"]
    np.testing.assert_array_equal(np.asarray(back.weight_probs), [0.5, 0.5])
    data = dict(np.load(tmp_path / "m.npz"))
    doc = json.loads(bytes(data["__graph__"]).decode())
    doc["format_version"] = 99
    data["__graph__"] = np.frombuffer(json.dumps(doc).encode(), np.uint8)
    np.savez(tmp_path / "future.npz", **data)
    with pytest.raises(GraphError, match="format version 99"):
        load_graph(tmp_path / "future.npz")


@pytest.fixture(scope="module")
def traced():
    with jax.numpy_dtype_promotion("standard"):  # flax's avg_pool is not strict-promotion clean
        return traced_digits_cnn()


def test_save_load_round_trip(tmp_path, traced):
    _, (graph, params) = traced
    g, p = optimize(graph, params)
    save_graph(tmp_path / "m.npz", g, p, meta={"k": 1})
    g2, p2, qs, meta = load_graph(tmp_path / "m.npz")
    assert meta == {"k": 1} and qs == {}
    assert [n.name for n in g2.nodes] == [n.name for n in g.nodes]
    x = jnp.ones((3, 8, 8, 1), jnp.float32)
    np.testing.assert_array_equal(np.asarray(execute(g2, p2, x)), np.asarray(execute(g, p, x)))


def test_load_errors(tmp_path):
    with pytest.raises(GraphError, match="does not exist"):
        load_graph(tmp_path / "missing.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(GraphError, match="not an npujax graph"):
        load_graph(bad)
