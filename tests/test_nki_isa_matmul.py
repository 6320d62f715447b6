"""nki.isa's tensor engine: nc_matmul and nc_transpose (PE array and vector engine).

Each is checked against an independent numpy computation."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.nki import KernelError
from trnsim.testing import assert_allclose
from tests.nki_isa_support import run

RNG = np.random.default_rng(11)
X = RNG.standard_normal((128, 64)).astype(np.float32)


def test_transpose_and_matmul_without_transpose_x():
    a = RNG.standard_normal((64, 128)).astype(np.float32)  # [M, K]
    b = RNG.standard_normal((128, 256)).astype(np.float32)  # [K, N]

    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((64, 256), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        nl.store(out, value=nl.copy(nl.matmul(ta, tb)))
        nl.store(t, value=nisa.nc_transpose(ta))
        return out, t

    out, t = kernel(a, b)
    assert_allclose(out, a.astype(np.float64) @ b, "float32")
    np.testing.assert_array_equal(t, a.T)


def test_vector_engine_transpose():
    a = X[:32, :16]
    got = run(lambda x: nisa.nc_transpose(x, engine=nisa.vector_engine), a, shape=(16, 32))
    np.testing.assert_array_equal(got, a.T)
    with pytest.raises(KernelError, match="at most 32x32"):
        run(lambda x: nisa.nc_transpose(x, engine=nisa.engine.vector), X, shape=(64, 128))
