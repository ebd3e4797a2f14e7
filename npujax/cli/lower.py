"""``npujax lower``: the per-layer NPU latency of an ONNX or saved model."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from npujax._lazy import names
from npujax._progress import phase
from npujax.cli._common import (
    add_progress_arg,
    bits_spec,
    console,
    epilog,
    output_dir,
    positive_int,
    precision_from_bits,
)
from npujax.errors import ConfigError, NpujaxError

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    DATAFLOW_NAMES = names("npujax.systolic.dataflow", "DATAFLOW_NAMES")
    MAPPINGS = names("npujax.systolic.mapping", "MAPPINGS")

    lo = sub.add_parser(
        "lower", help="per-layer NPU latency of an ONNX or saved model",
        description="Lower an ONNX model or a saved npujax model (model.npz from 'npujax demo') "
                    "onto a hardware preset and print the per-layer table: placement (NPU or CPU "
                    "fallback), GEMM shape, cycles, latency breakdown, bound, and where each "
                    "layer's activations lived (the acts column: DRAM, SRAM, depth-first "
                    "stripes, a fused output stage, an attention kernel, the host); with layer "
                    "fusion also each tensor between layers; with "
                    "--schedule the layer-split and pipelined multi-core schedules; with several "
                    "models their latency alone and sharing the NPU.",
        epilog=epilog(
            "npujax lower runs/<timestamp>/model.npz --npu edge_16x16 --weight-bits fc1=4",
            "npujax lower zoo:ppocr_cls --input-shape x=1,3,48,192 --npu tpu_v1 --out lowered/",
            "npujax lower zoo:ppocr_det --input-shape x=1,3,640,640 --fusion layer --cores 4 "
            "--schedule best",
            "npujax lower keras:MobileNetV2 --npu edge_16x16 --batch 4",
            "npujax lower zoo:ppocr_det zoo:ppocr_cls --input-shape 1:x=1,3,640,640 "
            "--input-shape 2:x=1,3,48,192 --npu edge_16x16 --cores 2 --sharing core_partitioned",
            "npujax lower --scalesim-config scale.cfg --topology resnet18.csv --out reports/",
            "npujax lower keras:MobileNetV2 --npu coral_devboard --sustained 300",
            "npujax lower det.onnx --npu coral_devboard --host-stage resize:from=1920x1080 "
            "--host-stage normalize --host-stage nms:candidates=1000",
            "npujax lower decoder:qwen2.5-0.5b --phase decode --kv-len 1024 --npu "
            "datacenter_128x128 --weight-bits 4 --act-bits 16 --kv-bits 8",
            "npujax lower decoder:path/to/config.json --phase decode --batch 8 --kv-len "
            "512,512,1024,1024,2048,2048,4096,4096 --npu datacenter_128x128"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    lo.intermixed = True  # models may follow options: `npujax lower --npu X A.onnx B.onnx`
    FUSION_LEVELS = names("npujax.hw.spec", "FUSION_LEVELS")
    UNSUPPORTED_POLICIES = names("npujax.hw.spec", "UNSUPPORTED_POLICIES")
    OBJECTIVES = names("npujax.plan.pipeline", "OBJECTIVES")
    SHARING = names("npujax.plan.coresident", "SHARING")

    lo.add_argument("model", nargs="*", help="an .onnx model, zoo:ppocr_cls / zoo:ppocr_det / "
                    "zoo:ppocr_rec, a "
                    "model.npz written by 'npujax demo', a Keras application "
                    "keras:NAME[:key=value...] (e.g. keras:MobileNet:alpha=0.25:input_shape="
                    "160x160x3; random weights; the keras extra), or decoder:NAME|config.json (an "
                    "LLM from its Hugging Face config.json, or the shipped qwen2.5-0.5b, "
                    "llama-3.2-1b, llama-3.1-8b, tiny; from shapes, no weights); "
                    "several models share the NPU (none with --topology)")
    lo.add_argument("--input-shape", action="append", metavar="[I:]NAME=1,3,224,224",
                    help="static shape of an ONNX input (repeat for several inputs); with several "
                    "models, I: (1, 2, ...) says which model it is for (default: all)")
    lo.add_argument("--fusion", choices=FUSION_LEVELS,
                    help="what the compiler fuses across layers (default: the preset's "
                    "ops.fusion): none, elementwise epilogues, residual epilogues, or layer "
                    "fusion (activations kept on chip, depth-first pairs)")
    lo.add_argument("--cores", type=positive_int,
                    help="override the preset's array.cores (identical cores sharing the DRAM); "
                    "the inference runs on all of them (array.cores_per_inference = 0), "
                    "whatever the runtime's default core mask of the preset")
    lo.add_argument("--schedule", choices=("layer_split", "pipeline", "best"),
                    help="also compare layer-split and pipelined multi-core schedules "
                    "(throughput and latency; with several models, of each model alone); "
                    "'best' picks by --objective")
    lo.add_argument("--objective", choices=OBJECTIVES,
                    help="what --schedule best optimises (default: throughput; needs "
                    "--schedule best)")
    lo.add_argument("--sharing", choices=SHARING,
                    help="how several models share the NPU (default: time_multiplexed; needs "
                    "two or more models)")
    lo.add_argument("--phase", choices=("prefill", "decode"), default="prefill",
                    help="decoder: a prefill of --seq-len tokens or one decode step against "
                    "--kv-len cached positions (default: prefill)")
    lo.add_argument("--seq-len", type=positive_int, default=128,
                    help="decoder: prompt tokens per sequence (default 128)")
    lo.add_argument("--kv-len",
                    help="decoder, --phase decode: cached positions of the step: one length "
                    "for every sequence, one per sequence (512,1024,2048: the batch) or a "
                    "file of lengths (default 1024)")
    lo.add_argument("--prefill-chunk", type=positive_int,
                    help="decoder: chunked prefill, tokens per chunk (each chunk attends to "
                    "the ones before; time to first token is their sum)")
    lo.add_argument("--weight-group-size", type=positive_int,
                    help="decoder: input channels per weight scale (e.g. 128 for int4 "
                    "GPTQ/AWQ-style weights): adds the scales' bytes")
    lo.add_argument("--expert-loads", metavar="F1,F2,...|FILE",
                    help="decoder, mixture of experts: measured per-expert fractions (or "
                    "token counts) of the routed assignments, instead of uniform routing")
    lo.add_argument("--ignore-config-field", action="append", metavar="NAME",
                    help="decoder: a config.json field you know changes no shape (npujax "
                    "refuses unknown fields rather than guess)")
    lo.add_argument("--kv-bits", type=positive_int, default=8,
                    help="decoder: width of the KV cache, the K/V operand of each decode "
                    "attention MatMul; the query and the softmax output take --act-bits "
                    "(default 8)")
    lo.add_argument("--kv-cache", choices=("copy", "in_place"), default="copy",
                    help="decoder: how a step reads its KV cache: copy (the traced graph's "
                    "Concat of the new position and head Transpose, a copy of the cache every "
                    "step; default) or in_place (the new keys and values written into the "
                    "cache, each attention MatMul reading it where it lies, as serving "
                    "runtimes do)")
    lo.add_argument("--sweep-resolution", action="store_true",
                    help="also lower at half and double the input resolution (ONNX models; "
                    "each model's with several)")
    lo.add_argument("--sustained", type=_seconds, metavar="SECONDS",
                    help="also the latency after SECONDS of continuous inference from cold, "
                    "with the preset's [thermal] model: each DVFS step's latency, power and "
                    "steady temperature, the time until the first throttle step and the "
                    "steady state (a preset without [thermal] never throttles)")
    lo.add_argument("--host-stage", action="append", metavar="KIND[:KEY=VALUE...]",
                    help="a host stage of the pipeline around the NPU (repeat): "
                    "resize:from=1920x1080 (camera frame WxH to the model's input), normalize, "
                    "layout (HWC->CHW), nms[:boxes=N:classes=C:candidates=M], "
                    "ctc[:steps=T:classes=V], topk[:classes=N:k=5] (sizes default to the "
                    "model's output shape); prints the end-to-end latency, synchronous and "
                    "double-buffered throughput and the bounding stage")
    lo.add_argument("--zero-copy", action="store_true",
                    help="with --host-stage: the NPU reads and writes the host's buffers, so "
                    "the input and output copies cost nothing")
    lo.add_argument("--shapes", nargs="+", metavar="CSV|SHAPE:WEIGHT",
                    help="a distribution of input shapes (a CSV of shape,probability rows, or "
                    "tokens such as 48x160:3 48x320:1; a number is a sequence length or a "
                    "square side): lower the ONNX model at each, and compare recompiling per "
                    "shape with padding to --buckets buckets (npujax.plan.buckets)")
    lo.add_argument("--buckets", default=None, metavar="K|A..B",
                    help="with --shapes: the bucket counts to plan (default 1..4)")
    lo.add_argument("--inferences", type=float, default=1000.0,
                    help="with --shapes: inferences a compiled shape serves, over which its "
                    "compile time is amortised (default 1000)")
    lo.add_argument("--compile-s", type=float,
                    help="with --shapes: compile/reload time per shape in seconds (default: the "
                    "preset's host.shape_compile_s)")
    lo.add_argument("--unsupported", choices=UNSUPPORTED_POLICIES,
                    help="override the preset's ops.unsupported: 'fallback' (host CPU), "
                    "'rewrite_or_fallback' (per layer the cheaper of an exact rewrite and the "
                    "fallback, reported with why) or 'rewrite_or_refuse'")
    lo.add_argument("--deployed", action="store_true",
                    help="cost the model as the device runs its own deployed model, the one a "
                    "vendor's benchmark times and fit --table costs: on a channels-minor "
                    "device an NCHW model rewritten channels-last (or kept in its layout), "
                    "without layout conversions at its input and outputs (one model)")
    lo.add_argument("--npu", default="edge_16x16",
                    help="preset name or TOML path (default: edge_16x16)")
    lo.add_argument("--dataflow", help="override the preset's dataflow "
                    f"({', '.join(DATAFLOW_NAMES)})")
    lo.add_argument("--mapping", choices=MAPPINGS,
                    help="override the preset's memory.mapping: 'best' (per layer the DRAM-level "
                    "loop order and tiling with the fewest DRAM bytes; the default) or "
                    "'scalesim' (SCALE-Sim's fixed fold order, for cross-checks)")
    lo.add_argument("--weight-bits", action="append",
                    help="8 (default), per layer: fc1=4,fc2=8 (layers not named keep 8; may be "
                    "repeated), or 'saved' for the mixed-precision policy in the model file")
    lo.add_argument("--act-bits", action="append",
                    help="8, or per layer: conv1=8 (may be repeated)")
    lo.add_argument("--batch", type=positive_int,
                    help="inference batch size (default: the model's)")
    lo.add_argument("--out", help="write schedule.json, layers.csv and plots (per-layer latency, "
                    "stacked breakdown, roofline) here; with several models coresidency.json "
                    "and those files of each model alone in DIR/<model>/")
    lo.add_argument("--format", choices=("table", "csv", "json"), default="table",
                    help="stdout format: tables for reading (default), or the per-layer CSV "
                    "(layers.csv's columns) / the schedule JSON (schedule.json) alone, for "
                    "pipelines; messages go to stderr")
    lo.add_argument("--scalesim-config", metavar="ARCH.cfg",
                    help="a SCALE-Sim architecture config: with --topology, write SCALE-Sim's "
                    "COMPUTE/BANDWIDTH/DETAILED_ACCESS reports for it into --out")
    lo.add_argument("--topology", metavar="TOPO.csv",
                    help="a SCALE-Sim topology (conv or GEMM form) to report on")
    add_progress_arg(lo)
    lo.set_defaults(fn=run, model_flag_defaults={d: lo.get_default(d) for d in _MODEL_FLAGS})


#: The destinations of the options that only a model lowering reads (SCALE-Sim mode takes its
#: array, dataflow and layers from the config and topology, and refuses them).
_MODEL_FLAGS = ("input_shape", "fusion", "cores", "schedule", "objective", "sharing", "phase",
                "seq_len", "kv_len", "kv_bits", "kv_cache", "prefill_chunk", "weight_group_size",
                "expert_loads", "ignore_config_field", "sweep_resolution", "npu", "dataflow",
                "mapping", "weight_bits", "act_bits", "batch", "format", "shapes",
                "unsupported", "compile_s", "sustained", "host_stage", "zero_copy", "deployed")


def _seconds(text: str) -> float:
    """A finite number of seconds >= 0 (``--sustained``)."""
    import math

    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"expected seconds of continuous inference (a number "
                                         f">= 0), got {text!r}")
    return v


def _run_scalesim(args: argparse.Namespace) -> int:
    from npujax.systolic.scalesim_io import (
        read_scalesim_config,
        read_topology,
        write_scalesim_reports,
    )

    if not (args.scalesim_config and args.topology and args.out) or args.model:
        raise ConfigError("SCALE-Sim mode needs --scalesim-config ARCH.cfg, --topology "
                          "TOPO.csv and --out DIR, and no model argument.")
    defaults = getattr(args, "model_flag_defaults", {})
    given = [f"--{d.replace('_', '-')}" for d, v in defaults.items() if getattr(args, d) != v]
    if given:
        verb = "does" if len(given) == 1 else "do"
        raise ConfigError(f"{', '.join(given)} {verb} nothing in SCALE-Sim mode: the array "
                          "size, SRAMs and dataflow come from --scalesim-config and the layers "
                          "from --topology; edit those files (or drop the option).")
    config = read_scalesim_config(args.scalesim_config)
    layers = read_topology(args.topology)
    out = output_dir(args.out)
    assert out is not None
    if config.interface_bandwidth != "CALC":
        log.warning(f"{args.scalesim_config}: InterfaceBandwidth = "
                    f"{config.interface_bandwidth}; npujax reports SCALE-Sim's CALC mode (a "
                    "stall-free DRAM interface): Stall Cycles are 0 and the DRAM columns are "
                    "what CALC mode would report.")
    written = write_scalesim_reports(layers, config, out)
    if written.approximate_reads:
        shown = ", ".join(written.approximate_reads[:5])
        more = len(written.approximate_reads) - 5
        shown += f", +{more}" if more > 0 else ""
        log.warning(f"{len(written.approximate_reads)} layers ({shown}) have an operand larger "
                    "than half its SRAM: their DRAM read columns are the compulsory reads "
                    "(SCALE-Sim re-reads evicted data); every other column is exact.")
    console().print(f"{len(layers)} layers on a {config.rows}x{config.cols} {config.dataflow} "
                    f"array; wrote {', '.join(str(out / n) for n in written.files)}")
    return 0


def _check_flags(args: argparse.Namespace, models: int) -> None:
    """Refuse flags that would do nothing with these arguments (a silent no-op misleads).

    Raises:
      ConfigError: ``--objective`` without ``--schedule best``; ``--sharing`` with one model.
    """
    if args.objective is not None and args.schedule != "best":
        raise ConfigError(f"--objective {args.objective} says what '--schedule best' optimises; "
                          "add --schedule best (or drop --objective).")
    if args.buckets is not None and not args.shapes:
        raise ConfigError("--buckets plans buckets for a distribution of input shapes; it needs "
                          "--shapes (or drop --buckets).")
    if args.zero_copy and not args.host_stage:
        raise ConfigError("--zero-copy says the pipeline's copies are free; it needs "
                          "--host-stage (or drop --zero-copy).")
    if (args.sustained is not None or args.host_stage) and models > 1:
        raise ConfigError("--sustained and --host-stage report one model's deployment; give "
                          "one model.")
    if args.deployed and (models > 1 or args.sweep_resolution or args.shapes):
        raise ConfigError("--deployed costs one model at its input shape; give one model, "
                          "without --sweep-resolution or --shapes.")
    if args.sharing is not None and models < 2:
        raise ConfigError(f"--sharing {args.sharing} says how several models share the NPU, but "
                          "one model was given; name two or more models (or drop --sharing).")


def _note_fusion_override(args: argparse.Namespace, preset_fusion: str, npu: str) -> None:
    """Log a notice when ``--fusion`` asks for more than the preset's compiler declares."""
    from npujax.hw import FUSION_LEVELS

    if args.fusion and FUSION_LEVELS.index(args.fusion) > FUSION_LEVELS.index(preset_fusion):
        log.warning("note: --fusion %s goes beyond what %s's compiler declares (ops.fusion = "
                    "%r): the figures are those of a compiler that fuses more than the preset "
                    "claims.", args.fusion, npu, preset_fusion)


def run(args: argparse.Namespace) -> int:
    if args.scalesim_config or args.topology:
        return _run_scalesim(args)
    if not args.model:
        raise ConfigError("npujax lower needs a model (or --scalesim-config with --topology).")
    _check_flags(args, len(args.model))
    if args.format != "table" and (len(args.model) > 1 or args.sweep_resolution
                                   or args.shapes or args.schedule
                                   or args.sustained is not None or args.host_stage):
        raise ConfigError(f"--format {args.format} prints one model's schedule; give one "
                          "model file, without --sweep-resolution, --schedule, --sustained or "
                          "--host-stage (their tables need --format table).")
    if any(str(m).startswith("decoder:") for m in args.model):
        if args.sustained is not None or args.host_stage:
            raise ConfigError("--sustained and --host-stage are not implemented for a decoder "
                              "step; lower the decoder's ONNX export.")
        if len(args.model) > 1:
            raise ConfigError("decoder:<config> is lowered on its own; give it as the only model.")
        if args.deployed:
            raise ConfigError("--deployed builds an image model as the device runs it; a "
                              "decoder's graph has no layout to change (drop --deployed).")
        args.model = args.model[0]
        return _run_decoder(args)
    from npujax.hw import load_npu_spec
    from npujax.plan.lower import lower_dataflows
    from npujax.report.lowering import print_lowering, summary_line
    from npujax.workflows.inputs import load_model
    from npujax.workflows.lowering import import_onnx_for_lowering

    saved = args.weight_bits == ["saved"]
    wbits = bits_spec(args.weight_bits) if args.weight_bits and not saved else 8
    abits = bits_spec(args.act_bits) if args.act_bits else 8
    spec = load_npu_spec(args.npu)
    _note_fusion_override(args, spec.ops.fusion, spec.name)
    changes: dict[str, Any] = {}
    if args.fusion:
        changes["ops.fusion"] = args.fusion
    if args.cores:
        changes["array.cores"] = args.cores
        changes["array.cores_per_inference"] = 0
    if args.mapping:
        changes["memory.mapping"] = args.mapping
    if args.unsupported:
        changes["ops.unsupported"] = args.unsupported
    if changes:
        spec = spec.with_fields(changes)
    out = output_dir(args.out)
    if len(args.model) > 1:
        if saved:
            raise ConfigError("--weight-bits saved applies to one saved model; give widths.")
        return _run_many(args, spec, wbits, abits, out)
    args.model = args.model[0]
    shapes = _input_shapes(args, 1, 1)
    onnx_model = str(args.model).lower().endswith(".onnx")
    batch = args.batch
    meta: dict[str, Any]
    progress = not args.no_progress
    with phase(f"lower: importing {args.model}", progress):
        if onnx_model:
            graph, meta = import_onnx_for_lowering(args.model, shapes, args.batch), {}
            batch = None  # the batch is part of the imported shapes
        else:
            graph, _, _, meta = load_model(args.model, shapes)
    if args.deployed:
        from npujax.workflows.fit_table import deployed_model

        graph, spec = deployed_model(graph, spec)
    if saved:
        if "mixed_precision_policy" not in meta:
            raise ConfigError(f"{args.model} holds no saved precision policy; pass --weight-bits "
                              "8 or layer=bits pairs.")
        wbits = meta["mixed_precision_policy"]
    if args.sweep_resolution and not onnx_model:
        raise ConfigError("--sweep-resolution re-imports the model at other input sizes; "
                          "it needs an .onnx model.")
    if args.shapes and not onnx_model:
        raise ConfigError("--shapes re-imports the model at each input shape; it needs an "
                          ".onnx model (or zoo:NAME).")
    precision = _precision_fn(wbits, abits)
    with phase(f"lower: costing {len(graph.nodes)} nodes on {spec.name}", progress):
        result = lower_dataflows(graph, spec, precision(graph), dataflow=args.dataflow,
                                 batch=batch)
    if result.graph is not None:  # ops.unsupported rewrote layers: report on that graph
        graph, batch = result.graph, None
        spec = spec.with_fields({"ops.unsupported": "fallback"})
    if args.format != "table":
        return _print_machine_readable(args, result, spec, out)
    con = console()
    print_lowering(con, result, f"{Path(args.model).name} on {spec.name} "
                                f"({result.schedule.dataflow})")
    from npujax.report.lowering import print_rewrites

    print_rewrites(con, result.schedule)
    from npujax.ir.passes import rebatch
    from npujax.plan import memory_report
    from npujax.report.lowering import (
        print_attention,
        print_edges,
        print_memory,
        print_sram_split,
    )

    lowered = graph if batch is None else rebatch(graph, batch)
    memory = memory_report(lowered, result.schedule, spec)
    print_edges(con, result.schedule)
    print_attention(con, result.schedule)
    print_memory(con, {Path(args.model).name: memory})
    print_sram_split(con, result.schedule)
    extra: dict[str, Any] = {"memory": memory.to_dict()}
    extra.update(_schedules_and_sweep(con, args, args.model, graph, lowered, spec, precision,
                                      onnx_model))
    extra.update(_deployment(con, args, graph, lowered, spec, precision, result.schedule,
                             abits, batch))
    if out is not None:
        with phase(f"lower: writing {out}", progress):
            _write(con, out, result, spec, extra)
    # the headline last, where the terminal leaves the cursor (the tables above can be long)
    chosen = extra.get("chosen_core_schedule")
    con.print(summary_line(result.schedule, Path(args.model).name, spec.name,
                           extra["core_schedules"][chosen] if chosen else None), soft_wrap=True)
    return 0


def _deployment(con: Any, args: argparse.Namespace, graph: Any, lowered: Any, spec: Any,
                precision: Any, schedule: Any, abits: Any, batch: int | None
                ) -> dict[str, Any]:
    """``--sustained`` and ``--host-stage``: printed, and returned for schedule.json."""
    from npujax.plan.host_pipeline import parse_host_stage
    from npujax.report.lowering import print_host_pipeline, print_sustained
    from npujax.workflows.lowering import pipeline_lowering, sustained_lowering

    extra: dict[str, Any] = {}
    if args.host_stage:
        stages = [parse_host_stage(s) for s in args.host_stage]
        act = abits if isinstance(abits, int) else 8
        rep = pipeline_lowering(lowered, spec, schedule, stages, act_bits=act,
                                zero_copy=args.zero_copy)
        print_host_pipeline(con, rep)
        extra["host_pipeline"] = rep.to_dict()
    if args.sustained is not None:
        steps = len(spec.thermal.dvfs_clock_scales)
        with phase(f"lower: {steps} throttled clock(s) for --sustained", not args.no_progress):
            sus = sustained_lowering(graph, spec, precision(graph), args.sustained, schedule,
                                     dataflow=args.dataflow, batch=batch)
        print_sustained(con, sus)
        extra["sustained"] = sus.to_dict()
    return extra


def _precision_fn(wbits: Any, abits: Any):
    """The quantization spec of a graph from command-line widths (None: 8 bits everywhere)."""
    def precision(g):
        default = not isinstance(wbits, dict) and not isinstance(abits, dict) \
            and wbits == abits == 8
        return None if default else precision_from_bits(g, wbits, abits)
    return precision


def _schedules_and_sweep(con: Any, args: argparse.Namespace, path: str, graph: Any,
                         lowered: Any, spec: Any, precision: Any, onnx_model: bool,
                         title: str = "") -> dict[str, Any]:
    """``--schedule`` and ``--sweep-resolution`` for one model: printed, and returned for its
    schedule.json."""
    from npujax.plan import best_core_schedule, core_schedules
    from npujax.report.lowering import print_core_schedules, print_resolution_sweep
    from npujax.workflows.lowering import resolution_sweep

    extra: dict[str, Any] = {}
    progress = not args.no_progress
    if args.schedule:
        with phase(f"lower: {title}core schedules", progress):
            cores = core_schedules(lowered, spec, precision(graph), dataflow=args.dataflow)
        chosen = (best_core_schedule(cores, args.objective or "throughput")
                  if args.schedule == "best" else cores[args.schedule])
        print_core_schedules(con, cores, chosen.kind, title=title)
        extra["core_schedules"] = {k: v.to_dict() for k, v in cores.items()}
        extra["chosen_core_schedule"] = chosen.kind
    if args.sweep_resolution:
        batch = args.batch if onnx_model else None
        with phase(f"lower: {title}resolution sweep (3 imports)", progress):
            sweep = resolution_sweep(path, graph, spec, batch, precision, args.dataflow)
        print_resolution_sweep(con, sweep, title=title)
        extra["resolution_sweep"] = sweep
    if getattr(args, "shapes", None):
        extra["shape_buckets"] = _shape_buckets(con, args, path, graph, spec, precision, title)
    return extra


def parse_buckets(text: str) -> list[int]:
    """``"3"`` -> ``[3]``; ``"1..4"`` -> ``[1, 2, 3, 4]`` (the ``--buckets`` option)."""
    a, dots, b = text.partition("..")
    try:
        lo, hi = int(a), int(b) if dots else int(a)
    except ValueError:
        lo, hi = 0, -1
    if lo < 1 or hi < lo:
        raise ConfigError(f"--buckets {text!r}: give K or A..B with 1 <= A <= B (e.g. 1..4).")
    return list(range(lo, hi + 1))


def _shape_buckets(con: Any, args: argparse.Namespace, path: str, graph: Any, spec: Any,
                   precision: Any, title: str = "") -> dict[str, Any]:
    """``--shapes``: the model at each shape, the bucket plans, printed and returned."""
    from npujax.report.lowering import print_shape_buckets
    from npujax.workflows.lowering import import_onnx_for_lowering
    from npujax.workflows.shape_buckets import (
        read_shape_distribution,
        shape_bucket_report,
        shape_costs,
    )

    ks = parse_buckets(args.buckets or "1..4")
    src = args.shapes[0] if len(args.shapes) == 1 and Path(args.shapes[0]).is_file() \
        else args.shapes
    dist = read_shape_distribution(src)
    compile_s = spec.host.shape_compile_s if args.compile_s is None else args.compile_s
    base = {t: graph.tensors[t].shape for t in graph.inputs}
    costs = shape_costs(lambda shapes: import_onnx_for_lowering(path, shapes, None), base, dist,
                        spec, precision, args.dataflow, show_progress=not args.no_progress)
    report = shape_bucket_report(costs, ks, compile_s, args.inferences)
    print_shape_buckets(con, report, title=title)
    return report


def _write(con: Any, out: Path, result: Any, spec: Any, extra: dict[str, Any]) -> None:
    """schedule.json, layers.csv and the plots of one model into ``out`` (atomically)."""
    from npujax._atomic import staged_dir
    from npujax.report.lowering import write_lowering

    with staged_dir(out) as stage:
        names = write_lowering(stage, result, spec, extra or None)
    con.print(f"wrote {', '.join(str(out / n) for n in names)}")


def _input_shapes(args: argparse.Namespace, index: int, models: int) -> dict[str, Any]:
    from npujax.frontends.onnx import parse_input_shapes

    return parse_input_shapes(_shapes_for(args.input_shape or [], index, models))


def _print_machine_readable(args: argparse.Namespace, result: Any, spec: Any,
                            out: Path | None, extra: dict[str, Any] | None = None) -> int:
    """``--format csv|json``: the per-layer CSV, or ``schedule.json``'s content (with ``extra``,
    a decoder step's figures), alone on stdout (and the files in ``--out``)."""
    import sys

    from npujax._atomic import staged_dir
    from npujax.report.files import json_text, layers_csv_text
    from npujax.report.lowering import schedule_record, write_lowering

    text = (layers_csv_text(result.schedule) if args.format == "csv"
            else json_text(schedule_record(result, extra)))
    if out is not None:
        with staged_dir(out) as stage:
            names = write_lowering(stage, result, spec, extra)
        log.info(f"wrote {', '.join(str(out / n) for n in names)}")
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0


def _shapes_for(specs: list[str], index: int, models: int) -> list[str]:
    """The ``--input-shape`` values for model ``index`` (1-based): unprefixed ones, and those
    prefixed ``index:``.

    Raises:
      ConfigError: a prefix that is not a model's position.
    """
    mine = []
    for s in specs:
        head, sep, rest = s.partition(":")
        if sep and head.strip().isdigit():
            if not 1 <= int(head) <= models:
                raise ConfigError(f"--input-shape {s!r} is for model {head}, but "
                                  f"{models} model(s) were given.")
            if int(head) == index:
                mine.append(rest)
        else:
            mine.append(s)
    return mine


def _run_many(args: argparse.Namespace, spec: Any, wbits: Any, abits: Any,
              out: Path | None) -> int:
    """Several models sharing the NPU: each alone, then together; with ``--out`` also each
    model's own files in ``out/<model>/``."""
    from npujax._atomic import staged_dir
    from npujax.ir.passes import rebatch
    from npujax.plan import lower_models
    from npujax.plan.lower import lower_dataflows
    from npujax.report import write_json
    from npujax.report.lowering import print_coresidency, write_lowering
    from npujax.workflows.inputs import load_model
    from npujax.workflows.lowering import import_onnx_for_lowering

    precision = _precision_fn(wbits, abits)
    graphs, quants, paths, onnx = {}, {}, {}, {}
    n_models = len(args.model)
    for i, path in enumerate(args.model, 1):
        name = Path(path).name
        if name in graphs:
            name = f"{i}:{name}"
        onnx[name] = str(path).lower().endswith(".onnx")
        if args.sweep_resolution and not onnx[name]:
            raise ConfigError(f"--sweep-resolution re-imports each model at other input sizes; "
                              f"model {i} ({name}) is not an .onnx model.")
        try:
            shapes = _input_shapes(args, i, n_models)
            with phase(f"lower: importing model {i} of {n_models}, {path}",
                       not args.no_progress):
                if onnx[name]:
                    g = import_onnx_for_lowering(path, shapes, args.batch)
                else:
                    g = load_model(path, shapes)[0]
                    if args.batch:
                        g = rebatch(g, args.batch)
        except NpujaxError as e:
            raise type(e)(f"model {i} ({name}): {e} With several models, an --input-shape "
                          f"for one of them is prefixed by its position: --input-shape "
                          f"{i}:NAME=D1,D2,...") from e
        graphs[name], paths[name] = g, str(path)
        quants[name] = precision(g)
    with phase(f"lower: costing {n_models} models on {spec.name}", not args.no_progress):
        co = lower_models(graphs, spec, quants, sharing=args.sharing or "time_multiplexed",
                          dataflow=args.dataflow)
    con = console()
    print_coresidency(con, co)
    per_model: dict[str, dict[str, Any]] = {}
    for name, g in graphs.items():
        per_model[name] = _schedules_and_sweep(con, args, paths[name], g, g, spec, precision,
                                               onnx[name], title=f"{name}: ")
    if out is not None:
        with staged_dir(out) as stage:
            write_json(stage / "coresidency.json", co.to_dict())
            written = [str(out / "coresidency.json")]
            for share in co.models:
                name = share.name
                folder = name.replace(":", "_")
                result = lower_dataflows(graphs[name], spec, quants[name],
                                         dataflow=args.dataflow)
                (stage / folder).mkdir()
                write_lowering(stage / folder, result, spec,
                               {"memory": share.memory.to_dict(), **per_model[name]})
                written.append(str(out / folder) + "/")
        con.print(f"wrote {', '.join(written)}")
    return 0


def _kv_lens(spec: str, batch: int | None) -> list[int]:
    """``--kv-len``: one length, a comma list (one per sequence) or a file of lengths (one
    per line or comma-separated), matched against ``--batch``.

    Raises:
      ConfigError: an unreadable file, a non-integer or negative length, or a count that is
        neither 1 nor ``--batch``.
    """
    text = spec
    # numbers (signed ones are refused below, not looked for as a file), else a file's name
    if not all(c.isdigit() or c in ", +-" for c in spec.strip()):
        try:
            text = Path(spec).read_text()
        except OSError as e:
            raise ConfigError(f"--kv-len {spec!r} is neither lengths (1024 or 512,1024) nor a "
                              f"readable file: {e.strerror or e}.") from e
    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts or not all(p.isdigit() for p in parts):
        raise ConfigError(f"--kv-len must be non-negative integers, got {spec!r}.")
    lens = [int(p) for p in parts]
    if len(lens) == 1:
        return lens * (batch or 1)
    if batch is not None and batch != len(lens):
        raise ConfigError(f"--kv-len gives {len(lens)} lengths (one per sequence) but --batch "
                          f"is {batch}; give one length, or one per sequence.")
    return lens


def _expert_loads(spec: str | None) -> list[float] | None:
    """``--expert-loads``: per-expert fractions or counts, a comma list or a file."""
    if spec is None:
        return None
    text = spec
    if not all(c.isdigit() or c in ",. e-" for c in spec.strip()):
        try:
            text = Path(spec).read_text()
        except OSError as e:
            raise ConfigError(f"--expert-loads {spec!r} is neither numbers nor a readable "
                              f"file: {e.strerror or e}.") from e
    try:
        return [float(p) for p in text.replace(",", " ").split()]
    except ValueError as e:
        raise ConfigError(f"--expert-loads must be numbers (one per routed expert): {e}.") \
            from e


def _run_decoder(args: argparse.Namespace) -> int:
    """``npujax lower decoder:<name or config.json>``: a prefill or decode step of a batch."""
    from npujax.hw import load_npu_spec
    from npujax.models.hf_config import load_decoder
    from npujax.models.serving import lower_decoder
    from npujax.report.lowering import (
        print_attention,
        print_lowering,
        print_sram_split,
        write_lowering,
    )

    name = str(args.model).split(":", 1)[1]
    if args.input_shape or args.sweep_resolution or args.shapes or args.compile_s is not None:
        raise ConfigError("--input-shape, --sweep-resolution, --shapes and --compile-s apply to "
                          ".onnx models; a decoder's shapes are --seq-len, --kv-len and "
                          "--batch.")
    if args.schedule:
        raise ConfigError(f"--schedule {args.schedule} is not implemented for a decoder (it "
                          "would be ignored); drop it, or lower the decoder's ONNX export.")
    widths = []
    for what, v in (("--weight-bits", args.weight_bits), ("--act-bits", args.act_bits)):
        b = bits_spec(v) if v else 8
        if not isinstance(b, int):
            raise ConfigError(f"{what} for a decoder is one width for every linear layer, "
                              f"got {v}.")
        widths.append(b)
    if args.phase == "decode" and args.prefill_chunk:
        raise ConfigError("--prefill-chunk applies to --phase prefill.")
    cfg = load_decoder(name, ignore=args.ignore_config_field or ())
    if args.phase == "prefill" and args.kv_len is not None:
        # (it was read and ignored: a prefill's length is its prompt's)
        raise ConfigError("--kv-len sets the cached positions of a decode step (--phase "
                          "decode); a prefill's prompts are --seq-len tokens and its batch is "
                          "--batch.")
    lens = _kv_lens("1024" if args.kv_len is None else args.kv_len, args.batch)
    loads = _expert_loads(args.expert_loads)
    if loads is not None and not cfg.moe_layers:
        raise ConfigError(f"--expert-loads applies to a mixture of experts; {name} is dense.")
    spec = load_npu_spec(args.npu)
    if args.unsupported:
        spec = spec.with_fields({"ops.unsupported": args.unsupported})
    progress = not args.no_progress
    seqs = f"{len(lens)} sequence{'s' if len(lens) != 1 else ''}"
    with phase(f"lower: the {name} decoder ({args.phase}, {seqs}) from its shapes on "
               f"{spec.name}", progress):
        result, rep = lower_decoder(
            cfg, spec, phase=args.phase, seq_len=args.seq_len,
            kv_lens=lens if args.phase == "decode" else [0] * len(lens),
            weight_bits=widths[0], act_bits=widths[1], kv_bits=args.kv_bits,
            weight_group_size=args.weight_group_size or 0,
            prefill_chunk=args.prefill_chunk or 0, expert_loads=loads, dataflow=args.dataflow,
            kv_cache=args.kv_cache)
    from npujax.models.decoders import decoder_figures

    first = rep.prefill_chunk if len(rep.chunk_latency_s) > 1 else args.seq_len
    fig = decoder_figures(result.schedule, cfg, phase=args.phase, seq_len=first,
                          kv_len=max(lens), batch=len(lens), kv_bits=args.kv_bits, spec=spec)
    extra = {"decoder": fig.to_dict(), "serving": rep.to_dict()}
    if args.format != "table":  # the step's schedule alone on stdout, as for a model file
        return _print_machine_readable(args, result, spec, output_dir(args.out), extra)
    con = console()
    lens_text = (str(lens[0]) if len(set(lens)) == 1 else f"{min(lens)}-{max(lens)}")
    shape = (f"{args.seq_len} tokens" if args.phase == "prefill"
             else f"1 token, {lens_text} cached")
    chunk = (f", first of {len(rep.chunk_latency_s)} chunks of {args.prefill_chunk}"
             if len(rep.chunk_latency_s) > 1 else "")
    name = Path(name).name if name.endswith(".json") else name
    print_lowering(con, result, f"{name} {args.phase} ({shape}, batch {len(lens)}{chunk}) on "
                                f"{spec.name} ({result.schedule.dataflow})")
    gib = 2.0 ** 30
    if args.phase == "prefill":
        con.print(f"prefill: time to first token {rep.ttft_s * 1e3:,.3f} ms"
                  + (f" ({len(rep.chunk_latency_s)} chunks: "
                     + ", ".join(f"{c * 1e3:,.2f}" for c in rep.chunk_latency_s) + " ms)"
                     if len(rep.chunk_latency_s) > 1 else "")
                  + f"; {rep.tokens_per_s_per_sequence:,.1f} tokens/s per sequence, "
                  f"{rep.tokens_per_s:,.1f} in aggregate")
    else:
        con.print(f"decode: {rep.latency_s * 1e3:,.3f} ms per step, "
                  f"{rep.tokens_per_s_per_sequence:,.1f} tokens/s per sequence, "
                  f"{rep.tokens_per_s:,.1f} in aggregate; KV cache read per token: "
                  f"{rep.kv_cache_bytes_per_token:,.0f} bytes ({args.kv_bits}-bit; "
                  + ("read in place)" if args.kv_cache == "in_place" else
                     "copied each step: --kv-cache in_place reads it in place)"))
    con.print(f"weights {widths[0]}-bit"
              + (f" (groups of {args.weight_group_size}: {rep.scale_bytes_per_step / 1e6:,.2f}"
                 f" MB of scales per step, not in the modelled latency: +"
                 f"{rep.scale_bytes_per_step / spec.memory.dram_bytes_per_s * 1e3:,.3f} ms at "
                 "the DRAM bandwidth)" if args.weight_group_size else "")
              + f", activations {widths[1]}-bit; {rep.parameters / 1e9:,.3f} B parameters; "
              f"weights read per step {rep.weight_bytes_per_step / 1e6:,.1f} MB")
    if cfg.moe_layers:
        step_tokens = (1 if args.phase == "decode"
                       else min(args.prefill_chunk or args.seq_len, args.seq_len))
        con.print(f"mixture of experts: {rep.expected_experts:,.2f} of {cfg.experts} experts "
                  f"touched per MoE layer in expectation ("
                  + ("measured loads" if loads else f"uniform top-{cfg.experts_per_token}")
                  + f", {len(lens) * step_tokens} tokens a step);"
                  " costed as " + " and ".join(f"{d} (weight {w:.2f})"
                                               for d, w in rep.costed_experts))
    cap = (f"{rep.dram_capacity_bytes / gib:,.2f} GiB" if rep.dram_capacity_bytes
           else "not stated by the preset (memory.dram_bytes)")
    con.print(f"memory: weights {rep.weights_bytes / gib:,.3f} GiB + KV cache "
              f"{rep.kv_cache_bytes / gib:,.3f} GiB; DRAM capacity {cap}")
    con.print(("the first chunk's roofline" if len(rep.chunk_latency_s) > 1 else "roofline")
              + f": {fig.roofline_s * 1e3:,.3f} ms ({fig.bound}-bound; "
              f"{fig.arithmetic_intensity:,.1f} MACs/byte vs ridge "
              f"{spec.ridge_macs_per_byte:,.1f}); modelled / roofline = "
              f"{result.schedule.latency_s / fig.roofline_s:,.2f}")
    print_attention(con, result.schedule)
    print_sram_split(con, result.schedule)
    out = output_dir(args.out)
    if out is not None:
        from npujax._atomic import staged_dir

        with staged_dir(out) as stage:
            names = write_lowering(stage, result, spec, extra)
        con.print(f"wrote {', '.join(str(out / n) for n in names)}")
    return 0
