"""DMA with compute: dma_copy(dst_rmw_op=nl.add) and dma_compute add in fp32, round once."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.nki import KernelError

RNG = np.random.default_rng(5)
A, B, C = (RNG.standard_normal((128, 96)).astype(np.float32) for _ in range(3))


@nki.jit
def accumulate(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    acc = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=acc, src=a)
    nisa.dma_copy(dst=acc, src=b, dst_rmw_op=nl.add)   # acc += b, by the DMA
    nisa.dma_copy(dst=out, src=acc)
    return out


@nki.jit
def three_way_sum(a, b, c):
    out = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.shared_hbm)
    nisa.dma_compute(dst=out, srcs=[a, b, c], reduce_op=nl.add)
    return out


@nki.jit
def scaled(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nisa.dma_compute(out, [a, b], nl.add, scales=[1.0, 2.0])
    return out


def test_dma_copy_adds_into_its_destination():
    assert np.allclose(accumulate(A, B), A + B)


def test_dma_compute_sums_in_fp32_and_rounds_to_the_destination_once():
    got = np.asarray(three_way_sum(A, B, C), dtype=np.float32)
    want = (A + B + C).astype(np.float32)
    assert np.allclose(got, want, rtol=1e-2, atol=1e-2) and not np.array_equal(got, want)


def test_dma_compute_refuses_scales_other_than_one():
    with pytest.raises(KernelError, match="scales"):
        scaled(A, B)
