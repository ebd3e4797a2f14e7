"""Compare weight/output/input stationary on ResNet-18, MobileNetV2 and a transformer encoder.

For 16x16, 32x32 and 128x128 arrays and each dataflow: compute cycles (closed form, exact to
SCALE-Sim) and total cycles with DRAM stalls (npujax.systolic.memory), summed over the layers;
tables go to docs/results/dataflows.md (the prose there is written by hand after reading them,
between the markers this script leaves alone) and plots to docs/results/dataflows_*.png.

Usage: PYTHONPATH=. python experiments/dataflow_comparison/main.py [--out docs/results]
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))

from networks import NETWORKS  # noqa: E402

from npujax._atomic import atomic_write_bytes, atomic_write_text  # noqa: E402
from npujax.hw import DATAFLOWS  # noqa: E402
from npujax.systolic import gemm_memory  # noqa: E402

SHORT = {"weight_stationary": "WS", "output_stationary": "OS", "input_stationary": "IS"}

# Hardware per array size (int8 operands and outputs, 3 separate double-buffered SRAMs as in
# SCALE-Sim; DRAM bandwidth in bytes per array cycle). 16x16 is the edge_16x16 preset
# (128 KiB SRAMs, 6.4 GB/s at 1 GHz); the larger ones scale SRAM and bandwidth with the array.
HARDWARE = {
    16: {"sram": 128 * 1024, "bw": 6.4},
    32: {"sram": 512 * 1024, "bw": 16.0},
    128: {"sram": 8 * 1024 * 1024, "bw": 64.0},
}
BEGIN, END = "<!-- tables:begin -->", "<!-- tables:end -->"


def evaluate(layers, size: int, dataflow: str):
    M, K, N, G, U = (jnp.asarray([lay[i] for lay in layers], jnp.int32) for i in range(1, 6))
    hw = HARDWARE[size]
    m = jax.jit(lambda: gemm_memory(M, K, N, size, size, dataflow, sram_bytes_a=hw["sram"],
                                    sram_bytes_b=hw["sram"], sram_bytes_out=hw["sram"],
                                    dram_bytes_per_cycle=hw["bw"], unique_elems_a=U))()
    g = np.asarray(G, np.float64)
    return {"compute": np.asarray(m["compute_cycles"], np.float64) * g,
            "total": np.asarray(m["total_cycles"], np.float64) * g,
            "dram": np.asarray(m["dram_bytes"], np.float64) * g,
            "macs": np.asarray([lay[1] * lay[2] * lay[3] * lay[4] for lay in layers], np.float64)}


def _plot(path, net, res):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    sizes = sorted(HARDWARE)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    width = 0.26
    for i, df in enumerate(DATAFLOWS):
        x = np.arange(len(sizes)) + (i - 1) * width
        comp = [res[(s, df)]["compute"].sum() for s in sizes]
        tot = [res[(s, df)]["total"].sum() for s in sizes]
        ax.bar(x, tot, width, color=f"C{i}", alpha=0.35)
        ax.bar(x, comp, width, color=f"C{i}", label=f"{SHORT[df]} ({df})")
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(sizes)), [f"{s}x{s}" for s in sizes])
    ax.set_ylabel("cycles (solid: compute, light: + DRAM stalls)")
    ax.set_title(f"{net}: cycles per inference by dataflow")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def tables(all_res) -> str:
    out = []
    for net, (layers, res) in all_res.items():
        macs = sum(lay[1] * lay[2] * lay[3] * lay[4] for lay in layers)
        out.append(f"### {net} ({len(layers)} GEMM layers, {macs / 1e9:.3f} GMACs)\n")
        out.append("| array | dataflow | compute cycles | total cycles (with stalls) | stall % "
                   "| utilization | DRAM MB | layers won (total) |")
        out.append("|---|---|---:|---:|---:|---:|---:|---:|")
        for s in sorted(HARDWARE):
            tot = np.stack([res[(s, df)]["total"] for df in DATAFLOWS])
            wins = np.bincount(np.argmin(tot, axis=0), minlength=3)
            best_c = min(res[(s, df)]["compute"].sum() for df in DATAFLOWS)
            best_t = min(res[(s, df)]["total"].sum() for df in DATAFLOWS)
            for i, df in enumerate(DATAFLOWS):
                r = res[(s, df)]
                c, t = r["compute"].sum(), r["total"].sum()
                util = macs / (c * s * s)
                bold = lambda v, best: f"**{v:,.0f}**" if v == best else f"{v:,.0f}"  # noqa: E731
                out.append(f"| {s}x{s} | {SHORT[df]} | {bold(c, best_c)} | {bold(t, best_t)} | "
                           f"{100 * (t - c) / t:.1f} | {util:.3f} | {r['dram'].sum() / 1e6:.2f} | "
                           f"{wins[i]} |")
        out.append("")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "docs/results"))
    args = p.parse_args(argv)
    out = Path(args.out)
    all_res = {}
    for net, make in NETWORKS.items():
        layers = make()
        res = {(s, df): evaluate(layers, s, df) for s in HARDWARE for df in DATAFLOWS}
        all_res[net] = (layers, res)
        _plot(out / f"dataflows_{net}.png", net, res)
    body = tables(all_res)
    print(body)
    md = out / "dataflows.md"
    text = md.read_text() if md.exists() else f"# Dataflow comparison\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    atomic_write_text(md, f"{head}{BEGIN}\n{body}\n{END}{tail}")


if __name__ == "__main__":
    main()
