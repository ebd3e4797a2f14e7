"""The dataflow comparison experiment runs end to end and writes its tables and plots."""

import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_dataflow_comparison_writes_tables_and_plots(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["main.py", "--out", str(tmp_path), "--small"])
    runpy.run_path(str(ROOT / "experiments/dataflow_comparison/main.py"), run_name="__main__")
    text = (tmp_path / "dataflows.md").read_text()
    assert "### resnet18" in text and "### mobilenet_v2" in text
    # the CNN tables have both DRAM-level mappings: SCALE-Sim's order (before) and the mapper
    assert "| 128x128 | best | OS |" in text and "| 16x16 | scalesim | WS |" in text
    # the transformer blocks are traced: softmax and normalization are vector layers
    assert "transformer encoder block (traced" in text and "decode (1 token" in text
    assert "Gelu, LayerNormalization" in text and "RMSNormalization" in text
    for net in ("resnet18", "mobilenet_v2", "transformer_encoder", "decoder_prefill",
                "decoder_decode"):
        assert (tmp_path / f"dataflows_{net}.png").stat().st_size > 10_000
