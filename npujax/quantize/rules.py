"""Quantize any traced Flax (NNX or Linen) or imported model by per-layer rules on module paths.

A rule matches layer names -- the Flax module path (``"encoder/conv1"``, ``"layers/0"``) or the
ONNX node name -- with a regular expression (``re.search``); the first matching rule decides how
that layer is quantized, as in Qwix's ``QuantizationRule`` list. The per-channel weight axis
comes from the op (:func:`npujax.ops.kernel_out_axis`: Conv -> the kernel's output
channels, Dense/Gemm -> output features), so no rule has to name an axis.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from npujax.errors import ConfigError
from npujax.ir.graph import Graph
from npujax.ops import gemm_nodes, quantizable_nodes
from npujax.quant import IntFormat, check_bits
from npujax.quantize.quantizers import Quantizer
from npujax.quantize.spec import FORMATS, LayerQuant, for_operands

__all__ = ["QuantRule", "quant_spec_from_rules", "first_last_rules"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantRule:
    """How the layers whose name matches ``pattern`` are quantized.

    Attributes:
      pattern: regular expression searched in the layer name (module path).
      weight_bits: weight width (signed, narrow range, symmetric); None keeps float weights.
      act_bits: input-activation width (unsigned asymmetric per tensor by default); None keeps
        float inputs.
      weight_per_channel: per-output-channel weight scales (else per tensor).
      act_symmetric: symmetric signed activations instead of asymmetric unsigned.
      skip: leave matching layers in float entirely.
      weight_format, act_format: ``"int"`` (the widths above), ``"fp8_e4m3fn"`` or
        ``"fp8_e5m2"`` (FP8, Micikevicius et al. 2022; the width is then unused).
      weight_block_size: per-block weight scales over this many input channels (ONNX opset-21
        blocked quantization), or None.
      quantizer: ``"ste"``, ``"lsq"``, ``"lsq+"`` or a :class:`Quantizer` (see
        :class:`npujax.LayerQuant`).

    Raises:
      ConfigError: if ``pattern`` is not a valid regular expression, a format name is unknown or
        the combination is invalid (see ``LayerQuant``).
      QuantizationError: a width that is not a whole number of bits in [2, 16].
    """

    pattern: str
    weight_bits: int | None = 8
    act_bits: int | None = 8
    weight_per_channel: bool = True
    act_symmetric: bool = False
    skip: bool = False
    weight_format: str = "int"
    act_format: str = "int"
    weight_block_size: int | None = None
    quantizer: Quantizer | str = "ste"

    def __post_init__(self) -> None:
        try:
            re.compile(self.pattern)
        except re.error as e:
            raise ConfigError(f"QuantRule.pattern {self.pattern!r} is not a valid regex: {e}.") \
                from None
        for f in ("weight_bits", "act_bits"):
            v = getattr(self, f)
            if v is not None:
                object.__setattr__(self, f, check_bits(v, f"QuantRule.{f}"))
        for f in ("weight_format", "act_format"):
            if getattr(self, f) not in FORMATS:
                raise ConfigError(f"QuantRule.{f} must be one of {list(FORMATS)}, got "
                                  f"{getattr(self, f)!r}.")
        self.layer_quant()  # validates the combination (method, formats, block size)

    def layer_quant(self) -> LayerQuant | None:
        """The :class:`LayerQuant` this rule gives (None when it skips the layer)."""
        if self.skip or (self.weight_bits is None and self.act_bits is None):
            return None
        w = None if self.weight_bits is None else (
            FORMATS[self.weight_format] or IntFormat(self.weight_bits, narrow_range=True))
        a = None if self.act_bits is None else (
            FORMATS[self.act_format] or IntFormat(self.act_bits, signed=self.act_symmetric))
        return LayerQuant(weight=w, act=a, weight_per_channel=self.weight_per_channel,
                          act_symmetric=self.act_symmetric,
                          quantizer=self.quantizer,  # type: ignore[arg-type]
                          weight_block_size=self.weight_block_size)


def quant_spec_from_rules(
    graph: Graph, rules: Sequence[QuantRule], *, strict: bool = True
) -> dict[str, LayerQuant]:
    """A :data:`~npujax.QuantSpec` for ``graph``'s GEMM layers from ordered rules.

    A GEMM of two activations (attention's MatMul/Einsum) is a layer too: a matching rule
    quantizes both operands at its ``act_bits`` (see :func:`npujax.quantize.spec.for_operands`).

    Args:
      graph: a traced or imported graph.
      rules: tried in order per layer; the first whose pattern matches wins. Layers no rule
        matches stay in float.
      strict: raise if a rule matches no layer (a typo in a pattern must not pass silently).

    Returns:
      ``{layer: LayerQuant}`` for every quantized layer.

    Raises:
      ConfigError: a rule that matches nothing (with ``strict``), listing the layer names.

    Examples:
      >>> rules = [QuantRule(pattern="conv1|fc2", weight_bits=8),   # first/last at 8 bits
      ...          QuantRule(pattern=".*", weight_bits=4)]
    """
    names = [n.name for n in quantizable_nodes(graph)]
    used = [False] * len(rules)
    spec: dict[str, LayerQuant] = {}
    for name in names:
        for i, rule in enumerate(rules):
            if re.search(rule.pattern, name):
                used[i] = True
                lq = rule.layer_quant()
                if lq is not None:  # (a GEMM of two activations: both at the act width)
                    spec[name] = for_operands(graph, name, lq, rule.act_bits)
                break
    if strict:
        unused = [r.pattern for r, u in zip(rules, used) if not u]
        if unused:
            raise ConfigError(
                f"quantization rule pattern(s) {unused} match no layer (or are shadowed by an "
                f"earlier rule); layer names are {names}."
            )
    return spec


def first_last_rules(graph: Graph, weight_bits: int, act_bits: int, *,
                     edge_bits: int = 8, quantizer: Quantizer | str = "ste") -> list[QuantRule]:
    """Rules keeping the first and last GEMM layers at ``edge_bits``, the rest as given; every
    layer quantized with ``quantizer`` (``"ste"``, ``"lsq"``, ``"lsq+"``).

    Raises:
      ConfigError: a graph without Conv/Gemm layers.
    """
    names = [n.name for n in gemm_nodes(graph)]
    if not names:
        raise ConfigError("the graph has no Conv/Gemm layer to quantize.")
    edges = sorted({names[0], names[-1]})
    pat = "^(" + "|".join(re.escape(n) for n in edges) + ")$"
    rules = [QuantRule(pattern=pat, weight_bits=edge_bits, act_bits=max(edge_bits, act_bits),
                       quantizer=quantizer)]
    if len(names) > len(edges):
        rules.append(QuantRule(pattern=".*", weight_bits=weight_bits, act_bits=act_bits,
                               quantizer=quantizer))
    return rules
