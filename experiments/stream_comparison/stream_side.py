"""Stream's side of the comparison: evaluate ONNX models on a Stream hardware description.

Runs under the Python that has Stream (``pip install stream-dse``; stream-dse 2.x needs Python
>= 3.12, npujax's own environment may be older) and writes one JSON object per model::

    /path/to/py3.12/bin/python stream_side.py --hardware HW.yaml --out stream.json a.onnx b.onnx

For each model: Stream's latency in cycles, its off-chip (DRAM) traffic and the wall time of the
evaluation (one allocation solve per fused group, OR-Tools backend). Stream counts off-chip
accesses in words of the off-chip port (64 bits on the example accelerators), at the element
width of the ONNX tensors (float32 for a float model).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--hardware", required=True, help="Stream hardware YAML")
    ap.add_argument("--out", required=True)
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    try:
        from stream.api import SolveOptions, evaluate_mapping
    except ImportError as e:
        print(f"Stream is not installed here ({e}); pip install stream-dse (Python >= 3.12).",
              file=sys.stderr)
        return 3
    results = {}
    for path in args.models:
        t = time.perf_counter()
        est = evaluate_mapping(args.hardware, path, f"/tmp/stream_side/{len(results)}",
                               options=SolveOptions(time_limit_s=args.time_limit,
                                                    artifacts=False))
        wall = time.perf_counter() - t
        words, port_bits = 0, 64
        for group in est.context.data["group_memory_accesses"].values():
            for core in group["cores"]:
                if core["is_offchip"]:
                    words += core["read"] + core["write"]
                    port_bits = core["read_bandwidth"]
        results[os.path.basename(path)] = {"cycles": est.cycles, "groups": len(est.group_cycles),
                         "offchip_words": words, "offchip_port_bits": port_bits,
                         "offchip_bytes": words * port_bits / 8, "wall_s": wall}
        print(path, results[os.path.basename(path)], flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
