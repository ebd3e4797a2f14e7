"""Saved files are validated as a whole, not trusted after their header (issue #11, class 5):
model files (schema, arrays against the graph, sizes before reading) and precision policies."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

from npujax.errors import ConfigError, GraphError, LimitError, NpujaxError
from npujax.frontends.onnx import from_onnx
from npujax.limits import limits
from npujax.quantize.model_file import load_graph, save_graph
from npujax.search.policy import PrecisionPolicy, load_policy, save_policy
from tests import hostile_inputs as hi


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    graph, params = from_onnx(hi.conv(1, 8, c_in=3, c_out=4))
    path = tmp_path_factory.mktemp("m") / "model.npz"
    save_graph(path, graph, params, meta={"note": "ok"})
    return path


def _members(path):
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _write(path, members):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def _npy(arr):
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    return buf.getvalue()


def _doc(members):
    return json.loads(np.load(io.BytesIO(members["__graph__.npy"])).tobytes())


def _with_doc(members, doc):
    return {**members, "__graph__.npy": _npy(np.frombuffer(json.dumps(doc).encode(), np.uint8))}


def test_roundtrip_still_loads(saved):
    graph, params, _, meta = load_graph(saved)
    assert meta == {"note": "ok"} and graph.nodes[0].op == "Conv"


def _kernel_key(members):
    return next(k for k in members if k.startswith("param/") and k.endswith("kernel.npy"))


CASES = {
    "no nodes": lambda m: _with_doc(m, {k: v for k, v in _doc(m).items() if k != "nodes"}),
    "nodes not a list": lambda m: _with_doc(m, {**_doc(m), "nodes": {"a": 1}}),
    "negative shape": lambda m: _with_doc(m, {**_doc(m), "tensors": {
        **_doc(m)["tensors"], "x": {"shape": [-1, 3, 8, 8], "dtype": "float32"}}}),
    "bad dtype": lambda m: _with_doc(m, {**_doc(m), "tensors": {
        **_doc(m)["tensors"], "x": {"shape": [1, 3, 8, 8], "dtype": "float99"}}}),
    "wrong declared output": lambda m: _with_doc(m, {**_doc(m), "tensors": {
        **_doc(m)["tensors"], "y": {"shape": [1, 4, 9, 9], "dtype": "float32"}}}),
    "unknown op": lambda m: _with_doc(m, {**_doc(m), "nodes": [
        {**_doc(m)["nodes"][0], "op": "Nope"}]}),
    "garbage attrs": lambda m: _with_doc(m, {**_doc(m), "nodes": [
        {**_doc(m)["nodes"][0], "attrs": {"strides": "x"}}]}),
    "kernel wrong shape": lambda m: {**m, _kernel_key(m): _npy(np.zeros((4, 3, 2, 2),
                                                                         np.float32))},
    "kernel wrong dtype": lambda m: {**m, _kernel_key(m): _npy(np.zeros((4, 3, 3, 3), np.int8))},
    "kernel missing": lambda m: {k: v for k, v in m.items() if k != _kernel_key(m)},
    "pickled array": lambda m: {**m, _kernel_key(m): _npy(np.array([{}], dtype=object))},
    "unknown quantizer": lambda m: _with_doc(m, {**_doc(m), "qstate_quantizers": {
        _doc(m)["nodes"][0]["name"]: "evil"}}),
    "meta not an object": lambda m: _with_doc(m, {**_doc(m), "meta": [1]}),
    "empty archive": lambda m: {},
    "not an array member": lambda m: {**m, "x.txt": b"hello"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_inconsistent_model_file_is_one_error(saved, tmp_path, case):
    bad = tmp_path / "bad.npz"
    _write(bad, CASES[case](_members(saved)))
    with pytest.raises(NpujaxError) as e:
        load_graph(bad)
    assert isinstance(e.value, (GraphError, LimitError)) or "shape" in str(e.value)
    assert "\n" not in str(e.value)


def test_damaged_empty_and_folder_files(saved, tmp_path):
    data = bytearray(saved.read_bytes())
    data[len(data) // 2] ^= 0xFF  # CRC damage inside a member
    (tmp_path / "crc.npz").write_bytes(bytes(data))
    (tmp_path / "empty.npz").write_bytes(b"")
    for p in ("crc.npz", "empty.npz", "."):
        with pytest.raises(GraphError):
            load_graph(tmp_path / p)


def test_huge_declared_array_is_refused_before_reading(saved, tmp_path):
    m = _members(saved)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (1 << 20, 1 << 20)})
    m[_kernel_key(m)] = b"\x93NUMPY\x01\x00" + header.getvalue()[8:]
    _write(tmp_path / "big.npz", m)
    with pytest.raises(LimitError, match="max_tensor_bytes"):
        load_graph(tmp_path / "big.npz")
    with limits(max_model_bytes=100), pytest.raises(LimitError, match="max_model_bytes"):
        load_graph(saved)


# --- precision policies


@pytest.mark.parametrize("doc, match", [
    ({"format": "npujax.precision_policy/1", "act_bits": {}}, "no 'weight_bits'"),
    ({"format": "npujax.precision_policy/1", "weight_bits": {"a": "x"}, "act_bits": {"a": 8}},
     "must be an int"),
    ({"format": "npujax.precision_policy/1", "weight_bits": {"a": True}, "act_bits": {"a": 8}},
     "must be an int"),
    ({"format": "npujax.precision_policy/1", "weight_bits": [8], "act_bits": {}}, "mapping"),
    ({"format": "npujax.precision_policy/1", "weight_bits": {"a": 8}, "act_bits": {"a": 8},
      "meta": 3}, "meta"),
    ({"format": "npujax.precision_policy/1", "weight_bits": {"a": 1}, "act_bits": {"a": 8}},
     "2"),
])
def test_invalid_policy_documents(tmp_path, doc, match):
    p = tmp_path / "p.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(NpujaxError, match=match):
        load_policy(p)


def test_policy_nan_folder_and_roundtrip(tmp_path):
    p = tmp_path / "p.json"
    p.write_text('{"format": "npujax.precision_policy/1", "weight_bits": {}, "act_bits": {}, '
                 '"meta": {"budget_s": NaN}}')
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_policy(p)
    with pytest.raises(ConfigError, match="folder"):
        load_policy(tmp_path)
    with pytest.raises(ConfigError, match="NaN"):
        save_policy(p, PrecisionPolicy({"a": 4}, {"a": 8}, {"budget_s": float("nan")}))
    save_policy(p, PrecisionPolicy({"a": 4}, {"a": 8}, {"budget_s": 1e-3}))
    assert load_policy(p).weight_bits == {"a": 4}


def test_data_file_sizes_are_checked_from_the_headers(tmp_path):
    """A --data .npz whose member declares a huge array (a zip bomb compresses to bytes) is
    refused before anything is decompressed."""
    from npujax.data.sources import load_inputs

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (1 << 16, 1 << 16)})
    _write(tmp_path / "d.npz", {"x.npy": b"\x93NUMPY\x01\x00" + header.getvalue()[8:]})
    with pytest.raises(LimitError, match="'x.npy'.*max_tensor_bytes"):
        load_inputs(str(tmp_path / "d.npz"), (3, 8, 8), 4, seed=0)
    np.save(tmp_path / "o.npy", np.array([{}], dtype=object), allow_pickle=True)
    with pytest.raises(ConfigError, match="objects"):
        load_inputs(str(tmp_path / "o.npy"), (3, 8, 8), 4, seed=0)
