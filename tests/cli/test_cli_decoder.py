"""``npujax lower decoder:<config>``: prefill and decode steps of the reference LLM decoder, with
tokens/s and the KV-cache bytes per token, and a narrower KV cache moving the decode latency."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from npujax.cli import main
from npujax.errors import ConfigError
from npujax.hw import load_npu_spec
from npujax.models.decoders import (
    decoder_figures,
    decoder_graph,
    decoder_precision,
    kv_cache_operands,
)
from npujax.models.transformer import DECODER_CONFIGS
from npujax.plan import lower, workloads

pytestmark = pytest.mark.flax_model


def _lower(tmp_path, name, *args):
    out = tmp_path / name
    assert main(["lower", "decoder:tiny", "--npu", "edge_transformer_16x16", "--out", str(out),
                 *args]) == 0
    return json.loads((out / "schedule.json").read_text())


def test_decode_figures_and_kv_bits(tmp_path, capsys):
    d8 = _lower(tmp_path, "d8", "--phase", "decode", "--kv-len", "64")
    d4 = _lower(tmp_path, "d4", "--phase", "decode", "--kv-len", "64", "--kv-bits", "4")
    out = capsys.readouterr().out
    assert "tokens/s" in out and "roofline:" in out and "memory-bound" in out
    f8, f4 = d8["decoder"], d4["decoder"]
    tiny = f8["config"]
    assert f8["kv_cache_bytes_per_token"] == 2 * tiny["layers"] * 64 * tiny["kv_heads"] * (
        tiny["d_model"] // tiny["heads"])  # 8-bit: one byte per element
    assert f4["kv_cache_bytes_per_token"] == f8["kv_cache_bytes_per_token"] / 2
    assert f8["tokens_per_s"] == pytest.approx(1 / d8["latency_s"])
    assert d4["latency_s"] < d8["latency_s"]  # the cache's bytes are saved
    # --format json: the same schedule and figures alone on stdout (it was refused for decoders)
    j8 = _lower(tmp_path, "j8", "--phase", "decode", "--kv-len", "64", "--format", "json")
    assert json.loads(capsys.readouterr().out) == j8 and j8["latency_s"] == d8["latency_s"]
    assert j8["decoder"] == f8
    # --kv-cache in_place: the cache read where it lies, not copied; the same bytes per token
    di = _lower(tmp_path, "di", "--phase", "decode", "--kv-len", "64", "--kv-cache", "in_place")
    assert "read in place" in capsys.readouterr().out
    assert di["dram_bytes"] < d8["dram_bytes"] and di["latency_s"] < d8["latency_s"]
    assert di["decoder"]["kv_cache_bytes_per_token"] == f8["kv_cache_bytes_per_token"]
    # a prefill processes seq_len tokens per sequence and reads no cache (no second CLI run:
    # lowering another graph compiles three more cost programs)
    fig = decoder_figures(SimpleNamespace(latency_s=0.5), DECODER_CONFIGS["tiny"],
                          phase="prefill", seq_len=16, kv_len=64, batch=2, kv_bits=8)
    assert fig.tokens_per_s == 64 and fig.kv_cache_bytes_per_token == 0


def test_decoder_errors(capsys):
    for argv, message in ((["lower", "decoder:nope"], "unknown decoder config 'nope'"),
                          (["lower", "decoder:tiny", "--weight-bits", "fc=4"],
                           "one width for every linear layer")):
        assert main(argv) == ConfigError.exit_code
        assert message in capsys.readouterr().err


def test_int4_weights_and_int8_cache_move_decode_latency_by_the_bytes_saved():
    cfg, kv_len = DECODER_CONFIGS["tiny"], 256
    g = decoder_graph(cfg, phase="decode", seq_len=1, kv_len=kv_len, batch=1)
    spec = load_npu_spec("edge_transformer_16x16")
    bw = spec.memory.dram_bytes_per_s
    s = {b: lower(g, spec, decoder_precision(g, *b)) for b in ((8, 8, 8), (4, 8, 8), (8, 8, 16))}
    # weight-only int4: exactly half the linear layers' weight bytes saved; the time saved is
    # at most their transfer time (some GEMVs are compute-bound on the array)
    gemm_weights = sum(w.weight_elems for w in workloads(g, spec) if w.op == "Gemm")
    saved = s[8, 8, 8].dram_bytes - s[4, 8, 8].dram_bytes
    assert saved == pytest.approx(gemm_weights * 4 / 8, rel=0.01)
    dt = s[8, 8, 8].latency_s - s[4, 8, 8].latency_s
    assert 0.3 * saved / bw < dt <= saved / bw * 1.001
    # the cache at 8 instead of 16 bits: the decode step is memory-bound, its time moves by the
    # DRAM bytes saved (the cache's K/V operands and the copies the traced graph makes of it)
    saved = s[8, 8, 16].dram_bytes - s[8, 8, 8].dram_bytes
    kv = [decoder_figures(s[b], cfg, phase="decode", seq_len=1, kv_len=kv_len, batch=1,
                          kv_bits=b[2], spec=spec) for b in ((8, 8, 8), (8, 8, 16))]
    assert saved >= kv[1].kv_cache_bytes_per_token - kv[0].kv_cache_bytes_per_token > 0
    dt = s[8, 8, 16].latency_s - s[8, 8, 8].latency_s
    assert dt == pytest.approx(saved / bw, rel=0.1)
    # the roofline bound of the step: memory, never above the modelled latency
    f = kv[0]
    assert f.bound == "memory" and f.roofline_s == pytest.approx(f.dram_bytes / bw)
    assert f.roofline_s <= s[8, 8, 8].latency_s and f.macs == s[8, 8, 8].macs
    assert len(kv_cache_operands(g)) == 2 * cfg.layers
