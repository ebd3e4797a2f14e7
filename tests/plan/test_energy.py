"""Energy and area (issue 13, section 3): preset sections, per-action energies, per-layer energy
(pure jnp: vmap over specs, grad in the relaxed mode) and its place in every report."""

from __future__ import annotations

import importlib.resources
import tomllib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax.errors import ConfigError
from npujax.hw import (
    area_breakdown,
    differentiable_spec,
    list_presets,
    load_npu_spec,
    mac_energy_pj,
    npu_spec_from_dict,
    sram_pj_per_byte,
    stack_specs,
)
from npujax.hw.spec import AreaSpec, EnergySpec, TechnologySpec
from npujax.plan import ENERGY_BREAKDOWN, layer_costs, layer_energy, lower
from npujax.plan.workload import Workload
from npujax.report.files import LAYER_COLUMNS


def _gemm(M, K, N):
    return Workload(name="g", op="Gemm", kind="gemm", M=M, K=K, N=N, macs=M * K * N,
                    weight_elems=K * N, bias_elems=N, in_elems=M * K, out_elems=M * N,
                    cpu_ops=2 * M * K * N)


def _layers():
    """A GEMM, a vector layer after it, and a CPU fallback layer after that."""
    return [_gemm(64, 576, 64),
            Workload(name="add", op="Add", kind="vector", in_elems=8192, out_elems=4096,
                     vector_ops=4096, cpu_ops=4096, producer=0),
            Workload(name="sm", op="Softmax", kind="vector", device="cpu", in_elems=4096,
                     out_elems=4096, cpu_ops=40960, link_in_elems=4096, link_out_elems=4096,
                     link_transfers=2, producer=1)]


_LAYERS = tuple(_layers())


@jax.jit
def _energy(spec, w, a, dram_bytes=None):
    """``layer_energy`` of :data:`_LAYERS`, compiled once per spec structure (eager dispatch of
    its few hundred small ops would cost seconds)."""
    return layer_energy(_LAYERS, spec, w, a, dram_bytes=dram_bytes)


def _preset_text(name):
    return (importlib.resources.files("npujax.presets") / f"{name}.toml").read_text()


def _bits(w, a, n=3):
    return jnp.full((n,), w, jnp.float32), jnp.full((n,), a, jnp.float32)


@pytest.mark.parametrize("name", list_presets())
def test_presets_load_with_energy_and_area(name):
    spec = load_npu_spec(name)
    area = area_breakdown(spec)
    assert all(float(v) > 0 for v in area)
    assert float(area.total_mm2) == pytest.approx(float(sum(area[:3])), rel=1e-6)
    assert float(mac_energy_pj(spec, 4.0, 4.0)) < float(mac_energy_pj(spec, 8.0, 8.0))


def test_sections_default_when_left_out(edge_spec):
    data = tomllib.loads(_preset_text("edge_16x16"))
    data.pop("technology")
    spec = npu_spec_from_dict(data)
    assert spec.technology == TechnologySpec() and spec.energy == EnergySpec()
    assert spec.area == AreaSpec()
    assert edge_spec.technology.node_nm == 28  # the preset's own node
    # Horowitz (ISSCC 2014), 45 nm: 8b multiply 0.2 pJ + 32b add 0.1 pJ; 10 pJ per 64-bit read
    # of 8 KB, 20 pJ at 32 KB
    assert float(mac_energy_pj(spec, 8.0, 8.0)) == pytest.approx(0.3)
    assert float(sram_pj_per_byte(spec, 8192)) * 8 == pytest.approx(10.0)
    assert float(sram_pj_per_byte(spec, 32768)) * 8 == pytest.approx(20.0)


@pytest.mark.parametrize("change, match", [
    ({"energy.dram_pj_per_byte": -1.0}, "dram_pj_per_byte.*non-negative"),
    ({"technology.node_nm": 0.5}, r"node_nm.*outside the physical range"),
    ({"area.sram_um2_per_byte": float("inf")}, "sram_um2_per_byte"),
    ({"energy.sram_reference_bytes": 0}, "sram_reference_bytes.*positive"),
    ({"energy.mac_pj": 1.0}, "unknown hardware field 'energy.mac_pj'"),
])
def test_bad_energy_fields_raise(edge_spec, change, match):
    with pytest.raises(ConfigError, match=match):
        edge_spec.with_fields(change)


def test_unknown_key_in_energy_section_names_it(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(_preset_text("edge_16x16") + "\n[energy]\nmac_pj = 1.0\n")
    with pytest.raises(ConfigError, match=r"bad.toml \[energy\].*'mac_pj'.*allowed keys"):
        load_npu_spec(path)


def test_hand_computed_energy_of_one_gemm(edge_spec):
    """A 4x64x32 GEMM on edge_16x16 at 45 nm (no node scaling), output stationary: M on the
    rows (1 fold), N on the columns (2 folds), K in time; 1000 DRAM bytes given."""
    spec = edge_spec.with_fields({"technology.node_nm": 45})
    e = jax.jit(lambda s: layer_energy([_gemm(4, 64, 32)], s, jnp.full((1,), 8.0),
                                       jnp.full((1,), 8.0), dram_bytes=jnp.full((1,), 1000.0)))(
        spec)
    macs = 4 * 64 * 32
    mac = macs * (0.2 * 8 * 8 / 64 + 0.1 * 32 / 32)          # Horowitz multiply + add
    register = macs * (8 + 8 + 32) / 8 * 0.03                 # operands and partial sum
    sram_byte = 1.25 * (131072 / 8192) ** 0.5                  # 5 pJ/B at 128 KiB
    reads = 4 * 64 * 2 + 64 * 32 * 1                          # a per N fold, b per M fold
    sram = (reads + 4 * 32) * sram_byte + 1000 * sram_byte     # + outputs + DRAM staging
    dram = 1000 * 162.5
    expect = np.asarray([mac, register, sram, dram, 0.0, 0.0]) * 1e-12
    got = np.asarray([float(v[0]) for v in e.breakdown().values()])
    np.testing.assert_allclose(got, expect, rtol=1e-5)
    assert float(e.total_j[0]) == pytest.approx(expect.sum(), rel=1e-5)


def test_energy_invariants(edge_spec):
    e8 = _energy(edge_spec, *_bits(8, 8))
    for k in ENERGY_BREAKDOWN:
        assert np.all(np.asarray(e8.breakdown()[k]) >= 0), k
    np.testing.assert_allclose(np.asarray(e8.total_j),
                               np.sum([np.asarray(v) for v in e8.breakdown().values()], 0),
                               rtol=1e-6)
    assert float(e8.host_j[2]) > 0 and float(e8.vector_j[1]) > 0 and float(e8.mac_j[0]) > 0
    # monotone in the bit widths and in the DRAM bytes
    e4 = _energy(edge_spec, *_bits(4, 4))
    e16 = _energy(edge_spec, *_bits(16, 8))
    assert float(e4.mac_j[0]) < float(e8.mac_j[0]) < float(e16.mac_j[0])
    assert float(e4.total_j.sum()) < float(e8.total_j.sum()) < float(e16.total_j.sum())
    dram = np.asarray(jax.jit(lambda s, w, a: layer_costs(_LAYERS, s, w, a).dram_bytes)(
        edge_spec, *_bits(8, 8)))
    more = _energy(edge_spec, *_bits(8, 8), dram * 2.0)
    assert np.all(np.asarray(more.dram_j) >= np.asarray(e8.dram_j))
    assert float(more.total_j[0]) > float(e8.total_j[0])


def test_area_monotone_and_tpu_v1_from_its_die():
    base = load_npu_spec("edge_16x16")
    a0 = float(area_breakdown(base).total_mm2)
    for change in ({"array.rows": 32}, {"array.cols": 17}, {"memory.ifmap_sram_bytes": 262144},
                   {"vector.lanes": 32}, {"array.cores": 2}):
        assert float(area_breakdown(base.with_fields(change)).total_mm2) > a0, change
    # Jouppi et al. 2017: the MMU is 24 % and the UB 29 % of a <= 331 mm^2 die (28 nm)
    tpu = area_breakdown(load_npu_spec("tpu_v1"))
    assert float(tpu.array_mm2) == pytest.approx(0.24 * 331, rel=0.01)
    assert float(tpu.sram_mm2) > 0.29 * 331 * 0.99


def test_vmap_over_stacked_specs_and_relaxed_gradient(edge_spec):
    w, a = _bits(8, 8)
    specs = [edge_spec, edge_spec.with_fields({"array.rows": 32, "energy.dram_pj_per_byte": 40.0,
                                               "memory.filter_sram_bytes": 16384})]
    batched = jax.jit(jax.vmap(lambda s: _energy(s, w, a).total_j))(stack_specs(specs))
    for i, s in enumerate(specs):
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(_energy(s, w, a).total_j),
                                   rtol=1e-5)

    ds = differentiable_spec(edge_spec)

    def total(wb, spec):
        return layer_energy(_LAYERS, spec, wb, a, relaxed=True).total_j.sum()

    value_and_grad = jax.jit(jax.value_and_grad(total, argnums=(0, 1)))
    value, (gw, gs) = value_and_grad(w, ds)
    exact = float(_energy(edge_spec, w, a).total_j.sum())
    assert float(value) == pytest.approx(exact, rel=1e-5)  # same forward value
    leaves = jax.tree.leaves(gs)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in [gw, *leaves])
    assert float(gw[0]) > 0  # wider weights cost energy
    assert float(gs.energy.dram_pj_per_byte) > 0 and float(gs.energy.mult_int8_pj) > 0


def test_lower_reports_energy_edp_and_area(small_resnet):
    graph, _ = small_resnet
    s = lower(graph, "edge_16x16")
    assert s.energy_j > 0 and s.energy_j == pytest.approx(sum(r.energy_j for r in s.layers))
    assert s.edp_js == pytest.approx(s.energy_j * s.latency_s)
    assert sum(s.energy_breakdown_j().values()) == pytest.approx(s.energy_j, rel=1e-9)
    assert s.area_mm2 == pytest.approx(float(area_breakdown(load_npu_spec("edge_16x16"))
                                             .total_mm2), rel=1e-6)
    d = s.to_dict()
    assert {"energy_j", "edp_js", "area_mm2", "energy_breakdown_j"} <= set(d)
    assert {"energy_j", "energy_dram_j"} <= set(d["layers"][0]) and "energy_j" in LAYER_COLUMNS
