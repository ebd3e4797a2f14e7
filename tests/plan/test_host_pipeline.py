"""The pipeline around the NPU (npujax.plan.host_pipeline): stage parsing, operation counts
against the documented formulas, and synchronous vs overlapped throughput."""

import math

import pytest

from npujax.errors import ConfigError
from npujax.hw import load_npu_spec
from npujax.plan.host_pipeline import HostStage, host_pipeline, parse_host_stage


@pytest.fixture(scope="module")
def spec():
    return load_npu_spec("edge_16x16").with_fields(
        {"host.cpu_ops_per_s": 1e10, "host.scalar_ops_per_s": 1e9,
         "host.memory_bytes_per_s": 4e9, "host.link_bytes_per_s": 1e9,
         "host.link_latency_s": 1e-4})


def test_parse_host_stages():
    assert parse_host_stage("resize:from=1920x1080") == HostStage("resize", {"from": (1920, 1080)})
    assert parse_host_stage("nms:boxes=8400:classes=80:candidates=300").params == {
        "boxes": 8400, "classes": 80, "candidates": 300}
    assert str(parse_host_stage("topk:k=5")) == "topk:k=5"
    for bad, match in (("blur", "unknown host stage"), ("nms:iou=0.5", "nms takes"),
                       ("resize:from=1920", "WIDTHxHEIGHT"), ("topk:k=0", "whole number"),
                       ("normalize:x=1", "takes: none")):
        with pytest.raises(ConfigError, match=match):
            parse_host_stage(bad)


def test_operation_counts_follow_the_documented_formulas(spec):
    stages = [parse_host_stage(s) for s in ("resize:from=1280x720", "normalize", "layout",
                                            "nms:candidates=1000")]
    rep = host_pipeline(spec, 0.004, stages, (1, 3, 640, 640), (1, 84, 8400),
                        input_bytes=3 * 640 * 640, output_bytes=84 * 8400)
    by = {s.name: s for s in rep.stages}
    e = 640 * 640 * 3
    assert by["resize"].ops == 8 * e and by["resize"].bytes == 1280 * 720 * 3 + e
    assert by["normalize"].ops == 5 * e and by["layout"].ops == 2 * e
    # YOLO's [1, 4 + 80, 8400]: 8400 boxes of 80 classes from the output shape
    m = 1000
    nms = 8400 * 80 + 8400 + 2 * m * math.log2(m) + 3 * m + 13 * m * (m - 1) / 2
    assert by["nms"].ops == pytest.approx(nms, rel=1e-15)
    assert by["nms"].seconds == pytest.approx(max(nms / 1e9, by["nms"].bytes / 4e9))
    # the host roofline: resize moves more bytes than its operations take
    assert by["resize"].bound == "memory" and by["resize"].seconds == by["resize"].bytes / 4e9
    assert by["copy_in"].seconds == pytest.approx(1e-4 + e / 1e9)
    assert [s.name for s in rep.stages] == ["resize", "normalize", "layout", "copy_in", "npu",
                                            "copy_out", "nms"]


def test_sync_is_the_sum_and_overlap_is_the_slowest_stage(spec):
    stages = [parse_host_stage("nms:boxes=8400:classes=80")]  # the worst case: a slow NMS
    rep = host_pipeline(spec, 0.004, stages, (2, 3, 64, 64), (2, 10),
                        input_bytes=2 * 3 * 64 * 64, output_bytes=20)
    total = sum(s.seconds for s in rep.stages)
    assert rep.latency_s == total and rep.bounding_stage.name == "nms"
    assert rep.throughput_fps(False) == pytest.approx(2 / total)
    assert rep.throughput_fps(True) == pytest.approx(2 / rep.bounding_stage.seconds)
    assert rep.bounding_stage.seconds > 0.004  # NMS on the host costs more than the inference
    zc = host_pipeline(spec, 0.004, [], (1, 3, 8, 8), (1, 10), input_bytes=192,
                       output_bytes=10, zero_copy=True)
    assert zc.latency_s == 0.004 and zc.bounding_stage.name == "npu"
    d = rep.to_dict()
    assert d["asynchronous"]["bound"] == "nms" and len(d["stages"]) == 4


def test_sizes_the_output_does_not_give_are_asked_for(spec):
    with pytest.raises(ConfigError, match="give boxes, classes"):
        host_pipeline(spec, 0.001, [parse_host_stage("nms")], (1, 3, 8, 8), (1, 10),
                      input_bytes=1, output_bytes=1)
    with pytest.raises(ConfigError, match="4-D image input"):
        host_pipeline(spec, 0.001, [parse_host_stage("resize:from=64x64")], (1, 16), (1, 10),
                      input_bytes=1, output_bytes=1)
    with pytest.raises(ConfigError, match="given twice"):
        host_pipeline(spec, 0.001, [parse_host_stage("topk"), parse_host_stage("topk:k=3")],
                      (1, 16), (1, 10), input_bytes=1, output_bytes=1)
