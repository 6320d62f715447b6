"""How fast AWS's public flash attention kernel traces and simulates, before and after.

nki-samples' ``flash_fwd`` (``src/nki_samples/reference/attention.py`` at
``fc5c69f~1``, the commit whose tests assert hardware latency thresholds) is the
kernel of the public corpus that takes longest: its perf tests run it at 16k and 32k
tokens. This script takes the fetched nki-samples git directory (``fetch`` puts it under
``/work/.mirror/aws-neuron+nki-samples/repo``; ``--mirror`` moves the root), extracts
that file into a temporary directory (nothing is copied into the repository), and
runs the kernel as its perf test does (``nki.benchmark``, causal, bf16, head size 96,
one head, 2048-token key tiles) at several sequence lengths: instructions,
dependencies per instruction, and host seconds to trace, and to trace and simulate.

``--before <git-rev>`` measures that revision of trnsim in the same run (extracted
with ``git archive``, run in a subprocess with PYTHONPATH set to it) and prints the
ratio: the machine is noisy, so compare figures measured side by side. Times are the
process's CPU seconds (``time.process_time``).

    python benchmarks/nki_public_speed.py --before 0bd64d9
    python benchmarks/nki_public_speed.py --tokens 4096,8192
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIRROR = Path("/work/.mirror")
SAMPLES = "aws-neuron+nki-samples/repo"
COMMIT = "fc5c69f~1"
KERNEL = "src/nki_samples/reference/attention.py"


def _extract(git_dir: Path, rev: str, paths: list[str], into: Path) -> None:
    archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", rev, *paths], capture_output=True, check=False)
    if archive.returncode:
        raise SystemExit(f"git archive {rev} {' '.join(paths)} in {git_dir} failed: {archive.stderr.decode().strip()}")
    tar_path = into / "tree.tar"
    tar_path.write_bytes(archive.stdout)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    tar_path.unlink()


def measure(kernel_dir: str, tokens: list[int]) -> dict:
    """Trace and simulate flash_fwd at each length; the figures as a dict."""
    import numpy as np

    import trnsim

    sys.path.insert(0, kernel_dir)
    import attention  # the public kernel file, extracted by the caller
    import neuronxcc.nki.language as nl
    from neuronxcc.nki import benchmark

    out: dict = {"trnsim": str(Path(trnsim.__file__).parent), "sizes": {}}
    for n in tokens:
        rng = np.random.default_rng(0)
        q, k = (nl.static_cast(rng.uniform(-1, 1, (1, 1, 96, n)), nl.bfloat16) for _ in range(2))
        v = nl.static_cast(rng.uniform(-1, 1, (1, 1, n, 96)), nl.bfloat16)
        config = attention.FlashConfig(seq_tile_size=2048, training=False, should_transpose_v=False)
        kwargs = {"use_causal_mask": True, "sliding_window": -1, "mixed_precision": True, "config": config}
        start = time.process_time()
        traced = attention.flash_fwd[1, 1].trace(q, k, v, None, chip="trn2", **kwargs)
        trace_s = time.process_time() - start
        program = traced.tracer.program
        deps = sum(len(i.deps) for i in program.instructions)
        start = time.process_time()
        bench = benchmark(warmup=5, iters=10)(attention.flash_fwd)[1, 1]
        bench(q, k, v, None, **kwargs)
        out["sizes"][str(n)] = {"instructions": len(program), "deps": deps, "trace_s": trace_s,
                                "benchmark_s": time.process_time() - start,
                                "simulated_us": bench.benchmark_result.nc_latency.get_latency_percentile(50)}
    return out


def measure_revision(rev: str, kernel_dir: str, tokens: list[int]) -> dict:
    """:func:`measure` on trnsim as it was at git revision ``rev``."""
    with tempfile.TemporaryDirectory(prefix="trnsim-before-") as tmp:
        _extract(REPO / ".git", rev, ["trnsim"], Path(tmp))
        env = {**os.environ, "PYTHONPATH": tmp}
        cmd = [sys.executable, __file__, "--json", "--kernel-dir", kernel_dir, "--tokens", ",".join(map(str, tokens))]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"measuring {rev} failed:\n{done.stderr}")
        return json.loads(done.stdout)


def report(after: dict, before: dict | None, rev: str | None) -> None:
    print(f"nki-samples flash_fwd at {COMMIT} (trn2, bf16, causal, 1 head, d=96); after = {after['trnsim']}"
          + (f", before = {rev}" if rev else ""))
    head = f"{'tokens':>6} {'instructions':>12} {'deps/inst':>9} {'trace s':>8} {'bench s':>8} {'simulated us':>12}"
    if before:
        head += f"  {'before deps/inst':>16} {'before bench s':>14} {'speedup':>7} {'same time':>9}"
    print(head)
    for n, a in after["sizes"].items():
        line = (f"{n:>6} {a['instructions']:>12,} {a['deps'] / a['instructions']:>9.1f} {a['trace_s']:>8.2f} "
                f"{a['benchmark_s']:>8.2f} {a['simulated_us']:>12,.1f}")
        if before:
            b = before["sizes"][n]
            same = "yes" if b["simulated_us"] == a["simulated_us"] else "NO"
            line += (f"  {b['deps'] / b['instructions']:>16.1f} {b['benchmark_s']:>14.2f} "
                     f"{b['benchmark_s'] / a['benchmark_s']:>6.1f}x {same:>9}")
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR, help="root of the fetched git directories")
    parser.add_argument("--before", metavar="GIT_REV", help="also measure this revision, for a before/after ratio")
    parser.add_argument("--tokens", default="4096,8192,16384", help="sequence lengths, comma separated")
    parser.add_argument("--kernel-dir", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    if args.json:
        print(json.dumps(measure(args.kernel_dir, tokens)))
        return
    git_dir = args.mirror / SAMPLES
    if not git_dir.is_dir():
        raise SystemExit(f"no nki-samples git directory at {git_dir}: fetch aws-neuron/nki-samples, or pass --mirror")
    with tempfile.TemporaryDirectory(prefix="nki-samples-") as tmp:
        _extract(git_dir, COMMIT, [KERNEL], Path(tmp))
        kernel_dir = str(Path(tmp) / Path(KERNEL).parent)
        before = measure_revision(args.before, kernel_dir, tokens) if args.before else None
        after = _measure_here(kernel_dir, tokens)
        report(after, before, args.before)


def _measure_here(kernel_dir: str, tokens: list[int]) -> dict:
    """:func:`measure` on this tree, in a subprocess like the revision before (the same
    start: no module imported by the parent)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, __file__, "--json", "--kernel-dir", kernel_dir, "--tokens", ",".join(map(str, tokens))]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"measuring this tree failed:\n{done.stderr}")
    return json.loads(done.stdout)


if __name__ == "__main__":
    main()
