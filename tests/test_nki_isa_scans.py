"""nki.isa's scans: tensor_tensor_scan, tensor_scalar_cumulative, sequence_bounds, and the scan kernel
on both numerics backends.

Each is checked against an independent numpy computation."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from tests.nki_isa_support import run

RNG = np.random.default_rng(11)
X = RNG.standard_normal((128, 64)).astype(np.float32)
Y = RNG.standard_normal((128, 64)).astype(np.float32)
F32 = np.float32


def test_tensor_tensor_scan_both_styles():
    a, b = X[:, :16], Y[:, :16]
    expect = np.empty_like(a)
    prev = np.full(128, F32(0.5))
    for i in range(16):
        prev = (a[:, i] * prev).astype(F32)
        prev = (prev + b[:, i]).astype(F32)
        expect[:, i] = prev
    got = run(lambda x, y: nisa.tensor_tensor_scan(x, y, 0.5, nl.multiply, nl.add), a, b, shape=(128, 16))
    np.testing.assert_array_equal(got, expect)

    def dst_style(x, y):
        out = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=out, data0=x, data1=y, initial=0.5, op0=nl.multiply, op1=nl.add)
        return out
    np.testing.assert_array_equal(run(dst_style, a, b, shape=(128, 16)), expect)


def test_tensor_scalar_cumulative_running_max_and_load_reduce():
    got = run(lambda x: nisa.tensor_scalar_cumulative(src=x, op0=nl.multiply, op1=nl.maximum, imm0=2.0), X)
    np.testing.assert_array_equal(got, np.maximum.accumulate(X * F32(2), axis=1))

    def body(x):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=out, src=x, op0=nl.add, op1=nl.add, imm0=0.0, imm1=10.0,
                                      reduce_cmd=nisa.reduce_cmd.load_reduce)
        return out
    expect = np.empty_like(X)
    acc = np.full(128, F32(10))
    for i in range(64):
        acc = (X[:, i] + acc).astype(F32)
        expect[:, i] = acc
    np.testing.assert_array_equal(run(body, X), expect)


def test_sequence_bounds_matches_the_documented_example():
    ids = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], np.float32)
    got = run(lambda s: nisa.sequence_bounds(segment_ids=s), ids, shape=(1, 2, 9))
    np.testing.assert_array_equal(got[0], [[9, 1, 1, 3, 3, 3, 9, 7, 7], [-1, 3, 3, 6, 6, 6, -1, 9, 9]])


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("op0,op1", [("multiply", "add"), ("subtract", "maximum"), ("divide", "minimum")])
def test_scan_kernel_matches_a_plain_loop_on_both_backends(backend, op0, op1):
    from trnsim.compute import get_backend
    fns = {"multiply": np.multiply, "add": np.add, "subtract": np.subtract, "maximum": np.maximum,
           "divide": np.divide, "minimum": np.minimum}
    rng = np.random.default_rng(5)
    a, b, init = (rng.standard_normal(s).astype(F32).astype(np.float64) for s in ((8, 40), (8, 40), 8))
    for reverse0 in (False, True):
        for reverse1 in (False, True):
            got = get_backend(backend).scan(a, b, init, op0, op1, reverse0, reverse1)
            prev = init.astype(F32)
            for i in range(40):
                x0 = (prev, a[:, i].astype(F32)) if reverse0 else (a[:, i].astype(F32), prev)
                t = fns[op0](*x0).astype(F32)
                t = (fns[op1](b[:, i].astype(F32), t) if reverse1 else fns[op1](t, b[:, i].astype(F32))).astype(F32)
                np.testing.assert_array_equal(got[:, i], t)
                prev = t


def test_new_instructions_cost_on_their_engines():
    @nki.jit
    def k(x, y):
        out = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        a, b = nl.load(x), nl.load(y)
        s = nisa.tensor_tensor_scan(a, b, 0.0, nl.multiply, nl.add)
        nl.store(out, nisa.max8(src=s))
        return out
    result = nki.benchmark(k, numerics=False)(X, Y)
    busy = result.summary()
    assert result.latency_ns > 0
    assert "vector" in str(busy).lower()
