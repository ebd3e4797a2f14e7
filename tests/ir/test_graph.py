"""``Graph``'s lookups (node, producer, consumers) answer from an index built once per graph,
as the scans of its nodes did."""

import pytest

from npujax.errors import GraphError
from npujax.ir.graph import Graph, Node, TensorType


def test_lookups_answer_as_scans_of_the_nodes():
    t = TensorType((1, 4), "float32")
    nodes = (Node("a", "Relu", ("x",), ("y",)),
             Node("b", "Add", ("y", "y"), ("z",)),  # reads y twice: listed once
             Node("c", "Mul", ("x", "z"), ("w",)))
    g = Graph(nodes, ("x",), ("w",), {k: t for k in "xyzw"})
    for tensor in "xyzw":
        assert g.producer(tensor) is next((n for n in nodes if tensor in n.outputs), None)
        assert g.consumers(tensor) == [n for n in nodes if tensor in n.inputs]
    assert g.consumers("y") == [nodes[1]] and g.consumers("w") == []
    g.consumers("x").clear()  # a caller's list, not the index's
    assert [n.name for n in g.consumers("x")] == ["a", "c"]
    assert g.node("b") is nodes[1]
    with pytest.raises(GraphError, match="no node named 'd'"):
        g.node("d")
    # a replaced graph answers for its own nodes
    h = g.replace(nodes=nodes[:1], outputs=("y",))
    assert h.consumers("y") == [] and g.consumers("y") == [nodes[1]]
