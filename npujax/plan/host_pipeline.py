"""The pipeline around the NPU: host pre-processing, copies, inference, post-processing.

A deployed model's frame goes through more than the NPU. The host resizes and normalises the
camera image and converts its layout, copies it into the NPU's buffers, waits for the inference,
copies the output back and post-processes it (non-maximum suppression, CTC decoding, top-k).
This module prices each host stage from its **operation count** on the preset's ``[host]``
rates and combines the stages with the NPU's latency from the one cost program
(:func:`npujax.lower`'s total, every pass included). It is a model after the cost program: it
reads the schedule's total and the graph's input and output shapes, and changes no number of
the program.

**Stage times.** A host stage takes ``max(ops / rate, bytes / host.memory_bytes_per_s)`` (the
host roofline that CPU fallback layers use, :mod:`npujax.plan.costs`; the second term only where
the preset gives the memory bandwidth). ``rate`` is ``host.cpu_ops_per_s`` for the stages that
vectorise and split over cores (resize, normalise, layout). For the scalar, branching loops
(NMS, CTC decoding, top-k) it is ``host.scalar_ops_per_s``, one core's rate (default
``cpu_ops_per_s``). A multiply-add counts as 2 operations, as in ``cpu_ops_per_s``. A copy takes
``host.link_latency_s + bytes / host.link_bytes_per_s`` unless the buffers are zero-copy (the
NPU reads the host's buffer itself: an SoC NPU sharing DRAM, or a preset whose DRAM *is* host
memory across the link, such as ``coral_*``, whose first layer's reads already cross it).

========== ==================================================== ================================
stage      operations per frame                                  source / assumption
========== ==================================================== ================================
resize     ``8 H W C`` (bilinear: 2 horizontal and 2 vertical    OpenCV ``resize`` INTER_LINEAR
           multiply-adds per output element); bytes ``H0 W0 C    (separable ``hresize`` /
           + H W C``                                             ``vresize``)
normalize  ``5 H W C``: ``x a + b`` (2), round (1), clamp to the mean/std folded with the input
           integer range (2); bytes ``H W C (1 + a_bits/8)``     quantisation into one affine map
layout     ``2 H W C``: a load and a store per element (HWC ->   a transpose does no arithmetic
           CHW); bytes ``2 H W C``
nms        ``N C`` (best class per box) ``+ N`` (score           greedy NMS (Neubeck and Van
           threshold) ``+ 2 M log2 M`` (sort) ``+ 3 M``          Gool, ICPR 2006) as in
           (areas) ``+ 13 M (M - 1) / 2`` (IoU of each pair: 4  torchvision ``nms``; the pair
           min/max, 2 differences and 2 clamps, a product, 2 term is the worst case (nothing
           for the union, 2 for the comparison)                  suppressed)
ctc        ``T V`` (best symbol per step) ``+ 3 T`` (repeat and  CTC best-path decoding (Graves
           blank tests, append)                                   et al., ICML 2006)
topk       ``N (1 + log2 k)`` (compare with the heap's minimum,  a k-element binary heap
           sift on insertion: the worst case)
========== ==================================================== ================================

``H0 x W0`` is the camera frame, ``H x W x C`` the model's input, ``N`` boxes of ``C`` classes,
``M`` candidates after the score threshold (default ``N``), ``T`` steps of ``V`` symbols, ``N``
classes for top-k; every count is per frame, times the batch. The post-processing inputs are
read at the NPU's output width (``a_bits / 8`` bytes per element).

**Submission.** *Synchronous*: the host submits a frame and waits, so a frame's stages run one
after another and nothing overlaps: latency = throughput period = the sum of the stages.
*Asynchronous with double buffering*: two input and two output buffers let the host
pre-process frame ``i + 1`` and post-process frame ``i - 1`` while the NPU runs frame ``i``, and
the copies overlap too. In steady state the pipeline delivers a frame every ``max(stage)``
seconds (throughput ``batch / max``), bounded by the slowest stage. A frame's own latency is
still the sum of its stages (it enters at the pipeline's rate, so it never queues). Assumed:
pre- and post-processing run on different host cores, each at the rates above, and the two
copies use the link's two directions (PCIe and USB 3 are full duplex). Where a host stage is the
bound, more cores or a faster NMS move it, not a faster NPU.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec

__all__ = ["HOST_STAGES", "PRE_STAGES", "POST_STAGES", "HostStage", "StageTime",
           "PipelineReport", "parse_host_stage", "host_pipeline"]

#: Host stages before the NPU, in the order a frame meets them.
PRE_STAGES = ("resize", "normalize", "layout")
#: Host stages after the NPU.
POST_STAGES = ("nms", "ctc", "topk")
#: Every host stage kind, and the parameters each takes (``kind:key=value:...``).
HOST_STAGES: dict[str, tuple[str, ...]] = {
    "resize": ("from",), "normalize": (), "layout": (),
    "nms": ("boxes", "classes", "candidates"), "ctc": ("steps", "classes"),
    "topk": ("classes", "k"),
}
_VECTOR = ("resize", "normalize", "layout")


@dataclasses.dataclass(frozen=True)
class HostStage:
    """One host stage: a kind of :data:`HOST_STAGES` and its parameters (ints; ``from`` a
    ``(width, height)`` pair). Missing parameters come from the model's input or output shape
    (:func:`host_pipeline`)."""

    kind: str
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        def show(v: Any) -> str:
            return "x".join(map(str, v)) if isinstance(v, tuple) else str(v)
        return ":".join([self.kind, *(f"{k}={show(v)}" for k, v in self.params.items())])


def parse_host_stage(text: str) -> HostStage:
    """A :class:`HostStage` from ``kind[:key=value...]``, e.g. ``resize:from=1920x1080`` (the
    camera frame, width x height), ``nms:boxes=8400:classes=80:candidates=1000``, ``ctc``,
    ``topk:k=5``.

    Raises:
      ConfigError: an unknown kind or key, or a value that is not a positive whole number
        (``from``: ``WxH``).
    """
    kind, *items = str(text).strip().split(":")
    if kind not in HOST_STAGES:
        raise ConfigError(f"unknown host stage {kind!r} in {text!r}; use one of "
                          f"{', '.join(HOST_STAGES)} (e.g. resize:from=1920x1080, "
                          "nms:boxes=8400:classes=80, topk:k=5).")
    params: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or key not in HOST_STAGES[kind]:
            allowed = ", ".join(HOST_STAGES[kind]) or "none"
            raise ConfigError(f"host stage {text!r}: {item!r} is not a key=value this stage "
                              f"takes; {kind} takes: {allowed}.")
        try:
            if key == "from":
                w, x, h = value.lower().partition("x")
                parsed: Any = (int(w), int(h))
                if not x or min(parsed) < 1:
                    raise ValueError
            else:
                parsed = int(value)
                if parsed < 1:
                    raise ValueError
        except ValueError:
            form = "WIDTHxHEIGHT (e.g. 1920x1080)" if key == "from" else "a whole number >= 1"
            raise ConfigError(f"host stage {text!r}: {key} must be {form}, got "
                              f"{value!r}.") from None
        params[key] = parsed
    return HostStage(kind, params)


@dataclasses.dataclass(frozen=True)
class StageTime:
    """One stage of a frame's path.

    Attributes:
      name: the stage (``resize``, ..., ``copy_in``, ``npu``, ``copy_out``, ``nms``, ...).
      resource: where it runs: ``host``, ``link`` or ``npu``.
      seconds: its time per batch (s).
      ops: host operations (0 for copies and the NPU).
      bytes: bytes it moves (host memory for host stages, the link for copies).
      bound: ``compute``, ``memory`` (host roofline), ``link``, ``npu`` or ``zero_copy``.
      detail: the stage as given, with the parameters taken from the model.
    """

    name: str
    resource: str
    seconds: float
    ops: float = 0.0
    bytes: float = 0.0
    bound: str = "compute"
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class PipelineReport:
    """End-to-end figures of the pipeline around the NPU (:func:`host_pipeline`).

    Attributes:
      stages: the frame's stages in order (pre, copy_in, npu, copy_out, post).
      batch: frames per inference.
      zero_copy: whether the copies were free.
    """

    stages: tuple[StageTime, ...]
    batch: int
    zero_copy: bool

    @property
    def latency_s(self) -> float:
        """A batch's end-to-end latency (s): the sum of its stages, with or without overlap."""
        return sum(s.seconds for s in self.stages)

    @property
    def bounding_stage(self) -> StageTime:
        """The slowest stage: what bounds the pipelined throughput."""
        return max(self.stages, key=lambda s: s.seconds)

    def throughput_fps(self, overlap: bool) -> float:
        """Frames per second: ``batch / sum`` synchronous, ``batch / max`` with asynchronous
        submission and double buffering (``overlap``)."""
        period = self.bounding_stage.seconds if overlap else self.latency_s
        return self.batch / period if period > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready figures (``schedule.json``'s ``host_pipeline``)."""
        b = self.bounding_stage
        return {
            "batch": self.batch, "zero_copy": self.zero_copy,
            "stages": [dataclasses.asdict(s) for s in self.stages],
            "synchronous": {"latency_s": self.latency_s,
                            "throughput_fps": self.throughput_fps(False),
                            "bound": "sum of stages"},
            "asynchronous": {"latency_s": self.latency_s,
                             "throughput_fps": self.throughput_fps(True),
                             "bound": b.name},
        }


def _image_dims(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """``(batch, H, W, C)`` of a 4-D image input, NCHW or NHWC (channels the short axis)."""
    if len(shape) != 4:
        raise ConfigError(f"pre-processing stages need a 4-D image input (N, C, H, W or N, H, "
                          f"W, C); the model's input has shape {tuple(shape)}.")
    n, a, b, c = (int(d) for d in shape)
    if a <= 4 < c:
        return n, b, c, a  # NCHW
    return n, a, b, c


def _post_defaults(stage: HostStage, shape: Sequence[int]) -> dict[str, int]:
    """Missing parameters of a post-processing stage from the model's output ``shape``."""
    p = dict(stage.params)
    dims = [int(d) for d in shape]
    need = {"nms": ("boxes", "classes"), "ctc": ("steps", "classes"), "topk": ("classes",)}
    missing = [k for k in need[stage.kind] if k not in p]
    if missing:
        if stage.kind == "nms" and len(dims) == 3 and dims[1] > 4:
            # YOLO's [N, 4 + classes, boxes] (or [N, boxes, 4 + classes])
            few, many = sorted(dims[1:])
            p.setdefault("boxes", many)
            p.setdefault("classes", few - 4)
        elif stage.kind == "ctc" and len(dims) == 3:
            p.setdefault("steps", dims[1])
            p.setdefault("classes", dims[2])
        elif stage.kind == "topk" and len(dims) >= 2:
            p.setdefault("classes", math.prod(dims[1:]))  # [N, classes] or [N, classes, 1, 1]
        else:
            raise ConfigError(f"host stage {stage}: give {', '.join(missing)} (the model's "
                              f"output shape {tuple(dims)} does not say them), e.g. "
                              f"{stage.kind}:{missing[0]}=100.")
    if stage.kind == "nms":
        p.setdefault("candidates", p["boxes"])
        if p["classes"] < 1:
            raise ConfigError(f"host stage {stage}: classes must be >= 1.")
    if stage.kind == "topk":
        p.setdefault("k", 5)
    return p


def _ops_bytes(stage: HostStage, in_shape: Sequence[int], out_shape: Sequence[int],
               act_bits: int) -> tuple[float, float, str]:
    """Operations and host-memory bytes of one stage per batch (module table), and its
    description with the parameters filled in."""
    ab = act_bits / 8.0
    if stage.kind in PRE_STAGES:
        n, h, w, c = _image_dims(in_shape)
        e = float(h * w * c)
        if stage.kind == "resize":
            w0, h0 = stage.params.get("from", (w, h))
            return (n * 8.0 * e, n * (w0 * h0 * c + e),
                    f"resize {w0}x{h0}x{c} -> {w}x{h}x{c}")
        if stage.kind == "normalize":
            return n * 5.0 * e, n * e * (1.0 + ab), f"normalize {w}x{h}x{c}"
        return n * 2.0 * e, n * 2.0 * e, f"layout HWC -> CHW {w}x{h}x{c}"
    n = int(out_shape[0]) if len(out_shape) else 1
    p = _post_defaults(stage, out_shape)
    if stage.kind == "nms":
        nb, nc, m = p["boxes"], p["classes"], p["candidates"]
        ops = nb * nc + nb + 2.0 * m * math.log2(max(m, 2)) + 3.0 * m + 13.0 * m * (m - 1) / 2
        return (n * ops, n * nb * (4 + nc) * ab,
                f"nms {nb} boxes x {nc} classes, {m} candidates")
    if stage.kind == "ctc":
        t, v = p["steps"], p["classes"]
        return n * (t * v + 3.0 * t), n * t * v * ab, f"ctc {t} steps x {v} symbols"
    nc, k = p["classes"], p["k"]
    return (n * nc * (1.0 + math.log2(max(k, 2))), n * nc * ab, f"top-{k} of {nc}")


def host_pipeline(spec: NpuSpec, npu_latency_s: float, stages: Sequence[HostStage],
                  input_shape: Sequence[int], output_shape: Sequence[int], *,
                  input_bytes: float, output_bytes: float, act_bits: int = 8,
                  zero_copy: bool = False) -> PipelineReport:
    """The pipeline around one inference (module docstring).

    Args:
      spec: the NPU; its ``[host]`` rates price the host stages and copies.
      npu_latency_s: the NPU's latency per inference (s), e.g. ``Schedule.latency_s``.
      stages: the host stages, in any order (pre-processing ones run before the NPU, in
        :data:`PRE_STAGES` order as given, post-processing ones after).
      input_shape: the model's (first) input shape, batch first.
      output_shape: the model's (first) output shape, batch first.
      input_bytes: bytes of the inputs the copy moves in.
      output_bytes: bytes of the outputs the copy moves back.
      act_bits: the width of the quantised input and output elements (bits).
      zero_copy: the NPU reads and writes the host's buffers (no copies).

    Returns:
      :class:`PipelineReport`.

    Raises:
      ConfigError: a stage given twice, a pre-processing stage on a non-image input, or a
        post-processing stage whose sizes neither its parameters nor the output shape give.
    """
    kinds = [s.kind for s in stages]
    twice = sorted({k for k in kinds if kinds.count(k) > 1})
    if twice:
        raise ConfigError(f"host stage {twice[0]!r} is given twice; give each stage once.")
    h = spec.host
    scalar = h.scalar_ops_per_s or h.cpu_ops_per_s
    batch = int(input_shape[0]) if len(input_shape) else 1

    def host_stage(s: HostStage) -> StageTime:
        ops, nbytes, detail = _ops_bytes(s, input_shape, output_shape, act_bits)
        t_ops = ops / (h.cpu_ops_per_s if s.kind in _VECTOR else scalar)
        t_mem = nbytes / h.memory_bytes_per_s if h.memory_bytes_per_s > 0 else 0.0
        return StageTime(s.kind, "host", max(t_ops, t_mem), ops, nbytes,
                         "memory" if t_mem > t_ops else "compute", detail)

    def copy(name: str, nbytes: float) -> StageTime:
        if zero_copy:
            return StageTime(name, "link", 0.0, 0.0, 0.0, "zero_copy", "zero-copy buffer")
        return StageTime(name, "link", h.link_latency_s + nbytes / h.link_bytes_per_s, 0.0,
                         nbytes, "link", f"{nbytes:,.0f} bytes over the host link")

    pre = [host_stage(s) for s in stages if s.kind in PRE_STAGES]
    post = [host_stage(s) for s in stages if s.kind in POST_STAGES]
    path = (*pre, copy("copy_in", input_bytes),
            StageTime("npu", "npu", float(npu_latency_s), bound="npu",
                      detail="the cost program's latency"),
            copy("copy_out", output_bytes), *post)
    return PipelineReport(tuple(path), batch, zero_copy)
