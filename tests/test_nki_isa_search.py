"""nki.isa's top-8 searches: max8, nc_find_index8 and nc_match_replace8.

Each is checked against an independent numpy computation."""

import numpy as np

import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from tests.nki_isa_support import run

RNG = np.random.default_rng(11)


def test_max8_find_index8_match_replace8():
    data = RNG.permutation(128 * 64).reshape(128, 64).astype(np.float32)
    top = -np.sort(-data, axis=1)[:, :8]
    np.testing.assert_array_equal(run(lambda x: nisa.max8(src=x), data, shape=(128, 8)), top)
    idx = run(lambda x, v: nisa.nc_find_index8(data=x, vals=v), data, top, shape=(128, 8), dtype=nl.uint32)
    np.testing.assert_array_equal(idx, np.argsort(-data, axis=1, kind="stable")[:, :8])

    def body(x, v):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=out, data=x, vals=v, imm=-1.0)
        return out
    expect = data.copy()
    np.put_along_axis(expect, np.argsort(-data, axis=1)[:, :8], -1.0, axis=1)
    np.testing.assert_array_equal(run(body, data, top), expect)


def test_match_replace8_duplicates_fill_slots_last_first():
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)

    def body(x, v):
        idx = nl.ndarray((1, 8), nl.uint32, buffer=nl.sbuf)
        nisa.nc_match_replace8(data=x, vals=v, imm=0.0, dst_idx=idx)
        return idx
    np.testing.assert_array_equal(run(body, data, vals, shape=(1, 8), dtype=nl.uint32), [[2, 10, 9, 8, 7, 6, 5, 4]])
