"""Fuzzing with hostile inputs (issue #11): generated ONNX files, presets, saved models and
policies, each mutated at random. Every one must end in a correct result or in an NpujaxError
(one line on the command line, the error's exit code), never another exception.

The example budget is small so CI stays fast; ``NPUJAX_FUZZ_EXAMPLES=500`` runs a larger
campaign (e.g. before a release).
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper as h
from onnx import numpy_helper as nh

from npujax.errors import NpujaxError
from npujax.frontends.onnx import from_onnx
from npujax.hw import load_npu_spec
from npujax.plan import lower
from npujax.quantize.model_file import load_graph, save_graph
from npujax.search.policy import load_policy
from tests import hostile_inputs as hi

N = int(os.environ.get("NPUJAX_FUZZ_EXAMPLES", "15"))
FUZZ = settings(max_examples=N, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

#: Integers an attacker likes.
evil_ints = st.sampled_from([0, -1, 1, 2, 3, 7, 2**15, 2**31 - 1, 2**31, 2**32, 2**53, 2**62,
                             -(2**31)]) | st.integers(-10, 10)
evil_floats = st.sampled_from([0.0, -0.0, -1.0, 1e-300, 1e308, math.inf, -math.inf, math.nan,
                               5e-324, 3.4e38]) | st.floats(-1e3, 1e3)


def _ok_or_npujax_error(fn):
    """Run ``fn``; NpujaxError is a clean outcome (one line); anything else fails the test."""
    try:
        return fn()
    except NpujaxError as e:
        assert "\n" not in str(e) and str(e), repr(e)
        return None


def _base_model() -> onnx.ModelProto:
    w = nh.from_array(np.ones((4, 3, 3, 3), np.float32) * 0.1, "w")
    b = nh.from_array(np.zeros(4, np.float32), "b")
    shape = nh.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
             h.make_node("Relu", ["c"], ["r"]),
             h.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Reshape", ["p", "shape"], ["y"])]
    return hi.model(nodes, [hi.vi("x", [1, 3, 8, 8])], [hi.vi("y", None)], [w, b, shape])


def _mutate_onnx(m: onnx.ModelProto, data) -> onnx.ModelProto:
    kind = data.draw(st.sampled_from(["attr", "dim", "init_dims", "drop_node", "dup_output",
                                      "opset", "external", "bytes", "op_type", "input_name"]))
    node = m.graph.node[data.draw(st.integers(0, len(m.graph.node) - 1))]
    if kind == "attr" and node.attribute:
        a = node.attribute[data.draw(st.integers(0, len(node.attribute) - 1))]
        a.ints[:] = [data.draw(evil_ints) for _ in range(data.draw(st.integers(0, 5)))]
    elif kind == "dim":
        d = m.graph.input[0].type.tensor_type.shape.dim
        d[data.draw(st.integers(0, 3))].dim_value = data.draw(evil_ints)
    elif kind == "init_dims":
        t = m.graph.initializer[data.draw(st.integers(0, len(m.graph.initializer) - 1))]
        t.dims[:] = [data.draw(evil_ints) for _ in range(data.draw(st.integers(0, 4)))]
    elif kind == "drop_node":
        del m.graph.node[data.draw(st.integers(0, len(m.graph.node) - 1))]
    elif kind == "dup_output":
        m.graph.node[-1].output[0] = m.graph.node[0].output[0]
    elif kind == "opset":
        m.opset_import[0].version = data.draw(evil_ints)
    elif kind == "external":
        t = m.graph.initializer[0]
        t.ClearField("raw_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", data.draw(st.sampled_from(
                ["../../etc/passwd", "/etc/passwd", "w.bin", "", "a/../../x", "nul\0l"]))),
                ("offset", str(data.draw(evil_ints))), ("length", str(data.draw(evil_ints)))):
            e = t.external_data.add()
            e.key, e.value = k, v
    elif kind == "bytes":
        raw = bytearray(m.SerializeToString())
        for _ in range(data.draw(st.integers(1, 8))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
        return onnx.ModelProto.FromString(bytes(raw)) if _parses(raw) else m
    elif kind == "op_type":
        node.op_type = data.draw(st.sampled_from(["If", "Loop", "ConstantOfShape", "Expand",
                                                   "Tile", "Div", "Nope", "Conv"]))
    elif kind == "input_name":
        node.input[0] = data.draw(st.sampled_from(["", "nope", "shape", "w", node.output[0]]))
    return m


def _parses(raw) -> bool:
    try:
        onnx.ModelProto.FromString(bytes(raw))
        return True
    except Exception:
        return False


@given(data=st.data())
@FUZZ
def test_fuzz_onnx_files(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("onnx")
    (folder / "w.bin").write_bytes(bytes(64))
    m = _base_model()
    for _ in range(data.draw(st.integers(1, 3))):
        m = _mutate_onnx(m, data)
    path = folder / "m.onnx"
    path.write_bytes(m.SerializeToString())
    mode = data.draw(st.sampled_from(["error", "fallback"]))
    got = _ok_or_npujax_error(lambda: from_onnx(path, unsupported=mode))
    if got is not None:
        s = _ok_or_npujax_error(lambda: lower(got[0], "edge_16x16"))
        if s is not None:
            assert math.isfinite(s.latency_s) and s.latency_s >= 0


PRESET = load_npu_spec("edge_16x16")


@given(changes=st.dictionaries(
    st.sampled_from(["array.rows", "array.cols", "array.clock_hz", "array.cores",
                     "array.operand_bits", "memory.dram_bytes_per_s", "memory.dram_latency_s",
                     "memory.ifmap_sram_bytes", "vector.lanes", "layout.dram_burst_bytes",
                     "host.cpu_ops_per_s", "host.link_latency_s", "ops.conv_max_kernel"]),
    evil_ints | evil_floats | st.sampled_from(["x", [], True, None]), min_size=1, max_size=4))
@FUZZ
def test_fuzz_presets(changes):
    spec = _ok_or_npujax_error(lambda: PRESET.with_fields(changes))
    if spec is not None:
        graph, _ = from_onnx(hi.conv(1, 16, c_in=8, c_out=8))
        s = lower(graph, spec)
        for r in s.layers:
            assert all(math.isfinite(v) and v >= 0 for v in r.costs._asdict().values())


@pytest.fixture(scope="module")
def model_members(tmp_path_factory):
    graph, params = from_onnx(_base_model())
    path = tmp_path_factory.mktemp("saved") / "model.npz"
    save_graph(path, graph, params, meta={"a": 1})
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _json_edit(doc, data):
    """Replace one value somewhere in a JSON document by a hostile one."""
    path, node = [], doc
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict)
                                        else list(range(len(node)))))
        path.append(key)
        node = node[key]
    value = data.draw(evil_ints | st.sampled_from([None, "x", [], {}, [-1], True, 1.5]))
    if not path:
        return value
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if data.draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@given(data=st.data())
@FUZZ
def test_fuzz_saved_models(tmp_path_factory, model_members, data):
    m = dict(model_members)
    kind = data.draw(st.sampled_from(["json", "array", "bytes", "drop"]))
    name = data.draw(st.sampled_from(sorted(m)))
    if kind == "json":
        doc = json.loads(np.load(io.BytesIO(m["__graph__.npy"])).tobytes())
        doc = _json_edit(doc, data)
        buf = io.BytesIO()
        np.save(buf, np.frombuffer(json.dumps(doc).encode(), np.uint8))
        m["__graph__.npy"] = buf.getvalue()
    elif kind == "array":
        buf = io.BytesIO()
        shape = tuple(data.draw(st.lists(st.integers(0, 5), max_size=4)))
        dtype = data.draw(st.sampled_from([np.float32, np.int8, np.float64, np.uint8]))
        np.save(buf, np.zeros(shape, dtype))
        m[name] = buf.getvalue()
    elif kind == "bytes":
        raw = bytearray(m[name])
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
        m[name] = bytes(raw)
    else:
        del m[name]
    path = tmp_path_factory.mktemp("bad") / "model.npz"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in m.items():
            z.writestr(k, v)
    got = _ok_or_npujax_error(lambda: load_graph(path))
    if got is not None:
        s = _ok_or_npujax_error(lambda: lower(got[0], "edge_16x16"))
        if s is not None:
            assert math.isfinite(s.latency_s)


@given(data=st.data())
@FUZZ
def test_fuzz_policies(tmp_path_factory, data):
    doc = {"format": "npujax.precision_policy/1", "weight_bits": {"conv": 4, "fc": 8},
           "act_bits": {"conv": 8, "fc": 8}, "meta": {"budget_s": 1e-3}}
    for _ in range(data.draw(st.integers(1, 3))):
        doc = _json_edit(doc, data)
    path = tmp_path_factory.mktemp("p") / "p.json"
    text = json.dumps(doc)
    if data.draw(st.booleans()):
        text = text[:data.draw(st.integers(0, len(text)))]  # truncated
    path.write_text(text)
    _ok_or_npujax_error(lambda: load_policy(path))


# --- issue 28: external data in any field, output folders with user files, resumption keys

EXTERNAL_PATHS = hi.tensor_field_paths()


@given(data=st.data())
@FUZZ
def test_fuzz_external_data_in_any_field(tmp_path_factory, data):
    """Wherever an external tensor sits (any field, one level of subgraphs) and whatever it
    names, its data comes from the model's folder (``w.bin``: zeros) or it is refused; the
    working directory's ``secret.bin`` (sevens) is never read."""
    import contextlib

    from npujax.frontends.onnx import load_onnx_model

    root = tmp_path_factory.mktemp("ext")
    cwd, folder = root / "cwd", root / "models"
    cwd.mkdir()
    folder.mkdir()
    (cwd / "secret.bin").write_bytes(np.full(16, 7.0, np.float32).tobytes())
    (folder / "w.bin").write_bytes(bytes(64))
    os.symlink(cwd, folder / "link")
    path = data.draw(st.sampled_from(EXTERNAL_PATHS))
    location = data.draw(st.sampled_from(["secret.bin", "../cwd/secret.bin",
                                          str(cwd / "secret.bin"), "link/secret.bin", "w.bin",
                                          "./w.bin", "link/../w.bin", ""]))
    offset = data.draw(st.integers(0, 48) | evil_ints)
    length = data.draw(st.sampled_from([None, 16]) | evil_ints)
    file = folder / "m.onnx"
    file.write_bytes(hi.model_with_external_at(path, location, offset=offset,
                                               length=length).SerializeToString())
    with contextlib.chdir(cwd):
        got = _ok_or_npujax_error(lambda: load_onnx_model(file))
    if got is not None:
        probe = hi.tensor_at(got, path)
        assert probe.data_location == onnx.TensorProto.DEFAULT and probe.raw_data == bytes(16)


@given(data=st.data())
@FUZZ
def test_fuzz_output_folders_with_user_files(tmp_path_factory, data):
    """An earlier run's files, the user's files (some at names a run writes, some edits of
    npujax's), a new run: refused (nothing changed) exactly when a name it writes holds a file
    npujax did not write as it is; else the user's files stay and the manifest is the new set."""
    from npujax._atomic import MANIFEST, staged_dir
    from npujax.errors import OutputError

    names = ["a.txt", "b.txt", "sub/c.txt", "sub/d/e.txt"]

    def run(out, files):
        with staged_dir(out) as stage:
            for rel, text in files.items():
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                (stage / rel).write_text(text)

    def tree(folder):
        return {p.relative_to(folder).as_posix(): p.read_text()
                for p in sorted(folder.rglob("*")) if p.is_file()} if folder.exists() else {}

    root = tmp_path_factory.mktemp("out")
    out = root / "o"
    old = {n: f"old {n}" for n in data.draw(st.lists(st.sampled_from(names), unique=True))}
    if old:
        run(out, old)
    user = {n: f"user {n}" for n in data.draw(st.lists(st.sampled_from([*names, "notes.txt"]),
                                                       unique=True))}
    for rel, text in user.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    new = {n: f"new {n}" for n in data.draw(st.lists(st.sampled_from(names), min_size=1,
                                                      unique=True))}
    before = tree(out)
    try:
        run(out, new)
        refused = False
    except OutputError as e:
        assert "\n" not in str(e)
        refused = True
    assert refused == any(n in user for n in new)
    assert sorted(p.name for p in root.iterdir()) == (["o"] if out.exists() else [])
    if refused:
        assert tree(out) == before
        return
    after = tree(out)
    assert {n: after[n] for n in user} == user
    assert set(json.loads(after[MANIFEST])["files"]) == set(new)
    assert {n: after[n] for n in new} == new
    gone = set(old) - set(new) - set(user)
    assert not gone & set(after) and set(after) == set(new) | set(user) | {MANIFEST}


@given(data=st.data())
@FUZZ
def test_fuzz_sweep_resumption_keys(tmp_path_factory, data):
    """Any change of a sweep's inputs refuses the resumption, naming each change on one line;
    the names of the model and the preset alone do not."""
    from npujax.errors import ConfigError
    from npujax.workflows.sweep import _KEY_FIELDS, _check_folder

    before = {"model": "m.onnx", "model_sha256": "a" * 64, "layers_sha256": "b" * 64,
              "npu": "edge_16x16", "npu_sha256": "c" * 64, "grid": {"array.rows": [8, 16]},
              "sample": None, "method": None, "seed": 0, "chunk_size": 4, "configs": 2,
              "npujax": "0.2.0"}
    out = tmp_path_factory.mktemp("sweep")
    (out / "sweep.json").write_text(json.dumps({"sweep": before}))
    changed = data.draw(st.lists(st.sampled_from([k for k, _ in _KEY_FIELDS] + ["model", "npu"]),
                                 unique=True))
    now = {**before, **{k: data.draw(evil_ints | st.sampled_from(["other", None, [8]]))
                        for k in changed}}
    labels = [label for k, label in _KEY_FIELDS if now[k] != before[k]]
    if not labels:
        _check_folder(out, {"sweep": now})
        return
    with pytest.raises(ConfigError) as e:
        _check_folder(out, {"sweep": now})
    assert "\n" not in str(e.value) and all(label in str(e.value) for label in labels)
@given(data=st.data())
@FUZZ
def test_fuzz_weights_at_the_fake_quant_api(data):
    # issue 28: a NaN/inf weight gave a NaN scale and NaN outputs silently; a huge finite one
    # -inf. Every outcome is a finite grid and finite outputs, or a QuantizationError.
    import jax.numpy as jnp

    from npujax.numerics import FP8_E4M3FN, IntFormat, lsq_fake_quant, lsq_init_step
    from npujax.quantize.quantizers.base import quantize_weight

    with np.errstate(over="ignore"):  # 1e308 -> inf in float32
        w = np.asarray(data.draw(st.lists(evil_floats, min_size=6, max_size=6)), np.float32)
    w = w.reshape(2, 3)
    fmt = data.draw(st.sampled_from([IntFormat(2), IntFormat(3), IntFormat(8, signed=False),
                                     FP8_E4M3FN]))
    axis = data.draw(st.sampled_from([None, 0, 1]))
    out = _ok_or_npujax_error(lambda: quantize_weight(jnp.asarray(w), fmt, axis, name="w"))
    assert out is not None or not np.all(np.isfinite(w))
    if out is not None:
        assert np.all(np.isfinite(np.asarray(out)))
    if isinstance(fmt, IntFormat):
        step = _ok_or_npujax_error(lambda: lsq_init_step(w, fmt, axis))
        if step is not None:
            out = lsq_fake_quant(jnp.asarray(w), step, fmt, axis=axis)
            assert np.all(np.isfinite(np.asarray(out)))
