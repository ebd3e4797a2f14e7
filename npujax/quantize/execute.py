"""Run a Graph as a pure JAX function, in float or with fake-quant weights and activations.

``execute(graph, params, x, quant=..., qstate=...)`` is jit-able, differentiable (w.r.t. params,
qstate and the search's bit probabilities) and vmap-able: the Python loop over nodes unrolls at
trace time, so one jitted call runs the whole model.

Quantization is placed as on an integer NPU: for each GEMM node (Conv, Gemm) named in ``quant``,
the input activation is fake-quantized per tensor with the calibrated ``qstate`` scale and zero
point, and the kernel is fake-quantized per output channel with a symmetric min-max scale computed
from the current weights (so QAT sees the grid that conversion will use).

Variants, chosen per layer by :class:`LayerQuant`:

* FP8 (``FloatFormat`` E4M3FN / E5M2, Micikevicius et al. 2022, arXiv:2209.05433): the same
  placement, with scale ``amax / fmt.max`` (activation: calibrated, per tensor; weight: per
  output channel) and zero point 0.
* per-block weights (``weight_block_size=B``): one symmetric min-max scale per block of ``B``
  consecutive input channels (and per position on every other kernel axis), as ONNX
  QuantizeLinear/DequantizeLinear opset 21 blocked quantization.
* LSQ / LSQ+ (``method="lsq"`` / ``"lsq+"``; Esser et al. 2020, arXiv:1902.08153; Bhalgat et al.
  2020, arXiv:2004.09576): the activation step (``qstate[node]["act_scale"]``), for LSQ+ the
  activation offset (``"act_offset"``), and the weight step (``"weight_step"``, per output
  channel) are learned qstate entries, applied with :func:`npujax.quant.lsq_fake_quant`; see
  :mod:`npujax.quantize.learned_steps`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from npujax.errors import ConfigError, ShapeError
from npujax.ir.graph import Graph, Params
from npujax.ops import gemm_nodes, kernel_in_axis, kernel_out_axis, out_channel_view, run_op
from npujax.quant import (
    FP8_E4M3FN,
    FP8_E5M2,
    MIN_SCALE,
    FloatFormat,
    Format,
    IntFormat,
    fake_quant,
    lsq_fake_quant,
    weight_qparams,
)

__all__ = ["LayerQuant", "QuantSpec", "quant_spec", "execute", "quantize_weight", "METHODS",
           "FORMATS"]

#: Quantizers of :class:`LayerQuant.method`.
METHODS = ("ste", "lsq", "lsq+")
#: Format names accepted by :func:`quant_spec` (``"int"``: the integer width given in bits).
FORMATS = {"int": None, "fp8_e4m3fn": FP8_E4M3FN, "fp8_e5m2": FP8_E5M2}


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerQuant:
    """How one GEMM node is quantized.

    Attributes:
      weight: weight format (:class:`IntFormat` or FP8 :class:`FloatFormat`); a tuple of formats
        means a differentiable mixture over candidates (mixed-precision search), weighted by
        ``bit_probs[node]``; None keeps float weights.
      act: input-activation format (per tensor, calibrated; integer or FP8); None keeps float
        inputs.
      weight_per_channel: per-output-channel weight scales (else one per tensor).
      act_symmetric: symmetric activation range (zero point at mid-code) instead of asymmetric.
      stochastic_rounding: round weights and activations stochastically (``floor(v + u)``, see
        :func:`npujax.quant.fake_quant`) when :func:`execute` is given a ``key`` (QAT); without
        a key (evaluation, deployment) rounding is to nearest, ties to even. Integer STE only.
      method: ``"ste"`` (min-max weight scale recomputed from the weights, calibrated activation
        scale; straight-through gradient), ``"lsq"`` (learned activation and weight steps,
        Esser et al. 2020) or ``"lsq+"`` (LSQ plus a learned activation offset, Bhalgat et al.
        2020). LSQ needs integer formats, a single weight format and no per-block weights.
      weight_block_size: per-block weight scales over blocks of this many input channels (ONNX
        opset-21 blocked quantization); None for per-channel/per-tensor.
      act_candidates: integer activation formats of a differentiable search mixture: the input
        is ``sum_j act_probs[node][j] * fake_quant(x, grid_j)`` with the per-candidate grids
        ``qstate[node]["act_scales"/"act_zero_points"]`` that :func:`npujax.quantize.calibrate`
        computes over one range; ``act`` must be the widest of them (it is what calibration
        and a non-search run use). Empty: no mixture.

    Raises:
      ConfigError: an unknown ``method``, LSQ with an FP8 format, a mixture, per-block weights
        or stochastic rounding; stochastic rounding with FP8; a ``weight_block_size`` that is
        not a positive int; ``act_candidates`` that are not integer formats with ``act`` the
        widest, or combined with LSQ.
    """

    weight: Format | tuple[Format, ...] | None = None
    act: Format | None = None
    weight_per_channel: bool = True
    act_symmetric: bool = False
    stochastic_rounding: bool = False
    method: str = "ste"
    weight_block_size: int | None = None
    act_candidates: tuple[IntFormat, ...] = ()

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"LayerQuant.method must be one of {METHODS}, got {self.method!r}.")
        if self.act_candidates:
            ok = all(isinstance(f, IntFormat) for f in self.act_candidates)
            if not ok or not isinstance(self.act, IntFormat) or self.act != max(
                    self.act_candidates, key=lambda f: f.bits) or self.method != "ste":
                raise ConfigError("act_candidates must be integer formats, act the widest of "
                                  f"them, and method 'ste'; got act={self.act}, candidates="
                                  f"{self.act_candidates}, method={self.method!r}.")
        b = self.weight_block_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise ConfigError(f"LayerQuant.weight_block_size must be a positive int or None, "
                              f"got {b!r}.")
        if b is not None and len(self.weight_candidates) > 1:
            raise ConfigError("per-block weights (weight_block_size) need a single weight "
                              "format, not a search mixture; fix the width first.")
        fp8 = [f for f in (*self.weight_candidates, self.act) if isinstance(f, FloatFormat)]
        if fp8 and self.stochastic_rounding:
            raise ConfigError(f"stochastic_rounding is for integer formats, got {fp8[0]}; "
                              "set stochastic_rounding=False for FP8 layers.")
        if self.method != "ste":
            why = ("an FP8 format" if fp8 else "a weight-format mixture"
                   if len(self.weight_candidates) > 1 else "per-block weights"
                   if b is not None else "stochastic rounding" if self.stochastic_rounding
                   else None)
            if why:
                raise ConfigError(f"method={self.method!r} learns an integer grid per tensor/"
                                  f"channel and does not support {why}; use method='ste' for "
                                  "this layer.")

    @property
    def weight_candidates(self) -> tuple[Format, ...]:
        """The weight format(s) as a tuple (empty for float weights)."""
        if self.weight is None:
            return ()
        return self.weight if isinstance(self.weight, tuple) else (self.weight,)


#: ``{node_name: LayerQuant}``; static configuration (closed over, not traced).
QuantSpec = Mapping[str, LayerQuant]


def quant_spec(
    graph: Graph,
    weight_bits: int | Mapping[str, int | Sequence[int]] = 8,
    act_bits: int | Mapping[str, int | Sequence[int]] = 8,
    *,
    method: str = "ste",
    weight_format: str = "int",
    act_format: str = "int",
    weight_block_size: int | None = None,
) -> dict[str, LayerQuant]:
    """The standard integer-NPU scheme for every GEMM node of ``graph``.

    Weights: signed, narrow-range (``[-2^(b-1)+1, 2^(b-1)-1]``), symmetric, per output channel.
    Activations: unsigned, asymmetric, per tensor. FP8 formats replace the integer ones where
    asked (symmetric, zero point 0; the widths are then unused).

    Args:
      graph: the graph whose Conv/Gemm nodes are quantized.
      weight_bits: one width for all layers, or ``{node: bits}``; a sequence of widths makes that
        layer a search mixture over the candidates.
      act_bits: one width for all layers, or ``{node: bits}``; a sequence of widths makes that
        layer's input a search mixture (:attr:`LayerQuant.act_candidates`, weighted by
        ``act_probs``).
      method: ``"ste"``, ``"lsq"`` or ``"lsq+"`` (see :class:`LayerQuant`).
      weight_format, act_format: ``"int"``, ``"fp8_e4m3fn"`` or ``"fp8_e5m2"``.
      weight_block_size: per-block weight scales over this many input channels, or None.

    Returns:
      ``{node_name: LayerQuant}`` for every GEMM node.

    Raises:
      ConfigError: if a mapping names a node that is not a GEMM node of the graph, or misses
        one; an unknown format name; an invalid combination (see :class:`LayerQuant`).

    Example:
      >>> spec = quant_spec(graph, 4, 4, method="lsq")                       # doctest: +SKIP
      >>> spec = quant_spec(graph, weight_format="fp8_e4m3fn", act_format="fp8_e4m3fn")
    """
    for what, f in (("weight_format", weight_format), ("act_format", act_format)):
        if f not in FORMATS:
            raise ConfigError(f"{what} must be one of {list(FORMATS)}, got {f!r}.")
    names = [n.name for n in gemm_nodes(graph)]

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
        a = ab[n]
        acands = (tuple(IntFormat(int(b), signed=False) for b in sorted(a))
                  if isinstance(a, Sequence) else ())
        afmt = FORMATS[act_format] or (acands[-1] if acands else IntFormat(int(a), signed=False))
        spec[n] = LayerQuant(weight=FORMATS[weight_format] or wfmt, act=afmt, method=method,
                             weight_block_size=weight_block_size,
                             act_candidates=acands if len(acands) > 1 else ())
    return spec


def quantize_weight(
    w: jax.Array, fmt: Format, axis: int | None, key: jax.Array | None = None,
    *, block_size: int | None = None,
) -> jax.Array:
    """Fake-quantize a weight tensor with a symmetric min-max scale (per channel on ``axis``, or
    per block of ``block_size`` along ``axis``); ``key`` selects stochastic rounding."""
    scale, zero_point = weight_qparams(w, fmt, axis, block_size=block_size)
    return fake_quant(w, scale, zero_point, fmt, axis, block_size=block_size, key=key)


def layer_weight_qparams(
    node, lq: LayerQuant, w: jax.Array, state: Mapping[str, jax.Array] | None = None,
    *, out_axis: int | None = None, in_axis: int | None = None,
) -> tuple[jax.Array, jax.Array, int | None, int | None]:
    """The weight grid a layer deploys with: ``(scale, zero_point, axis, block_size)``.

    Per block: min-max scales over ``weight_block_size`` input channels (axis ``in_axis``).
    LSQ layers with a ``"weight_step"`` in ``state``: the learned step (clamped to at least
    :data:`~npujax.quant.MIN_SCALE`, as :func:`~npujax.quant.lsq_fake_quant` uses it), zero
    point 0. Otherwise the symmetric min-max scale per output channel (``out_axis``) or tensor.
    ``out_axis``/``in_axis`` default to the node's kernel layout (pass them for a transposed
    kernel). Scales float32, zero points int32.
    """
    (fmt,) = lq.weight_candidates
    out_axis = kernel_out_axis(node) if out_axis is None else out_axis
    in_axis = kernel_in_axis(node) if in_axis is None else in_axis
    if lq.weight_block_size is not None:
        s, z = weight_qparams(w, fmt, in_axis, block_size=lq.weight_block_size)
        return s, z, in_axis, lq.weight_block_size
    axis = out_axis if lq.weight_per_channel else None
    if lq.method != "ste" and state is not None and "weight_step" in state:
        s = jnp.maximum(jnp.asarray(state["weight_step"], jnp.float32), MIN_SCALE)
        return s, jnp.zeros(s.shape, jnp.int32), axis, None
    s, z = weight_qparams(w, fmt, axis)
    return s, z, axis, None


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
    act_probs: Mapping[str, jax.Array] | None = None,
) -> Any:
    """Evaluate ``graph`` on ``x``.

    Args:
      graph: the model graph (static; close over it when jitting).
      params: ``{node_name: {role: float32 array}}``.
      x: input batch, or a sequence of them for multi-input graphs; shape ``(batch, ...)`` with the
        non-batch dimensions the graph was built with; float32.
      quant: which GEMM nodes are quantized and how (see :func:`quant_spec`); None runs in float.
      qstate: ``{node: {"act_scale": f32[], "act_zero_point": i32[]}}`` from calibration; needed
        for every node whose :class:`LayerQuant` has an ``act`` format. LSQ layers also read
        ``"weight_step"`` (f32 ``[C_out]`` or scalar) and, for LSQ+, ``"act_offset"`` (f32[]);
        these entries are differentiable.
      bit_probs: ``{node: f32[len(candidates)]}`` mixture weights for nodes whose weight is a
        tuple of candidate formats (probabilities, e.g. a softmax over learned logits).
      taps: node names whose first input and first output should also be returned.
      input_offsets: ``{node: array}`` added to a node's first input before quantization (zeros
        give the gradient of the output w.r.t. that activation, as sensitivity analysis needs).
      key: a ``jax.random`` key for the layers with ``stochastic_rounding`` (one key per call,
        e.g. per training step; folded with the node index); None rounds to nearest.
      act_probs: ``{node: f32[len(act_candidates)]}`` mixture weights for nodes whose
        :class:`LayerQuant` has ``act_candidates``.

    Returns:
      The graph output (a tuple if it has several). With ``taps``, a pair
      ``(output, {node: (input, output)})``.

    A graph imported at batch 1 whose shapes fold the batch size (e.g. a classifier head written
    ``x.reshape(x.shape[0], -1)``) runs a larger batch by mapping over its examples with
    ``jax.vmap``: same numbers as one call per example, one compiled program.

    Raises:
      ShapeError: if ``x`` does not match the graph's input shapes.
      ConfigError: if ``qstate`` or ``bit_probs`` lacks an entry a quantized node needs.
      UnsupportedOpError: if a node's operator has no implementation.
    """
    xs = _as_inputs(graph, x)
    if xs and xs[0].shape[0] != 1 and _batch_folded(graph):
        return _execute_per_example(graph, params, xs, quant=quant, qstate=qstate,
                                    bit_probs=bit_probs, taps=taps, input_offsets=input_offsets,
                                    key=key, act_probs=act_probs)
    env: dict[str, jax.Array] = {k: jnp.asarray(v) for k, v in graph.constants.items()}
    env.update(zip(graph.inputs, xs))
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
            ins[0] = _quantize_input(node.name, lq, ins[0], qstate, ka, act_probs)
            if lq.method != "ste" and lq.weight is not None and (
                    qstate is None or "weight_step" not in qstate.get(node.name, {})):
                raise ConfigError(
                    f"layer {node.name!r} learns its weight step (method={lq.method!r}) but "
                    "qstate has no 'weight_step' for it; calibrate with this quant spec "
                    "(npujax.quantize.calibrate adds the LSQ entries).")
            p["kernel"] = _quantize_kernel(node, lq, p["kernel"], bit_probs, kw, qstate)
        outs = run_op(node, ins, p)
        env.update(zip(node.outputs, outs))
        if node.name in taps:
            tapped[node.name] = (ins[0], outs[0])
    result = tuple(env[t] for t in graph.outputs)
    result = result[0] if len(result) == 1 else result
    return (result, tapped) if taps else result


def _batch_folded(graph: Graph) -> bool:
    """Whether ``graph`` was specialised to batch 1 with the batch folded into a shape (an
    imported ``x.reshape(x.shape[0], -1)`` becomes a Reshape to ``[1, -1]``)."""
    if not graph.inputs or graph.tensors[graph.inputs[0]].shape[:1] != (1,):
        return False
    return any(n.op == "Reshape" and n.attrs.get("shape") and n.attrs["shape"][0] not in (0, -1)
               for n in graph.nodes)


def _execute_per_example(graph, params, xs, *, taps, input_offsets, **kw):
    """Run a batch-1 graph on a batch by mapping over examples (``jax.vmap``; one program)."""

    def one(xi, offsets):
        offs = None if offsets is None else {k: v[None] for k, v in offsets.items()}
        return execute(graph, params, [v[None] for v in xi], taps=taps, input_offsets=offs, **kw)

    out = jax.vmap(one)(xs, dict(input_offsets) if input_offsets else None)
    return jax.tree.map(lambda a: a.reshape(a.shape[0], *a.shape[2:]), out)


def _quantize_input(name: str, lq: LayerQuant, x: jax.Array, qstate, key=None,
                    act_probs=None) -> jax.Array:
    if lq.act is None:
        return x
    if qstate is None or name not in qstate:
        raise ConfigError(
            f"layer {name!r} quantizes its input activation but qstate has no entry for it; "
            "run calibration first (npujax.quantize.calibrate) and pass its result as qstate."
        )
    s = qstate[name]
    if lq.act_candidates:
        if act_probs is None or name not in act_probs or "act_scales" not in s:
            raise ConfigError(
                f"layer {name!r} mixes {len(lq.act_candidates)} activation widths; pass "
                "act_probs={node: probabilities} and a qstate calibrated with this spec "
                "(it holds act_scales/act_zero_points).")
        probs = act_probs[name]
        return sum(probs[j] * fake_quant(x, s["act_scales"][j], s["act_zero_points"][j], f,
                                         key=key)
                   for j, f in enumerate(lq.act_candidates))
    if lq.method == "ste":
        return fake_quant(x, s["act_scale"], s["act_zero_point"], lq.act, key=key)
    # LSQ: the paper's activation gradient scale 1 / sqrt(features per sample * Q_p).
    g = 1.0 / math.sqrt(max(x.size // max(x.shape[0], 1), 1) * max(lq.act.qmax, 1))
    if lq.method == "lsq+":
        offset = s["act_offset"]
    else:  # fixed calibrated integer zero point z: offset -z * step gives the ONNX grid
        step = jnp.maximum(jnp.asarray(s["act_scale"], x.dtype), MIN_SCALE)
        offset = -jnp.asarray(s["act_zero_point"]).astype(x.dtype) * step
    return lsq_fake_quant(x, s["act_scale"], lq.act, g, offset=offset)


def _quantize_kernel(node, lq: LayerQuant, w: jax.Array, bit_probs, key=None,
                     qstate=None) -> jax.Array:
    """Fake-quantized kernel; an LSQ layer without a qstate ``weight_step`` gets the min-max
    grid (its initial value)."""
    fmts = lq.weight_candidates
    if not fmts:
        return w
    state = (qstate or {}).get(node.name, {})
    if lq.method != "ste" and "weight_step" in state:
        axis = kernel_out_axis(node) if lq.weight_per_channel else None
        return lsq_fake_quant(w, state["weight_step"], fmts[0], axis=axis)
    if lq.weight_block_size is not None:
        return quantize_weight(w, fmts[0], kernel_in_axis(node), key,
                               block_size=lq.weight_block_size)
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
