import importlib.resources

import pytest

from npujax.errors import ConfigError
from npujax.hw import LAYOUTS, differentiable_spec, list_presets, load_npu_spec, spec_to_toml

GOOD = importlib.resources.files("npujax.presets").joinpath("edge_16x16.toml").read_text()


def write(tmp_path, text):
    p = tmp_path / "npu.toml"
    p.write_text(text)
    return p


def test_default_preset_loads_with_units():
    spec = load_npu_spec("edge_16x16")
    assert (spec.array.rows, spec.array.cols) == (16, 16)
    assert spec.array.clock_hz > 0 and spec.memory.dram_bytes_per_s > 0
    assert spec.peak_macs_per_s == 256 * spec.array.clock_hz
    assert spec.layout.activation_layout in LAYOUTS
    assert "Conv" in spec.ops.supported


@pytest.mark.parametrize("name", ["edge_16x16", "tpu_v1", "gemmini_16x16"])
def test_shipped_presets(name):
    assert name in list_presets()
    spec = load_npu_spec(name)
    assert spec.name == name and spec.description


def test_tpu_v1_figures_from_the_paper():
    spec = load_npu_spec("tpu_v1")
    assert (spec.array.rows, spec.array.cols, spec.array.clock_hz) == (256, 256, 7.0e8)
    assert spec.peak_macs_per_s * 2 == pytest.approx(92e12, rel=0.01)  # 92 TOPS
    assert spec.memory.ifmap_sram_bytes == 24 * 2**20


def test_file_preset(tmp_path):
    spec = load_npu_spec(write(tmp_path, GOOD.replace('name = "edge_16x16"', 'name = "t"')))
    assert spec.name == "t"
    assert spec.dram_bytes_per_cycle == pytest.approx(6.4)


@pytest.mark.parametrize(
    "old,new,match",
    [
        ("ifmap_sram_bytes = 131072", "ifmap_sram_bytes = -1024", "ifmap_sram_bytes.*positive"),
        ("lanes = 16", "lanes = 16\nwidth = 3", "unknown key.*'width'"),
        ("rows = 16", "", "missing required key.*'rows'"),
        ('"output_stationary"', '"no_local_reuse"', "unknown dataflow"),
        ('"NHWC"', '"HWCN"', "unknown activation_layout"),
        ("rows = 16", "rows = 8.5", "whole number"),
        ("clock_hz = 1.0e9", 'clock_hz = "fast"', "must be a number"),
        ('name = "edge_16x16"', 'name = "t"\nfoo = 1', "unknown top-level"),
        ("[vector]\nlanes = 16", "", "missing section"),
        ("rows = 16", "rows = = 8", "not valid TOML"),
        ("dram_bytes_per_s = 6.4e9", "dram_bytes_per_s = inf", "positive finite"),
        ("dram_latency_s = 1.0e-7", "dram_latency_s = -1.0", "non-negative"),
        ('supported = ["Conv"', 'supported = [1, "Conv"', "list of strings"),
        ("cores = 1", "cores = 0", "'cores' must be a positive"),
        ("cpu_ops_per_s = 1.0e10", "cpu_ops_per_s = 1e30", r"= 1e\+30 \(ops/s\) is outside"),
        ("conv_max_stride = 2", "conv_max_stride = 2\nresize_max_scale = 0.5",
         "resize_max_scale = 0.5 is below 1"),
    ],
)
def test_bad_presets_raise_config_error(tmp_path, old, new, match):
    assert old in GOOD
    with pytest.raises(ConfigError, match=match):
        load_npu_spec(write(tmp_path, GOOD.replace(old, new, 1)))


def test_zero_latency_is_allowed(tmp_path):
    spec = load_npu_spec(write(tmp_path, GOOD.replace("dram_latency_s = 1.0e-7",
                                                      "dram_latency_s = 0")))
    assert spec.memory.dram_latency_s == 0.0


def test_missing_preset_lists_available():
    with pytest.raises(ConfigError, match="edge_16x16") as e:
        load_npu_spec("no_such_preset")
    assert "Did you mean" not in str(e.value)


def test_misspelt_preset_suggests_the_nearest():
    with pytest.raises(ConfigError, match="Did you mean 'coral_edgetpu'"):
        load_npu_spec("coral_edgtpu")


def test_a_field_with_a_default_may_be_left_out_of_presets():
    """A new hardware field with a default needs no edit of the existing presets."""
    import dataclasses

    from npujax.hw import spec as spec_module

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Section:
        lanes: int = spec_module._field()
        ops_per_lane: int = spec_module._field(default=2)

    assert spec_module._build_section("[vector]", Section, {"lanes": 16}).ops_per_lane == 2
    assert spec_module._build_section("[vector]", Section,
                                      {"lanes": 16, "ops_per_lane": 4}).ops_per_lane == 4
    with pytest.raises(ConfigError, match="missing required key.*'lanes'"):
        spec_module._build_section("[vector]", Section, {"ops_per_lane": 4})


@pytest.mark.parametrize("preset", list_presets())
def test_every_preset_survives_the_toml_writer(tmp_path, preset):
    spec = load_npu_spec(preset)
    path = tmp_path / "p.toml"
    path.write_text(spec_to_toml(spec, header="line one\nline two"))
    assert path.read_text().startswith("# line one\n# line two\n")
    assert load_npu_spec(path) == spec


def test_toml_writer_on_a_base_keeps_its_comments_and_rewrites_only_changed_keys(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text(spec_to_toml(load_npu_spec("coral_edgetpu")).replace(
        "[memory]", "# the memory, from the datasheet\n[memory]"))
    text = base.read_text()
    spec = load_npu_spec(base).with_fields({"memory.dram_bytes_per_s": 5.09e8,
                                            "array.rows": 32})
    out = spec_to_toml(spec, "fitted", base=base,
                       notes={"memory.dram_bytes_per_s": "fitted, +-20 %"})
    assert out.startswith("# fitted\n") and "# the memory, from the datasheet" in out
    changed = [ln for ln in out.splitlines()[1:] if ln not in text.splitlines()]
    assert len(changed) == 2, changed  # only the two keys, each with its comment
    assert any("dram_bytes_per_s = 509000000.0 # fitted, +-20 %" in ln for ln in changed)
    assert any(ln.startswith("rows = 32 # changed from 64") for ln in changed)
    path = tmp_path / "fitted.toml"
    path.write_text(out)
    assert load_npu_spec(path) == spec
    assert spec_to_toml(load_npu_spec(base), base=base) == text  # nothing changed: same text


def test_toml_writer_keeps_fitted_floats_exactly_and_refuses_traced_specs(tmp_path):
    spec = load_npu_spec("edge_16x16").with_fields(
        {"array.clock_hz": 700039120.321203, "memory.dram_latency_s": 1.234567891234e-7,
         "array.rows": 23}, name="fitted")
    path = tmp_path / "fitted.toml"
    path.write_text(spec_to_toml(spec))
    assert load_npu_spec(path) == spec
    with pytest.raises(ConfigError, match="not a number"):
        spec_to_toml(differentiable_spec(spec))
