"""Semantics that AWS's NKI library (nki-library, run by its test suite in simulation
mode) relies on, each checked on a small kernel of its own against numpy."""

import numpy as np
import pytest

from trnsim import nki
from trnsim.nki import isa as nisa
from trnsim.nki import language as nl
from trnsim.nki.tracer import KernelError

RNG = np.random.default_rng(7)


def test_tensor_reduce_reduces_as_many_trailing_axes_as_axis_names():
    # cascaded_max and layernorm_tkg reduce the last axis of a [P, A, B] tile with axis=1
    a = RNG.standard_normal((16, 5, 3)).astype(np.float32)

    @nki.jit
    def k(x):
        last = nl.ndarray((16, 5), nl.float32, buffer=nl.shared_hbm)
        both = nl.ndarray((16, 1), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        r = nl.ndarray((16, 5), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.maximum, data=t, axis=1)
        nl.store(last, r)
        nl.store(both, nisa.tensor_reduce(op=nl.add, data=t, axis=(1, 2)))
        return last, both

    last, both = k(a)
    np.testing.assert_array_equal(last, a.max(axis=2))
    np.testing.assert_allclose(both[:, 0], a.astype(np.float64).sum(axis=(1, 2)), rtol=1e-5, atol=1e-5)


def test_dma_copy_converts_an_integer_tile_through_fp32():
    # find_nonzero_indices loads an int8 identity into a float32 SBUF tile with dma_copy
    a = RNG.integers(-128, 128, (32, 24)).astype(np.int8)
    b = np.array([[2**24 + 1, -7, 3, 2**31 - 1]], np.int32)

    @nki.jit
    def k(x, y):
        fx = nl.ndarray((32, 24), nl.float32, buffer=nl.shared_hbm)
        fy = nl.ndarray((1, 4), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((32, 24), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nl.store(fx, t)
        nisa.dma_copy(dst=fy, src=y)
        return fx, fy

    fx, fy = k(nki.typed(a, nl.int8), nki.typed(b, nl.int32))
    np.testing.assert_array_equal(fx, a.astype(np.float32))
    np.testing.assert_array_equal(fy, b.astype(np.float32))   # 2**24 + 1 rounds to 2**24 in fp32


def test_ndarray_address_places_a_tile_where_it_says():
    # conv1d and the tkg kernels pin PSUM banks with nl.ndarray(..., address=(0, bank * 2048))
    a = RNG.standard_normal((128, 64)).astype(np.float32)
    b = RNG.standard_normal((128, 32)).astype(np.float32)

    @nki.jit
    def k(x, y):
        out = nl.ndarray((64, 32), nl.float32, buffer=nl.shared_hbm)
        xs = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf, address=(0, 0))
        ys = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf, address=(0, 64 * 4))
        nisa.dma_copy(dst=xs, src=x)
        nisa.dma_copy(dst=ys, src=y)
        acc = nl.ndarray((64, 32), nl.float32, buffer=nl.psum, address=(0, 3 * 2048))
        nisa.nc_matmul(dst=acc, stationary=xs, moving=ys)
        res = nl.ndarray((64, 32), nl.float32, buffer=nl.sbuf, address=(0, 96 * 4))
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
        return out

    program = nki.trace_program(k, a, b)
    placed = sorted((t.memory.name, t.start_partition, t.byte_offset) for t in program.tensors
                    if t.memory.name != "HBM")
    assert placed == [("PSUM", 0, 3 * 2048), ("SBUF", 0, 0), ("SBUF", 0, 256), ("SBUF", 0, 384)]
    out = k(a, b)
    np.testing.assert_allclose(out, a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_dma_transpose_permutes_3d_and_4d_tiles_as_nki_does():
    # norm_tkg_utils transposes a [BxS*H1, 1, 1, H0] HBM view into a [H0, 1, 1, BxS*H1] tile
    a4 = RNG.standard_normal((24, 2, 3, 16)).astype(np.float32)
    a3 = RNG.standard_normal((4, 5, 6)).astype(np.float32)

    @nki.jit
    def k(x4, x3):
        o4 = nl.ndarray((16, 2, 3, 24), nl.float32, buffer=nl.shared_hbm)
        o3 = nl.ndarray((6, 5, 4), nl.float32, buffer=nl.shared_hbm)
        t4 = nl.ndarray((16, 2, 3, 24), nl.float32, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t4, src=x4)
        nl.store(o4, t4)
        s3 = nl.load(x3)
        nl.store(o3, nisa.dma_transpose(s3))
        return o4, o3

    o4, o3 = k(a4, a3)
    np.testing.assert_array_equal(o4, a4.transpose(3, 1, 2, 0))
    np.testing.assert_array_equal(o3, a3.transpose(2, 1, 0))


def test_outside_a_kernel_the_launch_grid_is_empty():
    # topk's host-side config asks nl.program_ndim() for the sharding before any kernel runs
    assert (nl.program_ndim(), nl.num_programs(axes=0), nl.program_id(axis=0)) == (0, 1, 0)

    @nki.jit
    def k(x):
        out = nl.ndarray((1, 2), nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 2), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=t[:, 0:1], value=nl.program_ndim())
        nisa.memset(dst=t[:, 1:2], value=nl.num_programs(axes=0))
        nl.store(out, t)
        return out

    np.testing.assert_array_equal(k[3](np.zeros((1, 1), np.float32)), [[1, 3]])


def test_the_simulators_nki_dtype_is_the_module_of_data_types(monkeypatch):
    # the suite's set-up puts the simulator's modules in sys.modules; its qkv tests then
    # `import nki.dtype as nt` and read nt.float8_e4m3
    import sys

    import nki_cpu_simulator.nki as sim_nki
    import nki_cpu_simulator.nki.language.dtypes as sim_dtypes

    monkeypatch.setitem(sys.modules, "nki", sim_nki)
    monkeypatch.setitem(sys.modules, "nki.dtype", sim_dtypes)
    import nki.dtype as nt

    assert nt is sim_dtypes
    assert nt.float8_e4m3 is nl.float8_e4m3 and nt.bfloat16 is nl.bfloat16


def test_an_access_pattern_past_the_end_is_refused_only_where_it_is_used():
    # output_projection_tkg makes a .ap view for every iteration and uses it under a condition
    a = RNG.standard_normal((8, 12)).astype(np.float32)

    def kernel(use_last):
        @nki.jit
        def k(x):
            out = nl.ndarray((8, 3), nl.float32, buffer=nl.shared_hbm)
            t = nl.load(x)
            res = nl.ndarray((8, 3), nl.float32, buffer=nl.sbuf)
            for j in range(5):
                view = t.ap(pattern=[[12, 8], [4, 3]], offset=j)   # j = 4 reads element 12 of each row
                if j < 4 or use_last:
                    nisa.tensor_copy(dst=res, src=view)
            nl.store(out, res)
            return out
        return k

    np.testing.assert_array_equal(kernel(False)(a), a[:, 3::4])
    with pytest.raises(KernelError, match="reaches outside"):
        kernel(True)(a)


def test_nki_classes_take_their_fields_as_nki_makes_their_initializer():
    # attention_cte's @dataclass SectionParams declares its fields unannotated and is built
    # with keywords; mlp_tkg leaves a field out; NKI's guide: fields default to None
    from dataclasses import dataclass, field

    @dataclass
    class Section(nl.NKIObject):
        idx = None
        offset = 0

    @dataclass
    class Dims(nl.NKIObject):
        t: int
        h: int
        extra: list = field(default_factory=list)
        k: int = 7

        def __post_init__(self):
            self.th = None if self.h is None else self.t * self.h

    @dataclass(frozen=True)
    class Frozen(nl.NKIObject):
        a: int

    class Mine(nl.NKIObject):
        def __init__(self, v):
            self.v = 2 * v

    s = Section(idx=3)
    assert (s.idx, s.offset) == (3, 0)
    d = Dims(2, 5)
    assert (d.t, d.h, d.extra, d.k, d.th) == (2, 5, [], 7, 10)
    assert Dims(t=4).h is None and Dims(t=4).th is None
    assert Frozen(a=1).a == 1 and Mine(3).v == 6
    with pytest.raises(TypeError, match="two values for 't'"):
        Dims(1, t=2)

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(x), float(Dims(t=3, h=2).th)))
        return out

    np.testing.assert_array_equal(k(np.ones((2, 4), np.float32)), np.full((2, 4), 6.0, np.float32))
