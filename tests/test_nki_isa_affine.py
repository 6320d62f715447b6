"""nki.isa's affine index patterns: iota and affine_select, with nl.arange expressions and pattern= lists.

Each is checked against an independent numpy computation."""

import numpy as np

import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from tests.nki_isa_support import run

RNG = np.random.default_rng(11)
X = RNG.standard_normal((128, 64)).astype(np.float32)


def test_iota_and_affine_select():
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(64)[None, :]
    got = run(lambda x: nisa.iota(i_p * 64 + i_f, dtype=nl.float32), X)
    np.testing.assert_array_equal(got, np.arange(128 * 64, dtype=np.float32).reshape(128, 64))
    got = run(lambda x: nisa.affine_select(pred=(i_p - i_f >= 0), on_true_tile=x, on_false_value=-9.0), X)
    p, f = np.indices((128, 64))
    np.testing.assert_array_equal(got, np.where(p >= f, X, -9.0))


def test_iota_and_affine_select_with_patterns():
    def body(x):
        out = nl.ndarray((128, 64), nl.int32, buffer=nl.sbuf)
        nisa.iota(out, [[1, 8], [10, 8]], offset=3, channel_multiplier=100)
        return out
    p, k = np.indices((128, 64))
    expect = 3 + 100 * p + (k // 8) + 10 * (k % 8)
    np.testing.assert_array_equal(run(body, X, dtype=nl.int32), expect)

    def body2(x):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.affine_select(out, [[-1, 64]], 1, x, -7.0, cmp_op=nl.greater_equal)
        return out
    np.testing.assert_array_equal(run(body2, X), np.where(p - k >= 0, X, -7.0))

    def body3(x):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.iota(dst=out, pattern=[[2, 64]], offset=-5, name="idx")
        return out
    np.testing.assert_array_equal(run(body3, X), -5 + 2 * k)
