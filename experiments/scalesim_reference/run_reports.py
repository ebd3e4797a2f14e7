"""Run SCALE-Sim 3.0.0 on small GEMM and conv topologies with small SRAMs; store its three report
CSVs verbatim as JSON (test data for npujax's SCALE-Sim report writer).

The reference cases of ``run_scalesim.py`` use 1024 kB SRAMs, where no operand outgrows its
active buffer; these use 2 and 4 kB SRAMs so that SCALE-Sim's OFMAP write buffer drains during
compute and operands larger than half their SRAM stream in rotating sets. Runs *inside* the
virtual environment made by ``make_reference.sh`` (it imports nothing from npujax); ~1 minute.

Usage: python run_reports.py OUT.json
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile

import scalesim
from scalesim.scale_sim import scalesim as ScaleSim

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_scalesim import CONFIG  # noqa: E402  (the same architecture config as the reference)

GEMM = "Layer, M, N, K,\n" + "".join(f"{n}, {m}, {nn}, {k},\n" for n, m, k, nn in [
    ("g_64x9x16", 64, 9, 16), ("g_100x37x23", 100, 37, 23), ("g_33x300x7", 33, 300, 7),
    ("g_200x8x1", 200, 8, 1), ("g_17x20x40", 17, 20, 40)])
CONV = ("Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, "
        "Num Filter, Stride,\n"
        "c3x3_s1, 18, 18, 3, 3, 8, 16, 1,\n"
        "c3x3_s2, 17, 17, 3, 3, 4, 12, 2,\n"
        "c1x1_s2, 15, 15, 1, 1, 16, 24, 2,\n")



def run(kind, df, rows, cols, kb):
    with tempfile.TemporaryDirectory() as d:
        topo = os.path.join(d, "topo.csv")
        with open(topo, "w") as f:
            f.write(GEMM if kind == "gemm" else CONV)
        layout = os.path.join(d, "layout.csv")
        with open(layout, "w") as f:
            f.write("Layer name, unused,\n")
        cfg = os.path.join(d, "a.cfg")
        run_name = f"{kind}_{df}_{rows}x{cols}_{kb}kB"
        with open(cfg, "w") as f:
            f.write(CONFIG.format(run=run_name, rows=rows, cols=cols, sram_kb=kb, df=df))
        sim = ScaleSim(save_disk_space=True, verbose=False, config=cfg, topology=topo,
                       layout=layout, input_type_gemm=(kind == "gemm"))
        with contextlib.redirect_stdout(io.StringIO()):
            sim.run_scale(top_path=d)
        reports = {}
        for name in ("COMPUTE_REPORT.csv", "BANDWIDTH_REPORT.csv", "DETAILED_ACCESS_REPORT.csv"):
            with open(os.path.join(d, run_name, name)) as f:
                reports[name] = f.read()
    return {"kind": kind, "dataflow": df, "rows": rows, "cols": cols, "sram_kb": kb,
            "topology": GEMM if kind == "gemm" else CONV, "reports": reports}


def main(out):
    runs = [run(kind, df, rows, cols, kb) for kind in ("gemm", "conv") for df in ("ws", "os", "is")
            for rows, cols, kb in ((8, 8, 2), (4, 8, 4))]
    doc = {"generator": "experiments/scalesim_reference/run_reports.py",
           "scalesim_file": scalesim.__file__, "scalesim_version": "3.0.0", "runs": runs}
    with open(out + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main(sys.argv[1])
