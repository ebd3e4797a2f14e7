"""Small graphs for the PTQ method tests, built node by node (no Flax tracing: fast)."""

import numpy as np

from npujax.ir.graph import Graph, Node, TensorType

F32 = "float32"


def conv(name, x, y, k, cin, cout, *, groups=1, pad=1, relu=True):
    """An NHWC/HWIO stride-1 Conv node with bias, ``k x k``, padding ``pad``."""
    return Node(name, "Conv", (x,), (y,), {
        "data_layout": "NHWC", "kernel_layout": "HWIO", "strides": [1, 1],
        "padding": [[pad, pad], [pad, pad]], "dilations": [1, 1], "lhs_dilation": [1, 1],
        "groups": groups, "kernel_shape": [k, k, cin // groups, cout],
        **({"epilogue": ("Relu",)} if relu else {})}, ("kernel", "bias"))


def gemm(name, x, y, *, relu=False):
    return Node(name, "Gemm", (x,), (y,), {"epilogue": ("Relu",)} if relu else {},
                ("kernel", "bias"))


def separable_net(rng, hw=8):
    """conv 3x3 (3->8) -> ReLU -> depthwise 3x3 -> ReLU -> pointwise 1x1 (8->16) -> ReLU ->
    spatial mean -> dense (16->10): a MobileNet block. Returns ``(graph, params)``."""
    b = 1
    nodes = (conv("c1", "x", "t1", 3, 3, 8), conv("dw", "t1", "t2", 3, 8, 8, groups=8),
             conv("pw", "t2", "t3", 1, 8, 16, pad=0),
             Node("pool", "ReduceMean", ("t3",), ("t4",), {"axes": [1, 2], "keepdims": False}),
             gemm("fc", "t4", "y"))
    tensors = {"x": TensorType((b, hw, hw, 3), F32), "t1": TensorType((b, hw, hw, 8), F32),
               "t2": TensorType((b, hw, hw, 8), F32), "t3": TensorType((b, hw, hw, 16), F32),
               "t4": TensorType((b, 16), F32), "y": TensorType((b, 10), F32)}
    g = Graph(nodes, ("x",), ("y",), tensors)

    def w(*shape):
        fan_in = int(np.prod(shape[:-1]))
        return (rng.normal(size=shape) / np.sqrt(fan_in)).astype(np.float32)

    params = {"c1": {"kernel": w(3, 3, 3, 8), "bias": np.zeros(8, np.float32)},
              "dw": {"kernel": w(3, 3, 1, 8), "bias": np.zeros(8, np.float32)},
              "pw": {"kernel": w(1, 1, 8, 16), "bias": np.zeros(16, np.float32)},
              "fc": {"kernel": w(16, 10), "bias": np.zeros(10, np.float32)}}
    return g, params


def mlp_block(rng, d=16, hidden=32, tokens=4):
    """Pre-norm transformer MLP: ``x + fc2(gelu(fc1(LayerNorm(x))))``."""
    nodes = (Node("ln", "LayerNormalization", ("x",), ("h",), {"epsilon": 1e-6, "axis": -1},
                  ("scale", "bias")),
             gemm("fc1", "h", "u"), Node("gelu", "Gelu", ("u",), ("v",), {"approximate": "tanh"}),
             gemm("fc2", "v", "r"), Node("add", "Add", ("x", "r"), ("y",)))
    t = {n: TensorType((1, tokens, d), F32) for n in ("x", "h", "r", "y")}
    t.update({n: TensorType((1, tokens, hidden), F32) for n in ("u", "v")})
    params = {"ln": {"scale": (1 + 0.1 * rng.normal(size=d)).astype(np.float32),
                     "bias": (0.1 * rng.normal(size=d)).astype(np.float32)},
              "fc1": {"kernel": (rng.normal(size=(d, hidden)) / np.sqrt(d)).astype(np.float32),
                      "bias": np.zeros(hidden, np.float32)},
              "fc2": {"kernel": (rng.normal(size=(hidden, d)) / np.sqrt(hidden)).astype(
                  np.float32), "bias": np.zeros(d, np.float32)}}
    return Graph(nodes, ("x",), ("y",), t), params


def linear(k, n, *, relu=False):
    """One Gemm layer ``[batch, k] -> [batch, n]``."""
    g = Graph((gemm("fc", "x", "y", relu=relu),), ("x",), ("y",),
              {"x": TensorType((1, k), F32), "y": TensorType((1, n), F32)})
    return g


def correlated_inputs(rng, n, k):
    """``n`` inputs with correlated features and an offset (isotropic inputs would make
    rounding to nearest optimal for a layer's output error)."""
    return ((rng.normal(size=(n, k)) @ rng.normal(size=(k, k))) / np.sqrt(k) + 0.5).astype(
        np.float32)


def se_residual_net(rng, hw=6, *, folded=True):
    """conv 3x3 (3->8) -> squeeze-excitation (spatial mean, 1x1 8->8, Sigmoid, Mul) -> two
    parallel convs (3x3, 1x1) added -> + the first conv's output (residual) ->
    spatial mean -> Reshape to ``[1, 8]`` (``folded``: the batch folded, as a PaddlePaddle
    export, so the executor runs a batch per example) or ``[0, 8]`` -> dense (8->5). Returns
    ``(graph, params)``."""
    b = 1
    nodes = (conv("c1", "x", "t1", 3, 3, 8),
             Node("sq", "ReduceMean", ("t1",), ("g",), {"axes": [1, 2], "keepdims": True}),
             conv("se", "g", "g2", 1, 8, 8, pad=0, relu=False),
             Node("sig", "Sigmoid", ("g2",), ("g3",)), Node("ex", "Mul", ("t1", "g3"), ("t2",)),
             conv("a", "t2", "ta", 3, 8, 8), conv("b", "t2", "tb", 1, 8, 8, pad=0, relu=False),
             Node("ab", "Add", ("ta", "tb"), ("t3",)), Node("res", "Add", ("t3", "t1"), ("t4",)),
             Node("pool", "ReduceMean", ("t4",), ("t5",), {"axes": [1, 2], "keepdims": True}),
             Node("flat", "Reshape", ("t5",), ("t6",), {"shape": [1 if folded else 0, 8]}),
             gemm("fc", "t6", "y"))
    tensors = {"x": TensorType((b, hw, hw, 3), F32), "g": TensorType((b, 1, 1, 8), F32),
               "t5": TensorType((b, 1, 1, 8), F32),
               "t6": TensorType((b, 8), F32), "y": TensorType((b, 5), F32)}
    tensors.update({t: TensorType((b, 1, 1, 8), F32) for t in ("g2", "g3")})
    tensors.update({t: TensorType((b, hw, hw, 8), F32) for t in ("t1", "t2", "ta", "tb", "t3",
                                                                   "t4")})
    shapes = {"c1": (3, 3, 3, 8), "se": (1, 1, 8, 8), "a": (3, 3, 8, 8),
              "b": (1, 1, 8, 8), "fc": (8, 5)}
    params = {n: {"kernel": (rng.normal(size=s) / np.sqrt(np.prod(s[:-1]))).astype(np.float32),
                  "bias": (0.1 * rng.normal(size=s[-1])).astype(np.float32)}
              for n, s in shapes.items()}
    return Graph(nodes, ("x",), ("y",), tensors), params
