"""`npujax calibrate` and `npujax qat` as a user runs them (exit codes, messages)."""

from pathlib import Path

import pytest

from npujax.errors import ConfigError
from npujax.workflows.qat_experiment import load_qat_config
from tests.helpers import run_cli

run = run_cli  # in-process: the program's own main(), without a new interpreter


@pytest.mark.parametrize("text,message", [
    ("[qat]\nbogus = 1\n", "unknown key"),
    ("[qat]\nschemes = [\"W3A3\"]\n", "schemes"),
    ("[qat]\nobservers = [\"kl\"]\n", "observer"),
    ("[qat]\nqat_steps = 0\n", "qat_steps"),
    ("[qat]\nquantizer = \"pact\"\n", "quantizer"),
    ("not toml [", "not valid TOML"),
])
def test_qat_config_errors(tmp_path, text, message):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_qat_config(cfg)


def test_qat_shipped_config_loads():
    cfg = load_qat_config(Path(__file__).parents[2] / "experiments" / "qat_finetune" /
                          "config.toml")
    assert cfg.schemes == ("W8A8", "W4A8", "W4A4") and cfg.edge_bits == 8
    lsq = load_qat_config(Path(__file__).parents[2] / "experiments" / "qat_finetune" /
                          "lsq_w4a4.toml")
    assert lsq.quantizers == ("ste", "lsq", "lsq+") and lsq.schemes == ("W4A4",)


def test_qat_config_quantizer_string_or_list(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[qat]\nquantizer = \"lsq\"\n")
    assert load_qat_config(cfg).quantizers == ("lsq",)
    cfg.write_text("[qat]\nquantizer = [\"ste\", \"lsq+\"]\n")
    assert load_qat_config(cfg).quantizers == ("ste", "lsq+")


def test_cli_bad_config_exit_code(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[qat]\nbogus = 1\n")
    r = run("qat", "--config", str(cfg))
    assert r.returncode == 2 and "unknown key" in r.stderr and "Traceback" not in r.stderr
    r = run("calibrate", str(tmp_path / "missing.npz"), "--no-progress")
    assert r.returncode != 0 and "Traceback" not in r.stderr
