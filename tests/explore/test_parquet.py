"""results.parquet: written with pyarrow (the ``sweep`` extra), skipped with a notice without."""

import logging
import sys

import numpy as np
import pytest

from npujax.workflows.sweep import write_table_parquet

TABLE = {"array.rows": np.array([8, 16]), "latency_s": np.array([1.5e-3, 0.1 + 0.2]),
         "array.dataflow": np.array(["weight_stationary", "output_stationary"], dtype=object)}


def test_without_pyarrow_parquet_is_skipped_with_a_notice(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    with caplog.at_level(logging.INFO, logger="npujax"):
        assert write_table_parquet(tmp_path / "r.parquet", TABLE) is False
    assert not (tmp_path / "r.parquet").exists()
    assert "pip install pyarrow" in caplog.text


def test_parquet_round_trips_the_columns(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    assert write_table_parquet(tmp_path / "r.parquet", TABLE) is True
    back = pq.read_table(tmp_path / "r.parquet").to_pydict()
    assert list(back) == list(TABLE)
    assert back["latency_s"] == TABLE["latency_s"].tolist()  # float64, bit for bit
    assert back["array.rows"] == [8, 16] and back["array.dataflow"][1] == "output_stationary"
