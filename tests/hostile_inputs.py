"""Small hostile ONNX models shared by the hardening tests and the fuzz module."""

from __future__ import annotations

import numpy as np
import onnx
from google.protobuf.descriptor import FieldDescriptor
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def external_tensor(name: str, location: str, n: int = 4, offset: int = 0,
                    length: int | None = None) -> onnx.TensorProto:
    """A float32 [n] tensor whose data lives in ``location``."""
    t = T()
    t.name, t.data_type = name, T.FLOAT
    t.dims.extend([n])
    t.data_location = T.EXTERNAL
    info = {"location": location, "offset": str(offset), "length": str(4 * n if length is None
                                                                         else length)}
    for k, v in info.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def model(nodes, inputs, outputs, inits=(), opset=17, sparse=()) -> onnx.ModelProto:
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    g.sparse_initializer.extend(sparse)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def vi(name, shape, dtype=T.FLOAT):
    return h.make_tensor_value_info(name, dtype, shape)


def add_to_x(y0: str, nodes, inits=(), n: int = 4) -> onnx.ModelProto:
    """``y = x + y0`` after ``nodes`` (which compute ``y0`` from constants)."""
    return model([*nodes, h.make_node("Add", ["x", y0], ["y"])], [vi("x", [n])],
                 [vi("y", [n])], inits)


def if_external(location: str) -> onnx.ModelProto:
    """The issue's example: an ``If`` whose then-branch holds an external Constant."""
    then = h.make_graph([h.make_node("Constant", [], ["c"], value=external_tensor("k", location))],
                        "then", [], [vi("c", [4])])
    other = h.make_graph([h.make_node("Constant", [], ["d"],
                                      value=nh.from_array(np.zeros(4, np.float32)))],
                         "else", [], [vi("d", [4])])
    return add_to_x("y0", [h.make_node("If", ["cond"], ["y0"], then_branch=then,
                                       else_branch=other)],
                    [nh.from_array(np.array(True), "cond")])


def loop_external(location: str) -> onnx.ModelProto:
    """A ``Loop`` (one iteration) whose body reads an external Constant."""
    body = h.make_graph(
        [h.make_node("Constant", [], ["k"], value=external_tensor("k", location)),
         h.make_node("Identity", ["cond_in"], ["cond_out"]),
         h.make_node("Add", ["v_in", "k"], ["v_out"])],
        "body", [vi("i", [], T.INT64), vi("cond_in", [], T.BOOL), vi("v_in", [4])],
        [vi("cond_out", [], T.BOOL), vi("v_out", [4])])
    return add_to_x("y0", [h.make_node("Loop", ["trip", "cond", "v0"], ["y0"], body=body)],
                    [nh.from_array(np.array(1, np.int64), "trip"),
                     nh.from_array(np.array(True), "cond"),
                     nh.from_array(np.zeros(4, np.float32), "v0")])


def attr_tensors_external(location: str) -> onnx.ModelProto:
    """An external tensor inside a TENSORS attribute (of an otherwise ordinary node)."""
    m = add_to_x("c", [h.make_node("Constant", [], ["c"],
                                   value=nh.from_array(np.ones(4, np.float32)))])
    a = m.graph.node[0].attribute.add()
    a.name, a.type = "extra", onnx.AttributeProto.TENSORS
    a.tensors.append(external_tensor("k", location))
    return m


def sparse_external(location: str) -> onnx.ModelProto:
    """A sparse initializer whose values are external."""
    sp = onnx.SparseTensorProto()
    sp.dims.extend([4])
    sp.values.CopyFrom(external_tensor("s", location, n=1))
    sp.indices.CopyFrom(nh.from_array(np.array([0], np.int64), "s_idx"))
    return model([h.make_node("Add", ["x", "x"], ["y"])], [vi("x", [4])], [vi("y", [4])],
                 sparse=[sp])


def constant_of_shape(shape, then=("ReduceMean",)) -> onnx.ModelProto:
    """The issue's resource bomb: ConstantOfShape(shape) -> ReduceMean -> Add."""
    return model([h.make_node("ConstantOfShape", ["shape"], ["big"],
                              value=nh.from_array(np.array([1.0], np.float32))),
                  h.make_node(then[0], ["big"], ["m"], keepdims=0),
                  h.make_node("Add", ["x", "m"], ["y"])],
                 [vi("x", [1])], [vi("y", [1])],
                 [nh.from_array(np.asarray(shape, np.int64), "shape")])


def conv(n: int, hw: int, c_in: int = 64, c_out: int = 64, k: int = 3, **attrs) -> onnx.ModelProto:
    """``Conv(k x k, c_in -> c_out)`` on an ``[n, c_in, hw, hw]`` input (zero weights)."""
    attrs.setdefault("pads", [k // 2] * 4)
    w = nh.from_array(np.zeros((c_out, c_in, k, k), np.float32), "w")
    return model([h.make_node("Conv", ["x", "w"], ["y"], **attrs)],
                 [vi("x", [n, c_in, hw, hw])], [vi("y", None)], [w])


# --- every tensor-bearing field of the ONNX protobuf, found from its descriptors (issue 28)

TENSOR = onnx.TensorProto.DESCRIPTOR.full_name


def tensor_field_paths(max_repeat: int = 2) -> list[tuple]:
    """Every field path from ``ModelProto`` to a ``TensorProto`` field, each message type at
    most ``max_repeat`` times on a path (graphs nested once in another graph's node, and the
    recursion ends)."""
    def walk(d, path, seen):
        for f in d.fields:
            if f.type != FieldDescriptor.TYPE_MESSAGE:
                continue
            m = f.message_type
            if m.full_name == TENSOR:
                yield (*path, f)
            elif seen.get(m.full_name, 0) < max_repeat:
                yield from walk(m, (*path, f), {**seen, m.full_name: seen.get(m.full_name, 0) + 1})

    d = onnx.ModelProto.DESCRIPTOR
    return list(walk(d, (), {d.full_name: 1}))


def path_label(path) -> str:
    return ".".join(f.name for f in path)


def _child(msg, f, create: bool):
    """The message at field ``f`` of ``msg`` (a new element of a repeated field when creating,
    the last one when reading)."""
    if f.is_repeated:
        items = getattr(msg, f.name)
        return items.add() if create else items[len(items) - 1]
    return getattr(msg, f.name)


def model_with_external_at(path, location: str, **kw) -> onnx.ModelProto:
    """A valid small model (``y = x + x``) plus one external float32 [4] tensor named
    ``probe`` at the field ``path`` (:func:`tensor_field_paths`); ``kw`` as
    :func:`external_tensor`'s."""
    m = model([h.make_node("Add", ["x", "x"], ["y"])], [vi("x", [4])], [vi("y", [4])])
    msg = m
    for f in path[:-1]:
        msg = m.graph if msg is m and f.name == "graph" else _child(msg, f, create=True)
        if "name" in msg.DESCRIPTOR.fields_by_name and not msg.name:
            msg.name = f"probe_{f.name}"
    _child(msg, path[-1], create=True).CopyFrom(external_tensor("probe", location, **kw))
    return m


def tensor_at(m: onnx.ModelProto, path) -> onnx.TensorProto:
    """The tensor :func:`model_with_external_at` put at ``path``."""
    msg = m
    for f in path:
        msg = _child(msg, f, create=False)
    return msg
