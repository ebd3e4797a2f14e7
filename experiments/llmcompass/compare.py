"""npujax vs LLMCompass: per-operator and per-block LLM prefill and decode latency, same A100.

Usage (npujax with the main environment's python, LLMCompass in its own venv, a subprocess):

    python3 -m venv /work/venv-llmcompass
    /work/venv-llmcompass/bin/pip install numpy scipy pandas scalesim==2.0.2  # SCALE-Sim 2 configs
    # LLMCompass source (PrincetonUniversity/LLMCompass) unpacked at --llmcompass-src
    python experiments/llmcompass/compare.py --llmcompass-src /work/llmcompass-src \\
        --llmcompass-python /work/venv-llmcompass/bin/python [--reuse] [--out DIR]

LLMCompass (Zhang et al., "LLMCompass: Enabling Efficient Hardware Design for Large Language
Model Inference", ISCA 2024) simulates a GPT-style transformer block (its
``software_model/transformer.py``: ``TransformerBlockInitComputationTP`` for a prefill,
``TransformerBlockAutoRegressionTP`` for a decode step) on a system described by a JSON file;
we use its own ``configs/GA100.json`` with one device (no tensor parallelism, no all-reduce)
and its fastest mapping search, ``heuristic-GPU``. npujax lowers the same block from a
hand-written ``config.json`` (``configs/*.json`` here: ``d_model``, ``n_heads`` = key-value
heads, FFN ``4 d_model``, one layer) on ``a100_llmcompass.toml``, a preset carrying the same
hardware numbers. LLMCompass's block is GPT's (LayerNorm, a plain GELU FFN, no rotary
embedding); npujax reads Llama-family configs (RMSNorm, a gated FFN, RoPE), so the blocks share
these operators, compared one for one: the Q/K/V projections, Q.K^T, softmax, A.V, the output
projection, the FFN's up and down projections (d x 4d and 4d x d in both), GELU and the two
norms. What only npujax has (the FFN's gate projection and gate product, RoPE, the score
scaling, the residual adds, the KV-cache append, the layout transposes around the attention
matmuls) is listed separately and left out of the matched block total.

LLMCompass adds a measured kernel-launch overhead to every operator
(``hardware_model/compute_module.py``, ``overhead_dict["A100"]``); npujax has no such field, so
the table gives LLMCompass with and without it and the ratio against the latter.

Each LLMCompass prefill takes minutes on a shared CPU (the heuristic search); ``--reuse`` reads
the per-case results an earlier run saved in ``--out`` (``llm_llmcompass_raw.json``) instead of
rerunning it. Writes ``llm_comparison.json`` and one roofline PNG per model into ``--out``
(default ``docs/results``) and puts the tables between the markers of ``llm.md`` there
(``docs/results/llm.md``, which explains them), or into ``llm_comparison.md`` without one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from npujax._atomic import atomic_write_text
from npujax.hw.spec import load_npu_spec
from npujax.models.serving import lower_decoder
from npujax.report.plots import new_figure, save_figure

HERE = Path(__file__).resolve().parent
#: The A100 at two granularities: one npujax core per sublane (16 x 16, the SM's L1 split
#: four ways) and one per SM (32 x 32, L1 plus its share of the L2); the files cite LLMCompass.
PRESETS = {"sublane": HERE / "a100_llmcompass.toml", "sm": HERE / "a100_llmcompass_sm.toml"}

#: (name, config.json, d_model, n_heads): GPT-3 6.7B and 2.7B block dimensions (Brown et al.,
#: "Language Models are Few-Shot Learners", arXiv:2005.14165, Table 2.1).
MODELS = (("gpt3-6.7b", HERE / "configs" / "gpt3-6.7b.json", 4096, 32),
          ("gpt3-2.7b", HERE / "configs" / "gpt3-2.7b.json", 2560, 32))
BATCHES = (1, 8)
PREFILL_LEN = 512   # prompt tokens per sequence
DECODE_KV = 1024    # cached positions per sequence

#: The operators both tools model, in LLMCompass's order (its ``simluate_log``).
MATCHED = ("qkv_proj", "q_mul_k", "softmax", "a_mul_v", "o_proj", "layernorm0", "ffn_up",
           "gelu", "ffn_down", "layernorm1")


def cases() -> list[dict]:
    out = []
    for name, _, d, h in MODELS:
        for phase in ("prefill", "decode"):
            for b in BATCHES:
                out.append({"model": name, "d_model": d, "n_heads": h, "phase": phase,
                            "batch": b, "seq_len": PREFILL_LEN if phase == "prefill"
                            else DECODE_KV})
    return out


def key(c: dict) -> str:
    return f"{c['model']}/{c['phase']}/b{c['batch']}/s{c['seq_len']}"


def run_llmcompass(todo: list[dict], src: Path, python: str) -> list[dict]:
    """Each case in its own LLMCompass process (``run_llmcompass.py``), in its source tree."""
    out = []
    # LLMCompass runs SCALE-Sim there for tiles its look-up table lacks (a head of 80); the
    # folder is not in its repository
    (src / "systolic_array_model" / "temp").mkdir(exist_ok=True)
    for i, c in enumerate(todo):
        print(f"[{i + 1}/{len(todo)}] LLMCompass {key(c)} ...", file=sys.stderr, flush=True)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump([c], f)
        r = subprocess.run([python, str(HERE / "run_llmcompass.py"), "configs/GA100.json",
                            f.name], cwd=src, capture_output=True, text=True, check=False)
        Path(f.name).unlink()
        if r.returncode:
            sys.exit(f"LLMCompass failed on {key(c)}:\n{r.stderr[-3000:]}")
        out.extend(json.loads(r.stdout))
    return out


def _category(name: str, op: str, phase: str) -> str:
    """npujax layer -> the LLMCompass operator it matches, or an npujax-only group."""
    if not name.startswith("blocks/"):
        return "outside the block"
    leaf = name.split("/")[-1]
    table = {"q": "qkv_proj", "k": "qkv_proj", "v": "qkv_proj", "o": "o_proj",
             "matmul_0": "q_mul_k", "matmul_1": "a_mul_v", "softmax_0": "softmax",
             "attn_norm": "layernorm0", "mlp_norm": "layernorm1", "up": "ffn_up",
             "down": "ffn_down", "gelu_0": "gelu", "gate": "only: FFN gate projection"}
    if leaf in table:
        return table[leaf]
    if op == "Transpose":
        return "only: layout transposes"
    if leaf == "mul_0" and "/attn/" not in name:
        return "only: gate product"
    if op == "Add" and "/attn/" not in name:
        return "only: residual adds"
    if phase == "decode" and op == "Concat" and leaf in ("concat_2", "concat_3"):
        return "only: KV-cache append"
    return "only: RoPE, score scale/mask"


def run_npujax(c: dict, cfg: Path, spec) -> dict:
    t0 = time.perf_counter()
    b = c["batch"]
    if c["phase"] == "prefill":
        low, rep = lower_decoder(cfg, spec, phase="prefill", seq_len=c["seq_len"],
                                 kv_lens=[0] * b, weight_bits=16, act_bits=16, kv_bits=16)
    else:
        low, rep = lower_decoder(cfg, spec, phase="decode", kv_lens=[c["seq_len"]] * b,
                                 weight_bits=16, act_bits=16, kv_bits=16)
    ops: dict[str, float] = {}
    gemms = []
    for r in low.schedule.layers:
        cat = _category(r.name, r.op, c["phase"])
        ops[cat] = ops.get(cat, 0.0) + float(r.latency_s)
        if r.kind == "gemm" and r.costs.dram_bytes and cat in MATCHED:
            gemms.append({"name": r.name, "category": cat, "macs": float(r.macs),
                          "dram_bytes": float(r.costs.dram_bytes),
                          "latency_s": float(r.latency_s), "bound": r.bound,
                          "M": int(r.M), "K": int(r.K), "N": int(r.N)})
    block = sum(v for k, v in ops.items() if k != "outside the block")
    return {"ops_s": ops, "block_s": block, "matched_s": sum(ops.get(k, 0.0) for k in MATCHED),
            "step_s": float(rep.latency_s), "gemms": gemms,
            "wall_s": time.perf_counter() - t0}


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f}"


def table(rows: list[dict]) -> tuple[str, str]:
    """Markdown: the block totals, and one table per (model, phase, batch) of operators."""
    summary = ["| model | phase | batch | npujax, sublane preset (ms) | npujax, SM preset (ms) "
               "| LLMCompass, no launch overhead (ms) | ratio sublane | ratio SM "
               "| LLMCompass with overhead (ms) | npujax whole block, SM (ms) |",
               "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines = []
    for r in rows:
        lc, nj, sm = r["llmcompass"], r["npujax_sublane"], r["npujax_sm"]
        lc_no = {k: lc["ops_s"][k] - lc["overhead_s"][k] for k in MATCHED}
        tot = sum(lc_no.values())
        summary.append(
            f"| {r['model']} | {r['phase']} | {r['batch']} | {_ms(nj['matched_s'])} | "
            f"{_ms(sm['matched_s'])} | {_ms(tot)} | {nj['matched_s'] / tot:.2f} | "
            f"{sm['matched_s'] / tot:.2f} | {_ms(lc['latency_s'])} | {_ms(sm['block_s'])} |")
        what = (f"prefill of {r['seq_len']} tokens" if r["phase"] == "prefill"
                else f"decode step, {r['seq_len']} cached positions")
        lines += [f"#### {r['model']}, {what}, batch {r['batch']}", "",
                  "| operator | npujax sublane µs | npujax SM µs | LLMCompass µs (no overhead) | "
                  "ratio sublane | ratio SM | LLMCompass overhead µs |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for k in MATCHED:
            a, m, b_ = nj["ops_s"].get(k, 0.0), sm["ops_s"].get(k, 0.0), lc_no[k]
            lines.append(f"| {k} | {a * 1e6:.1f} | {m * 1e6:.1f} | {b_ * 1e6:.1f} | "
                         f"{a / b_:.2f} | {m / b_:.2f} | {lc['overhead_s'][k] * 1e6:.0f} |")
        lines.append(f"| **matched block** | **{nj['matched_s'] * 1e6:.1f}** | "
                     f"**{sm['matched_s'] * 1e6:.1f}** | **{tot * 1e6:.1f}** | "
                     f"**{nj['matched_s'] / tot:.2f}** | **{sm['matched_s'] / tot:.2f}** | "
                     f"{sum(lc['overhead_s'][k] for k in MATCHED) * 1e6:.0f} |")
        for k in sorted(x for x in nj["ops_s"] if x.startswith("only")):
            lines.append(f"| npujax {k} | {nj['ops_s'][k] * 1e6:.1f} | "
                         f"{sm['ops_s'].get(k, 0.0) * 1e6:.1f} | | | | |")
        lines.append("")
    return "\n".join(summary), "\n".join(lines).rstrip()


def fill_page(page: Path, summary: str, detail: str) -> None:
    """Put the tables between the page's ``<!-- summary:begin -->``/``end`` and
    ``<!-- detail:begin -->``/``end`` markers; the rest of the page is left alone."""
    text = page.read_text()
    for tag, body in (("summary", summary), ("detail", detail)):
        begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{body}\n{end}{tail}"
    atomic_write_text(page, text)


def _intensity(g: dict) -> float:
    """MACs per compulsory byte: ``groups x (MK + KN + MN) x 2`` bytes (fp16), ``groups`` the
    heads x sequences of a batched attention GEMM (``macs / (M K N)``)."""
    groups = g["macs"] / (g["M"] * g["K"] * g["N"])
    return g["macs"] / (2.0 * groups * (g["M"] * g["K"] + g["K"] * g["N"] + g["M"] * g["N"]))


def roofline(path: Path, model: str, rows: list[dict], peak: float, bw: float) -> None:
    """Both tools' matched GEMMs at batch 8 on the A100 roofline: x MACs per byte of the GEMM's
    compulsory fp16 traffic (each operand and the output once), y MACs over each tool's latency.
    """
    fig, ax = new_figure(7.0, 4.8)
    rows = [r for r in rows if r["model"] == model and r["batch"] == max(BATCHES)]
    ai = np.asarray([_intensity(g) for r in rows for g in r["npujax_sm"]["gemms"]])
    xs = np.geomspace(max(ai.min() / 3, 0.1), max(ai.max() * 3, 4 * peak / bw), 200)
    ax.loglog(xs, np.minimum(peak, xs * bw), "k-", lw=1.5,
              label="roof: min(peak, AI × 2.048 TB/s)")
    colours = {"LLMCompass": "C3", "npujax sublane": "C0", "npujax SM": "C2"}
    seen = set()
    for r in rows:
        lc = r["llmcompass"]
        by_name = {g["name"]: g for g in r["npujax_sublane"]["gemms"]}
        for g in r["npujax_sm"]["gemms"]:
            cat = g["category"]
            x = _intensity(g)
            # LLMCompass prices the three projections as one figure (3 x Q_proj): a third each
            lat_lc = (lc["ops_s"][cat] - lc["overhead_s"][cat]) / (3 if cat == "qkv_proj" else 1)
            for tool, lat in (("LLMCompass", lat_lc), ("npujax sublane",
                              by_name[g["name"]]["latency_s"]), ("npujax SM", g["latency_s"])):
                lab = f"{tool} {r['phase']}"
                ax.plot(x, g["macs"] / lat, "o" if r["phase"] == "prefill" else "^",
                        color=colours[tool], alpha=0.8, label=None if lab in seen else lab)
                seen.add(lab)
    ax.set_xlabel("arithmetic intensity (MACs / compulsory DRAM byte, fp16)")
    ax.set_ylabel("attained MAC/s")
    ax.set_title(f"{model} block, batch {max(BATCHES)}, on LLMCompass's A100:\nprefill of "
                 f"{PREFILL_LEN} tokens (o), decode at {DECODE_KV} cached (^)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--llmcompass-src", type=Path, default=Path("/work/llmcompass-src"))
    p.add_argument("--llmcompass-python", default="/work/venv-llmcompass/bin/python")
    p.add_argument("--out", type=Path, default=Path("docs/results"))
    p.add_argument("--reuse", action="store_true",
                   help="read LLMCompass's results from OUT/llm_llmcompass_raw.json")
    a = p.parse_args(argv)
    raw_path = a.out / "llm_llmcompass_raw.json"
    todo = cases()
    have = {}
    if a.reuse and raw_path.exists():
        have = {key(c): c for c in json.loads(raw_path.read_text())}
    missing = [c for c in todo if key(c) not in have]
    for c in run_llmcompass(missing, a.llmcompass_src, a.llmcompass_python):
        have[key(c)] = c
    specs = {k: load_npu_spec(v) for k, v in PRESETS.items()}
    spec = specs["sublane"]
    cfgs = {name: cfg for name, cfg, _, _ in MODELS}
    rows = []
    for i, c in enumerate(todo):
        print(f"[{i + 1}/{len(todo)}] npujax {key(c)} ...", file=sys.stderr, flush=True)
        rows.append({**c, **{f"npujax_{k}": run_npujax(c, cfgs[c["model"]], s)
                             for k, s in specs.items()}, "llmcompass": have[key(c)]})
    peak = spec.array.rows * spec.array.cols * spec.array.cores * spec.array.clock_hz
    bw = spec.memory.dram_bytes_per_s
    a.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(raw_path, json.dumps([have[key(c)] for c in todo], indent=1))
    atomic_write_text(a.out / "llm_comparison.json", json.dumps(rows, indent=1))
    summary, detail = table(rows)
    md = summary + "\n\n" + detail
    if (a.out / "llm.md").exists():
        fill_page(a.out / "llm.md", summary, detail)
    else:  # (in docs/results the page holds the tables: a second page would break the nav)
        atomic_write_text(a.out / "llm_comparison.md", md + "\n")
    for name, *_ in MODELS:
        roofline(a.out / f"llm_roofline_{name}.png", name, rows, peak, bw)
    print(md)


if __name__ == "__main__":
    main()
