"""Precision policies: per-layer weight and activation bit widths, saved as JSON files."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from npujax._atomic import atomic_write_text
from npujax.errors import ConfigError
from npujax.ir.graph import Graph
from npujax.numerics import check_bits
from npujax.quantize.spec import quant_spec

__all__ = ["PrecisionPolicy", "save_policy", "load_policy"]

FORMAT = "npujax.precision_policy/1"


@dataclasses.dataclass(frozen=True)
class PrecisionPolicy:
    """Per-layer bit widths chosen by a searcher.

    Attributes:
      weight_bits: ``{layer: bits}`` for every GEMM layer.
      act_bits: ``{layer: bits}`` input-activation width of every GEMM layer.
      meta: provenance (searcher, budget, modelled latency, preset, ...), JSON-serialisable.
    """

    weight_bits: Mapping[str, int]
    act_bits: Mapping[str, int]
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for what, d in (("weight_bits", self.weight_bits), ("act_bits", self.act_bits)):
            if not isinstance(d, Mapping):
                raise ConfigError(f"policy {what} must be a mapping {{layer: bits}}, got "
                                  f"{type(d).__name__}.")
            for layer, b in d.items():
                if not isinstance(layer, str):
                    raise ConfigError(f"policy {what} keys must be layer names, got {layer!r}.")
                if isinstance(b, bool) or not isinstance(b, int):
                    raise ConfigError(f"policy {what}[{layer!r}] must be an int, got {b!r}.")
                check_bits(b, f"policy {what}[{layer!r}]")
        if set(self.weight_bits) != set(self.act_bits):
            raise ConfigError("policy weight_bits and act_bits must name the same layers.")
        if not isinstance(self.meta, Mapping):
            raise ConfigError(f"policy meta must be a mapping, got {type(self.meta).__name__}.")

    def quant_spec(self, graph: Graph, **scheme: Any) -> dict[str, Any]:
        """The policy as a :data:`~npujax.QuantSpec` of ``graph`` (the standard integer scheme of
        :func:`npujax.quant_spec`; ``scheme`` passes its other options, e.g. ``quantizer``).

        Raises:
          ConfigError: the policy does not name exactly the graph's GEMM layers.
        """
        return quant_spec(graph, dict(self.weight_bits), dict(self.act_bits), **scheme)


def save_policy(path: str | os.PathLike[str], policy: PrecisionPolicy) -> None:
    """Write ``policy`` as JSON (atomically)."""
    doc = {"format": FORMAT, "weight_bits": dict(policy.weight_bits),
           "act_bits": dict(policy.act_bits), "meta": dict(policy.meta)}
    try:
        text = json.dumps(doc, indent=2, allow_nan=False)
    except ValueError:
        raise ConfigError(f"policy meta {dict(policy.meta)} holds NaN or infinity, which JSON "
                          "cannot store.") from None
    atomic_write_text(path, text + "\n")


def load_policy(path: str | os.PathLike[str]) -> PrecisionPolicy:
    """Read a policy written by :func:`save_policy`.

    The whole document is validated: the format tag, ``weight_bits`` and ``act_bits`` as
    ``{layer: bits}`` objects naming the same layers with whole widths in 2-16, ``meta`` an
    object; NaN/Infinity (not JSON) are refused.

    Raises:
      ConfigError: a missing file or a folder, not JSON, too large, a wrong format tag, a missing
        or mistyped key, or invalid widths.
    """
    where = str(path)
    if os.path.isdir(path):
        raise ConfigError(f"policy file {where!r} is a folder; pass the .json file written by "
                          "'npujax search --out'.")
    try:
        if os.path.getsize(path) > _MAX_POLICY_BYTES:
            raise ConfigError(f"policy file {where!r} is larger than {_MAX_POLICY_BYTES:,} "
                              "bytes; it is not a precision policy.")
        with open(path, encoding="utf-8") as f:
            doc = json.load(f, parse_constant=_no_constant)
    except FileNotFoundError:
        raise ConfigError(f"policy file {where!r} does not exist.") from None
    except OSError as e:
        raise ConfigError(f"policy file {where!r} cannot be read: {e.strerror}.") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as e:
        raise ConfigError(f"policy file {where!r} is not valid JSON: {e}.") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(
            f"{str(path)!r} is not an npujax precision policy (expected format {FORMAT!r}); "
            "write one with 'npujax search' or npujax.search.save_policy."
        )
    missing = [k for k in ("weight_bits", "act_bits") if k not in doc]
    if missing:
        raise ConfigError(f"policy file {where!r} has no {' or '.join(map(repr, missing))}; "
                          "write one with 'npujax search' or npujax.search.save_policy.")
    return PrecisionPolicy(doc["weight_bits"], doc["act_bits"], doc.get("meta", {}))


_MAX_POLICY_BYTES = 64 * 2**20


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
