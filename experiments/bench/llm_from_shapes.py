"""Benchmark (issue 30 item 3, issue 31 item 4): ``npujax lower decoder:...`` as a user runs it,
CPU seconds and peak RSS of the whole command (``/usr/bin/time -v``), with the compiled-program
cache cold (a fresh ``NPUJAX_COMPILE_CACHE``) and warm (the same folder again), for several
checkouts interleaved in one run; then the phases of one in-process lowering of this checkout.

Usage: python experiments/bench/llm_from_shapes.py [--trees /work/main,.] [--repeats 2]
           [--models qwen2.5-0.5b,llama-3.1-8b,experiments/llm_configs/mixtral-8x7b.json]

Targets: <= 1 s of CPU and <= 300 MB for a 0.5 B model, <= 2 s and <= 400 MB for 8 B.
A checkout that does not know a model (an old one and a config file) is reported as such.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(tree: str, model: str, cache: str) -> tuple[float, float] | None:
    """(CPU s, peak RSS MB) of one ``npujax lower`` decode step, or None if it failed."""
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), "NPUJAX_COMPILE_CACHE": cache}
    if model.endswith(".json"):
        model = str(Path(model).resolve())
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "npujax", "lower", f"decoder:{model}",
           "--phase", "decode", "--kv-len", "1024", "--npu", "edge_transformer_16x16",
           "--no-progress"]
    # (run outside any checkout: ``python -m`` puts the working folder first on sys.path)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=cache)
    if r.returncode:
        return None
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", r.stderr).group(1))
    sys_ = float(re.search(r"System time \(seconds\): ([\d.]+)", r.stderr).group(1))
    rss = float(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    return user + sys_, rss / 1024


def phases(model: str) -> None:
    """Where one in-process lowering of this checkout spends its CPU time."""
    t = time.process_time()
    from npujax.cli import compile_cache

    compile_cache()
    from npujax.hw import load_npu_spec
    from npujax.models.decoders import decoder_graph, decoder_precision
    from npujax.models.hf_config import load_decoder
    from npujax.plan import workloads
    from npujax.plan.lower import lower_dataflows

    spec = load_npu_spec("edge_transformer_16x16")
    marks = [("imports", time.process_time() - t)]
    t = time.process_time()
    cfg = load_decoder(model)
    g = decoder_graph(cfg, phase="decode", kv_len=1024)
    marks.append((f"config + graph ({len(g.nodes)} nodes)", time.process_time() - t))
    t = time.process_time()
    workloads(g, spec)
    marks.append(("workloads", time.process_time() - t))
    t = time.process_time()
    lower_dataflows(g, spec, decoder_precision(g, 8, 8, 8))
    marks.append(("cost program (trace + compile or cache load) and report",
                  time.process_time() - t))
    print(f"phases of {model} (this checkout, in process):")
    for what, s in marks:
        print(f"  {what:<58} {s:6.2f} s CPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", default="/work/main,.")
    ap.add_argument("--models", default="qwen2.5-0.5b,llama-3.1-8b,"
                                        "experiments/llm_configs/mixtral-8x7b.json")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    trees, models = a.trees.split(","), a.models.split(",")
    print(f"{'checkout':<16} {'model':<40} {'cache':<5} {'CPU s':>6} {'peak MB':>8}")
    for model in models:
        for _ in range(a.repeats):
            for tree in trees:  # interleaved: the machine's load falls on every tree alike
                with tempfile.TemporaryDirectory() as cache:
                    for state in ("cold", "warm"):
                        got = run(tree, model, cache)
                        shown = (f"{got[0]:6.2f} {got[1]:8.0f}" if got
                                 else "  (this checkout cannot lower it)")
                        print(f"{Path(tree).resolve().name:<16} {Path(model).name:<40} "
                              f"{state:<5} {shown}", flush=True)
    phases(models[0])


if __name__ == "__main__":
    main()
