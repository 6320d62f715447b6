"""nki.isa's selects: range_select, select_reduce and tensor_copy_predicated.

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


def test_range_select_and_select_reduce():
    lo = RNG.integers(0, 32, (128, 1)).astype(np.float32)
    hi = lo + 16
    fmin = np.finfo(np.float32).min

    def body(x, b0, b1):
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.range_select(on_true_tile=x, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b0, bound1=b1,
                          reduce_res=res, range_start=4)
        return res
    i = 4 + np.arange(64)[None, :]
    keep = (i >= lo) & (i < hi)
    np.testing.assert_array_equal(run_on("trn2", body, X, lo, hi, shape=(128, 1))[:, 0],
                                  np.where(keep, X, fmin).max(axis=1))
    with pytest.raises(KernelError, match="on_false_value must be FP32_MIN"):
        run_on("trn2", lambda x, b0, b1: nisa.range_select(on_true_tile=x, comp_op0=nl.less, comp_op1=nl.less, bound0=b0,
                                                       bound1=b1, on_false_value=0.0), X, lo, hi)

    pred = (X > 0).astype(np.float32)

    def body2(p, x):
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=out, predicate=p, on_true=x, on_false=-5.0, reduce_res=res, reverse_pred=True)
        return res
    np.testing.assert_array_equal(run(body2, pred, X, shape=(128, 1))[:, 0], np.where(pred != 0, -5.0, X).max(axis=1))


def test_tensor_copy_predicated_keeps_dst_elsewhere():
    pred = (X > 0.5).astype(np.float32)

    def body(p, x, y):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=y)
        nisa.tensor_copy_predicated(dst=out, src=x, predicate=p)
        return out
    np.testing.assert_array_equal(run(body, pred, X, Y), np.where(pred != 0, X, Y))
