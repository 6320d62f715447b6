"""Every Hugging Face text-generation architecture on ``neuron`` against the CPU.

    python benchmarks/hf_architectures.py                 # the whole sweep
    python benchmarks/hf_architectures.py --only llama,mixtral --jobs 2

Builds each causal-LM architecture of the installed transformers from a tiny config
with seeded random weights, runs forward, greedy and sampled generation (dynamic
cache) and static-cache generation (compiled with backend "neuron") on the CPU and on
``neuron``, and prints one row per architecture, each failure's cause and the pass rate
(see :mod:`trnsim.models.hf_coverage`).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from trnsim.models import hf_coverage


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated model types (default: every causal-LM architecture)")
    p.add_argument("--steps", default=",".join(hf_coverage.STEPS),
                   help=f"comma-separated steps of {','.join(hf_coverage.STEPS)}")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per architecture")
    p.add_argument("--jobs", type=int, default=1, help="architectures run at a time")
    a = p.parse_args(argv)
    archs = a.only.split(",") if a.only else None
    known = set(hf_coverage.architectures())
    unknown = [x for x in archs or () if x not in known]
    if unknown:
        p.error(f"unknown model types {unknown}; pick from the causal-LM mapping, e.g. llama,mixtral,mamba")
    steps = tuple(s for s in a.steps.split(",") if s)
    results = hf_coverage.sweep(archs, steps, a.timeout, a.jobs,
                                on_result=lambda r: print(hf_coverage.row(r), flush=True))
    passed, tried = hf_coverage.pass_rate(results)
    skipped = [r for r in results if r.status == "skip"]
    print(f"\n{len(results)} architectures, {len(skipped)} not buildable from a tiny config; "
          f"passed {passed}/{tried} ({100 * passed / max(tried, 1):.1f}%)")
    return 0 if passed == tried else 1


if __name__ == "__main__":
    sys.exit(main())
