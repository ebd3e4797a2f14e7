"""npujax.hw.fields: paths into the spec, their kinds, validated and traced replacement and
stacking."""

# the annotations stay strings, as in npujax/hw/spec.py (whose leaf rule reads them)
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.hw import NpuSpec, differentiable_spec, fields, load_npu_spec
from npujax.hw import spec as spec_module


@pytest.fixture(scope="module")
def edge():
    return load_npu_spec("edge_16x16")


def _leaf_paths(spec):
    return [".".join(k.name for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(spec)]


def test_parse_full_paths_and_the_dataflow_alias():
    assert fields.parse("array.rows") == ("array", "rows")
    assert fields.parse("dataflow") == ("array", "dataflow")
    assert fields.canonical("dataflow") == "array.dataflow"
    assert fields.parse("area.vector_lane_um2") == ("area", "vector_lane_um2")


@pytest.mark.parametrize("path, names", [
    ("arr.rows", ["'arr.rows'", "no section 'arr'", "array, memory, vector"]),
    ("array.rowz", ["'array.rowz'", "section 'array'", "rows, cols, dataflow"]),
    ("rows", ["'rows'", "did you mean 'array.rows'?"]),
    ("array", ["'array'", "section.key"]),
    ("array.rows.x", ["'array.rows.x'", "rows, cols"]),
])
def test_parse_errors_name_the_path_and_what_is_valid(path, names):
    with pytest.raises(ConfigError) as e:
        fields.parse(path)
    for n in names:
        assert n in str(e.value)


def test_sections_are_the_spec_dataclass_fields(edge):
    sections = tuple(f.name for f in dataclasses.fields(NpuSpec)
                     if dataclasses.is_dataclass(getattr(edge, f.name)))
    assert fields.SECTIONS == sections == tuple(spec_module._SECTIONS)
    assert fields.paths()[:2] == ("array.rows", "array.cols")
    assert {p.partition(".")[0] for p in fields.paths()} == set(sections)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _NocSpec:
    link_bytes_per_s: float = spec_module._field(default=1e9, lo=1e3, hi=1e15)
    topology: str = spec_module._field(default="mesh", choices=("mesh", "ring"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class _NocNpuSpec(NpuSpec):
    """A spec with one section more (the type hints resolve at module level)."""

    noc: _NocSpec = dataclasses.field(default_factory=_NocSpec)


def test_a_new_section_is_picked_up_from_the_spec_class():
    sections = spec_module._section_classes(_NocNpuSpec)
    assert list(sections) == [*fields.SECTIONS, "noc"]
    index = fields._index(sections)
    assert spec_module._numeric(index["noc.link_bytes_per_s"])
    assert not spec_module._numeric(index["noc.topology"])


def test_leaves_are_exactly_the_spec_pytree_leaves(edge):
    assert list(fields.numeric_paths()) == _leaf_paths(edge)
    assert all(fields.is_leaf(p) == (p in fields.numeric_paths()) for p in fields.paths())
    assert not fields.is_leaf("dataflow") and not fields.is_leaf("ops.supported")


def test_traced_is_a_leaf_outside_the_workload_sections(edge):
    traced = {p for p in fields.paths() if fields.is_traced(p)}
    assert traced == {p for p in _leaf_paths(edge)
                      if p.partition(".")[0] not in fields.WORKLOAD_SECTIONS}
    # the numbers the layers are built from stay static axes of a sweep
    assert set(fields.numeric_paths()) - traced == {
        "layout.c0", "layout.channel_alignment", "layout.dram_burst_bytes",
        "ops.conv_max_kernel", "ops.conv_max_stride", "ops.resize_max_scale"}
    assert fields.TRACED_SECTIONS == ("array", "memory", "vector", "host", "technology",
                                      "energy", "area", "thermal")


def test_get_and_validated_replace(edge):
    assert fields.get(edge, "dataflow") == edge.array.dataflow
    big = fields.replace(edge, {"array.rows": 32, "dataflow": "output_stationary"}, name="big")
    assert (big.name, big.array.rows, big.array.dataflow) == ("big", 32, "output_stationary")
    assert big.array.cols == edge.array.cols
    with pytest.raises(ConfigError, match="array.rows"):
        fields.replace(edge, {"array.rows": 0})
    with pytest.raises(ConfigError, match="given twice"):
        fields.replace(edge, {"dataflow": "input_stationary", "array.dataflow": "input_stationary"})
    with pytest.raises(ConfigError, match="'memory.sram'"):
        fields.replace(edge, {"memory.sram": 1})


def test_replace_traced_under_jit_and_grad(edge):
    base = differentiable_spec(edge, jnp.float32)

    def peak(x):
        s = fields.replace_traced(base, {"array.rows": x, "array.clock_hz": 2 * x})
        return s.peak_macs_per_s

    x = jnp.float32(3.0)
    a = edge.array
    assert float(jax.jit(peak)(x)) == pytest.approx(a.cores * 3 * a.cols * 6)
    # d/dx (cores * x * cols * 2x) = 4 x cores cols
    assert float(jax.jit(jax.grad(peak))(x)) == pytest.approx(4 * 3 * a.cores * a.cols)
    s = fields.replace_traced(edge, {"vector.lanes": "anything"})  # not validated
    assert s.vector.lanes == "anything" and s.array == edge.array


def test_stack_gives_int64_and_float64_leaves(edge):
    rows = np.array([8, 16, 32])
    s = fields.stack(edge, {"array.rows": rows, "memory.dram_bytes_per_s": [1e9, 2e9, 4e9]}, 3)
    for path, leaf in zip(fields.numeric_paths(), jax.tree.leaves(s)):
        dtype = np.int64 if isinstance(fields.get(edge, path), int) else np.float64
        assert leaf.shape == (3,) and leaf.dtype == dtype, path
    np.testing.assert_array_equal(s.array.rows, rows)
    np.testing.assert_array_equal(s.array.cols, [edge.array.cols] * 3)
    assert s.array.dataflow == edge.array.dataflow
    with pytest.raises(ConfigError, match="only numeric"):
        fields.stack(edge, {"dataflow": ["ws", "os", "is"]}, 3)
    with pytest.raises(ConfigError, match=r"expected \(3,\)"):
        fields.stack(edge, {"array.rows": [8, 16]}, 3)


def test_ranges_raw_and_log_scale():
    assert fields.field_range("array.clock_hz") == (1e3, 1e11)
    assert fields.field_range("memory.dram_latency_s") == (0.0, 1.0)
    assert fields.log_range("memory.dram_latency_s") == (1e-9, 1.0)
    assert fields.log_range("array.rows") == (1.0, 2.0 ** 16)
    with pytest.raises(ConfigError, match="'array.dataflow' is not a number"):
        fields.field_range("array.dataflow")


def test_a_parameter_cache_size_without_a_cache_is_refused():
    """From a new-user trial: ``parameter_cache_bytes`` was silently ignored while
    ``parameter_cache = "none"``."""
    from npujax.hw import load_npu_spec

    spec = load_npu_spec("edge_16x16")
    with pytest.raises(ConfigError, match="parameter_cache_bytes = 8192 has no effect"):
        spec.with_fields({"memory.parameter_cache_bytes": 8192})
    cached = spec.with_fields({"memory.parameter_cache": "streams_from_host",
                               "memory.parameter_cache_bytes": 8192})
    assert cached.memory.parameter_cache_bytes == 8192


def test_fields_a_per_model_sram_split_overrides_cannot_be_varied(edge):
    """A sweep, fit or co-design varying a buffer a per-model split sizes would change no
    number: refused by name, with the switch; the same fields vary on a fixed split."""
    from npujax.explore import Grid
    from npujax.plan.fit import fit_spec

    coral = load_npu_spec("coral_edgetpu")
    assert fields.ignored(coral, "memory.ifmap_sram_bytes") is not None
    assert fields.ignored(coral, "memory.dram_bytes_per_s") is None
    assert fields.ignored(edge, "memory.ifmap_sram_bytes") is None
    with pytest.raises(ConfigError, match="memory.ifmap_sram_bytes.*sram_split = 'per_model'"):
        Grid.build({"memory.ifmap_sram_bytes": [65536, 131072]}, coral)
    with pytest.raises(ConfigError, match="parameter_cache_bytes.*onchip_sram_bytes"):
        Grid.build({"array.rows": [32, 64],
                    "memory.parameter_cache_bytes": [1 << 20, 1 << 22]}, coral)
    Grid.build({"memory.ifmap_sram_bytes": [65536, 131072]}, edge)
    with pytest.raises(ConfigError, match="fitted field 'memory.ofmap_sram_bytes'"):
        fit_spec([], coral, [0], [1e-3], ["ofmap_sram_bytes"])


def test_a_per_model_split_chip_has_the_area_of_its_one_sram():
    """The silicon is the shared SRAM, not the buffers a fixed split would size: area follows
    onchip_sram_bytes (numpy reference of the buffer formula) and not ifmap_sram_bytes."""
    from npujax.hw.energy import area_breakdown, area_scale

    coral = load_npu_spec("coral_edgetpu")
    ar = coral.area
    c = coral.memory.onchip_sram_bytes
    want = (area_scale(coral) * 1e-6 * coral.array.cores
            * (ar.sram_um2_per_byte * c + ar.sram_periphery_um2_per_sqrt_byte * np.sqrt(c)))
    np.testing.assert_allclose(float(area_breakdown(coral).sram_mm2), want, rtol=1e-6)
    bigger = coral.with_fields({"memory.onchip_sram_bytes": 2 * c})
    assert float(area_breakdown(bigger).sram_mm2) > float(area_breakdown(coral).sram_mm2)
    other = coral.with_fields({"memory.ifmap_sram_bytes": 65536})
    assert float(area_breakdown(other).sram_mm2) == float(area_breakdown(coral).sram_mm2)
