"""ZigZag's Eyeriss-like hardware on AlexNet's CONV layers with a row-stationary spatial unrolling.

Usage (ZigZag in its own venv; npujax is not needed):
    python3 -m venv /work/venv-zigzag && /work/venv-zigzag/bin/pip install zigzag-dse
    /work/venv-zigzag/bin/python experiments/eyeriss/zigzag_alexnet.py [--out FILE.json]

ZigZag (Mei et al., IEEE TC 2021; ``zigzag-dse`` on PyPI) ships an Eyeriss-like accelerator
(``zigzag/inputs/hardware/eyeriss_like.yaml``: a 14 x 12 operational array, per-PE register
files for inputs, weights and outputs, an output SRAM, a weight SRAM, a 1 MB shared SRAM and
DRAM of 64 bits per cycle). It is used as shipped. The spatial mapping is the RS unrolling:
ofmap rows ``OY`` on the 14-wide dimension D1 and filter rows ``FY`` on the 12-high dimension
D2 (the diagonal ifmap reuse follows from ZigZag's ``iy = oy + fy`` relation); the unrolled
``OY`` is the largest divisor of E up to 14 (ZigZag unrolls whole divisors). ZigZag searches the
temporal mapping (LOMA, minimal latency). Each layer is one group (CONV2/4/5 have two groups:
their figures are doubled), batch 4, 16-bit operands. Prints the per-layer cycles and writes
them as JSON; the comparison is in docs/results/row_stationary.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import yaml

#: (name, C per group, M per group, R=S, E=F, U, groups, padded input H=W)
LAYERS = (("CONV1", 3, 96, 11, 55, 4, 1, 227), ("CONV2", 48, 128, 5, 27, 1, 2, 31),
          ("CONV3", 256, 384, 3, 13, 1, 1, 15), ("CONV4", 192, 192, 3, 13, 1, 2, 15),
          ("CONV5", 192, 128, 3, 13, 1, 2, 15))
BATCH = 4


def layer(name, c, m, k, e, u, hin):
    return {"id": 0, "name": name, "operator_type": "Conv",
            "equation": "O[b][k][oy][ox]+=W[k][c][fy][fx]*I[b][c][iy][ix]",
            "dimension_relations": [f"ix={u}*ox+1*fx", f"iy={u}*oy+1*fy"],
            "loop_dims": ["B", "K", "C", "OY", "OX", "FY", "FX"],
            "loop_sizes": [BATCH, m, c, e, e, k, k],
            "operand_precision": {"W": 16, "I": 16, "O": 16, "O_final": 16},
            "operand_source": {"I": 0}, "pr_loop_dims": ["IX", "IY"],
            "pr_loop_sizes": [hin, hin]}


def main(argv=None) -> int:
    import zigzag
    from zigzag import api

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--replicate", action="store_true",
                    help="also unroll filters K on D2 next to FY (Eyeriss's replication of "
                         "small PE sets: floor(12 / R) filter groups)")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    hw = str(Path(zigzag.__file__).parent / "inputs/hardware/eyeriss_like.yaml")
    rows = []
    for name, c, m, k, e, u, g, hin in LAYERS:
        oy = max(d for d in range(1, 15) if e % d == 0)
        d2 = [f"FY, {k}"]
        if args.replicate and 12 // k > 1:
            d2.append(f"K, {12 // k}")
        mapping = [{"name": "default", "spatial_mapping": {"D1": [f"OY, {oy}"], "D2": d2},
                    "memory_operand_links": {"O": "O", "W": "I2", "I": "I1"}}]
        with tempfile.TemporaryDirectory() as tmp:
            wl, mp = Path(tmp) / "w.yaml", Path(tmp) / "m.yaml"
            wl.write_text(yaml.safe_dump([layer(name, c, m, k, e, u, hin)]))
            mp.write_text(yaml.safe_dump(mapping))
            energy, latency, cmes = api.get_hardware_performance_zigzag(
                str(wl), hw, str(mp), opt="latency", dump_folder=tmp,
                loma_show_progress_bar=False, enable_mix_spatial_mapping=args.replicate)
        cme = cmes[0][1][0][0] if isinstance(cmes[0][1], list) else cmes[0][0]
        util = float(getattr(cme, "mac_utilization1", float("nan")))
        rows.append({"layer": name, "groups": g, "oy_unroll": oy, "d2": d2,
                     "cycles": float(latency) * g, "latency_ms_200MHz": float(latency) * g / 2e5,
                     "energy_pj": float(energy) * g, "mac_utilization": util})
        print(rows[-1], flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
