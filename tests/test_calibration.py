"""Calibration against the published NKI matmul tutorial figures (slow: run with -m slow)."""

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name, published_ms", [("matmul_basic", 51.80), ("matmul_optimized", 6.97)])
def test_nki_matmul_tutorial_on_trn1(name, published_ms):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from nki_matmul import calibrate
    from trnsim.kernels import matmul

    r = calibrate(getattr(matmul, name))
    assert abs(r["ms"] / published_ms - 1) <= 0.25, r
    if name == "matmul_optimized":
        assert r["pct_of_peak"] >= 75, r
