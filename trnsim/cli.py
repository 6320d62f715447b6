"""The ``trnsim`` command: ``demo``, ``chips``, ``run``, ``report``, ``diff``, ``coverage``, ``validate``
and ``doctor``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn, Sequence

from trnsim.atomic import check_writable
from trnsim import settings
from trnsim.errors import TrnSimError


def _chips(args: argparse.Namespace) -> int:
    from trnsim.hw.spec import load_chip, shipped_chips

    chips = [load_chip(name) for name in shipped_chips()] + [load_chip(path) for path in args.chip or []]
    rows = [
        ("generation", lambda c: c.generation),
        ("NeuronCore", lambda c: c.neuron_core),
        ("cores per chip", lambda c: str(c.cores_per_chip)),
        ("logical core (LNC)", lambda c: str(c.logical_core_size)),
        ("PE clock", lambda c: f"{c.tensor_engine.clock_ghz:g} GHz"),
        ("PE array", lambda c: f"{c.tensor_engine.pe_rows}x{c.tensor_engine.pe_cols}"),
        ("peak bf16 / core", lambda c: f"{c.tensor_engine.peak_flops() / 1e12:.1f} TFLOP/s"),
        ("peak fp32 / core", lambda c: f"{c.tensor_engine.peak_flops(fp32=True) / 1e12:.1f} TFLOP/s"),
        ("vector clock", lambda c: f"{c.vector_engine.clock_ghz:g} GHz"),
        ("scalar clock", lambda c: f"{c.scalar_engine.clock_ghz:g} GHz"),
        ("GpSimd clock", lambda c: f"{c.gpsimd.clock_ghz:g} GHz"),
        ("SBUF", lambda c: f"{c.sbuf.partitions * c.sbuf.partition_kib // 1024} MiB "
                           f"({c.sbuf.partitions}x{c.sbuf.partition_kib} KiB)"),
        ("PSUM", lambda c: f"{c.psum.partitions * c.psum.partition_kib // 1024} MiB ({c.psum.banks} banks)"),
        ("HBM", lambda c: f"{c.hbm.capacity_gib:g} GiB"),
        ("HBM bandwidth", lambda c: f"{c.hbm.bw_gbps:g} GB/s"),
        ("DMA", lambda c: f"{c.dma.engines} engines, {c.dma_bw_gbps:g} GB/s"),
        ("NeuronLink", lambda c: f"v{c.neuronlink.version}, {c.neuronlink.chip_bw_gbps:g} GB/s"),
        ("instances", lambda c: ", ".join(i.name for i in c.instances)),
    ]
    table = [[""] + [c.name for c in chips]] + [[label] + [f(c) for c in chips] for label, f in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    return 0


_DEMO_TRACE = "traces/demo.json"


def _demo(args: argparse.Namespace) -> int:
    if args.what == "llama":
        return _demo_llama(args)
    if args.what == "compile":
        return _demo_compile(args)
    from trnsim.demo import run_demo

    m, k, n = args.size
    result = run_demo(m, k, n, chip=args.chip, trace=args.trace)
    print(result.run.summary())
    rel = result.max_abs_error / result.reference_scale if result.reference_scale else 0.0
    status = "matches" if rel < 1e-5 else "DOES NOT match"
    print(f"result         {status} numpy (max abs error {result.max_abs_error:.3g}, relative {rel:.2g})")
    print(f"trace          {result.trace_path} (open in https://ui.perfetto.dev)")
    return 0 if rel < 1e-5 else 1


def _demo_llama(args: argparse.Namespace) -> int:
    from trnsim.demo import run_llama_demo

    trace = args.trace if args.trace != _DEMO_TRACE else "traces/llama.json"
    r = run_llama_demo(steps=args.steps, chip=args.chip, trace=trace)
    import torch

    ok = r.max_rel_diff < 1e-4
    print(f"model          TinyLlama, {r.params / 1e6:.2f}M parameters; {r.tokens} tokens a step; AdamW")
    print(f"chip           {torch.neuron.chip().name}")
    print("losses         " + " ".join(f"{x:.5f}" for x in r.neuron_losses) +
          f" on neuron, {'matching' if ok else 'NOT matching'} the CPU's (max relative difference "
          f"{r.max_rel_diff:.1e})")
    rows = r.profile.summary()
    busy = sum(row.total_us for row in rows)
    launch = torch.neuron.chip().runtime.op_launch_ps / 1e6
    print(f"train step     {r.step_us:,.1f} us simulated, {len(r.profile.records)} device ops, "
          f"{r.tokens / (r.step_us * 1e-6):,.0f} tokens/s")
    print(f"device busy    {100 * busy / r.step_us:.1f}% of the step; the rest waits for the host to launch ops "
          f"({launch:g} us each)")
    print("\n".join(str(rows).splitlines()[:9]))
    if len(rows) > 8:
        print(f"... {len(rows) - 8} more ops")
    print(f"trace          {r.trace_path} (open in https://ui.perfetto.dev)")
    return 0 if ok else 1


def _demo_compile(args: argparse.Namespace) -> int:
    from trnsim.demo import run_compile_demo

    trace = args.trace if args.trace != _DEMO_TRACE else "traces/compile.json"
    r = run_compile_demo(chip=args.chip, trace=trace)
    import torch

    ok = r.max_abs_diff <= 1e-4
    eager_us, comp_us = r.eager.device_ps / 1e6, r.compiled.device_ps / 1e6
    kernels = [rec for rec in r.compiled.records if rec.info is not None]
    fused = [rec for rec in kernels if rec.name.startswith("fused[")]
    saved = sum(rec.info["eager_bytes"] - rec.info["hbm_bytes"] for rec in kernels)
    print(f"model          TinyLlama forward, {r.tokens} tokens; torch.compile(backend=\"neuron\") on "
          f"{torch.neuron.chip().name}")
    print(f"logits         compiled {'match' if ok else 'DO NOT match'} eager (max abs difference "
          f"{r.max_abs_diff:.1e})")
    print(f"eager          {eager_us:,.1f} us simulated, {len(r.eager.records)} ops, each launched by the host")
    print(f"compiled       {comp_us:,.1f} us simulated ({comp_us / eager_us:.2f} of eager): one launch, "
          f"{len(kernels)} kernels ({len(fused)} fused), {saved / 2**20:.1f} MiB of HBM traffic kept in SBUF")
    sim_s = sum(g.simulated_compile_s for g in r.graphs)
    print(f"compilation    {len(r.graphs)} graph, {r.compile_s:.1f} s on this host; the Neuron compiler would "
          f"take about {sim_s:.0f} s (simulated, not device time)")
    rows = r.compiled.summary()
    print("\n".join(str(rows).splitlines()[:9]))
    if len(rows) > 8:
        print(f"... {len(rows) - 8} more kernels")
    print(f"trace          {r.trace_path} (open in https://ui.perfetto.dev)")
    return 0 if ok else 1


def _report(args: argparse.Namespace) -> int:
    from trnsim.trace import load, plot_timeline, report
    from trnsim.trace.plot import image_format

    if args.plot is not None:   # an empty --plot is refused by name, not skipped
        image_format(args.plot)
        check_writable(args.plot)
    trace = load(args.trace)
    print(report(trace, top=args.top))
    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")   # a file, not a window
        plot_timeline(trace, args.plot)
        print(f"timeline       {args.plot}")
    return 0


def _diff(args: argparse.Namespace) -> int:
    from trnsim.trace import compare

    print(compare(args.a, args.b, top=args.top))
    return 0


def _default_trace(stem: str, nproc: int) -> str:
    return f"traces/{stem}{'.job' if nproc > 1 else ''}.json"


def _run(args: argparse.Namespace) -> int:
    from trnsim.backend.runscript import Program

    program = Program(args.script, module=args.module)
    program.check()
    if args.nproc < 1:
        raise TrnSimError(f"--nproc {args.nproc}: give 1 or more ranks")
    trace = None if args.no_trace else args.trace or _default_trace(program.stem, args.nproc * args.nnodes)
    if trace:
        check_writable(trace)
    if args.nproc > 1 or args.nnodes > 1:
        from trnsim.backend.distributed.launch import run_job

        return run_job(program, args.args, args.nproc, trace, instance=args.instance, chip=args.chip,
                       fidelity=args.fidelity, timeout_s=args.timeout, nnodes=args.nnodes, node_rank=args.node_rank,
                       rdzv_endpoint=args.rdzv_endpoint, top=args.top)
    import trnsim
    from trnsim.backend import follow
    from trnsim.backend.nkicall import array_kernels_on_timeline
    from trnsim.backend.progress import Progress
    from trnsim.backend.runscript import INTERRUPTED, stopped_line
    from trnsim.trace import load, report
    from trnsim.trace.partial import save_run

    code: int | str | None = 0
    failure: BaseException | None = None
    from trnsim.backend import hostshims

    hostshims.install_pinned_factories()   # the script is a device program, pinned buffers included
    prof = trnsim.profile()
    with follow.children_followed() as children:   # the Python processes it starts record their own ops
        try:
            with prof, array_kernels_on_timeline(), Progress():
                program.run(args.args)
        except SystemExit as e:   # the script's own exit: summarise what ran, then exit as it did
            code = e.code
        except BaseException as e:  # noqa: BLE001 - Ctrl-C or the script's exception: a partial trace, one line
            failure = e
    interrupted = isinstance(failure, KeyboardInterrupt)
    if failure is not None and not interrupted:
        print(program.traceback(failure), end="", file=sys.stderr)
    # marked partial when the run did not finish (prof.partial says why)
    recorded, processes = _with_children(prof, children)
    unfinished = prof.partial or recorded.partial   # the script's, or a process it started that failed
    written = save_run(recorded, trace, unfinished) if trace else None   # never over a finished trace
    if failure is not None:
        event = "interrupted" if interrupted else f"the script raised {type(failure).__name__}"
        print(stopped_line(event, recorded, written, trace), file=sys.stderr)
        return INTERRUPTED if interrupted else 1
    # the summary of the trace file as written, so `trnsim report` on it prints the same
    print(report(load(written) if written else recorded, top=args.top))
    if processes:
        print(processes)
    if prof.partial:   # sys.exit with a failure status
        print(stopped_line(f"the script {prof.partial}", recorded, written, trace), file=sys.stderr)
    elif unfinished:
        print(stopped_line(f"a process the script started did not finish ({unfinished})", recorded, written, trace),
              file=sys.stderr)
    elif written:
        print(f"trace          {written}")
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _process_name(trace: Any) -> str:
    """``pid N (rank R): command`` of a followed process's trace."""
    rank = f" (rank {trace.meta['rank']})" if "rank" in trace.meta else ""
    return f"pid {trace.meta['pid']}{rank}: {trace.meta['command']}"


def _with_children(prof: Any, children: list) -> tuple[Any, str | None]:
    """The run's trace, with the traces of the Python processes it started that ran ops
    on the device (:mod:`trnsim.backend.follow`), and a line saying which processes did
    the work where that is not this one alone (None then): one child alone (its trace is
    the run's), several (merged as the ranks of a job), or none at all."""
    from trnsim.backend.follow import command_line
    from trnsim.trace.export import merge

    own = prof.trace()
    if not children:
        if prof.records:
            return own, None
        return own, ("processes      no op ran on the neuron device, in this process or in a Python process it "
                     "started (one that does not import torch, or ends by os._exit, is not followed)")
    if not prof.records and len(children) == 1:
        (child,) = children
        return child, f"processes      the device work ran in a process the script started, {_process_name(child)}"
    traces = children
    if prof.records:
        own.process = own.meta["rank_name"] = f"pid {os.getpid()} (trnsim run)"
        own.meta.update(pid=os.getpid(), command=command_line())
        traces = [own, *children]
    job = merge(traces, {"world_size": len(traces), "instance": os.environ.get("TRNSIM_INSTANCE", "")})
    failed = [f"{t.process}: {t.partial}" for t in traces if t.partial]
    if failed:
        job.meta["partial"] = "; ".join(failed)
    lines = [f"processes      {len(traces)} ran ops on the device, each on a device of its own (merged as a job's "
             "ranks are):"]
    lines += [f"  {_process_name(t)}" for t in traces]
    return job, "\n".join(lines)


def _coverage(args: argparse.Namespace) -> int:
    from trnsim.backend import coverage

    cov = coverage()
    print(f"aten ops on neuron: {len(cov['kernel'])} timed by a kernel from trnsim.kernels, "
          f"{len(cov['estimate'])} by a bandwidth estimate, {len(cov['none'])} with no device work")
    for kind in ("kernel", "estimate", "none") if args.all else ("kernel",):
        print(f"\n[{kind}]")
        for name in cov[kind]:
            print(f"  {name}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    import importlib.metadata
    import platform

    from trnsim.compat import aliases
    from trnsim.hw.spec import load_chip
    from trnsim.nki.jit import PLATFORM_ENV, platform_target

    print("import names (AWS's packages win when installed; TRNSIM_NO_ALIASES=1 turns the aliases off)")
    for row in aliases.status():
        if row.resolves_to == "real":
            print(f"  {row.name:<14} the installed package wins: {row.origin}")
        elif row.resolves_to == "trnsim":
            target = "trnsim.nki (as neuronxcc.nki)" if row.name == "neuronxcc" else row.target
            print(f"  {row.name:<14} aliased to {target}")
        else:
            print(f"  {row.name:<14} not importable (aliases off, no real package)")
    bad = settings.problems()
    if "TRNSIM_CHIP" in bad:
        print("chip           none: $TRNSIM_CHIP is bad (below)")
        device_name = "none"
    else:
        device_chip = load_chip(None)
        device_name = device_chip.name
        print(f"chip           {device_chip.name} ({device_chip.neuron_core}, LNC={device_chip.logical_core_size}) "
              f"for the neuron device ($TRNSIM_CHIP)")
    nki_chip = platform_target()
    print(f"NKI kernels    {nki_chip or device_name}"
          + (f" (${PLATFORM_ENV})" if nki_chip else f" (${PLATFORM_ENV} unset: the device's chip)"))
    if "TRNSIM_FIDELITY" in bad:
        print("fidelity       none: $TRNSIM_FIDELITY is bad (below)")
    else:
        print(f"fidelity       {settings.env_fidelity()} ($TRNSIM_FIDELITY)")
    versions = [("python", platform.python_version())]
    for dist in ("trnsim", "torch", "numpy", "numba", "transformers"):
        try:
            versions.append((dist, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            versions.append((dist, "not installed"))
    print("versions       " + ", ".join(f"{name} {v}" for name, v in versions))
    for note in settings.unknown_names():
        print(f"settings       {note}")
    if not bad:
        print("settings       every TRNSIM_* variable set is valid")
        return 0
    for name, error in bad.items():
        print(f"settings       {name}: {' '.join(str(error).split())}")
    return 1


class _Parser(argparse.ArgumentParser):
    """argparse, with a refusal on one line like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"trnsim: error: {message}; see {self.prog} --help\n")


def _validate(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from trnsim.atomic import write_atomic
    from trnsim.validate import KINDS, Sources, all_figures, report, run, steps, summary

    repos = {}
    for name, path in (("aws-neuron-sdk", args.aws_neuron_sdk), ("nki-samples", args.nki_samples)):
        if path is not None:
            if not Path(path).is_dir():
                raise TrnSimError(f"--{name} {path!r} is not a directory; pass a checkout or git directory of "
                                  f"aws-neuron/{name}")
            repos[name] = Path(path)
    figures = [f for f in all_figures() if (f.quick or not args.quick) and (not args.kind or f.kind in args.kind)]
    if args.quick:
        figures = [f for f in figures if f.repo is None]
    for path in (args.markdown, args.json):
        if path:
            check_writable(path)

    def progress(result):
        if result.simulated is not None and result.host_s > 5:
            print(f"  {result.figure.what}: {result.host_s:.0f} s", file=sys.stderr, flush=True)

    print(f"{len(figures)} published figures ({', '.join(k for k in KINDS if any(f.kind == k for f in figures))})",
          file=sys.stderr, flush=True)
    results = run(figures, Sources(repos), progress=progress)
    print(report(results))
    if args.markdown:
        write_atomic(args.markdown, lambda f: f.write(report(results, markdown=True) + "\n"))
    if args.json:
        data = {"figures": [{"key": r.figure.key, "kind": r.figure.kind, "what": r.figure.what, "chip": r.figure.chip,
                             "source": r.figure.source, "group": r.figure.group, "unit": r.figure.unit,
                             "published": r.figure.published, "simulated": r.simulated, "error": r.error,
                             "skipped": r.skipped, "refused": r.refused} for r in results],
                "summary": [dict(zip(("kind", "group", "figures", "median_abs_error", "worst_abs_error", "refused"),
                                     row))
                            for row in summary(results)],
                "steps": [{"series": s.series, "before": s.before, "after": s.after, "published": s.published,
                           "simulated": s.simulated, "kept": s.kept} for s in steps(results)]}
        write_atomic(args.json, lambda f: json.dump(data, f, indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trnsim", description="Cycle-approximate AWS Trainium simulator")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="matmul: simulate a tiled bf16 matmul kernel, check it against numpy; "
                                       "llama: train a small Llama on the neuron device; compile: its forward pass "
                                       "eager and through torch.compile(backend=\"neuron\"); each writes a trace")
    demo.add_argument("what", nargs="?", choices=("matmul", "llama", "compile"), default="matmul",
                      help="which demo (default matmul)")
    demo.add_argument("--steps", type=int, default=3, help="llama: training steps (default 3)")
    demo.add_argument("--chip", default=None,
                      help="chip name (trn1, trn2, trn3) or path to a chip TOML; default $TRNSIM_CHIP or trn2")
    demo.add_argument("--trace", default=_DEMO_TRACE,
                      help="where to write the trace (default traces/demo.json; llama: traces/llama.json)")
    demo.add_argument("--size", type=int, nargs=3, metavar=("M", "K", "N"), default=(1024, 1024, 1024),
                      help="matmul sizes, multiples of 128 (M, K) and 512 (N); default 1024 1024 1024")
    demo.set_defaults(func=_demo)

    chips = sub.add_parser("chips", help="print the shipped chips side by side")
    chips.add_argument("--chip", action="append", help="also show this chip TOML (repeatable)")
    chips.set_defaults(func=_chips)

    report = sub.add_parser("report", help="print the summary of a saved trace (a run's or a job's), as trnsim run "
                                           "printed it")
    report.add_argument("trace", help="a trace written by trnsim (trnsim run, trnsim.profile, a merged job trace)")
    report.add_argument("--top", type=int, default=10, help="ops and fused kernels listed (default 10)")
    report.add_argument("--plot", metavar="PNG", help="also draw the timeline, one row per engine and DMA queue "
                                                       "(each rank's, for a job trace), to this image")
    report.set_defaults(func=_report)

    diff = sub.add_parser("diff", help="compare two traces op by op (say eager and compiled): the simulated time "
                                       "the second saves, by op, largest first")
    diff.add_argument("a", help="the first trace (the baseline)")
    diff.add_argument("b", help="the second trace")
    diff.add_argument("--top", type=int, default=20, help="rows listed (default 20; the rest summed in one row)")
    diff.set_defaults(func=_diff)

    run = sub.add_parser("run", help="run a PyTorch or NKI script (or -m module) on the simulated device, following "
                                     "the Python processes it starts, print where the time went and write a trace; "
                                     "--nproc N runs it on N ranks with torchrun")
    run.add_argument("--nproc", type=int, default=1, help="ranks (processes) per node, as torchrun's --nproc-per-node")
    run.add_argument("--instance", default=None, help="the instance the ranks run on (trn1.32xlarge, trn2.48xlarge, ...; "
                                                      "default $TRNSIM_INSTANCE or the chip's own)")
    run.add_argument("--chip", default=None, help="chip name or TOML (default $TRNSIM_CHIP or trn2)")
    run.add_argument("--fidelity", default=None, choices=settings.FIDELITIES, type=str.lower,
                     help="default $TRNSIM_FIDELITY")
    run.add_argument("--trace", default=None, help="write the trace here (the merged trace of all ranks with --nproc); "
                                                   "default traces/SCRIPT.json (traces/SCRIPT.job.json with --nproc)")
    run.add_argument("--no-trace", action="store_true", help="write no trace")
    run.add_argument("--top", type=int, default=10, help="ops and fused kernels listed in the summary (default 10)")
    run.add_argument("--timeout", type=float, default=None, help="give up on the job after this many seconds")
    run.add_argument("--nnodes", type=int, default=1, help="servers of a multi-node job (torchrun's --nnodes)")
    run.add_argument("--node-rank", type=int, default=0, help="this server's rank in a multi-node job")
    run.add_argument("--rdzv-endpoint", default="localhost:29400", help="host:port of the multi-node rendezvous")
    run.add_argument("-m", dest="module", action="store_true",
                     help="run the module named where the script goes, as python -m does (trnsim run -m "
                          "torchtitan.train --job.config_file ...); with --nproc, as torchrun -m does")
    run.add_argument("script", help="the script to run, unchanged (with -m: the module)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    run.set_defaults(func=_run)

    cov = sub.add_parser("coverage", help="list the aten ops the neuron device times with a kernel or an estimate")
    cov.add_argument("--all", action="store_true", help="also list the estimated ops and those without device work")
    cov.set_defaults(func=_coverage)

    val = sub.add_parser("validate", help="simulate every published Trainium measurement trnsim can reproduce and "
                                          "print published against simulated, the error, and the median and worst "
                                          "error per kind")
    val.add_argument("--quick", action="store_true", help="only the figures that take seconds (no public code)")
    val.add_argument("--kind", action="append", choices=("kernel", "dma", "collective", "e2e"),
                     help="only figures of this kind (repeatable)")
    val.add_argument("--aws-neuron-sdk", metavar="PATH", help="a checkout or git directory of aws-neuron/aws-neuron-sdk: "
                                                            "run the NKI tutorials' own kernels")
    val.add_argument("--nki-samples", metavar="PATH", help="a checkout or git directory of aws-neuron/nki-samples: run "
                                                         "its reference kernels whose perf tests state a measurement")
    val.add_argument("--markdown", metavar="PATH", help="also write the tables as Markdown")
    val.add_argument("--json", metavar="PATH", help="also write every figure and the summary as JSON")
    val.set_defaults(func=_validate)

    doctor = sub.add_parser("doctor", help="which of nki, neuronxcc, torch_neuronx, torch_xla, ... are trnsim's and which real "
                                           "packages win; the chip, fidelity and versions")
    doctor.set_defaults(func=_doctor)
    return parser


def _check_settings(args: argparse.Namespace) -> None:
    """Refuse a bad ``--chip`` or ``--instance`` by the flag's name, then (``run`` passing its
    flags on as the variables its script reads) every ``TRNSIM_*`` variable by its name."""
    chip = getattr(args, "chip", None)
    if isinstance(chip, str):   # `trnsim chips --chip` takes paths, each named by its own errors
        from trnsim.hw.spec import load_chip_from

        load_chip_from(chip, f"--chip {chip[:200]!r}", "")
    if getattr(args, "instance", None):
        args.instance = settings.instance(args.instance, f"--instance {args.instance[:80]!r}")
    if args.func is _run:
        for key, value in (("TRNSIM_INSTANCE", args.instance), ("TRNSIM_CHIP", args.chip),
                           ("TRNSIM_FIDELITY", args.fidelity)):
            if value:
                os.environ[key] = value
    if args.func not in (_report, _diff, _doctor):   # saved traces need no chip; doctor reports every setting
        settings.check()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _check_settings(args)
        return args.func(args)
    except TrnSimError as e:
        print(f"trnsim: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except BrokenPipeError:   # output piped into head, say: stop quietly
        sys.stdout = open(os.devnull, "w")
        return 0
    except KeyboardInterrupt:   # Ctrl-C outside a script's run (which says more itself)
        from trnsim.backend.runscript import INTERRUPTED

        print("trnsim: interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
