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

_TENSOR = hi.TENSOR
_CWD_DATA = np.full(4, 7.0, np.float32).tobytes()  # what must never be read
_DATA = np.full(4, 2.0, np.float32).tobytes()  # the model folder's file


PATHS = hi.tensor_field_paths()
_label, _model_with_external, _probe = hi.path_label, hi.model_with_external_at, hi.tensor_at


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
