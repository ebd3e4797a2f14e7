"""The precision vocabulary: how each layer is quantized (:class:`LayerQuant`), for a whole graph
(:data:`QuantSpec`), and the standard integer-NPU scheme (:func:`quant_spec`).

Every part of npujax speaks this one vocabulary: rules (:func:`npujax.quant_spec_from_rules`)
and precision policies (:meth:`npujax.search.PrecisionPolicy.quant_spec`) produce a QuantSpec;
QAT, calibration, execution, conversion, ONNX export and the NPU latency model
(:func:`npujax.lower`) consume it. Bit widths are checked in one place
(:func:`npujax.numerics.check_bits`: integers of 2 to 16 bits).

Attention: a MatMul or Einsum of two activations (``Q K^T``, ``P V``) is a layer too. Its first
operand takes the ``act`` format and its second (the array's stationary operand) the ``weight``
format, both per tensor on calibrated static grids (the second symmetric when its format is
signed). Both operands are activations, so the standard schemes give both the activation width
(:func:`quant_spec` with a single ``weight_bits``, rules); a ``weight_bits`` mapping (a searched
policy) sets the second operand's width explicitly. An operand that is a softmax output has the
fixed range ``[0, 1]`` (``act_range`` / ``operand_range``; an unsigned format: at 8 bits scale
1/255, zero point 0) instead of a calibrated one, as integer transformer deployments do (I-BERT,
Kim et al. 2021, arXiv:2101.01321; FQ-ViT, Lin et al. 2022, arXiv:2111.13824).

Normalizations (LayerNorm, RMSNorm), softmax and GELU are not layers of a spec: they run in
float (at higher precision than the GEMMs around them), their inputs and outputs quantized only
where a GEMM reads them.

Formats: integer (:class:`~npujax.numerics.IntFormat`) or FP8 (``FloatFormat`` E4M3FN / E5M2,
Micikevicius et al. 2022, arXiv:2209.05433); per-block weights (``weight_block_size``, ONNX opset
21 blocked quantization); the quantizer (:mod:`npujax.quantize.quantizers`: STE, LSQ, LSQ+ or
the search mixture) decides how the layer is fake-quantized and what state it keeps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from npujax.errors import ConfigError
from npujax.numerics import FP8_E4M3FN, FP8_E5M2, FloatFormat, Format, IntFormat, check_bits
from npujax.ops import OPS, embedding_nodes, operand_quantized_ops, quantizable_nodes
from npujax.quantize.quantizers import STE, Mixture, Quantizer, get_quantizer

if TYPE_CHECKING:
    from npujax.ir.graph import Graph

__all__ = ["LayerQuant", "QuantSpec", "quant_spec", "FORMATS", "SOFTMAX_RANGE", "fixed_range",
           "for_operands"]

#: Format names accepted by :func:`quant_spec` and rules (``"int"``: the width given in bits).
FORMATS: dict[str, Format | None] = {"int": None, "fp8_e4m3fn": FP8_E4M3FN,
                                     "fp8_e5m2": FP8_E5M2}


#: The fixed range of a softmax output (probabilities).
SOFTMAX_RANGE = (0.0, 1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerQuant:
    """How one GEMM node is quantized.

    Attributes:
      weight: weight format (:class:`IntFormat` or FP8 :class:`FloatFormat`); a tuple of formats
        means a differentiable mixture over candidates (mixed-precision search); None keeps
        float weights. For a GEMM of two activations (MatMul, Einsum): the format of the second
        (stationary) operand, per tensor on a calibrated grid.
      act: input-activation format (per tensor, calibrated; integer or FP8); None keeps float
        inputs. With ``act_candidates``, the widest of them. For a GEMM of two activations: the
        first operand's format.
      act_range: a fixed ``(min, max)`` range of the input activation that calibration uses
        instead of the observed one (a softmax output: :data:`SOFTMAX_RANGE`); None calibrates.
      operand_range: the same for the second operand of a GEMM of two activations.
      weight_per_channel: per-output-channel weight scales (else one per tensor).
      act_symmetric: symmetric activation range (zero point at mid-code) instead of asymmetric.
      stochastic_rounding: round weights and activations stochastically (``floor(v + u)``, see
        :func:`npujax.numerics.fake_quant`) when :func:`npujax.execute` is given a ``key`` (QAT);
        without a key (evaluation, deployment) rounding is to nearest, ties to even. Integer
        formats only.
      quantizer: a :class:`~npujax.quantize.quantizers.Quantizer` (or its registered name:
        ``"ste"``, ``"lsq"``, ``"lsq+"``, ``"mixture"``). Several candidate formats make the
        layer a search mixture (the STE default becomes ``Mixture()``).
      weight_block_size: per-block weight scales over blocks of this many input channels (ONNX
        opset-21 blocked quantization); None for per-channel/per-tensor.
      act_candidates: integer activation formats of a search mixture (``act`` the widest).

    Raises:
      ConfigError: an unknown quantizer, a combination the quantizer does not support (LSQ with
        FP8, a mixture, per-block weights or stochastic rounding), stochastic rounding with
        FP8, a ``weight_block_size`` that is not a positive int or combined with a mixture.
    """

    weight: Format | tuple[Format, ...] | None = None
    act: Format | None = None
    weight_per_channel: bool = True
    act_symmetric: bool = False
    stochastic_rounding: bool = False
    quantizer: Quantizer = STE()
    weight_block_size: int | None = None
    act_candidates: tuple[IntFormat, ...] = ()
    act_range: tuple[float, float] | None = None
    operand_range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        for f in ("act_range", "operand_range"):
            r = getattr(self, f)
            if r is None:
                continue
            ok = (isinstance(r, tuple) and len(r) == 2
                  and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in r))
            if not ok or not (-float("inf") < r[0] <= 0.0 <= r[1] < float("inf")) \
                    or r[0] == r[1]:
                raise ConfigError(f"LayerQuant.{f} must be a finite (min, max) tuple with "
                                  f"min <= 0 <= max and min < max, got {r!r}.")
        q = get_quantizer(self.quantizer)
        if isinstance(q, STE) and (len(self.weight_candidates) > 1 or self.act_candidates):
            q = Mixture()
        object.__setattr__(self, "quantizer", q)
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
        q.validate(self)

    @property
    def weight_candidates(self) -> tuple[Format, ...]:
        """The weight format(s) as a tuple (empty for float weights)."""
        if self.weight is None:
            return ()
        return self.weight if isinstance(self.weight, tuple) else (self.weight,)

    @property
    def weight_bits(self) -> int | None:
        """Width of the (single) weight format: ``IntFormat.bits``, 8 for FP8; None for float
        weights.

        Raises:
          ConfigError: a search mixture (several candidate formats).
        """
        return _bits(self.weight_candidates, "weight")

    @property
    def act_bits(self) -> int | None:
        """Width of the input-activation format (8 for FP8); None for float inputs."""
        return _bits(() if self.act is None else (self.act,), "act")


def _bits(fmts: tuple[Format, ...], what: str) -> int | None:
    if not fmts:
        return None
    if len(fmts) > 1:
        raise ConfigError(f"a {what} mixture over {len(fmts)} formats has no single width; "
                          "fix one format per layer first.")
    (f,) = fmts
    return f.bits if isinstance(f, IntFormat) else 8


#: ``{node_name: LayerQuant}``; static configuration (closed over, not traced).
QuantSpec = Mapping[str, LayerQuant]


def quant_spec(
    graph: Graph,
    weight_bits: int | Mapping[str, int | Sequence[int]] = 8,
    act_bits: int | Mapping[str, int | Sequence[int]] = 8,
    *,
    quantizer: Quantizer | str = "ste",
    weight_format: str = "int",
    act_format: str = "int",
    weight_block_size: int | None = None,
    embedding_bits: int | None = None,
) -> dict[str, LayerQuant]:
    """The standard integer-NPU scheme for every GEMM node of ``graph`` (attention's MatMuls of
    two activations included, see the module docstring), and optionally its embedding tables.

    Weights: signed, narrow-range (``[-2^(b-1)+1, 2^(b-1)-1]``), symmetric, per output channel
    (the second operand of a MatMul of two activations: the activation width, per tensor).
    Activations: unsigned, asymmetric, per tensor (a softmax output: the fixed range [0, 1]).
    FP8 formats replace the integer ones where asked (symmetric, zero point 0; the widths are
    then unused).

    Args:
      graph: the graph whose Conv/Gemm nodes are quantized.
      weight_bits: one width for all layers, or ``{node: bits}``; a sequence of widths makes that
        layer a search mixture over the candidates.
      act_bits: one width for all layers, or ``{node: bits}``; a sequence of widths makes that
        layer's input a search mixture (``act_candidates`` of :class:`LayerQuant`).
      quantizer: ``"ste"``, ``"lsq"``, ``"lsq+"`` or a :class:`Quantizer` (mixtures of several
        widths use ``Mixture``).
      weight_format: ``"int"``, ``"fp8_e4m3fn"`` or ``"fp8_e5m2"``.
      act_format: ``"int"``, ``"fp8_e4m3fn"`` or ``"fp8_e5m2"``.
      weight_block_size: per-block weight scales over this many input channels, or None.
      embedding_bits: also quantize every embedding table (a Gather of a parameter table,
        :func:`npujax.ops.embedding_nodes`) weight-only at this width: signed, narrow range,
        symmetric per row (each token's vector its own scale), no activation format (the
        input is token ids); None (default) keeps tables in float.

    Returns:
      ``{node_name: LayerQuant}`` for every GEMM node (and embedding, with
      ``embedding_bits``).

    Raises:
      ConfigError: if a mapping names a node that is not a GEMM node of the graph, or misses
        one; an unknown format name; an invalid combination (see :class:`LayerQuant`).
      QuantizationError: a width that is not a whole number of bits in [2, 16].

    Examples:
      >>> spec = quant_spec(graph, 4, 4, quantizer="lsq")                    # doctest: +SKIP
      >>> spec = quant_spec(graph, weight_format="fp8_e4m3fn", act_format="fp8_e4m3fn")
    """
    for what, f in (("weight_format", weight_format), ("act_format", act_format)):
        if f not in FORMATS:
            raise ConfigError(f"{what} must be one of {list(FORMATS)}, got {f!r}.")
    names = [n.name for n in quantizable_nodes(graph)]
    q = get_quantizer(quantizer)

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

    def widths(v, what):
        if isinstance(v, Sequence) and not isinstance(v, str):
            return tuple(check_bits(b, what) for b in v)
        return check_bits(v, what)

    wb, ab = per_layer(weight_bits, "weight_bits"), per_layer(act_bits, "act_bits")
    spec = {}
    for n in names:
        w = widths(wb[n], f"weight_bits[{n!r}]")
        wfmt = (tuple(IntFormat(b, narrow_range=True) for b in w) if isinstance(w, tuple)
                else IntFormat(w, narrow_range=True))
        a = widths(ab[n], f"act_bits[{n!r}]")
        acands = (tuple(IntFormat(b, signed=False) for b in sorted(a))
                  if isinstance(a, tuple) else ())
        afmt = FORMATS[act_format] or (acands[-1] if acands else IntFormat(a, signed=False))
        if isinstance(wfmt, tuple) and len(wfmt) == 1:
            wfmt = wfmt[0]
        lq = LayerQuant(weight=FORMATS[weight_format] or wfmt, act=afmt, quantizer=q,
                        weight_block_size=weight_block_size,
                        act_candidates=acands if len(acands) > 1 else ())
        operand = None if isinstance(weight_bits, Mapping) else ab[n]
        spec[n] = for_operands(graph, n, lq, operand)
    if embedding_bits is not None:
        b = check_bits(embedding_bits, "embedding_bits")
        for node in embedding_nodes(graph):
            spec[node.name] = LayerQuant(weight=IntFormat(b, narrow_range=True), act=None,
                                         quantizer=q)
    return spec


def for_operands(graph: Graph, name: str, lq: LayerQuant,
                 operand_bits: int | Sequence[int] | None = None) -> LayerQuant:
    """``lq`` made right for layer ``name`` if it is a GEMM of two activations (else ``lq``):
    the second operand's integer format at ``operand_bits`` (None: ``lq``'s weight widths),
    an operand that is a softmax output with its fixed range :data:`SOFTMAX_RANGE` and an
    unsigned format, and no per-block grid (``weight_block_size`` is for weights; both operands
    are per tensor).
    """
    node = graph.node(name)
    if node.op not in operand_quantized_ops():
        return lq
    act_range = fixed_range(graph, node.inputs[0]) if lq.act is not None else None
    operand_range = fixed_range(graph, node.inputs[1])
    fmts = lq.weight_candidates
    if operand_bits is not None and fmts and all(isinstance(f, IntFormat) for f in fmts):
        bits = (tuple(operand_bits) if isinstance(operand_bits, Sequence) else (operand_bits,))
        fmts = tuple(IntFormat(b, narrow_range=True) for b in sorted(bits))
    if operand_range is not None:
        fmts = tuple(IntFormat(f.bits, signed=False) if isinstance(f, IntFormat) else f
                     for f in fmts)
    weight = None if not fmts else fmts[0] if len(fmts) == 1 else fmts
    return dataclasses.replace(lq, weight=weight, act_range=act_range,
                               operand_range=operand_range if fmts else None,
                               weight_block_size=None)


def fixed_range(graph: Graph, tensor: str) -> tuple[float, float] | None:
    """The fixed range of ``tensor`` as a GEMM operand: :data:`SOFTMAX_RANGE` for a softmax
    output (also through ops exact on codes: Reshape, Transpose, Expand, ...), else None
    (calibrated)."""
    t = tensor
    while True:
        p = graph.producer(t)
        if p is None:
            return None
        if p.op == "Softmax":
            return SOFTMAX_RANGE
        d = OPS.get(p.op)
        if d is None or d.codes != "exact":  # (data movement, max, ReLU keep [0, 1])
            return None
        t = p.inputs[0]
