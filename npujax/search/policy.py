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
from npujax.quant import check_bits
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
            for layer, b in d.items():
                if not isinstance(b, int):
                    raise ConfigError(f"policy {what}[{layer!r}] must be an int, got {b!r}.")
                check_bits(b, f"policy {what}[{layer!r}]")
        if set(self.weight_bits) != set(self.act_bits):
            raise ConfigError("policy weight_bits and act_bits must name the same layers.")

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
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")


def load_policy(path: str | os.PathLike[str]) -> PrecisionPolicy:
    """Read a policy written by :func:`save_policy`.

    Raises:
      ConfigError: missing file, not JSON, wrong format tag or invalid widths.
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"policy file {str(path)!r} does not exist.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"policy file {str(path)!r} is not valid JSON: {e}.") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(
            f"{str(path)!r} is not an npujax precision policy (expected format {FORMAT!r}); "
            "write one with 'npujax search' or npujax.search.save_policy."
        )
    return PrecisionPolicy(doc["weight_bits"], doc["act_bits"], doc.get("meta", {}))
