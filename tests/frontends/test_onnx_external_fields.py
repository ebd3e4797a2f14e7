"""External data in every tensor-bearing field of the ONNX protobuf (issue 28, item 6).

The fields are found from the protobuf descriptors, not listed by hand: every path from
``ModelProto`` to a ``TensorProto`` field (graphs nested once inside another: an ``If`` branch,
a ``Loop`` body, a function's default attribute, a training graph) gets one external tensor, and
:func:`load_onnx_model` must read it from the model's own folder or refuse it, never from the
working directory. A field a future ``onnx`` adds is covered without editing this file.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from google.protobuf.descriptor import FieldDescriptor

from npujax.errors import GraphError
from npujax.frontends.onnx import load_onnx_model
from npujax.ops._onnx import iter_onnx_tensors
from tests import hostile_inputs as hi

_TENSOR = onnx.TensorProto.DESCRIPTOR.full_name
_CWD_DATA = np.full(4, 7.0, np.float32).tobytes()  # what must never be read
_DATA = np.full(4, 2.0, np.float32).tobytes()  # the model folder's file


def _paths(d=onnx.ModelProto.DESCRIPTOR, path=(), seen=None, max_repeat=2):
    """Every field path from ``d`` to a TensorProto field, each message type at most
    ``max_repeat`` times on a path (so a graph inside a graph's node, but the recursion ends)."""
    seen = seen or {d.full_name: 1}
    for f in d.fields:
        if f.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        m = f.message_type
        if m.full_name == _TENSOR:
            yield (*path, f)
            continue
        if seen.get(m.full_name, 0) < max_repeat:
            yield from _paths(m, (*path, f), {**seen, m.full_name: seen.get(m.full_name, 0) + 1},
                              max_repeat)


PATHS = list(_paths())


def _label(path) -> str:
    return ".".join(f.name for f in path)


def _child(msg, f, create: bool):
    """The message at field ``f`` of ``msg`` (a new element of a repeated field when creating,
    the last one when reading)."""
    if f.is_repeated:
        items = getattr(msg, f.name)
        return items.add() if create else items[len(items) - 1]
    return getattr(msg, f.name)


def _model_with_external(path, location: str) -> onnx.ModelProto:
    """A valid small model (``y = x + x``) plus one external tensor at ``path``."""
    m = hi.model([onnx.helper.make_node("Add", ["x", "x"], ["y"])], [hi.vi("x", [4])],
                 [hi.vi("y", [4])])
    msg = m
    for f in path[:-1]:
        msg = m.graph if msg is m and f.name == "graph" else _child(msg, f, create=True)
        if "name" in msg.DESCRIPTOR.fields_by_name and not msg.name:
            msg.name = f"probe_{f.name}"
    _child(msg, path[-1], create=True).CopyFrom(hi.external_tensor("probe", location))
    return m


def _probe(model: onnx.ModelProto, path) -> onnx.TensorProto:
    msg = model
    for f in path:
        msg = _child(msg, f, create=False)
    return msg


def _all_tensors(msg):
    """Every TensorProto inside ``msg``, found through the descriptors (independent of
    ``iter_onnx_tensors``)."""
    if msg.DESCRIPTOR.full_name == _TENSOR:
        yield msg
        return
    for f, value in msg.ListFields():
        if f.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        for v in (value if f.is_repeated else [value]):
            yield from _all_tensors(v)


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """``(model folder, working directory)``: the working directory holds ``secret.bin``."""
    cwd, folder = tmp_path / "cwd", tmp_path / "models"
    cwd.mkdir()
    folder.mkdir()
    (cwd / "secret.bin").write_bytes(_CWD_DATA)
    monkeypatch.chdir(cwd)
    return folder, cwd


def _load_each(folder, location, check):
    """Save one model per path, load it, and return the paths where ``check`` failed."""
    failures = []
    for path in PATHS:
        file = folder / "m.onnx"
        file.write_bytes(_model_with_external(path, location).SerializeToString())
        try:
            result = load_onnx_model(file)
        except GraphError as e:
            result = e
        problem = check(path, result)
        if problem:
            failures.append(f"{_label(path)}: {problem}")
    return failures


def test_the_walk_finds_the_fields_it_must():
    labels = {_label(p) for p in PATHS}
    assert {"graph.initializer", "graph.sparse_initializer.values",
            "graph.node.attribute.g.initializer", "graph.node.attribute.t",
            "functions.attribute_proto.t", "training_info.algorithm.initializer"} <= labels
    assert len(PATHS) > 100  # one level of subgraphs everywhere


def test_every_tensor_field_is_walked():
    """:func:`iter_onnx_tensors` (which every external-data check relies on) yields the tensor
    at every path."""
    missed = [_label(p) for p in PATHS
              if not any(t.name == "probe" for _, t in
                         iter_onnx_tensors(_model_with_external(p, "w.bin")))]
    assert missed == []


def test_external_data_in_any_field_is_never_read_from_the_working_directory(dirs):
    folder, _ = dirs

    def check(path, result):
        if not isinstance(result, GraphError):
            got = _probe(result, path)
            return f"loaded, data {got.raw_data[:8]!r}"
        if "does not exist" not in str(result):
            return f"refused for another reason: {result}"
        return None

    assert _load_each(folder, "secret.bin", check) == []


def test_external_data_in_any_field_is_read_from_the_models_folder(dirs):
    folder, _ = dirs
    (folder / "w.bin").write_bytes(_DATA)

    def check(path, result):
        if isinstance(result, GraphError):
            return f"refused: {result}"
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in _all_tensors(result)):
            return "a tensor still points at a file"
        got = _probe(result, path)
        return None if got.raw_data == _DATA else f"data {got.raw_data[:8]!r}"

    assert _load_each(folder, "w.bin", check) == []


@pytest.mark.parametrize("escape", ["../cwd/secret.bin", "absolute", "link/secret.bin"])
def test_external_data_escaping_the_folder_from_any_field_is_refused(dirs, escape):
    folder, cwd = dirs
    if escape == "absolute":
        escape = str(cwd / "secret.bin")
    os.symlink(cwd, folder / "link")

    def check(path, result):
        if not isinstance(result, GraphError):
            return "loaded"
        return None if "outside" in str(result) or "only relative" in str(result) else \
            f"refused for another reason: {result}"

    assert _load_each(folder, escape, check) == []
