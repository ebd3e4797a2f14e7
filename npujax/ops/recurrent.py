"""Recurrent layers: ONNX ``LSTM`` and ``GRU`` (opset 14), run exactly with ``lax.scan``.

Semantics (https://onnx.ai/onnx/operators/onnx__LSTM.html, ``onnx__GRU.html``), per direction,
with ``f`` = sigmoid and ``g`` = ``h`` = tanh (the default activations, the only ones imported):

====  ==========================================================================================
LSTM  gates ``i, o, f, c`` (W, R, B in that order; peepholes ``P`` in the order ``i, o, f``):
      ``i = f(X Wi' + H Ri' + Pi*C + Wbi + Rbi)``, ``f_t = f(X Wf' + H Rf' + Pf*C + Wbf + Rbf)``,
      ``c = g(X Wc' + H Rc' + Wbc + Rbc)``, ``C = f_t*C + i*c``,
      ``o = f(X Wo' + H Ro' + Po*C + Wbo + Rbo)`` (the new ``C``), ``H = o*h(C)``;
      ``input_forget = 1`` couples the gates: ``f_t = 1 - i`` (as onnxruntime computes it).
GRU   gates ``z, r, h``: ``z = f(X Wz' + H Rz' + Wbz + Rbz)``, ``r = f(X Wr' + H Rr' + Wbr + Rbr)``,
      ``linear_before_reset = 0``: ``h~ = g(X Wh' + (r*H) Rh' + Rbh + Wbh)``;
      ``= 1``: ``h~ = g(X Wh' + r*(H Rh' + Rbh) + Wbh)``; ``H = (1 - z)*h~ + z*H``.
====  ==========================================================================================

``direction`` is ``forward``, ``reverse`` (time runs backwards; ``Y`` keeps the input's time
order) or ``bidirectional`` (both, stacked on the ``num_directions`` axis). ``layout = 0``:
``X [seq, batch, input]``, ``Y [seq, dirs, batch, hidden]``, states ``[dirs, batch, hidden]``;
``layout = 1``: ``X [batch, seq, input]``, ``Y [batch, seq, dirs, hidden]``, states
``[batch, dirs, hidden]``. ``sequence_lens`` (int32 ``[batch]``, a constant or a run-time
tensor) stops batch row ``b`` after ``sequence_lens[b]`` steps as onnxruntime does: ``Y`` is 0
past its length, the final states are those of its last valid step (a reverse pass starts at
step ``sequence_lens[b] - 1``), and a row of length 0 has final states 0. Non-default
``activations`` and ``clip`` are refused (never approximated).

Weights are params: ``W [dirs, gates*hidden, input]``, ``R [dirs, gates*hidden, hidden]``,
``B [dirs, 2*gates*hidden]`` (``Wb`` then ``Rb``; absent: zeros) and the LSTM's peepholes
``P [dirs, 3*hidden]``; ``X``, ``sequence_lens``, ``initial_h`` and ``initial_c`` are inputs
(``attrs['operands']`` names which, in order).

Cost: the layer's GEMMs are ``[X_t, H_{t-1}] x [W | R]'`` for every step, ``gates x (input +
hidden) x hidden`` MACs per step, batch row and direction. On the array they are costed as one
GEMM per direction (``groups = dirs``) with ``M = seq x batch``, ``K = input + hidden``,
``N = gates x hidden``: the weights stay stationary while the steps stream through, as on a
weight-stationary array; the recurrence, which makes each step wait for the previous one's
``H``, is not modelled (an optimistic bound: at ``M = batch`` per step the fill and drain of
every step would add latency). On the host CPU it costs ``2 x MACs`` operations, as every GEMM
does; the gate nonlinearities are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from npujax.errors import GraphError, UnsupportedOpError
from npujax.ops.registry import ArrayWork, OpDef, onnx_importer, register

if TYPE_CHECKING:
    from npujax.ir.graph import Node

__all__ = ["GATES"]

#: Gates per recurrent operator (rows of ``W`` and ``R`` per hidden unit).
GATES = {"LSTM": 4, "GRU": 3}
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh")}
_STATES = {"LSTM": ("initial_h", "initial_c"), "GRU": ("initial_h",)}
_OUTPUTS = {"LSTM": ("Y", "Y_h", "Y_c"), "GRU": ("Y", "Y_h")}
_ONNX_INPUTS = {"LSTM": ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
                "GRU": ("X", "W", "R", "B", "sequence_lens", "initial_h")}


def _cell(op: str, a: Mapping[str, Any], r: jax.Array, rb: jax.Array, p: jax.Array | None):
    """The step function ``(state, x_proj) -> (new_state, h)`` of one direction, where
    ``x_proj = X_t W' + Wb`` is computed for all steps at once (``rb``, ``p``: ``[1, n]``)."""

    def lstm(state, xw):
        h, c = state
        gi, go, gf, gc = jnp.split(xw + h @ r.T + rb, 4, axis=-1)
        pi, po, pf = (None, None, None) if p is None else jnp.split(p, 3, axis=-1)
        i = jax.nn.sigmoid(gi if pi is None else gi + pi * c)
        if a["input_forget"]:  # coupled gates: f = 1 - i (onnxruntime)
            f = 1 - i
        else:
            f = jax.nn.sigmoid(gf if pf is None else gf + pf * c)
        c = f * c + i * jnp.tanh(gc)
        o = jax.nn.sigmoid(go if po is None else go + po * c)
        h = o * jnp.tanh(c)
        return (h, c), h

    def gru(state, xw):
        (h,) = state
        xz, xr, xh = jnp.split(xw, 3, axis=-1)
        rz, rr, rh = jnp.split(r, 3, axis=0)
        bz, br, bh = jnp.split(rb, 3, axis=-1)
        z = jax.nn.sigmoid(xz + h @ rz.T + bz)
        rt = jax.nn.sigmoid(xr + h @ rr.T + br)
        if a["linear_before_reset"]:
            hh = jnp.tanh(xh + rt * (h @ rh.T + bh))
        else:
            hh = jnp.tanh(xh + (rt * h) @ rh.T + bh)
        h = (1 - z) * hh + z * h
        return (h,), h

    return lstm if op == "LSTM" else gru


def _recurrent(node: Node, inputs: Sequence[jax.Array], params: Mapping[str, jax.Array]):
    a = node.attrs
    op, hidden, layout = node.op, int(a["hidden_size"]), int(a["layout"])
    got = dict(zip(a["operands"], inputs))
    x = got["X"]
    dtype = x.dtype
    x = x.astype(jnp.float32)
    if layout:
        x = jnp.swapaxes(x, 0, 1)  # -> [seq, batch, input]
    seq, batch, _ = x.shape
    dirs = 2 if a["direction"] == "bidirectional" else 1
    g = GATES[op]
    w, r = params["W"], params["R"]
    b = params.get("B", jnp.zeros((dirs, 2 * g * hidden), jnp.float32))
    states = []
    for s in _STATES[op]:
        v = got.get(s)
        if v is None:
            v = jnp.zeros((dirs, batch, hidden), jnp.float32)
        else:
            v = v.astype(jnp.float32)
            v = jnp.swapaxes(v, 0, 1) if layout else v  # -> [dirs, batch, hidden]
        states.append(v)
    lens = got.get("sequence_lens")
    steps = jnp.arange(seq, dtype=jnp.int32)
    ys, finals = [], []
    for d in range(dirs):
        cell = _cell(op, a, r[d],
                     b[d, None, g * hidden:], params["P"][d, None] if "P" in params else None)
        xw = jnp.einsum("sbi,gi->sbg", x, w[d]) + b[d, None, None, :g * hidden]
        if lens is None:
            step = cell
        else:
            def step(state, inp, cell=cell):
                xw_t, t = inp
                new, h = cell(state, xw_t)
                valid = (t < lens.astype(jnp.int32))[:, None]
                new = tuple(jnp.where(valid, n, o) for n, o in zip(new, state))
                return new, jnp.where(valid, h, jnp.zeros_like(h))
        reverse = a["direction"] == "reverse" or d == 1
        final, y = lax.scan(step, tuple(s[d] for s in states),
                            xw if lens is None else (xw, steps), reverse=reverse)
        if lens is not None:  # a row of length 0 ends in zeros (onnxruntime)
            empty = (lens.astype(jnp.int32) <= 0)[:, None]
            final = tuple(jnp.where(empty, jnp.zeros_like(f), f) for f in final)
        ys.append(y)
        finals.append(final)
    y = jnp.stack(ys, axis=1)  # [seq, dirs, batch, hidden]
    outs = {"Y": jnp.transpose(y, (2, 0, 1, 3)) if layout else y}
    for k, name in enumerate(_OUTPUTS[op][1:]):
        last = jnp.stack([f[k] for f in finals])  # [dirs, batch, hidden]
        outs[name] = jnp.swapaxes(last, 0, 1) if layout else last
    return [outs[k].astype(dtype) for k in a["results"]]


def _work(node: Node, ins: Sequence[tuple[int, ...]], outs: Sequence[tuple[int, ...]],
          align: int) -> ArrayWork:
    """``dirs`` GEMMs of ``[seq*batch, input + hidden] x [input + hidden, gates*hidden]``: the
    layer's MACs exactly, ``gates x (input + hidden) x hidden x seq x dirs x batch`` (module
    docstring)."""
    a = node.attrs
    x = ins[0]
    seq, batch = (x[1], x[0]) if int(a["layout"]) else (x[0], x[1])
    hidden, dirs, g = int(a["hidden_size"]), 2 if a["direction"] == "bidirectional" else 1, \
        GATES[node.op]
    k, n, m = int(x[2]) + hidden, g * hidden, int(seq) * int(batch)
    K, N = -(-k // align) * align, -(-n // align) * align
    return ArrayWork(m, K, N, dirs, dirs * m * k * n, dirs * K * N,
                     dirs * N if "B" in node.params else 0)


def _import(ctx: Any, n: Any, a: Mapping[str, Any]) -> None:
    op = n.op_type
    g = GATES[op]
    where = f"{op} node {ctx.node_name!r}"
    given = {k: t for k, t in zip(_ONNX_INPUTS[op], n.input) if t}
    acts = tuple(v.decode() if isinstance(v, bytes) else str(v)
                 for v in a.get("activations", ()))
    direction = a.get("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise GraphError(f"{where}: direction={direction!r}; ONNX {op} takes 'forward', "
                         "'reverse' or 'bidirectional'.")
    dirs = 2 if direction == "bidirectional" else 1
    default = _DEFAULT_ACTIVATIONS[op]
    if acts and tuple(v.lower() for v in acts) != tuple(v.lower() for v in default * dirs):
        raise UnsupportedOpError(
            f"{where} has activations={list(acts)}; npujax imports {op} only with the default "
            f"activations {list(default * dirs)} (others are refused, not approximated).")
    if "clip" in a:
        raise UnsupportedOpError(f"{where} has clip={a['clip']}; npujax imports {op} only "
                                 "without a cell clip.")
    layout = int(a.get("layout", 0))
    if layout not in (0, 1):
        raise GraphError(f"{where}: layout={layout}; ONNX {op} takes 0 or 1.")
    w = ctx.const(given["W"], "weight W").astype(np.float32)
    r = ctx.const(given["R"], "recurrence weight R").astype(np.float32)
    x_shape = ctx.shape(given["X"])
    if len(x_shape) != 3 or w.ndim != 3 or r.ndim != 3:
        raise GraphError(f"{where}: X, W and R must be 3-D, got {list(x_shape)}, "
                         f"{list(w.shape)}, {list(r.shape)}.")
    hidden = int(a.get("hidden_size", r.shape[-1]))
    seq, batch = (x_shape[1], x_shape[0]) if layout else (x_shape[0], x_shape[1])
    shapes = {"W": (dirs, g * hidden, x_shape[2]), "R": (dirs, g * hidden, hidden),
              "B": (dirs, 2 * g * hidden), "P": (dirs, 3 * hidden)}
    params = {"W": w, "R": r}
    for k in ("B", "P"):
        if k in given:
            params[k] = ctx.const(given[k], f"input {k}").astype(np.float32)
    for k, v in params.items():
        if tuple(v.shape) != shapes[k]:
            raise GraphError(f"{where}: {k} has shape {list(v.shape)}; with hidden_size "
                             f"{hidden}, direction {direction!r} and input size {x_shape[2]} "
                             f"it must be {list(shapes[k])}.")
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    for k in _STATES[op]:
        if k in given and tuple(ctx.shape(given[k])) != state:
            raise GraphError(f"{where}: {k} has shape {list(ctx.shape(given[k]))}; it must be "
                             f"{list(state)} (layout {layout}).")
    if "sequence_lens" in given:
        if tuple(ctx.shape(given["sequence_lens"])) != (batch,):
            raise GraphError(f"{where}: sequence_lens has shape "
                             f"{list(ctx.shape(given['sequence_lens']))}; it must be [{batch}].")
        lens = ctx.consts.get(given["sequence_lens"])
        if lens is not None and (np.any(lens < 0) or np.any(lens > seq)):
            raise GraphError(f"{where}: sequence_lens {lens.tolist()} must lie in "
                             f"[0, {seq}] (the sequence length).")
    operands = [k for k in ("X", "sequence_lens", *_STATES[op]) if k in given]
    results = [k for k, t in zip(_OUTPUTS[op], n.output) if t]
    ctx.emit(op, [given[k] for k in operands], [t for t in n.output if t], {
        "hidden_size": hidden, "direction": direction, "layout": layout,
        "linear_before_reset": int(a.get("linear_before_reset", 0)) if op == "GRU" else 0,
        "input_forget": int(a.get("input_forget", 0)) if op == "LSTM" else 0,
        "operands": operands, "results": results,
    }, params)


def _export(w: Any, node: Node) -> None:
    a = node.attrs
    op = node.op
    given = dict(zip(a["operands"], node.inputs))
    given.update({k: w.init(f"{node.name}.{k}", w.param(node, k))
                  for k in ("W", "R", "B", "P") if k in node.params})
    names = list(_ONNX_INPUTS[op])
    last = max(i for i, k in enumerate(names) if k in given)
    outs = dict(zip(a["results"], node.outputs))
    extra = ({"linear_before_reset": int(a["linear_before_reset"])} if op == "GRU"
             else {"input_forget": int(a["input_forget"])})
    w.add(op, [given.get(k, "") for k in names[:last + 1]],
          [outs.get(k, "") for k in _OUTPUTS[op]][:max(_OUTPUTS[op].index(k)
                                                      for k in a["results"]) + 1],
          node.name, hidden_size=int(a["hidden_size"]), direction=a["direction"],
          layout=int(a["layout"]), **extra)


for _op in GATES:
    register(OpDef(name=_op, run=_recurrent, cost="array", export=_export, array_work=_work,
                   integers=True))  # (sequence_lens, int32, is only compared: exact)
    onnx_importer(_op, weights=True)(_import)
