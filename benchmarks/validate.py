"""trnsim against published Trainium measurements: the full validation run, written into
docs/validation.md, and the fit of the collective parameters.

Runs every figure of :mod:`trnsim.validate` (``trnsim validate`` runs the same), the public
NKI tutorial kernels and nki-samples' reference kernels included: they are read from
fetched aws-neuron-sdk and nki-samples repositories at the commit that published each
figure (``fetch`` puts them under ``/work/.mirror/aws-neuron+<name>/repo``;
``--aws-neuron-sdk`` and ``--nki-samples`` move them; nothing is copied into this
repository). Prints the
table and rewrites the generated part of docs/validation.md (``--no-docs`` leaves it).

``--fit`` instead refits ``[fabric] reduce_fixed_ns``, ``collective_fixed_ns`` and
``collective_dma_gbps`` of trn1 to the collective figures of the ``fit`` group (least
squares of the log error; needs scipy, which ``pip install -e ".[corpus]"`` brings) and
prints them beside the chip file's values, with the error each gives.

    python benchmarks/validate.py
    python benchmarks/validate.py --fit
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "validation.md"
BEGIN, END = "<!-- validate: begin (python benchmarks/validate.py) -->", "<!-- validate: end -->"
SDK = Path("/work/.mirror/aws-neuron+aws-neuron-sdk/repo")
SAMPLES = Path("/work/.mirror/aws-neuron+nki-samples/repo")
PARAMS = ("reduce_fixed_ns", "collective_fixed_ns", "collective_dma_gbps")


def fit() -> None:
    from scipy.optimize import minimize

    from trnsim.hw.spec import load_chip
    from trnsim.validate.collectives import TABLES, latency_us

    base = load_chip("trn1")
    points = [(inst, ranks, nodes, kind, nbytes, us) for _, _, inst, chip, nodes, ranks, kind, group, table in TABLES
              if group == "fit" and chip == "trn1" for nbytes, us in table.items()]

    def errors(values) -> list[float]:
        chip = dataclasses.replace(base, fabric=dataclasses.replace(base.fabric, **dict(zip(PARAMS, values))))
        return [math.log(latency_us(i, r, n, k, b, chip) / us) for i, r, n, k, b, us in points]

    start = [getattr(base.fabric, p) for p in PARAMS]
    best = minimize(lambda v: sum(e * e for e in errors(v)) if min(v) > 0 else math.inf, start,
                    method="Nelder-Mead", options={"xatol": 1e-3, "fatol": 1e-12, "maxiter": 4000})
    print(f"{len(points)} fit figures (trn1): least squares of log(simulated / published)")
    for name, now, new in zip(PARAMS, start, best.x):
        print(f"  {name:<22} chip file {now:>10.2f}   fit {new:>10.2f}")
    for label, values in (("chip file", start), ("fit", best.x)):
        errs = sorted(abs(math.expm1(e)) for e in errors(values))
        print(f"  {label:<9} median |error| {errs[len(errs) // 2]:.1%}, worst {errs[-1]:.1%}")


def write_doc(text: str) -> None:
    from trnsim.atomic import write_atomic

    doc = DOC.read_text()
    head, _, rest = doc.partition(BEGIN)
    _, _, tail = rest.partition(END)
    write_atomic(DOC, lambda f: f.write(f"{head}{BEGIN}\n\n{text}\n\n{END}{tail}"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--aws-neuron-sdk", type=Path, default=SDK, help=f"aws-neuron-sdk repository (default {SDK})")
    parser.add_argument("--nki-samples", type=Path, default=SAMPLES, help=f"nki-samples repository (default {SAMPLES})")
    parser.add_argument("--fit", action="store_true", help="refit the collective parameters and print them")
    parser.add_argument("--no-docs", action="store_true", help="leave docs/validation.md as it is")
    args = parser.parse_args()
    if args.fit:
        fit()
        return 0
    from trnsim.validate import Sources, all_figures, report, run

    repos = {}
    for name, path in (("aws-neuron-sdk", args.aws_neuron_sdk), ("nki-samples", args.nki_samples)):
        if path.is_dir():
            repos[name] = path
        else:
            print(f"no {name} at {path}: the figures of its public kernels are skipped", file=sys.stderr)
    start = time.perf_counter()
    results = run(all_figures(), Sources(repos))
    print(report(results))
    print(f"\nhost time {time.perf_counter() - start:.0f} s")
    if not args.no_docs:
        write_doc(report(results, markdown=True))
        print(f"wrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
