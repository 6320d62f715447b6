"""How fast instruction fidelity computes one matmul: the float32 path against float64.

The numba backend computes ``acc + stationary.T @ moving`` as the PE array does (fp32
accumulation, one rounding per contraction step). Operands whose products are exact in
float32 (bf16, fp16, fp8 values) take a float32 loop; others a float64 one. This times
both loops on the same bf16 operands of the largest matmul instruction ([128, 128]
stationary, [128, 512] moving), checks that their bits agree, and prints the ratio,
measured in one run (the machine is noisy: compare the ratio, not the times).

    python benchmarks/matmul_numerics.py
"""

from __future__ import annotations

import time

import numpy as np


def main(repeats: int = 50) -> None:
    from trnsim import dtypes
    from trnsim.compute import decode, encode
    from trnsim.compute import fast

    rng = np.random.default_rng(0)

    def bf16(shape: tuple[int, int]) -> np.ndarray:
        return decode(encode(rng.standard_normal(shape), dtypes.bfloat16), dtypes.bfloat16)

    stationary, moving = bf16((128, 128)), bf16((128, 512))
    acc = np.zeros((128, 512), np.float32)
    narrow = fast._float32_products(stationary, moving)
    assert narrow is not None, "bf16 operands should take the float32 path"
    wide = fast._matmul(acc.copy(), stationary, moving)          # compiled (or loaded) outside the timing
    fast32 = fast._matmul_float32(acc.copy(), *narrow)
    assert wide.tobytes() == fast32.tobytes(), "the two loops disagree"
    times = {}
    for name, run in (("float64 loop", lambda: fast._matmul(acc.copy(), stationary, moving)),
                      ("float32 loop", lambda: fast._matmul_float32(acc.copy(), *narrow)),
                      ("matmul (check + float32)", lambda: fast.matmul(acc, stationary, moving))):
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        times[name] = best
    base = times["float64 loop"]
    print("one matmul instruction, bf16 [128, 128] x [128, 512], best of", repeats)
    for name, t in times.items():
        print(f"  {name:<26} {t * 1e3:7.3f} ms   {base / t:4.1f}x the float64 loop")


if __name__ == "__main__":
    main()
