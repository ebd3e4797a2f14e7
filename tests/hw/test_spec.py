import pytest

from npujax.errors import ConfigError
from npujax.hw import list_presets, load_npu_spec

GOOD = """
name = "t"
[array]
rows = 8
cols = 4
dataflow = "weight_stationary"
clock_hz = 5e8
[memory]
ifmap_sram_bytes = 1024
filter_sram_bytes = 1024
ofmap_sram_bytes = 1024
dram_bytes_per_s = 1e9
[vector]
lanes = 4
"""


def write(tmp_path, text):
    p = tmp_path / "npu.toml"
    p.write_text(text)
    return p


def test_default_preset_loads_with_units():
    spec = load_npu_spec("edge_16x16")
    assert "edge_16x16" in list_presets()
    assert (spec.array.rows, spec.array.cols) == (16, 16)
    assert spec.array.clock_hz > 0 and spec.memory.dram_bytes_per_s > 0
    assert spec.peak_macs_per_s == 256 * spec.array.clock_hz


def test_file_preset(tmp_path):
    spec = load_npu_spec(write(tmp_path, GOOD))
    assert spec.array.operand_bits == 8  # default
    assert spec.dram_bytes_per_cycle == 2.0


@pytest.mark.parametrize(
    "old,new,match",
    [
        ("ifmap_sram_bytes = 1024", "ifmap_sram_bytes = -1024", "ifmap_sram_bytes.*positive"),
        ("lanes = 4", "lanes = 4\nwidth = 3", "unknown key.*'width'"),
        ("rows = 8", "", "missing required key 'rows'"),
        ('"weight_stationary"', '"row_stationary"', "unknown dataflow"),
        ("rows = 8", "rows = 8.5", "whole number"),
        ("clock_hz = 5e8", 'clock_hz = "fast"', "must be a number"),
        ('name = "t"', 'name = "t"\nfoo = 1', "unknown top-level"),
        ("[vector]\nlanes = 4", "", "missing section"),
        ("rows = 8", "rows = = 8", "not valid TOML"),
        ("dram_bytes_per_s = 1e9", "dram_bytes_per_s = inf", "positive finite"),
    ],
)
def test_bad_presets_raise_config_error(tmp_path, old, new, match):
    assert old in GOOD
    with pytest.raises(ConfigError, match=match):
        load_npu_spec(write(tmp_path, GOOD.replace(old, new)))


def test_missing_preset_lists_available():
    with pytest.raises(ConfigError, match="edge_16x16"):
        load_npu_spec("no_such_preset")
