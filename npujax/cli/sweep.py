"""``npujax sweep``: a design-space sweep of a model over hardware configurations."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from npujax._lazy import names
from npujax.cli._common import add_progress_arg, console, epilog, int_list, positive_int, seed


def add_parser(sub: argparse._SubParsersAction) -> None:
    SAMPLING_METHODS = names("npujax.explore.grid", "SAMPLING_METHODS")
    DEFAULT_CHUNK = names("npujax.workflows.sweep", "DEFAULT_CHUNK")
    DEFAULT_OBJECTIVES = names("npujax.workflows.sweep", "DEFAULT_OBJECTIVES")

    sw = sub.add_parser(
        "sweep", help="design-space sweep over hardware configurations (sharded over devices)",
        description="Evaluate a model on every configuration of a grid of hardware fields "
                    "(or a random / Latin hypercube sample of it), sharded over the local "
                    "devices (and over processes under jax.distributed), and write "
                    "results.csv / results.parquet, pareto.csv and plots to --out. Chunks are "
                    "written as they finish; rerunning the same command resumes.",
        epilog=epilog(
            "npujax sweep zoo:ppocr_cls --input-shape x=1,3,48,192 --npu edge_16x16 "
            "--grid array.rows=8,16,32 --grid array.cols=8,16,32 "
            "--grid memory.dram_bytes_per_s=3.2e9,6.4e9,12.8e9 --grid dataflow=ws,os,is "
            "--bits 4,8 --out sweeps/cls",
            "npujax sweep model.npz --grid array.rows=4,8,16,32,64 --grid array.cols=4,8,16,32 "
            "--sample 10 --method lhs --out sweeps/s",
            "npujax sweep model.onnx --grid array.rows=8,16,32 --shard $SLURM_ARRAY_TASK_ID/4 "
            "--out s/$SLURM_ARRAY_TASK_ID",
            "npujax sweep --merge s/0 s/1 s/2 s/3 --out s/all"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sw.add_argument("model", nargs="?", help="an .onnx model, zoo:ppocr_cls / zoo:ppocr_det / "
                    "zoo:ppocr_rec, a "
                    "model.npz written by 'npujax demo', or keras:NAME[:key=value...] (a Keras "
                    "application)")
    sw.add_argument("--input-shape", action="append", metavar="NAME=1,3,224,224",
                    help="static shape of an ONNX input (repeat for several inputs)")
    sw.add_argument("--npu", default="edge_16x16",
                    help="the base preset the grid changes (name or TOML path)")
    sw.add_argument("--grid", action="append", metavar="SECTION.KEY=V1,V2",
                    help="an axis: a hardware field and its values (repeat for more axes); "
                    "dataflow=ws,os,is for the dataflow")
    sw.add_argument("--bits", type=int_list("--bits"),
                    help="uniform weight and activation widths to sweep (e.g. 2,4,8; "
                    "default 8)")
    sw.add_argument("--sample", type=positive_int,
                    help="evaluate this many configurations instead of the full product")
    sw.add_argument("--method", choices=SAMPLING_METHODS, default="random",
                    help="how --sample draws (default random; lhs = Latin hypercube)")
    sw.add_argument("--seed", type=seed, default=0, help="sampling seed (default 0)")
    sw.add_argument("--chunk-size", type=positive_int, default=DEFAULT_CHUNK,
                    help=f"configurations per chunk file (default {DEFAULT_CHUNK})")
    sw.add_argument("--pareto", default=",".join(DEFAULT_OBJECTIVES),
                    help="columns the Pareto front minimises, e.g. energy_j,area_mm2 or "
                    f"edp_js,pes (default {','.join(DEFAULT_OBJECTIVES)})")
    sw.add_argument("--out", required=True, help="the sweep's folder (rerun to resume; "
                    "files npujax did not write there are kept)")
    cluster = sw.add_argument_group("slices on a cluster (no coordinator; e.g. a SLURM job array)")
    cluster.add_argument("--shard", metavar="I/N",
                         help="evaluate only slice I (0 .. N-1) of N disjoint slices of the "
                         "grid (every N-th chunk from chunk I) into --out; merge the N folders "
                         "with --merge")
    cluster.add_argument("--merge", nargs="+", metavar="DIR",
                         help="join the --out folders of the N slices of one sweep (checked: "
                         "same model, spec, grid, options and npujax version) and write the "
                         "results, the Pareto front and the plots to --out, as one run would "
                         "(no MODEL or --grid)")
    dist = sw.add_argument_group("several processes (jax.distributed; see the README)")
    dist.add_argument("--distributed", action="store_true",
                      help="join a jax.distributed job (coordinator and process ids from the "
                      "options below, else detected: SLURM, Open MPI, Kubernetes, Cloud TPU)")
    dist.add_argument("--coordinator", metavar="HOST:PORT",
                      help="address of process 0's coordinator (implies --distributed)")
    dist.add_argument("--num-processes", type=positive_int, help="processes in the job")
    dist.add_argument("--process-id", type=int, help="this process's id, 0 .. N-1")
    add_progress_arg(sw)
    sw.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from npujax.errors import ConfigError

    if args.merge:
        given = [flag for flag, v in (("MODEL", args.model), ("--grid", args.grid),
                                      ("--shard", args.shard), ("--bits", args.bits),
                                      ("--sample", args.sample)) if v]
        if given:
            raise ConfigError(f"--merge takes the slices' folders only; {', '.join(given)} come "
                              "from the slices (drop them).")
        return _merge(args)
    if not args.model or not args.grid:
        raise ConfigError("npujax sweep needs a MODEL and at least one --grid SECTION.KEY=V1,V2 "
                          "(or --merge DIR... to join slices).")
    from npujax.explore.grid import Grid, parse_grid_axis
    from npujax.hw import load_npu_spec
    from npujax.workflows.sweep import file_sha256, parse_shard, run_sweep

    shard = parse_shard(args.shard) if args.shard else None
    if args.distributed or args.coordinator:
        _join(args)
    spec = load_npu_spec(args.npu)
    axes = dict(parse_grid_axis(g) for g in args.grid)
    if len(axes) != len(args.grid):
        raise ConfigError("a --grid axis is given twice; give each field once with all its "
                          "values.")
    if args.bits:
        axes["bits"] = args.bits
    grid = Grid.build(axes, spec)
    from npujax._progress import phase

    model_sha256 = file_sha256(args.model)  # (before reading it: the bytes that are swept)
    try:
        with _cache_every_program():
            with phase(f"sweep: importing {args.model}", not args.no_progress):
                graph = _load_model(args)
            r = run_sweep(graph, spec, grid, args.out, model=Path(args.model).name,
                          sample=args.sample, method=args.method, seed=args.seed,
                          chunk_size=args.chunk_size,
                          objectives=tuple(o.strip() for o in args.pareto.split(",")
                                           if o.strip()),
                          progress=not args.no_progress, model_sha256=model_sha256,
                          shard=shard)
    except KeyboardInterrupt:  # the generic "no output" line would hide the kept chunks
        from npujax.workflows.sweep import kept_chunks

        done = kept_chunks(args.out)
        print(f"npujax sweep: {done} finished chunk(s) kept in {args.out}; rerun the same "
              "command to resume", file=sys.stderr)
        raise
    con = console()
    # with every chunk resumed, the rate is the one the evaluating run measured (sweep.json
    # keeps it): say so, not as if this run had measured it
    rate = (f"{r.evaluations_per_s:.3g} evaluations/s" if r.evaluated else
            f"nothing left to evaluate (the run that evaluated them: "
            f"{r.evaluations_per_s:.3g} evaluations/s)")
    if r.result is None and shard is not None and r.files:
        con.print(f"slice {args.shard}: {r.evaluated} chunk(s) evaluated, {r.skipped} resumed; "
                  f"{rate}")
        con.print(f"wrote {', '.join(str(Path(args.out) / n) for n in r.files)}; join the "
                  f"{shard[1]} slices with npujax sweep --merge DIR... --out DIR")
        return 0
    if r.result is None:
        con.print(f"evaluated {r.evaluated} chunk(s); process 0 writes the results")
        return 0
    res = r.result
    con.print(f"{len(res)} configurations x {res.layers} layers: {r.evaluated} chunk(s) "
              f"evaluated, {r.skipped} resumed; {rate}")
    con.print(f"wrote {', '.join(str(Path(args.out) / n) for n in r.files)}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from npujax.workflows.sweep import merge_sweeps

    r = merge_sweeps(args.merge, args.out,
                     objectives=tuple(o.strip() for o in args.pareto.split(",") if o.strip()))
    res = r.result
    assert res is not None  # (merge_sweeps always returns the whole sweep)
    con = console()
    con.print(f"{len(res)} configurations x {res.layers} layers from {len(args.merge)} slices")
    con.print(f"wrote {', '.join(str(Path(args.out) / n) for n in r.files)}")
    return 0


def _cache_every_program() -> contextlib.AbstractContextManager[None]:
    """Keep every program the block compiles in the persistent cache the command line set up
    (``npujax.cli.compile_cache``), not only those that took a second (JAX's threshold): a
    sweep's programs depend on the padded layer count (the layers themselves where a pass
    needs them static), the grid's static values and the batch sizes, not on the traced
    hardware numbers or layer shapes (JAX's cache key is the program), so a second sweep of
    the same model and grid shape compiles nothing, and the program is kept traced too
    (``npujax._program_cache``: a second sweep traces nothing)."""
    import jax

    from npujax._program_cache import cache_every_compilation

    return cache_every_compilation(
        bool(jax.config.jax_compilation_cache_dir))  # type: ignore[attr-defined]


def _join(args: argparse.Namespace) -> None:
    """``jax.distributed.initialize`` with the command line's coordinator and ids."""
    import jax

    from npujax.errors import ConfigError

    try:
        jax.distributed.initialize(coordinator_address=args.coordinator,
                                   num_processes=args.num_processes,
                                   process_id=args.process_id)
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"cannot join the jax.distributed job ({e}); pass --coordinator "
                          "HOST:PORT --num-processes N --process-id I (the same coordinator "
                          "and N in every process).") from None


def _load_model(args: argparse.Namespace):
    """The optimized graph of an ONNX model, a saved npujax model or a Keras application."""
    from npujax.frontends.onnx import parse_input_shapes
    from npujax.workflows.inputs import load_model
    from npujax.workflows.lowering import import_onnx_for_lowering

    shapes = parse_input_shapes(args.input_shape or [])
    if str(args.model).lower().endswith(".onnx"):
        return import_onnx_for_lowering(args.model, shapes, None)
    return load_model(args.model, shapes)[0]
