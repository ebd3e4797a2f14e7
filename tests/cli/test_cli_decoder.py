"""``npujax lower decoder:<config>``: prefill and decode steps of the reference LLM decoder, with
tokens/s and the KV-cache bytes per token, and a narrower KV cache moving the decode latency."""

from __future__ import annotations

import json

import pytest

from npujax.cli import main
from npujax.errors import ConfigError

pytestmark = pytest.mark.flax_model


def _lower(tmp_path, name, *args):
    out = tmp_path / name
    assert main(["lower", "decoder:tiny", "--npu", "edge_transformer_16x16", "--out", str(out),
                 *args]) == 0
    return json.loads((out / "schedule.json").read_text())


def test_decode_figures_and_kv_bits(tmp_path, capsys):
    d8 = _lower(tmp_path, "d8", "--phase", "decode", "--kv-len", "64")
    d4 = _lower(tmp_path, "d4", "--phase", "decode", "--kv-len", "64", "--kv-bits", "4")
    assert "tokens/s" in capsys.readouterr().out
    f8, f4 = d8["decoder"], d4["decoder"]
    tiny = f8["config"]
    assert f8["kv_cache_bytes_per_token"] == 2 * tiny["layers"] * 64 * tiny["kv_heads"] * (
        tiny["d_model"] // tiny["heads"])  # 8-bit: one byte per element
    assert f4["kv_cache_bytes_per_token"] == f8["kv_cache_bytes_per_token"] / 2
    assert f8["tokens_per_s"] == pytest.approx(1 / d8["latency_s"])
    assert d4["latency_s"] < d8["latency_s"]  # the cache's bytes are saved
    pre = _lower(tmp_path, "p", "--seq-len", "16", "--weight-bits", "4", "--act-bits", "16")
    assert pre["decoder"]["tokens_per_s"] == pytest.approx(16 / pre["latency_s"])
    assert pre["decoder"]["kv_cache_bytes_per_token"] == 0


def test_decoder_errors(capsys):
    for argv, message in ((["lower", "decoder:nope"], "unknown decoder config 'nope'"),
                          (["lower", "decoder:tiny", "--weight-bits", "fc=4"],
                           "one width for every linear layer")):
        assert main(argv) == ConfigError.exit_code
        assert message in capsys.readouterr().err
