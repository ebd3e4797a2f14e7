"""Hardware fields: ``"section.key"`` paths into an :class:`~npujax.hw.NpuSpec`, in one place.

A field is named by its path ``section.key`` (``"array.rows"``, ``"memory.dram_bytes_per_s"``);
``"dataflow"`` is short for ``array.dataflow``. The sections (:data:`SECTIONS`) are the
dataclass fields of :class:`~npujax.hw.NpuSpec`, so a section added there reaches every user of
paths: the preset loader, the sweep's grids and stacked specs, the fit, the co-design and the
gradient check.

Every field is one of three kinds:

* *traced* (:func:`is_traced`): the numeric leaves outside :data:`WORKLOAD_SECTIONS`, data under
  ``jit``/``vmap``/``grad``: a sweep varies them inside one compiled program;
* *numeric workload fields*: the numbers of ``layout`` and ``ops`` (``c0``,
  ``channel_alignment``, ``dram_burst_bytes``, ``conv_max_kernel``, ``conv_max_stride``,
  ``resize_max_scale``), pytree
  leaves too, but the layers are built from them;
* *static*: names, choices and operator lists (``dataflow``, ``precision_scaling``, ``mapping``,
  ``activation_layout``, ``supported``, ...), part of the pytree's structure.

The rule for *traced*: a field is a numeric pytree leaf (:func:`is_leaf`: an ``int`` or ``float``
field, the data fields :mod:`npujax.hw.spec` registers) **and** its section does not change the
workloads. :func:`npujax.plan.workloads` builds the layers in Python from ``layout`` (channel
padding to ``channel_alignment`` and ``c0``) and ``ops`` (placement by ``conv_max_kernel`` and
``conv_max_stride``), so a new value of one of those numbers needs new workloads, as a new name
does: the design-space sweep (:class:`npujax.explore.Grid`) compiles one program per value of
such an axis.

:func:`replace` validates as a preset file is validated (:meth:`~npujax.hw.NpuSpec.with_fields`);
:func:`replace_traced` sets traced or array values inside ``jit``/``grad`` without validation;
:func:`stack` gives every leaf an ``[n]`` axis for ``jax.vmap``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from npujax.errors import ConfigError
from npujax.hw.spec import _SECTIONS, NpuSpec, _numeric

__all__ = ["SECTIONS", "WORKLOAD_SECTIONS", "TRACED_SECTIONS", "parse", "canonical", "paths",
           "numeric_paths", "is_leaf", "is_traced", "get", "replace", "replace_traced",
           "field_range", "log_range", "stack", "ignored", "check_varied"]

#: The spec's sections, in preset order (:class:`~npujax.hw.NpuSpec`'s dataclass fields).
SECTIONS: tuple[str, ...] = tuple(_SECTIONS)

#: Sections whose fields :func:`npujax.plan.workloads` reads to build the layers: their numeric
#: fields are leaves but not traced (see the module docstring).
WORKLOAD_SECTIONS: tuple[str, ...] = ("layout", "ops")

#: Sections whose numeric fields are traced (evaluated as data without recompiling).
TRACED_SECTIONS: tuple[str, ...] = tuple(s for s in SECTIONS if s not in WORKLOAD_SECTIONS)

#: Short names accepted for a path.
_ALIASES = {"dataflow": "array.dataflow"}

#: Fields the cost program does not read while another field has a given value:
#: ``{path: (switch path, switch value, what is read instead)}``.
_IGNORED_WHEN = {
    "memory.ifmap_sram_bytes": ("memory.sram_split", "per_model",
                                "the per-model split of memory.onchip_sram_bytes sizes it"),
    "memory.ofmap_sram_bytes": ("memory.sram_split", "per_model",
                                "the per-model split of memory.onchip_sram_bytes sizes it"),
    "memory.parameter_cache_bytes": ("memory.sram_split", "per_model",
                                     "the per-model split of memory.onchip_sram_bytes sizes it"),
}


def _index(sections: Mapping[str, type]) -> dict[str, dataclasses.Field]:
    """``{"section.key": field}`` of every field of ``sections``, in order."""
    return {f"{s}.{f.name}": f for s, cls in sections.items() for f in dataclasses.fields(cls)}


_FIELDS = _index(_SECTIONS)


def parse(path: str) -> tuple[str, str]:
    """``(section, key)`` of a field path.

    Args:
      path: ``"section.key"`` (e.g. ``"array.rows"``), or ``"dataflow"``.

    Returns:
      The section and the key, e.g. ``("array", "rows")``.

    Raises:
      ConfigError: not a string, or no such field; the message names the path and lists the
        sections (unknown section) or the section's keys (unknown key).
    """
    if not isinstance(path, str):
        raise ConfigError(f"a hardware field is a string 'section.key' (e.g. 'array.rows'), got "
                          f"{path!r}.")
    full = _ALIASES.get(path, path)
    if full in _FIELDS:
        section, _, key = full.partition(".")
        return section, key
    section, dot, key = full.partition(".")
    if not dot:
        owners = [p for p in _FIELDS if p.partition(".")[2] == path]
        hint = f"; did you mean {owners[0]!r}?" if len(owners) == 1 else ""
        raise ConfigError(f"unknown hardware field {path!r}: write 'section.key' with sections "
                          f"{', '.join(SECTIONS)}{hint} (docs/hw.md).")
    if section not in _SECTIONS:
        raise ConfigError(f"unknown hardware field {path!r}: no section {section!r}; the "
                          f"sections are {', '.join(SECTIONS)} (docs/hw.md).")
    keys = [f.name for f in dataclasses.fields(_SECTIONS[section])]
    raise ConfigError(f"unknown hardware field {path!r}: section {section!r} has the keys "
                      f"{', '.join(keys)} (docs/hw.md).")


def canonical(path: str) -> str:
    """The full ``"section.key"`` form of a path (``"dataflow"`` -> ``"array.dataflow"``).

    Raises:
      ConfigError: no such field (:func:`parse`).
    """
    return ".".join(parse(path))


def paths() -> tuple[str, ...]:
    """Every field's ``"section.key"``, in preset order."""
    return tuple(_FIELDS)


def numeric_paths() -> tuple[str, ...]:
    """The paths of the numeric fields (the spec's pytree leaves), in preset order."""
    return tuple(p for p, f in _FIELDS.items() if _numeric(f))


def is_leaf(path: str) -> bool:
    """Whether the field is a numeric pytree leaf of :class:`~npujax.hw.NpuSpec`.

    Raises:
      ConfigError: no such field.
    """
    return _numeric(_FIELDS[canonical(path)])


def is_traced(path: str) -> bool:
    """Whether the field can change as data inside one compiled program: a numeric leaf outside
    :data:`WORKLOAD_SECTIONS` (see the module docstring).

    Raises:
      ConfigError: no such field.
    """
    return is_leaf(path) and parse(path)[0] not in WORKLOAD_SECTIONS


def get(spec: NpuSpec, path: str) -> Any:
    """The value of a field (of a concrete, traced, stacked or gradient spec).

    Args:
      spec: the NPU, or any pytree of its structure (e.g. ``jax.grad``'s result).
      path: ``"section.key"`` or ``"dataflow"``.

    Returns:
      The field's value.

    Raises:
      ConfigError: no such field.
    """
    section, key = parse(path)
    return getattr(getattr(spec, section), key)


def _canonical_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(changes, Mapping):
        raise ConfigError(f"hardware field changes must be a mapping {{'section.key': value}}, "
                          f"got {type(changes).__name__}; e.g. {{'array.rows': 32}}.")
    out: dict[str, Any] = {}
    for path, value in changes.items():
        full = canonical(path)
        if full in out:
            raise ConfigError(f"hardware field {full!r} is given twice (as {path!r} too).")
        out[full] = value
    return out


def replace(spec: NpuSpec, changes: Mapping[str, Any], name: str | None = None) -> NpuSpec:
    """A copy of ``spec`` with fields changed, validated as a preset file is.

    Args:
      spec: a concrete NPU.
      changes: ``{path: value}``, e.g. ``{"array.rows": 32, "dataflow": "os"}``.
      name: the new spec's name (default: ``spec``'s).

    Returns:
      The validated copy (:meth:`~npujax.hw.NpuSpec.with_fields`).

    Raises:
      ConfigError: an unknown or repeated field, or a value a preset could not hold.
    """
    return spec.with_fields(_canonical_changes(changes), name=name)


def replace_traced(spec: NpuSpec, changes: Mapping[str, Any]) -> NpuSpec:
    """A copy of ``spec`` with fields set to traced or array values, without validation.

    For values inside ``jax.jit``/``jax.grad``/``jax.vmap`` (a fit's parameters, a co-design's
    relaxed hardware), which :func:`replace` cannot check.

    Args:
      spec: the NPU (e.g. :func:`~npujax.hw.differentiable_spec` of a preset).
      changes: ``{path: value}``; values of any type, kept as given.

    Returns:
      The copy.

    Raises:
      ConfigError: an unknown or repeated field.
    """
    by_section: dict[str, dict[str, Any]] = {}
    for path, value in _canonical_changes(changes).items():
        section, key = parse(path)
        by_section.setdefault(section, {})[key] = value
    return dataclasses.replace(spec, **{s: dataclasses.replace(getattr(spec, s), **kv)
                                        for s, kv in by_section.items()})


def field_range(path: str) -> tuple[float, float]:
    """The physical range ``(lo, hi)`` of a numeric field, as preset validation enforces it
    (``docs/hw.md``, "Ranges").

    Args:
      path: a numeric field's ``"section.key"``.

    Returns:
      ``(lo, hi)`` as floats in the field's unit; ``lo`` is 0 for fields that may be 0.

    Raises:
      ConfigError: no such field, or a field without a range (names, choices, lists).
    """
    meta = _FIELDS[canonical(path)].metadata
    if meta.get("lo") is None or meta.get("hi") is None:
        raise ConfigError(f"hardware field {path!r} is not a number and has no range; numeric "
                          f"fields are {', '.join(numeric_paths())}.")
    return float(meta["lo"]), float(meta["hi"])


def log_range(path: str) -> tuple[float, float]:
    """:func:`field_range` with a positive ``lo`` for a log scale: a field that may be 0 gets
    ``lo = hi x 1e-9``.

    Args:
      path: a numeric field's ``"section.key"``.

    Returns:
      ``(lo, hi)``, ``0 < lo < hi``, in the field's unit.

    Raises:
      ConfigError: no such field, or a field without a range.
    """
    lo, hi = field_range(path)
    return (lo if lo > 0 else hi * 1e-9), hi


def stack(spec: NpuSpec, changes: Mapping[str, Any], n: int) -> NpuSpec:
    """``spec`` with every numeric leaf an ``[n]`` array (int64 for ``int`` fields, float64 for
    ``float`` ones), for ``jax.vmap`` over ``n`` configurations.

    Args:
      spec: a concrete NPU (its static fields are shared by all ``n``).
      changes: ``{path: [n] values}`` for the leaves that vary; the others repeat ``spec``'s.
      n: the number of configurations.

    Returns:
      The stacked spec.

    Raises:
      ConfigError: an unknown field, one that is not a numeric leaf, or values not ``[n]``.
    """
    given: dict[str, np.ndarray] = {}
    for path, values in _canonical_changes(changes).items():
        if not is_leaf(path):
            raise ConfigError(f"cannot stack {path!r}: only numeric fields vary under vmap; "
                              "give each value of a name its own spec.")
        dtype = np.int64 if str(_FIELDS[path].type) == "int" else np.float64
        given[path] = np.asarray(values, dtype)
        if given[path].shape != (n,):
            raise ConfigError(f"stack: {path!r} has shape {given[path].shape}, expected ({n},).")
    sections = {}
    for section in SECTIONS:
        sec = getattr(spec, section)
        new = {}
        for f in dataclasses.fields(sec):
            if not _numeric(f):
                continue
            path = f"{section}.{f.name}"
            dtype = np.int64 if str(f.type) == "int" else np.float64
            new[f.name] = given[path] if path in given else np.full(n, getattr(sec, f.name),
                                                                      dtype)
        sections[section] = dataclasses.replace(sec, **new)
    return dataclasses.replace(spec, **sections)


def ignored(spec: NpuSpec, path: str) -> str | None:
    """Why the cost program does not read field ``path`` on ``spec``, or None if it does.

    A preset with ``memory.sram_split = "per_model"`` sizes its activation buffers and parameter
    cache per model from ``memory.onchip_sram_bytes`` (:mod:`npujax.plan.passes.onchip_split`),
    so their own values have no effect there.

    Raises:
      ConfigError: no such field.
    """
    full = canonical(path)
    rule = _IGNORED_WHEN.get(full)
    if rule is None:
        return None
    switch, value, instead = rule
    if get(spec, switch) != value:
        return None
    return f"{switch} = {value!r}: {instead}"


def check_varied(spec: NpuSpec, paths: Sequence[str], what: str) -> None:
    """Refuse to vary a field ``spec``'s cost program ignores (:func:`ignored`): a sweep axis,
    a fitted or co-designed field that changes no number would be a silently wrong answer.

    Args:
      spec: the base NPU.
      paths: the fields varied (``section.key`` or short names).
      what: how they are varied, for the message (e.g. ``"grid axis"``).

    Raises:
      ConfigError: a varied field the cost program ignores on ``spec``, naming the switch.
    """
    for path in paths:
        why = ignored(spec, path)
        if why is not None:
            switch = _IGNORED_WHEN[canonical(path)][0]
            raise ConfigError(
                f"{what} {canonical(path)!r} changes nothing on {spec.name!r}, which has {why}; "
                f"vary memory.onchip_sram_bytes instead, or set {switch} = 'fixed' and "
                "memory.onchip_sram_bytes = 0 in a copy of the preset (docs/hw.md).")
