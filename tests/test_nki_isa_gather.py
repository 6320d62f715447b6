"""nki.isa's gathers and shuffles: nc_n_gather, local_gather, nonzero_with_count, nc_stream_shuffle,
and tensor_partition_reduce beside them.

Each is checked against an independent numpy computation."""

import numpy as np
import pytest

import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.nki import KernelError
from tests.nki_isa_support import run, run_on

RNG = np.random.default_rng(11)
X = RNG.standard_normal((128, 64)).astype(np.float32)
Y = RNG.standard_normal((128, 64)).astype(np.float32)


def test_nc_stream_shuffle_within_quadrants():
    mask = list(RNG.permutation(32))
    mask[5] = 255

    def body(x, y):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=y)
        nisa.nc_stream_shuffle(src=x, dst=out, shuffle_mask=mask)
        return out
    expect = Y.copy()
    for p in range(128):
        if mask[p % 32] != 255:
            expect[p] = X[(p // 32) * 32 + mask[p % 32]]
    np.testing.assert_array_equal(run(body, X, Y), expect)
    with pytest.raises(KernelError, match="shuffle_mask must hold 32"):
        run(lambda x: nisa.nc_stream_shuffle(src=x, dst=x, shuffle_mask=[0] * 31), X)


def test_partition_reduce_and_gathers():
    got = run(lambda x: nisa.tensor_partition_reduce(nl.maximum, x), X, shape=(1, 64))
    np.testing.assert_array_equal(got[0], X.max(axis=0))

    idx = RNG.integers(0, 64, (128, 10)).astype(np.int32)
    got = run(lambda x, i: nisa.nc_n_gather(data=x, indices=i), X, idx, shape=(128, 10))
    np.testing.assert_array_equal(got, np.take_along_axis(X, idx, axis=1))

    src = RNG.standard_normal((128, 32, 4)).astype(np.float32)
    per_core = RNG.integers(0, 32, (16, 2))
    index = np.tile(per_core, (8, 1)) * 4
    got = run(lambda s, i: nisa.local_gather(s, i, 4, 20), src, index.astype(np.int32), shape=(128, 20, 4))
    expect = np.empty((128, 20, 4), np.float32)
    for core in range(8):
        rows = slice(16 * core, 16 * core + 16)
        flat = (index[rows] // 4).reshape(-1, order="F")[:20]
        expect[rows] = np.take(src[rows], flat, axis=1)
    np.testing.assert_array_equal(got, expect)


def test_gather_index_errors_name_the_bad_index_and_the_kernel_line():
    idx = RNG.integers(0, 64, (128, 10)).astype(np.int32)
    idx[7, 2], idx[90, 9] = -3, 64   # the first bad index in order is -3, though 64 is the largest
    with pytest.raises(KernelError, match=r"test_nki_isa_gather\.py:\d+: nc_n_gather index -3 \(partition 7, "
                                          r"element 2 of .*\) is outside 0\.\.63, the 64 elements per partition"):
        run(lambda x, i: nisa.nc_n_gather(data=x, indices=i), X, idx, shape=(128, 10))

    src = RNG.standard_normal((128, 32, 4)).astype(np.float32)
    index = np.zeros((128, 2), np.int32)
    index[5, 0], index[3, 1] = 126, 200   # 126 is read first (indices are read column by column)
    with pytest.raises(KernelError, match=r"test_nki_isa_gather\.py:\d+: local_gather index 126 \(partition 5, "
                                          r"element 0 of .*\) is outside 0\.\.124"):
        run(lambda s, i: nisa.local_gather(s, i, 4, 20), src, index, shape=(128, 20, 4))


def test_nonzero_with_count_on_gpsimd_core_partitions():
    src = (RNG.random((128, 8)) < 0.4).astype(np.float32)
    src[0] = [0, 1, 1, 0, 0, 1, 0, 0]

    def body(s):
        out = nl.ndarray((128, 9), nl.int32, buffer=nl.sbuf)
        nisa.memset(out, 7, engine=nisa.vector_engine)
        nisa.nonzero_with_count(dst=out, src=s, index_offset=16, padding_val=-1)
        return out
    got = run_on("trn2", body, src, shape=(128, 9), dtype=nl.int32)
    np.testing.assert_array_equal(got[0], [17, 18, 21, -1, -1, -1, -1, -1, 3])
    for p in range(128):
        if p % 16:
            assert (got[p] == 7).all()
        else:
            nz = np.flatnonzero(src[p]) + 16
            np.testing.assert_array_equal(got[p], [*nz, *[-1] * (8 - nz.size), nz.size])
    with pytest.raises(KernelError, match="only on NeuronCore-v3 and newer"):
        run_on("trn1", body, src, shape=(128, 9), dtype=nl.int32)
