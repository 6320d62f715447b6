"""nki.isa's DMA instructions: dma_transpose, and dma_copy converting between dtypes.

Each is checked against an independent numpy computation."""

import numpy as np

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl

RNG = np.random.default_rng(11)
X = RNG.standard_normal((128, 64)).astype(np.float32)


def test_dma_transpose_and_dma_copy_converts_fp32_to_bf16():
    @nki.jit
    def k(a):
        out = nl.ndarray((64, 128), nl.float32, buffer=nl.shared_hbm)
        t = nisa.dma_transpose(a[:, :])
        nl.store(out, t)
        return out
    np.testing.assert_array_equal(k(X), X.T)

    @nki.jit
    def k_sbuf(a):
        out = nl.ndarray((16, 128), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nisa.dma_transpose(nl.load(a)))
        return out
    np.testing.assert_array_equal(k_sbuf(X[:, :16]), X[:, :16].T)

    @nki.jit
    def k2(a):
        out = nl.ndarray((128, 64), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=nl.load(a))
        return out
    import torch
    np.testing.assert_array_equal(k2(X), torch.from_numpy(X).bfloat16().float().numpy())


def test_converting_dma_moves_the_destination_bytes_into_hbm():
    from trnsim import Program, dtypes
    from trnsim.hw.dma import plan_dma
    from trnsim.isa import DmaCopy
    p = Program("trn1")
    s = p.sbuf([128, 64], dtypes.float32, "s")
    h = p.hbm([128, 64], dtypes.bfloat16, "h")
    plan = plan_dma(p.chip, DmaCopy(h.view(), s.view()))
    assert plan.hbm_bytes == 128 * 64 * 2
    same = plan_dma(p.chip, DmaCopy(p.hbm([128, 64], dtypes.float32, "f").view(), s.view()))
    assert same.hbm_bytes == 128 * 64 * 4
