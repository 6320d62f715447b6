"""Hardware figures live in the chip files and hw/ alone: a clock, a bandwidth or a cycle
count written into a kernel or the torch device would time every chip with one chip's
number (fused kernels once split work between engines at trn2's clocks on every chip).
This reads the source of trnsim/kernels, trnsim/backend, trnsim/compute and trnsim/nki
for such figures (unit conversions, ``PS_PER_NS``, are not figures)."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trnsim"
OUTSIDE_HW = ("kernels", "backend", "compute", "nki")
# a number next to a hardware unit or a clock/bandwidth/latency name
FIGURE = re.compile(r"\b\d+(\.\d+)?\s*(GHz|MHz|GB/s|TB/s|cycles?)\b|"
                    r"\b(\w*(clock|ghz|gbps|bandwidth|latency|cycle|cost)\w*|\w+_(ns|bw))\s*=\s*\(?\s*[-\d.]",
                    re.IGNORECASE)


def test_no_kernel_or_device_module_holds_a_hardware_figure():
    found = []
    for folder in OUTSIDE_HW:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                hit = FIGURE.search(code)
                if hit and "_per_" not in hit.group(0).lower() and not code.lstrip().startswith(('"', "'")):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}")
    assert not found, ("hardware figures outside hw/ and the chip files (take them from the chip "
                       "spec the kernel is traced for):\n" + "\n".join(found))
