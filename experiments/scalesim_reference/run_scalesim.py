"""Run SCALE-Sim 3.0.0 on reference GEMMs and ResNet-18 conv layers; write its figures as JSON.

Runs *inside* the virtual environment made by ``make_reference.sh`` (scalesim needs numpy < 2.4),
so it imports nothing from npujax. For every dataflow (ws/os/is) and square array size it writes
one SCALE-Sim topology per case class, runs SCALE-Sim in "CALC" (estimate-bandwidth) mode, and
collects per layer: ``Total Cycles`` and ``Total Cycles (incl. prefetch)`` and ``Stall Cycles``
(COMPUTE_REPORT), ``Overall Util %``, ``Mapping Efficiency %``, ``Compute Util %`` and the SRAM
reads/writes per operand (DETAILED_ACCESS_REPORT).

Usage: python run_scalesim.py OUT.json [--arrays 8,16,32,128] [--dataflows ws,os,is]
       [--kinds gemm,conv,depthwise] [--jobs N] [--per-layer]

``--per-layer`` runs SCALE-Sim once per layer (a one-layer topology each, as a user who asks it
about one layer at a time) and records each run's seconds with the layer (``seconds``), for
``experiments/bench/emulator.py``'s one-layer-per-call comparison; GEMM and conv kinds only.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time

import numpy
import scalesim
from scalesim.scale_sim import scalesim as ScaleSim

# (name, M, K, N): plain GEMMs, chosen to hit the edge cases of the fold arithmetic
# (extents below, equal to and just above the array size; a single row/column; long streams).
GEMMS = [
    ("g_64x9x16", 64, 9, 16),
    ("g_1x1x1", 1, 1, 1),
    ("g_1x64x10", 1, 64, 10),
    ("g_100x37x23", 100, 37, 23),
    ("g_128x128x128", 128, 128, 128),
    ("g_129x33x130", 129, 33, 130),
    ("g_33x300x7", 33, 300, 7),
    ("g_256x64x256", 256, 64, 256),
    ("g_16x512x64", 16, 512, 64),
    ("g_200x8x1", 200, 8, 1),
    # growing the array along a folded dimension can *add* cycles (3 short folds -> 2 longer ones):
    ("g_1x17x8", 1, 17, 8),
    ("g_17x1x8", 17, 1, 8),
    # a transformer encoder's attention scores, sequence 128, head dim 64
    ("g_128x64x128", 128, 64, 128),
]

# ResNet-18 conv layers (He et al. 2016; each distinct shape once), batch 1, at a 64x64 input so
# that SCALE-Sim's cycle-by-cycle memory loop stays affordable on 8x8 arrays. SCALE-Sim's conv is
# "valid" only, so every input is given pre-padded: IFMAP = H + 2*pad.
# (name, ifmap_h, ifmap_w, filt_h, filt_w, channels, filters, stride, pad)
RESNET18_64 = [
    ("conv1", 64, 64, 7, 7, 3, 64, 2, 3),
    ("layer1_conv3x3", 16, 16, 3, 3, 64, 64, 1, 1),
    ("layer2_0_conv1", 16, 16, 3, 3, 64, 128, 2, 1),
    ("layer2_0_downsample", 16, 16, 1, 1, 64, 128, 2, 0),
    ("layer2_conv3x3", 8, 8, 3, 3, 128, 128, 1, 1),
    ("layer3_0_conv1", 8, 8, 3, 3, 128, 256, 2, 1),
    ("layer3_0_downsample", 8, 8, 1, 1, 128, 256, 2, 0),
    ("layer3_conv3x3", 4, 4, 3, 3, 256, 256, 1, 1),
    ("layer4_0_conv1", 4, 4, 3, 3, 256, 512, 2, 1),
    ("layer4_0_downsample", 4, 4, 1, 1, 256, 512, 2, 0),
    ("layer4_conv3x3", 2, 2, 3, 3, 512, 512, 1, 1),
]

# Depthwise 3x3 layers (MobileNetV2-style, small). SCALE-Sim has no grouped conv: a layer whose name
# contains "DP" is split into one single-channel layer per channel (each an M x 9 x 1 GEMM),
# which is npujax's per-group mapping with groups = channels.
DEPTHWISE = [
    ("DP_dw_s1", 14, 14, 3, 3, 8, 1, 1, 1),
    ("DP_dw_s2", 14, 14, 3, 3, 6, 1, 2, 1),
]

CONFIG = """[general]
run_name = {run}

[architecture_presets]
ArrayHeight = {rows}
ArrayWidth = {cols}
IfmapSramSzkB = {sram_kb}
FilterSramSzkB = {sram_kb}
OfmapSramSzkB = {sram_kb}
IfmapOffset = 0
FilterOffset = 10000000
OfmapOffset = 20000000
Bandwidth = 10
Dataflow = {df}
ReadRequestBuffer = 32
WriteRequestBuffer = 32

[layout]
IfmapCustomLayout = False
FilterCustomLayout = False
IfmapSRAMBankBandwidth = 10
IfmapSRAMBankNum = 10
IfmapSRAMBankPort = 2
FilterSRAMBankBandwidth = 10
FilterSRAMBankNum = 10
FilterSRAMBankPort = 2

[sparsity]
SparsitySupport = false
SparseRep = ellpack_block
OptimizedMapping = false
BlockSize = 8
RandomNumberGeneratorSeed = 40

[run_presets]
InterfaceBandwidth = CALC
UseRamulatorTrace = False
"""

SRAM_KB = 1024  # large SRAMs: CALC mode sizes the DRAM bandwidth, cycles do not depend on these


def _valid_input(h, fh, s, pad):
    """Pre-padded input extent that SCALE-Sim should see: the rows a padded conv actually reads.

    SCALE-Sim computes ``out = ceil((H - R + S) / S)``, one more output than a convolution has when
    ``(H - R)`` is not a multiple of S (it counts a partial window). PyTorch/ONNX floor the
    output, so the last ``(H - R) % S`` padded rows are never read: crop them.
    """
    out = (h + 2 * pad - fh) // s + 1
    return (out - 1) * s + fh


def _layers(kind, only=None):
    """The topology rows of ``kind`` (all, or only the one at index ``only``)."""
    rows = GEMMS if kind == "gemm" else RESNET18_64 if kind == "conv" else DEPTHWISE
    return rows if only is None else [rows[only]]


def _write_topology(path, kind, only=None):
    # SCALE-Sim splits every row on ',' and drops the last field, so rows must end with a comma.
    with open(path, "w") as f:
        if kind == "gemm":
            f.write("Layer, M, N, K,\n")
            for name, m, k, n in _layers(kind, only):
                f.write(f"{name}, {m}, {n}, {k},\n")
        else:
            f.write("Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, "
                    "Channels, Num Filter, Stride,\n")
            for name, h, w, fh, fw, c, nf, s, pad in _layers(kind, only):
                hp, wp = _valid_input(h, fh, s, pad), _valid_input(w, fw, s, pad)
                f.write(f"{name}, {hp}, {wp}, {fh}, {fw}, {c}, {nf}, {s},\n")


def _read_report(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    header = [h.strip() for h in rows[0] if h.strip()]
    return [dict(zip(header, (float(v) for v in r if v.strip()))) for r in rows[1:] if r]


def _cases(kind, only=None):
    if kind == "gemm":
        return [dict(name=n, M=m, K=k, N=nn) for n, m, k, nn in _layers(kind, only)]
    out = []
    for name, h, w, fh, fw, c, nf, s, pad in _layers(kind, only):
        hp, wp = _valid_input(h, fh, s, pad), _valid_input(w, fw, s, pad)
        oh, ow = (hp - fh) // s + 1, (wp - fw) // s + 1
        case = dict(name=name, ifmap_h=hp, ifmap_w=wp, filt_h=fh, filt_w=fw, channels=c,
                    filters=nf, stride=s, pad_applied=pad, M=oh * ow, K=fh * fw * c, N=nf)
        if kind == "depthwise":  # one SCALE-Sim layer per channel
            out += [dict(case, name=f"{name}_ch{i}", channels=1, K=fh * fw, group=i,
                         groups=c) for i in range(c)]
        else:
            out.append(case)
    return out


def run_one(kind, df, size, workdir=None, only=None):
    """SCALE-Sim on the layers of ``kind`` (or only the one at index ``only``) at one dataflow
    and square array size: ``(per-layer results, seconds of the run)``."""
    if workdir is None:
        with tempfile.TemporaryDirectory() as d:
            return run_one(kind, df, size, d, only)
    topo = os.path.join(workdir, f"{kind}.csv")
    layout = os.path.join(workdir, "layout.csv")
    cfg = os.path.join(workdir, f"{df}_{size}.cfg")
    _write_topology(topo, kind, only)
    with open(layout, "w") as f:
        f.write("Layer name, unused,\n")
    run = f"{kind}_{df}_{size}"
    with open(cfg, "w") as f:
        f.write(CONFIG.format(run=run, rows=size, cols=size, sram_kb=SRAM_KB, df=df))
    sim = ScaleSim(save_disk_space=True, verbose=False, config=cfg, topology=topo, layout=layout,
                   input_type_gemm=(kind == "gemm"))
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        sim.run_scale(top_path=workdir)
    seconds = time.perf_counter() - t0
    comp = _read_report(os.path.join(workdir, run, "COMPUTE_REPORT.csv"))
    det = _read_report(os.path.join(workdir, run, "DETAILED_ACCESS_REPORT.csv"))
    results = []
    for case, c, d in zip(_cases(kind, only), comp, det):
        results.append({
            **case,
            "dataflow": df, "rows": size, "cols": size,
            "total_cycles": int(c["Total Cycles"]),
            "total_cycles_incl_prefetch": int(c["Total Cycles (incl. prefetch)"]),
            "stall_cycles": int(c["Stall Cycles"]),
            "overall_util_pct": c["Overall Util %"],
            "mapping_efficiency_pct": c["Mapping Efficiency %"],
            "compute_util_pct": c["Compute Util %"],
            "sram_ifmap_reads": int(d["SRAM IFMAP Reads"]),
            "sram_filter_reads": int(d["SRAM Filter Reads"]),
            "sram_ofmap_writes": int(d["SRAM OFMAP Writes"]),
            "dram_ifmap_reads": int(d["DRAM IFMAP Reads"]),
            "dram_filter_reads": int(d["DRAM Filter Reads"]),
            "dram_ofmap_writes": int(d["DRAM OFMAP Writes"]),
        })
    return results, seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--arrays", default="8,16,32,128")
    p.add_argument("--dataflows", default="ws,os,is")
    p.add_argument("--kinds", default="gemm,conv,depthwise")
    p.add_argument("--jobs", type=int, default=1, help="SCALE-Sim runs in parallel processes")
    p.add_argument("--per-layer", action="store_true",
                   help="one SCALE-Sim run per layer, each timed (gemm and conv kinds)")
    args = p.parse_args(argv)
    kinds = args.kinds.split(",")
    if args.per_layer and "depthwise" in kinds:
        p.error("--per-layer takes the gemm and conv kinds (a depthwise layer is several runs)")
    combos = [(kind, df, int(size), None, only) for kind in kinds
              for df in args.dataflows.split(",") for size in args.arrays.split(",")
              for only in (range(len(_layers(kind))) if args.per_layer else [None])]
    cases, timings = [], []
    with multiprocessing.Pool(args.jobs) as pool:
        for (kind, df, size, _, only), (res, sec) in zip(combos, pool.starmap(run_one, combos)):
            per_layer = {"seconds": round(sec, 4)} if only is not None else {}
            cases += [{**r, "kind": kind, **per_layer} for r in res]
            timings.append({"kind": kind, "dataflow": df, "rows": size, "cols": size,
                            "layers": len(res), "seconds": round(sec, 4)})
            print(f"{kind:5s} {df} {size:4d}x{size:<4d} {len(res):3d} layers {sec:8.2f} s",
                  file=sys.stderr, flush=True)
    doc = {
        "generator": "experiments/scalesim_reference/run_scalesim.py",
        "scalesim_version": "3.0.0",
        "numpy_version": numpy.__version__,
        "python_version": platform.python_version(),
        "mode": "InterfaceBandwidth=CALC (estimate-bandwidth), SRAMs 1024 kB each, word 1 byte",
        "scalesim_file": scalesim.__file__,
        "cases": cases,
        "timings": timings,
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
