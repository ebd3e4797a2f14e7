"""Quantize any traced Flax (NNX or Linen) or imported model by per-layer rules on module paths.

A rule matches layer names -- the Flax module path (``"encoder/conv1"``, ``"layers/0"``) or the
ONNX node name -- with a regular expression; the first matching rule decides how that layer is
quantized, as in Qwix's ``QuantizationRule`` list. Two vocabularies are accepted:

* npujax's: ``pattern`` searched anywhere in the name (``re.search``), ``weight_bits`` /
  ``act_bits`` (8 by default) and ``weight_format`` / ``act_format``;
* Qwix's (https://github.com/google/qwix, ``qwix.QtRule``): ``module_path`` matched against the
  whole name (``re.fullmatch``), ``weight_qtype`` / ``act_qtype`` as a string (``"int8"``,
  ``"int4"``, ``"uint8"``, ``"float8_e4m3fn"``, ``"float8_e5m2"``) or a numpy/JAX dtype; a
  missing qtype leaves that operand in float, as in Qwix. A Qwix ``QtRule`` object itself is
  accepted too (:func:`as_rule`). The per-channel weight axis
comes from the op (:func:`npujax.ops.kernel_out_axis`: Conv -> the kernel's output
channels, Dense/Gemm -> output features), so no rule has to name an axis.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from npujax.errors import ConfigError
from npujax.ir.graph import Graph
from npujax.numerics import IntFormat, check_bits
from npujax.ops import gemm_nodes, quantizable_nodes
from npujax.quantize.quantizers import Quantizer
from npujax.quantize.spec import FORMATS, LayerQuant, for_operands

__all__ = ["QuantRule", "quant_spec_from_rules", "first_last_rules", "as_rule", "parse_qtype"]

#: Qwix's floating-point qtype names -> npujax format names.
_FLOAT_QTYPES = {"float8_e4m3fn": "fp8_e4m3fn", "fp8_e4m3fn": "fp8_e4m3fn", "e4m3": "fp8_e4m3fn",
                 "float8_e5m2": "fp8_e5m2", "fp8_e5m2": "fp8_e5m2", "e5m2": "fp8_e5m2"}
_INT_QTYPE = re.compile(r"(u?)int(\d+)")


def parse_qtype(qtype: object, what: str = "qtype") -> tuple[str, int | None, bool | None]:
    """A Qwix-style quantization type as ``(format name, bits, signed)``.

    Args:
      qtype: ``"int8"``, ``"int4"``, ``"uint8"`` (any width 2-16), ``"float8_e4m3fn"``,
        ``"float8_e5m2"``, or a numpy/JAX dtype of those names (``jnp.int8``,
        ``jnp.float8_e4m3fn``).
      what: the field, for the message.

    Returns:
      ``("int", bits, signed)`` for integers (``signed`` False for ``uint``), or
      ``(fp8 format name, None, None)``.

    Raises:
      ConfigError: an unknown type name (lists the accepted ones).
      QuantizationError: an integer width outside [2, 16].
    """
    name = getattr(qtype, "__name__", None) or getattr(qtype, "name", None) or qtype
    if not isinstance(name, str):
        name = str(qtype)
    name = name.lower()
    if name in _FLOAT_QTYPES:
        return _FLOAT_QTYPES[name], None, None
    m = _INT_QTYPE.fullmatch(name)
    if m is None:
        raise ConfigError(f"{what} {qtype!r} is not a known quantization type; use 'int8', "
                          "'int4', 'uint8' (any width 2-16), 'float8_e4m3fn' or 'float8_e5m2'.")
    return "int", check_bits(int(m.group(2)), what), m.group(1) != "u"


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantRule:
    """How the layers whose name matches ``pattern`` are quantized.

    Give either ``pattern`` (npujax) or ``module_path`` (Qwix); with ``module_path`` the widths and
    formats come from ``weight_qtype`` / ``act_qtype`` only (None: that operand stays float).

    Attributes:
      pattern: regular expression searched in the layer name (module path).
      module_path: regular expression that must match the whole layer name (Qwix's
        ``QtRule.module_path``, ``re.fullmatch``).
      weight_qtype: Qwix-style weight type (``"int8"``, ``"int4"``, ``"float8_e4m3fn"``, a
        dtype); overrides ``weight_bits`` / ``weight_format``. Weights are signed and
        symmetric: an unsigned type (``"uint4"``) raises ConfigError.
      act_qtype: Qwix-style input-activation type; overrides ``act_bits`` / ``act_format``
        (``"int8"`` gives unsigned asymmetric codes unless ``act_symmetric``, as npujax's NPUs
        use; ``"uint8"`` the same).
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
      ConfigError: if neither or both of ``pattern`` and ``module_path`` are given, the regular
        expression is invalid, a format or qtype name is unknown or the combination is invalid
        (see ``LayerQuant``).
      QuantizationError: a width that is not a whole number of bits in [2, 16].

    Examples:
      >>> QuantRule(pattern="conv", weight_bits=4)                            # npujax
      >>> QuantRule(module_path="fc.*", weight_qtype="int8", act_qtype="int8")  # Qwix
    """

    pattern: str | None = None
    module_path: str | None = None
    weight_qtype: object = None
    act_qtype: object = None
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
        if (self.pattern is None) == (self.module_path is None):
            raise ConfigError("QuantRule needs exactly one of pattern= (searched in the layer "
                              "name) and module_path= (Qwix: matches the whole name); got "
                              f"pattern={self.pattern!r}, module_path={self.module_path!r}.")
        field = "pattern" if self.pattern is not None else "module_path"
        try:
            re.compile(getattr(self, field))
        except (re.error, TypeError) as e:
            raise ConfigError(f"QuantRule.{field} {getattr(self, field)!r} is not a valid "
                              f"regex: {e}.") from None
        for op in ("weight", "act"):
            qt = getattr(self, f"{op}_qtype")
            if qt is None and self.module_path is None:
                continue  # npujax vocabulary: the widths and formats as given
            # Qwix vocabulary (or a qtype given): the qtype decides; no qtype, no quantization
            fmt, bits, signed = ("int", None, True) if qt is None else parse_qtype(
                qt, f"QuantRule.{op}_qtype")
            if op == "weight" and signed is False:
                raise ConfigError(f"QuantRule.weight_qtype {qt!r}: npujax quantizes weights "
                                  "signed and symmetric (narrow range, zero point 0), so an "
                                  f"unsigned weight type has no meaning; use 'int{bits}'.")
            object.__setattr__(self, f"{op}_bits", bits if fmt == "int" or qt is None else 8)
            object.__setattr__(self, f"{op}_format", fmt)
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


    @property
    def label(self) -> str:
        """The rule's regular expression as written (for messages)."""
        return self.pattern if self.pattern is not None else f"module_path={self.module_path}"

    def matches(self, name: str) -> bool:
        """Whether the rule applies to layer ``name`` (``re.search`` for ``pattern``,
        ``re.fullmatch`` for ``module_path``)."""
        if self.module_path is not None:
            return re.fullmatch(self.module_path, name) is not None
        assert self.pattern is not None
        return re.search(self.pattern, name) is not None


def as_rule(rule: object) -> QuantRule:
    """``rule`` as a :class:`QuantRule`: a QuantRule itself, or a Qwix ``QtRule`` (any object
    with ``module_path``, ``weight_qtype`` and ``act_qtype`` attributes, read by duck typing so
    npujax never imports qwix).

    Raises:
      ConfigError: an object that is neither (names its type).
    """
    if isinstance(rule, QuantRule):
        return rule
    if all(hasattr(rule, f) for f in ("module_path", "weight_qtype", "act_qtype")):
        return QuantRule(module_path=rule.module_path,  # type: ignore[attr-defined]
                         weight_qtype=rule.weight_qtype,  # type: ignore[attr-defined]
                         act_qtype=rule.act_qtype)  # type: ignore[attr-defined]
    raise ConfigError(f"a quantization rule must be an npujax.QuantRule or a qwix.QtRule, got "
                      f"{type(rule).__name__}.")


def quant_spec_from_rules(
    graph: Graph, rules: Sequence[QuantRule | object], *, strict: bool = True
) -> dict[str, LayerQuant]:
    """A :data:`~npujax.QuantSpec` for ``graph``'s GEMM layers from ordered rules.

    A GEMM of two activations (attention's MatMul/Einsum) is a layer too: a matching rule
    quantizes both operands at its ``act_bits`` (see :func:`npujax.quantize.spec.for_operands`).

    Args:
      graph: a traced or imported graph.
      rules: tried in order per layer; the first that matches wins (see :meth:`QuantRule.matches`;
        Qwix ``QtRule`` objects are converted by :func:`as_rule`). Layers no rule matches stay
        in float.
      strict: raise if a rule matches no layer (a typo in a pattern must not pass silently).

    Returns:
      ``{layer: LayerQuant}`` for every quantized layer.

    Raises:
      ConfigError: a rule that matches nothing (with ``strict``), listing the layer names.

    Examples:
      >>> rules = [QuantRule(pattern="conv1|fc2", weight_bits=8),   # first/last at 8 bits
      ...          QuantRule(pattern=".*", weight_bits=4)]
    """
    checked = [as_rule(r) for r in rules]
    names = [n.name for n in quantizable_nodes(graph)]
    used = [False] * len(checked)
    spec: dict[str, LayerQuant] = {}
    for name in names:
        for i, rule in enumerate(checked):
            if rule.matches(name):
                used[i] = True
                lq = rule.layer_quant()
                if lq is not None:  # (a GEMM of two activations: both at the act width)
                    spec[name] = for_operands(graph, name, lq, rule.act_bits)
                break
    if strict:
        unused = [r.label for r, u in zip(checked, used) if not u]
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
