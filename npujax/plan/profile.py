"""Measured per-layer profiles: read them, and match their names to the cost model's layers.

Two formats are read directly (:func:`read_profile` tells them apart by content):

* **CSV** with a header ``layer,latency_s`` (more columns are ignored; ``name`` may stand for
  ``layer``, so the ``layers.csv`` that ``npujax lower --out`` writes is a profile): one row per
  layer or per ONNX node, latency in seconds. A name given on several rows is a repeated
  measurement; its median is used.
* **onnxruntime profiling JSON** (``SessionOptions.enable_profiling = True``, the file
  ``InferenceSession.end_profiling()`` returns): a Chrome-trace list of events; every node event
  (``"cat": "Node"``, name ``<node>_kernel_time``) holds the node's kernel time ``dur`` in
  microseconds. A node run several times (several ``InferenceSession.run`` calls) gives the
  median of its runs, so the first (warm-up) run does not bias it. Format: onnxruntime's
  ``docs/Profiling_Tools.md`` and ``onnxruntime/core/common/profiler.cc``.

npujax's layers are not one-to-one with ONNX nodes: :func:`npujax.optimize` folds BatchNorm into
the preceding convolution and fuses activations into its output stage, and shape-only nodes
(Reshape, Flatten, ...) cost nothing. :func:`match_profile` therefore attributes every measured
name to a layer: a layer's own name (as ``npujax lower`` prints it; ONNX node names are kept,
unnamed nodes are called ``<Op>@<k>`` as onnxruntime calls them), else the node of the
*unoptimized* graph of that name, followed up its producers to the first node that is a layer
(a folded BatchNorm, a fused Relu or a Reshape is charged to the convolution before it). A node
name onnxruntime made by fusing (``MatMul@0/MatMulAddFusion``) is matched by the part before its
first ``/`` when the whole name matches nothing. The times of all names charged to one layer are
summed.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from npujax.errors import ConfigError
from npujax.ir.graph import Graph
from npujax.plan.workload import Workload

__all__ = ["Profile", "MatchedProfile", "read_profile", "read_profile_csv", "read_ort_profile",
           "match_profile"]


@dataclasses.dataclass(frozen=True)
class Profile:
    """Measured latencies by name.

    Attributes:
      names: layer or ONNX node names, in the order first seen.
      latency_s: float64 ``[len(names)]`` seconds per name (the median of repeated entries).
      runs: int ``[len(names)]``, how many measurements each median is taken over.
      source: the file (or ``"<memory>"``).
      format: ``"csv"`` or ``"onnxruntime"``.
    """

    names: tuple[str, ...]
    latency_s: np.ndarray
    runs: np.ndarray
    source: str = "<memory>"
    format: str = "csv"

    @classmethod
    def from_samples(cls, samples: dict[str, list[float]], source: str, fmt: str) -> Profile:
        """The median of each name's samples (seconds).

        Raises:
          ConfigError: no samples, or a negative or non-finite one.
        """
        if not samples:
            raise ConfigError(f"{source}: the profile holds no measurements.")
        for name, v in samples.items():
            if not all(np.isfinite(x) and x >= 0 for x in v):
                raise ConfigError(f"{source}: {name!r} has a negative or non-finite latency "
                                  f"{v}; measured latencies are seconds >= 0.")
        names = tuple(samples)
        return cls(names, np.asarray([float(np.median(samples[n])) for n in names], np.float64),
                   np.asarray([len(samples[n]) for n in names], np.int64), source, fmt)


def _samples_csv(text: str, source: str) -> dict[str, list[float]]:
    reader = csv.DictReader(io.StringIO(text))
    fields = [f.strip() for f in (reader.fieldnames or [])]
    key = "layer" if "layer" in fields else "name"  # 'name': the layers.csv of npujax lower
    if key not in fields or "latency_s" not in fields:
        raise ConfigError(f"{source}: a CSV profile needs the header 'layer,latency_s' (got "
                          f"{fields}); one row per layer or ONNX node, latency in seconds.")
    samples: dict[str, list[float]] = {}
    for i, row in enumerate(reader, start=2):
        row = {(k or "").strip(): v for k, v in row.items()}
        name = (row.get(key) or "").strip()
        try:
            value = float(row.get("latency_s") or "")
        except ValueError:
            raise ConfigError(f"{source}, line {i}: latency_s {row.get('latency_s')!r} is not "
                              "a number of seconds.") from None
        if not name:
            raise ConfigError(f"{source}, line {i}: empty layer name.")
        samples.setdefault(name, []).append(value)
    return samples


def read_profile_csv(path: str | os.PathLike[str]) -> Profile:
    """Read a ``layer,latency_s`` CSV profile (see the module docstring).

    Raises:
      ConfigError: the file is missing, lacks the header, or holds a bad number.
    """
    text = _read(path)
    return Profile.from_samples(_samples_csv(text, str(path)), str(path), "csv")


def _samples_ort(events: object, source: str) -> dict[str, list[float]]:
    if not isinstance(events, list):
        raise ConfigError(f"{source}: not an onnxruntime profile (expected a JSON list of "
                          "trace events, from SessionOptions.enable_profiling).")
    samples: dict[str, list[float]] = {}
    suffix = "_kernel_time"
    for e in events:
        if not isinstance(e, dict) or e.get("cat") != "Node":
            continue
        name = str(e.get("name", ""))
        if not name.endswith(suffix):
            continue  # fence events of older onnxruntime versions
        try:
            dur = float(e["dur"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{source}: node event {name!r} has no numeric 'dur' (us).") from None
        samples.setdefault(name[: -len(suffix)], []).append(dur * 1e-6)
    if not samples:
        raise ConfigError(f"{source}: the onnxruntime profile holds no node events "
                          "('cat': 'Node', '<node>_kernel_time'); run the session at least once "
                          "before end_profiling().")
    return samples


def read_ort_profile(path: str | os.PathLike[str]) -> Profile:
    """Read an onnxruntime profiling JSON (node kernel times, the median over runs).

    Raises:
      ConfigError: the file is missing, not JSON, or holds no node events.
    """
    text = _read(path)
    try:
        events = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e}).") from None
    return Profile.from_samples(_samples_ort(events, str(path)), str(path), "onnxruntime")


def read_profile(path: str | os.PathLike[str]) -> Profile:
    """Read a CSV or onnxruntime-JSON profile, told apart by its first character (``[``: JSON).

    Raises:
      ConfigError: see :func:`read_profile_csv` and :func:`read_ort_profile`.
    """
    text = _read(path)
    if text.lstrip().startswith("["):
        return read_ort_profile(path)
    return read_profile_csv(path)


def _read(path: str | os.PathLike[str]) -> str:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"profile {str(path)!r} not found; pass a 'layer,latency_s' CSV or an "
                          "onnxruntime profiling JSON.")
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read profile {str(path)!r}: {e}.") from None


@dataclasses.dataclass(frozen=True)
class MatchedProfile:
    """A profile charged to the cost model's layers.

    Attributes:
      layer_index: int ``[P]``, index (into the workloads) of each measured layer, ascending.
      measured_s: float64 ``[P]``, seconds per measured layer (the sum of its names).
      names: ``[P]`` tuples, the profile names charged to each layer.
      skipped: profile names matched to no layer (only with ``on_unmatched="skip"``).
      unmeasured: names of the layers no profile entry was charged to (left out of the fit).
    """

    layer_index: np.ndarray
    measured_s: np.ndarray
    names: tuple[tuple[str, ...], ...]
    skipped: tuple[str, ...]
    unmeasured: tuple[str, ...]


def match_profile(profile: Profile, layers: Sequence[Workload], raw_graph: Graph | None = None,
                  *, on_unmatched: str = "error") -> MatchedProfile:
    """Charge every measured name to a layer (see the module docstring) and sum per layer.

    Args:
      profile: the measurements.
      layers: the workloads the model is costed as (:func:`npujax.plan.workloads`).
      raw_graph: the graph before :func:`npujax.optimize` (as imported), so that ONNX nodes
        folded or fused away are charged to the layer that absorbed them; None matches layer
        names only.
      on_unmatched: ``"error"`` (default) or ``"skip"`` (leave such names out, listed in
        ``MatchedProfile.skipped``).

    Raises:
      ConfigError: unmatched names with ``on_unmatched="error"``, an unknown ``on_unmatched``,
        or no name matched at all.
    """
    if on_unmatched not in ("error", "skip"):
        raise ConfigError(f"on_unmatched must be 'error' or 'skip', got {on_unmatched!r}.")
    index = {w.name: i for i, w in enumerate(layers)}
    producer: dict[str, str] = {}
    node_inputs: dict[str, tuple[str, ...]] = {}
    if raw_graph is not None:
        producer = {t: n.name for n in raw_graph.nodes for t in n.outputs}
        node_inputs = {n.name: tuple(t for t in n.inputs if t not in raw_graph.constants)
                       for n in raw_graph.nodes}

    def layer_of(name: str) -> int | None:
        seen: set[str] = set()
        todo = [name]
        while todo:  # breadth-first up the producers: the nearest layer absorbs the node
            n = todo.pop(0)
            if n in index:
                return index[n]
            if n in seen or n not in node_inputs:
                continue
            seen.add(n)
            todo.extend(producer[t] for t in node_inputs[n] if t in producer)
        return None

    sums: dict[int, float] = {}
    charged: dict[int, list[str]] = {}
    skipped = []
    for name, t in zip(profile.names, profile.latency_s):
        i = layer_of(name)
        if i is None and "/" in name:
            i = layer_of(name.split("/", 1)[0])
        if i is None:
            skipped.append(name)
            continue
        sums[i] = sums.get(i, 0.0) + float(t)
        charged.setdefault(i, []).append(name)
    if skipped and on_unmatched == "error":
        shown = ", ".join(repr(s) for s in skipped[:8]) + (" ..." if len(skipped) > 8 else "")
        raise ConfigError(
            f"{profile.source}: {len(skipped)} of {len(profile.names)} profile names match no "
            f"layer of the model: {shown}. Layer names are those 'npujax lower' prints (e.g. "
            f"{', '.join(repr(w.name) for w in layers[:3])}) or the model's ONNX node names; "
            "check the profile is of this model, or skip them (--skip-unmatched).")
    if not sums:
        raise ConfigError(f"{profile.source}: no profile name matches a layer of the model.")
    order = sorted(sums)
    unmeasured = tuple(w.name for i, w in enumerate(layers) if i not in sums)
    return MatchedProfile(np.asarray(order, np.int64),
                          np.asarray([sums[i] for i in order], np.float64),
                          tuple(tuple(charged[i]) for i in order), tuple(skipped), unmeasured)
