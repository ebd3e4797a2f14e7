"""Run a Graph as a pure JAX function, in float or with fake-quant weights and activations.

``execute(graph, params, x, quant=..., qstate=...)`` is jit-able, differentiable (w.r.t. params,
qstate and the search's bit probabilities) and vmap-able: the Python loop over nodes unrolls at
trace time, so one jitted call runs the whole model.

Quantization is placed as on an integer NPU: for each GEMM node (Conv, Gemm) named in ``quant``,
the input activation is fake-quantized per tensor with the calibrated ``qstate`` scale and zero
point, and the kernel is fake-quantized per output channel with a symmetric min-max scale computed
from the current weights (so QAT sees the grid that conversion will use).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from npujax.errors import ConfigError, ShapeError
from npujax.graph.ir import Graph, Params
from npujax.graph.ops import out_channel_view, run_op
from npujax.quant import IntFormat, fake_quant, weight_qparams

__all__ = ["LayerQuant", "QuantSpec", "quant_spec", "execute", "quantize_weight"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerQuant:
    """How one GEMM node is quantized.

    Attributes:
      weight: weight format; a tuple of formats means a differentiable mixture over candidates
        (mixed-precision search), weighted by ``bit_probs[node]``; None keeps float weights.
      act: input-activation format (per tensor, calibrated); None keeps float inputs.
      weight_per_channel: per-output-channel weight scales (else one per tensor).
      act_symmetric: symmetric activation range (zero point at mid-code) instead of asymmetric.
      stochastic_rounding: round weights and activations stochastically (``floor(v + u)``, see
        :func:`npujax.quant.fake_quant`) when :func:`execute` is given a ``key`` (QAT); without
        a key (evaluation, deployment) rounding is to nearest, ties to even.
    """

    weight: IntFormat | tuple[IntFormat, ...] | None = None
    act: IntFormat | None = None
    weight_per_channel: bool = True
    act_symmetric: bool = False
    stochastic_rounding: bool = False

    @property
    def weight_candidates(self) -> tuple[IntFormat, ...]:
        """The weight format(s) as a tuple (empty for float weights)."""
        if self.weight is None:
            return ()
        return self.weight if isinstance(self.weight, tuple) else (self.weight,)


#: ``{node_name: LayerQuant}``; static configuration (closed over, not traced).
QuantSpec = Mapping[str, LayerQuant]


def quant_spec(
    graph: Graph,
    weight_bits: int | Mapping[str, int | Sequence[int]] = 8,
    act_bits: int | Mapping[str, int] = 8,
) -> dict[str, LayerQuant]:
    """The standard integer-NPU scheme for every GEMM node of ``graph``.

    Weights: signed, narrow-range (``[-2^(b-1)+1, 2^(b-1)-1]``), symmetric, per output channel.
    Activations: unsigned, asymmetric, per tensor.

    Args:
      graph: the graph whose Conv/Gemm nodes are quantized.
      weight_bits: one width for all layers, or ``{node: bits}``; a sequence of widths makes that
        layer a search mixture over the candidates.
      act_bits: one width for all layers, or ``{node: bits}``.

    Returns:
      ``{node_name: LayerQuant}`` for every GEMM node.

    Raises:
      ConfigError: if a mapping names a node that is not a GEMM node of the graph, or misses one.
    """
    names = [n.name for n in graph.gemm_nodes]

    def per_layer(v, what):
        if isinstance(v, Mapping):
            unknown = set(v) - set(names)
            missing = set(names) - set(v)
            if unknown or missing:
                raise ConfigError(
                    f"{what} mapping must name exactly the GEMM layers {names}; "
                    f"unknown: {sorted(unknown)}, missing: {sorted(missing)}."
                )
            return dict(v)
        return {n: v for n in names}

    wb, ab = per_layer(weight_bits, "weight_bits"), per_layer(act_bits, "act_bits")
    spec = {}
    for n in names:
        w = wb[n]
        wfmt = (
            tuple(IntFormat(int(b), narrow_range=True) for b in w)
            if isinstance(w, Sequence)
            else IntFormat(int(w), narrow_range=True)
        )
        spec[n] = LayerQuant(weight=wfmt, act=IntFormat(int(ab[n]), signed=False))
    return spec


def quantize_weight(
    w: jax.Array, fmt: IntFormat, axis: int | None, key: jax.Array | None = None
) -> jax.Array:
    """Fake-quantize a weight tensor with a symmetric min-max scale (per channel on ``axis``);
    ``key`` selects stochastic rounding."""
    scale, zero_point = weight_qparams(w, fmt, axis)
    return fake_quant(w, scale, zero_point, fmt, axis, key=key)


def _as_inputs(graph: Graph, x: jax.Array | Sequence[jax.Array]) -> list[jax.Array]:
    xs = list(x) if isinstance(x, (list, tuple)) else [x]
    if len(xs) != len(graph.inputs):
        raise ShapeError(f"graph has {len(graph.inputs)} inputs {graph.inputs}, got {len(xs)}.")
    for name, v in zip(graph.inputs, xs):
        want = graph.tensors[name].shape
        if jnp.ndim(v) != len(want) or tuple(jnp.shape(v)[1:]) != tuple(want[1:]):
            raise ShapeError(
                f"input {name!r} must have shape (batch, {', '.join(map(str, want[1:]))}), "
                f"got {tuple(jnp.shape(v))}."
            )
    return [jnp.asarray(v, jnp.float32) for v in xs]


def execute(
    graph: Graph,
    params: Params,
    x: jax.Array | Sequence[jax.Array],
    *,
    quant: QuantSpec | None = None,
    qstate: Mapping[str, Mapping[str, jax.Array]] | None = None,
    bit_probs: Mapping[str, jax.Array] | None = None,
    taps: Collection[str] = (),
    input_offsets: Mapping[str, jax.Array] | None = None,
    key: jax.Array | None = None,
) -> Any:
    """Evaluate ``graph`` on ``x``.

    Args:
      graph: the model graph (static; close over it when jitting).
      params: ``{node_name: {role: float32 array}}``.
      x: input batch, or a sequence of them for multi-input graphs; shape ``(batch, ...)`` with the
        non-batch dimensions the graph was built with; float32.
      quant: which GEMM nodes are quantized and how (see :func:`quant_spec`); None runs in float.
      qstate: ``{node: {"act_scale": f32[], "act_zero_point": i32[]}}`` from calibration; needed
        for every node whose :class:`LayerQuant` has an ``act`` format.
      bit_probs: ``{node: f32[len(candidates)]}`` mixture weights for nodes whose weight is a
        tuple of candidate formats (probabilities, e.g. a softmax over learned logits).
      taps: node names whose first input and first output should also be returned.
      input_offsets: ``{node: array}`` added to a node's first input before quantization (zeros
        give the gradient of the output w.r.t. that activation, as sensitivity analysis needs).
      key: a ``jax.random`` key for the layers with ``stochastic_rounding`` (one key per call,
        e.g. per training step; folded with the node index); None rounds to nearest.

    Returns:
      The graph output (a tuple if it has several). With ``taps``, a pair
      ``(output, {node: (input, output)})``.

    Raises:
      ShapeError: if ``x`` does not match the graph's input shapes.
      ConfigError: if ``qstate`` or ``bit_probs`` lacks an entry a quantized node needs.
      UnsupportedOpError: if a node's operator has no implementation.
    """
    env: dict[str, jax.Array] = {k: jnp.asarray(v) for k, v in graph.constants.items()}
    env.update(zip(graph.inputs, _as_inputs(graph, x)))
    quant = quant or {}
    tapped: dict[str, tuple[jax.Array, jax.Array]] = {}
    for index, node in enumerate(graph.nodes):
        ins = [env[t] for t in node.inputs]
        p = dict(params.get(node.name, {}))
        if input_offsets and node.name in input_offsets:
            ins[0] = ins[0] + input_offsets[node.name]
        lq = quant.get(node.name)
        if lq is not None:
            ka = kw = None
            if key is not None and lq.stochastic_rounding:
                ka, kw = jax.random.split(jax.random.fold_in(key, index))
            ins[0] = _quantize_input(node.name, lq, ins[0], qstate, ka)
            p["kernel"] = _quantize_kernel(node, lq, p["kernel"], bit_probs, kw)
        outs = run_op(node, ins, p)
        env.update(zip(node.outputs, outs))
        if node.name in taps:
            tapped[node.name] = (ins[0], outs[0])
    result = tuple(env[t] for t in graph.outputs)
    result = result[0] if len(result) == 1 else result
    return (result, tapped) if taps else result


def _quantize_input(name: str, lq: LayerQuant, x: jax.Array, qstate, key=None) -> jax.Array:
    if lq.act is None:
        return x
    if qstate is None or name not in qstate:
        raise ConfigError(
            f"layer {name!r} quantizes its input activation but qstate has no entry for it; "
            "run calibration first (npujax.graph.calibrate) and pass its result as qstate."
        )
    s = qstate[name]
    return fake_quant(x, s["act_scale"], s["act_zero_point"], lq.act, key=key)


def _quantize_kernel(node, lq: LayerQuant, w: jax.Array, bit_probs, key=None) -> jax.Array:
    fmts = lq.weight_candidates
    if not fmts:
        return w
    axis, back = None, lambda v: v
    if lq.weight_per_channel:  # one scale per output channel (a grouped ConvTranspose: a view)
        w, axis, back = out_channel_view(node, w)
    if len(fmts) == 1:
        return back(quantize_weight(w, fmts[0], axis, key))
    if bit_probs is None or node.name not in bit_probs:
        raise ConfigError(
            f"layer {node.name!r} has {len(fmts)} candidate weight formats but bit_probs has no "
            "entry for it; pass bit_probs={node: probabilities} or a single format."
        )
    probs = bit_probs[node.name]
    return back(sum(probs[i] * quantize_weight(w, f, axis) for i, f in enumerate(fmts)))
