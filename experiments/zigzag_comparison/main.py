"""npujax vs ZigZag: per-layer energy (and latency) of the same layers, same per-action energies.

Usage:
    pip install zigzag-dse        # or: pip install 'npujax[compare]'
    python experiments/zigzag_comparison/main.py [--npu edge_16x16] [--out DIR]

ZigZag (Mei et al., "ZigZag: Enlarging joint architecture-mapping design space exploration for
DNN accelerators", IEEE TC 2021; ``zigzag-dse`` on PyPI) counts the accesses of every memory
level under the best temporal mapping its LOMA search finds and multiplies them by per-access
energies from the hardware description. This script writes that description from the npujax
preset (``hardware()``): the same R x C array and per-MAC energy (:func:`npujax.hw.mac_energy_pj`
at 8 bits), one operand register per PE for the weight and the input and a 32-bit partial-sum
register (written at ``register_pj_per_byte`` per byte, read for free, as npujax counts them),
the preset's three SRAM buffers at :func:`npujax.hw.sram_pj_per_byte` of their capacities, and
DRAM at ``dram_pj_per_byte`` with the preset's bandwidth per cycle. The spatial mapping is the
preset's dataflow (output stationary: output pixels on the rows, output channels on the
columns); ZigZag chooses the loop order (``opt="energy"``), npujax its default DRAM-level
mapping (``best``, :mod:`npujax.systolic.mapping`). Each layer is one single-operator ONNX
model lowered by :func:`npujax.lower` (its Conv or
MatMul row; layout transforms left out) and described to ZigZag with the same loop bounds and
8-bit operands, 32-bit partial sums and 8-bit outputs.

Prints the per-layer table and writes ``zigzag_comparison.json`` into ``--out``; the numbers
and their explanation are in ``docs/results/fidelity.md`` ("Energy: npujax vs ZigZag").
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

from npujax._atomic import atomic_write_text
from npujax.frontends.onnx import from_onnx
from npujax.hw import NpuSpec, load_npu_spec, mac_energy_pj, sram_pj_per_byte
from npujax.ir.passes import optimize
from npujax.plan import lower

#: (name, kind, params): conv layers of a ResNet and of the PP-OCR classifier's shape class, and
#: GEMMs of a transformer block and a classifier head. Channels are multiples of 16 so that
#: npujax's channel alignment pads nothing (ZigZag has no such padding).
LAYERS = (
    ("resnet_conv3x3_64", "conv", dict(cin=64, cout=64, hw=28, k=3, stride=1)),
    ("resnet_conv1x1_128_256", "conv", dict(cin=128, cout=256, hw=14, k=1, stride=1)),
    ("ppocr_conv3x3_s2_16_32", "conv", dict(cin=16, cout=32, hw=24, k=3, stride=2)),
    ("gemm_64x256x256", "gemm", dict(m=64, k=256, n=256)),
    ("gemm_1x512x1008", "gemm", dict(m=1, k=512, n=1008)),
)


def onnx_layer(kind: str, p: dict) -> onnx.ModelProto:
    """A single Conv (no bias, 'same' padding) or MatMul with a constant weight."""
    rng = np.random.default_rng(0)
    if kind == "conv":
        k, s = p["k"], p["stride"]
        w = rng.normal(0, 0.1, (p["cout"], p["cin"], k, k)).astype(np.float32)
        node = helper.make_node("Conv", ["x", "w"], ["y"], name="layer", kernel_shape=[k, k],
                                pads=[k // 2] * 4, strides=[s, s])
        x_shape = [1, p["cin"], p["hw"], p["hw"]]
    else:
        w = rng.normal(0, 0.1, (p["k"], p["n"])).astype(np.float32)
        node = helper.make_node("MatMul", ["x", "w"], ["y"], name="layer")
        x_shape = [p["m"], p["k"]]
    g = helper.make_graph([node], "layer",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    return onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))


def zigzag_layer(name: str, kind: str, p: dict) -> dict:
    """The same layer in ZigZag's workload format (8-bit I and W, 32-bit psums, 8-bit out)."""
    prec = {"W": 8, "I": 8, "O": 32, "O_final": 8}
    if kind == "conv":
        k, s = p["k"], p["stride"]
        out = -(-p["hw"] // s)
        return {"id": 0, "name": name, "operator_type": "Conv",
                "equation": "O[b][k][oy][ox]+=W[k][c][fy][fx]*I[b][c][iy][ix]",
                "dimension_relations": [f"ix={s}*ox+1*fx", f"iy={s}*oy+1*fy"],
                "loop_dims": ["B", "K", "C", "OY", "OX", "FY", "FX"],
                "loop_sizes": [1, p["cout"], p["cin"], out, out, k, k],
                "operand_precision": prec, "operand_source": {"I": 0},
                "pr_loop_dims": ["IX", "IY"], "pr_loop_sizes": [p["hw"], p["hw"]],
                "padding": [[k // 2, k // 2], [k // 2, k // 2]]}
    return {"id": 0, "name": name, "operator_type": "Gemm",
            "equation": "O[b][k]+=W[k][c]*I[b][c]",
            "loop_dims": ["B", "K", "C"], "loop_sizes": [p["m"], p["n"], p["k"]],
            "operand_precision": prec, "operand_source": {"I": 0}}


def _port(name: str, kind: str, bw_max: int, alloc: list[str]) -> dict:
    return {"name": name, "type": kind, "bandwidth_min": 8, "bandwidth_max": bw_max,
            "allocation": alloc}


def _memory(size_bits: int, pj_per_byte_r: float, pj_per_byte_w: float, bw_bits: int,
            operands: list[str], served: list[str]) -> dict:
    """A memory level whose accesses are ``bw_bits`` wide (ZigZag counts accesses of
    ``bandwidth_max`` bits: the cost per access is that many bytes at the per-byte energy)."""
    alloc_r = [a for op in operands for a in ((f"{op}, tl", f"{op}, th") if op == "O"
                                               else (f"{op}, tl",))]
    alloc_w = [a for op in operands for a in ((f"{op}, fh", f"{op}, fl") if op == "O"
                                               else (f"{op}, fh",))]
    return {"size": int(size_bits), "r_cost": pj_per_byte_r * bw_bits / 8,
            "w_cost": pj_per_byte_w * bw_bits / 8, "area": 0, "latency": 1,
            "auto_cost_extraction": False, "operands": operands,
            "ports": [_port("r_port_1", "read", bw_bits, alloc_r),
                      _port("w_port_1", "write", bw_bits, alloc_w)],
            "served_dimensions": served}


def hardware(spec: NpuSpec) -> dict:
    """ZigZag's description of ``spec``'s array, registers, SRAMs and DRAM (npujax energies)."""
    a, m, e = spec.array, spec.memory, spec.energy
    scale = float(spec.technology.node_nm / e.reference_node_nm) ** e.node_exponent
    reg = e.register_pj_per_byte * scale
    sram = {b: (float(sram_pj_per_byte(spec, getattr(m, f"{b}_sram_bytes"))),
                float(sram_pj_per_byte(spec, getattr(m, f"{b}_sram_bytes"), write=True)))
            for b in ("ifmap", "filter", "ofmap")}
    dram_bits = max(8, int(m.dram_bytes_per_s / a.clock_hz * 8))
    return {
        "name": f"{spec.name}_zigzag",
        "memories": {
            "reg_W": _memory(8, 0.0, reg, 8, ["I2"], []),
            "reg_I": _memory(8, 0.0, reg, 8, ["I1"], []),
            "reg_O": _memory(32, 0.0, reg, 32, ["O"], []),
            "sram_ifmap": _memory(m.ifmap_sram_bytes * 8, *sram["ifmap"], 8 * a.rows, ["I1"],
                                  ["D1", "D2"]),
            "sram_filter": _memory(m.filter_sram_bytes * 8, *sram["filter"], 8 * a.cols, ["I2"],
                                   ["D1", "D2"]),
            "sram_ofmap": _memory(m.ofmap_sram_bytes * 8, *sram["ofmap"], 32 * a.cols, ["O"],
                                  ["D1", "D2"]),
            "dram": {"size": 10**10, "r_cost": e.dram_pj_per_byte * dram_bits / 8,
                     "w_cost": e.dram_pj_per_byte * dram_bits / 8, "area": 0, "latency": 1,
                     "auto_cost_extraction": False, "operands": ["I1", "I2", "O"],
                     "ports": [_port("rw_port_1", "read_write", dram_bits,
                                     ["I1, fh", "I1, tl", "I2, fh", "I2, tl", "O, fh", "O, tl",
                                      "O, fl", "O, th"])],
                     "served_dimensions": ["D1", "D2"]},
        },
        "operational_array": {"unit_energy": float(mac_energy_pj(spec, 8.0, 8.0)),
                              "unit_area": 1, "dimensions": ["D1", "D2"],
                              "sizes": [a.rows, a.cols]},
    }


def mapping(spec: NpuSpec) -> list[dict]:
    """The preset's dataflow as ZigZag's spatial mapping (rows D1, columns D2)."""
    rows_dim = {"output_stationary": ("OX", "B"), "weight_stationary": ("C", "C"),
                "input_stationary": ("C", "C")}[spec.array.dataflow]
    cols = ("K", "K")
    links = {"O": "O", "W": "I2", "I": "I1"}
    return [{"name": "default", "spatial_mapping": {"D1": [f"{rows_dim[0]}, {spec.array.rows}"],
                                                    "D2": [f"{cols[0]}, {spec.array.cols}"]},
             "memory_operand_links": links},
            {"name": "Gemm", "spatial_mapping": {"D1": [f"{rows_dim[1]}, {spec.array.rows}"],
                                                 "D2": [f"{cols[1]}, {spec.array.cols}"]},
             "memory_operand_links": links}]


def run_zigzag(spec: NpuSpec, name: str, kind: str, p: dict, work: Path) -> dict:
    """ZigZag's energy breakdown (J) and latency (s) of one layer."""
    from zigzag.api import get_hardware_performance_zigzag

    hw_path, map_path, wl_path = work / "hw.yaml", work / "map.yaml", work / f"{name}.yaml"
    hw_path.write_text(yaml.safe_dump(hardware(spec), sort_keys=False))
    map_path.write_text(yaml.safe_dump(mapping(spec), sort_keys=False))
    wl_path.write_text(yaml.safe_dump([zigzag_layer(name, kind, p)], sort_keys=False))
    energy, latency, cmes = get_hardware_performance_zigzag(
        str(wl_path), str(hw_path), str(map_path), opt="energy",
        dump_folder=str(work / name), loma_show_progress_bar=False)
    cme = cmes[0][1][0][0]  # the layer's evaluation under the SumStage's total
    # levels per operand, innermost first: register, SRAM buffer, DRAM (as in hardware())
    per_level = np.sum([np.asarray(v, np.float64) for v in cme.mem_energy_breakdown.values()], 0)
    return {"energy_j": float(energy) * 1e-12, "latency_s": float(latency) / spec.array.clock_hz,
            "mac_j": float(cme.mac_energy) * 1e-12, "register_j": per_level[0] * 1e-12,
            "sram_j": per_level[1] * 1e-12, "dram_j": per_level[2] * 1e-12,
            "levels_j": {str(op): [float(v) * 1e-12 for v in lv]
                         for op, lv in cme.mem_energy_breakdown.items()},
            "temporal_mapping": str(cme.temporal_mapping.mapping_dic_origin)}


def run_npujax(spec: NpuSpec, kind: str, p: dict) -> dict:
    """npujax's energy breakdown (J) and latency (s) of the layer's Conv/MatMul row."""
    graph = optimize(*from_onnx(onnx_layer(kind, p)))[0]
    sched = lower(graph, spec)
    rows = [r for r in sched.layers if r.kind == "gemm"]
    assert len(rows) == 1, [r.name for r in sched.layers]
    r = rows[0]
    e = r.energy
    assert e is not None
    return {"energy_j": e.total_j, "latency_s": r.latency_s, "mac_j": e.mac_j,
            "register_j": e.register_j, "sram_j": e.sram_j, "dram_j": e.dram_j,
            "dram_bytes": r.costs.dram_bytes, "macs": r.macs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npu", default="edge_16x16")
    ap.add_argument("--out", default=None, help="folder for zigzag_comparison.json")
    args = ap.parse_args()
    logging.disable(logging.INFO)  # ZigZag configures the root logger at INFO
    spec = load_npu_spec(args.npu)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, kind, p in LAYERS:
            n = run_npujax(spec, kind, p)
            z = run_zigzag(spec, name, kind, p, Path(tmp))
            rows.append({"layer": name, "npujax": n, "zigzag": z})
    head = (f"{'layer':24s} {'MACs':>10s} | {'energy uJ npujax':>16s} {'zigzag':>8s} {'ratio':>6s}"
            f" | {'MAC':>13s} {'reg':>13s} {'SRAM':>13s} {'DRAM':>13s} | {'latency us':>10s}"
            f" {'zigzag':>8s}")
    print(f"{spec.name}: energy per layer (uJ; component columns npujax/zigzag)")
    print(head)
    for r in rows:
        n, z = r["npujax"], r["zigzag"]
        comp = " ".join(f"{n[k] * 1e6:6.2f}/{z[k] * 1e6:<6.2f}"
                        for k in ("mac_j", "register_j", "sram_j", "dram_j"))
        ratio = n["energy_j"] / z["energy_j"] if z["energy_j"] else math.nan
        print(f"{r['layer']:24s} {n['macs']:10,d} | {n['energy_j'] * 1e6:16.3f} "
              f"{z['energy_j'] * 1e6:8.3f} {ratio:6.2f} | {comp} | "
              f"{n['latency_s'] * 1e6:10.2f} {z['latency_s'] * 1e6:8.2f}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(args.out) / "zigzag_comparison.json", json.dumps(
            {"npu": spec.name, "layers": rows}, indent=2, default=float) + "\n")


if __name__ == "__main__":
    main()
