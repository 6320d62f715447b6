"""nki.isa's random numbers: rng, rand2, seeding, generator state and dropout.

Each is checked against an independent numpy computation."""

import numpy as np
import pytest

import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.nki import KernelError
from tests.nki_isa_support import run, run_on

RNG = np.random.default_rng(11)
X = RNG.standard_normal((128, 64)).astype(np.float32)


def test_random_numbers_and_dropout():
    def body(x):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.rand2(out, -2.0, 3.0)
        return out
    u = run_on("trn3", body, X)
    assert u.min() >= -2.0 and u.max() < 3.0 and abs(u.mean() - 0.5) < 0.1
    np.testing.assert_array_equal(run_on("trn3", body, X), u)   # one program, one stream
    with pytest.raises(KernelError, match="rand2 is available only on NeuronCore-v4"):
        run(body, X)

    got = run(lambda x: nisa.dropout(x, prob=0.3), X)
    dropped = got == 0
    np.testing.assert_array_equal(got[~dropped], X[~dropped])
    assert 0.25 < dropped.mean() < 0.35
    assert (run(lambda x: nisa.dropout(x, prob=1.0), X) == 0).all()
    np.testing.assert_array_equal(run(lambda x: nisa.dropout(x, prob=0.0), X), X)

    def bits(x):
        out = nl.ndarray((128, 64), nl.int32, buffer=nl.sbuf)
        nisa.rng(out)
        return out
    r = run(bits, X, dtype=nl.int32)
    assert len(np.unique(r)) > 8000
    with pytest.raises(KernelError, match="must be an integer type"):
        run(lambda x: nisa.rng(x), X)


def test_set_rng_seed_repeats_the_stream():
    def body(seed):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.set_rng_seed(seed)
        return nisa.dropout(out, nisa.memset((128, 64), 1.0, nl.float32), 0.5)
    a = run(body, np.full((1, 1), 3, np.float32))
    b = run(body, np.full((1, 1), 3, np.float32))
    c = run(body, np.full((1, 1), 4, np.float32))
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
