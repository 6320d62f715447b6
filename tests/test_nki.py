"""trnsim.nki: tracing, scheduling, errors that name the kernel line, kernel CI helpers."""

import json
from pathlib import Path

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.nki import KernelError
from trnsim.testing import assert_allclose, assert_kernel_matches, assert_latency, tolerance

HERE = Path(__file__)
SOURCE = HERE.read_text().splitlines()


def line_of(tag: str) -> str:
    """``file:line`` of the line ending with ``# <tag>`` in this file."""
    (n,) = [i + 1 for i, text in enumerate(SOURCE) if text.rstrip().endswith(f"# {tag}")]
    return f"{HERE}:{n}"


def expect_error(kernel, *args, match: str, tag: str):
    with pytest.raises(KernelError, match=match) as info:
        nki.trace_program(kernel, *args, chip="trn1")
    assert line_of(tag) in str(info.value), str(info.value)
    return str(info.value)


X = np.ones((128, 512), np.float32)


def test_partition_dimension_above_128_names_the_line():
    @nki.jit
    def k(x):
        t = nl.ndarray((256, 4), nl.float32, buffer=nl.sbuf)  # too-many-partitions
        return t

    expect_error(k, X, match="partition dimension 256 exceeds the 128 partitions", tag="too-many-partitions")


def test_sbuf_overflow_says_what_is_live():
    @nki.jit
    def k(x):
        a = nl.load(x)
        b = nl.ndarray((128, 48 * 1024), nl.float32, buffer=nl.sbuf)  # sbuf-overflow
        b[:, 0:1024] = a  # a is still to be read, so its space is not free yet
        return a, b

    msg = expect_error(k, np.ones((128, 1024), np.float32), match="SBUF allocation", tag="sbuf-overflow")
    assert "live there: a (4 KiB" in msg and "192 KiB per partition" in msg


def test_psum_overflow():
    @nki.jit
    def k(x):
        tiles = []
        for _ in range(9):
            tiles.append(nl.ndarray((128, 512), nl.float32, buffer=nl.psum))  # psum-overflow
        return tiles

    msg = expect_error(k, X, match="PSUM allocation .* does not fit", tag="psum-overflow")
    assert "16 KiB per partition" in msg and "live there" in msg


def test_moving_free_size_above_512():
    @nki.jit
    def k(x):
        a = nl.load(x[:, 0:128])
        b = nl.load(x)
        c = nl.ndarray((128, 1024), nl.float32, buffer=nl.sbuf)
        c[:, 0:512] = b
        c[:, 512:1024] = b
        r = nl.matmul(a, c, transpose_x=True)  # wide-moving
        return r

    expect_error(k, X, match="moving free size 1024 exceeds nl.tile_size.gemm_moving_fmax \\(512\\)", tag="wide-moving")


def test_misaligned_start_partition():
    @nki.jit
    def k(x):
        a = nl.load(x)
        b = nl.exp(a[16:48])  # misaligned
        return b

    expect_error(k, X, match="start partition 16 is misaligned for 32 partitions; it must be 0, 32, 64 or 96", tag="misaligned")


def test_out_of_bounds_hbm_access():
    @nki.jit
    def k(x):
        a = nl.load(x[0:256, :])  # out-of-bounds
        return a

    expect_error(k, X, match="the index into x\\[128, 512\\] runs 128 elements past its end on axis 0", tag="out-of-bounds")


def test_reading_a_tile_before_anything_wrote_it():
    @nki.jit
    def k(x):
        t = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
        u = nl.exp(t)  # read-before-write
        return u

    expect_error(k, X, match="reads SBUF tile t\\[128, 512\\] before anything wrote it", tag="read-before-write")


def test_psum_accumulation_group_misuse():
    @nki.jit
    def into_sbuf(x):
        a = nl.load(x[:, 0:128])
        acc = nl.zeros((128, 512), nl.float32, buffer=nl.sbuf)
        acc += nl.matmul(a, nl.load(x), transpose_x=True)  # accumulate-in-sbuf
        return acc

    expect_error(into_sbuf, X, match="matmul results accumulate in PSUM.*accumulation group misuse", tag="accumulate-in-sbuf")

    @nki.jit
    def wrong_shape(x):
        a = nl.load(x[:, 0:128])
        acc = nl.zeros((128, 256), nl.float32, buffer=nl.psum)
        acc += nl.matmul(a, nl.load(x), transpose_x=True)  # accumulate-wrong-shape
        return acc

    expect_error(wrong_shape, X, match="matmul result is \\[128, 512\\] but the accumulator", tag="accumulate-wrong-shape")


def test_kernel_must_return_hbm():
    @nki.jit  # returns-a-tile
    def k(x):
        return nl.load(x)

    expect_error(k, X, match="a kernel returns HBM tensors", tag="returns-a-tile")


@nki.jit
def scale_rows(x):
    """out = exp(x) * 2 over [N, F] in 128-row tiles."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        nl.store(out[i * 128:(i + 1) * 128, :], value=nl.multiply(nl.exp(t), 2.0))  # store-line
    return out


def test_value_style_kernel_numerics_and_trace_source_lines(tmp_path):
    x = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    assert_allclose(scale_rows(x), np.exp(x.astype(np.float64)) * 2, "float32")
    path = tmp_path / "t.json"
    r = nki.benchmark(scale_rows, trace=path)(x)
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    stores = [e for e in events if e["cat"].startswith("dma.q") and "hbm:x" not in e["args"]["operands"]]
    assert stores and all(e["args"]["source"] == line_of("store-line") for e in stores)
    assert r.instructions == len(events) == 2 * 4
    assert set(r.busy_pct) >= {"scalar", "vector", "dma.q0", "dma.q12"}


def test_destination_passing_style():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        sa = nl.ndarray((128, 128), a.dtype, buffer=nl.sbuf)
        sb = nl.ndarray((128, 512), b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sa, src=a)
        nisa.dma_copy(dst=sb, src=b)
        acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, sa, sb)
        nisa.nc_matmul(acc, sa, sb)
        res = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.activation(dst=res, op=nl.relu, data=res, scale=0.5)
        nisa.dma_copy(dst=out, src=res)
        return out

    rng = np.random.default_rng(1)
    a = rng.standard_normal((128, 128)).astype(np.float32)
    b = rng.standard_normal((128, 512)).astype(np.float32)
    assert_allclose(k(a, b), np.maximum(2 * a.T.astype(np.float64) @ b * 0.5, 0), "float32")


def test_launch_grid_and_program_id():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        n = nl.num_programs(0)
        rows = x.shape[0] // n
        t = nl.load(x[i * rows:(i + 1) * rows, :])
        nl.store(out[i * rows:(i + 1) * rows, :], value=nl.add(t, float(i)))
        return out

    x = np.arange(256 * 8, dtype=np.float32).reshape(256, 8)
    out = k[2](x)
    np.testing.assert_array_equal(out[:128], x[:128])
    np.testing.assert_array_equal(out[128:], x[128:] + 1)
    out = k[2, 2](np.ones((256, 8), np.float32))
    assert (out[:128] == 1).all() and (out[128:] == 2).all()  # both instances along axis 1 write the same rows
    # a dimension of 0 launches one instance on it (AWS's contributed pipelined attention calls kernel[0])
    np.testing.assert_array_equal(k[0](x[:128]), k[1](x[:128]))
    for bad in (-1, 1.5, True, ()):
        with pytest.raises(KernelError, match="launch grid"):
            k[bad]


def test_loops_overlap_where_their_data_allow_and_a_device_loop_does_not():
    def make(loop):
        @nki.jit
        def k(x):
            out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
            for i in loop(4):
                t = nl.load(x[i * 128:(i + 1) * 128, :])
                nl.store(out[i * 128:(i + 1) * 128, :], value=nl.exp(t))
            return out
        return k

    x = np.ones((512, 512), np.float32)
    parallel = nki.benchmark(make(nl.affine_range), numerics=False)(x).latency_ns
    ordered = nki.benchmark(make(nl.sequential_range), numerics=False)(x).latency_ns
    serial = nki.benchmark(make(nl.dynamic_range), numerics=False)(x).latency_ns
    assert parallel == ordered < serial   # nothing carries from one iteration to the next
    one = nki.benchmark(make(lambda n: nl.dynamic_range(1)), numerics=False)(x).latency_ns
    assert serial > 3.5 * one  # each iteration of a device loop waits for the one before


def test_masked_load_and_store():
    @nki.jit
    def k(x):
        n, f = x.shape
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(f)[None, :]
        for t in nl.affine_range((n + 127) // 128):
            tile = nl.load(x[t * 128 + i_p, i_f], mask=(t * 128 + i_p < n))
            nl.store(out[t * 128 + i_p, i_f], value=nl.multiply(tile, 3.0, mask=(t * 128 + i_p < n)), mask=(t * 128 + i_p < n))
        return out

    x = np.random.default_rng(2).standard_normal((200, 16)).astype(np.float32)
    assert_allclose(k(x), 3 * x.astype(np.float64), "float32")


def test_same_kernel_same_latency_and_trace(tmp_path):
    x = np.ones((256, 64), np.float32)
    runs = [nki.benchmark(scale_rows, trace=tmp_path / f"{i}.json")(x) for i in range(2)]
    assert runs[0].latency_ns == runs[1].latency_ns
    assert (tmp_path / "0.json").read_bytes() == (tmp_path / "1.json").read_bytes()


def test_chip_from_argument_and_environment(monkeypatch):
    x = np.ones((256, 64), np.float32)
    trn1 = nki.benchmark(scale_rows, chip="trn1", numerics=False)(x)
    monkeypatch.setenv("TRNSIM_CHIP", "trn1")
    assert nki.benchmark(scale_rows, numerics=False)(x).latency_ns == trn1.latency_ns
    monkeypatch.setenv("TRNSIM_CHIP", "trn3")
    assert nki.benchmark(scale_rows, numerics=False)(x).latency_ns != trn1.latency_ns


def test_testing_helpers():
    x = np.random.default_rng(3).standard_normal((128, 32)).astype(np.float32)
    assert_kernel_matches(scale_rows, lambda a: np.exp(a) * 2, x)
    with pytest.raises(AssertionError, match="differs from the reference at 4096 of 4096 elements"):
        assert_kernel_matches(scale_rows, lambda a: np.exp(a) * 3, x)
    result = assert_latency(scale_rows, x, max_ns=1e6)
    with pytest.raises(AssertionError, match=f"takes {result.latency_ns:,.1f} ns of simulated time, over its budget of 100.0 ns"):
        assert_latency(scale_rows, x, max_ns=100)
    assert tolerance("bfloat16")[0] > tolerance("float32")[0] and tolerance("int32") == (0.0, 0.0)


def test_pytest_plugin(pytester):
    pytester.makepyfile("""
        import numpy as np, os, pytest
        import trnsim.nki as nki
        import trnsim.nki.language as nl

        @nki.jit
        def copy(x):
            out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.load(x))
            return out

        @pytest.mark.nki(chip="trn1")
        def test_marker(nki_benchmark):
            assert os.environ["TRNSIM_CHIP"] == "trn1"
            r = nki_benchmark(copy, np.ones((128, 64), np.float32))
            assert (r.outputs == 1).all() and r.latency_ns > 0

        def test_option():
            assert os.environ.get("TRNSIM_CHIP") == "trn3"
    """)
    result = pytester.runpytest("--trnsim-chip", "trn3", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_review_regressions_in_the_language():
    x = np.arange(128 * 4, dtype=np.float32).reshape(128, 4)

    @nki.jit
    def copy_into_zeros(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 4), nl.float32, buffer=nl.psum)
        nisa.tensor_copy(acc, src=nl.load(x))  # positional dst beside a keyword operand
        nl.store(out, value=acc)
        return out

    np.testing.assert_array_equal(copy_into_zeros(x), x)

    @nki.jit
    def row_first(x, row):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.add(nl.load(row), nl.load(x)))
        return out

    row = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(row_first(x, row), x + 1)

    @nki.jit
    def two_index_mask(x):
        i_p, i_f = nl.arange(128)[:, None], nl.arange(4)[None, :]
        return nl.load(x[i_p, i_f], mask=(i_p >= i_f))  # two-index-mask

    with pytest.raises(KernelError, match="relating two indices"):
        nki.trace_program(two_index_mask, x)

    @nki.jit
    def chained(x):
        i_p = nl.arange(128)[:, None]
        return nl.load(x[i_p, 0:4], mask=(i_p < 64 or i_p >= 100))

    with pytest.raises(KernelError, match="combine conditions with &"):
        nki.trace_program(chained, x)

    @nki.jit
    def negative_start(x):
        i_p, i_f = nl.arange(128)[:, None], nl.arange(4)[None, :]
        return nl.load(x[i_p, i_f - 1])  # negative-start

    expect_error(negative_start, x, match="starts at -1, before the start of the axis", tag="negative-start")


def test_slice_accumulation_writes_once():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 1024), nl.float32, buffer=nl.psum)
        ta, tb = nl.load(a), nl.load(b)
        acc[:, 0:512] += nl.matmul(ta, tb, transpose_x=True)
        nl.store(out, value=acc[:, 0:512])
        return out

    a = np.ones((128, 128), np.float32)
    b = np.ones((128, 512), np.float32)
    prog = nki.trace_program(k, a, b)
    assert [i.opcode for i in prog].count("tensor_copy") == 1  # only the copy out for the store
    assert (k(a, b) == 128).all()


def test_float64_arguments_in_kernel_ci():
    x = np.random.default_rng(5).standard_normal((128, 16))
    assert_kernel_matches(scale_rows, lambda a: np.exp(a) * 2, x)


def test_kernels_run_on_a_chip_with_few_dma_queues(tmp_path):
    chip = tmp_path / "fewq.toml"
    chip.write_text('extends = "trn2"\n[chip]\nname = "fewq"\n[dma]\nengines = 2\nqueues_per_engine = 1\n')
    x = np.ones((256, 64), np.float32)
    r = nki.benchmark(scale_rows, chip=str(chip))(x)
    assert set(t for t in r.busy_pct if t.startswith("dma")) == {"dma.q0", "dma.q1"}
    assert_allclose(r.outputs, np.exp(x.astype(np.float64)) * 2, "float32")


def test_run_observers_see_numpy_runs_until_unregistered():
    from trnsim import adapters

    @nki.jit
    def double(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(x), 2.0))
        return out

    seen = []
    unregister = adapters.register_run_observer(lambda name, run, args: seen.append((name, run.total_ps > 0)))
    try:
        double(np.ones((128, 4), np.float32))
    finally:
        unregister()
    double(np.ones((128, 4), np.float32))
    assert seen == [("double", True)]


def test_a_kernel_called_from_a_kernel_joins_its_program():
    """AWS's NKI library composes kernels: a jit kernel (``mode="trace"``, as the library
    marks them, or any other) called inside another kernel traces into the caller's
    Program on the caller's tensors; launched on its own it runs as any kernel. A grid
    launch from inside a kernel is refused by name."""
    import numpy as np

    import trnsim.nki as nki
    import trnsim.nki.language as nl

    @nki.jit(mode="trace")
    def doubled(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a) * 2.0)
        return out

    @nki.jit
    def doubled_plus_one(a):
        b = doubled(a)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(b) + 1.0)
        return out

    @nki.jit
    def on_a_grid(a):
        return doubled[2](a)

    a = np.arange(16 * 32, dtype=np.float32).reshape(16, 32) / 7
    np.testing.assert_array_equal(doubled(a), a * 2.0)
    np.testing.assert_array_equal(doubled_plus_one(a), a * 2.0 + 1.0)
    assert len(nki.trace_program(doubled_plus_one, a)) > len(nki.trace_program(doubled, a))
    with pytest.raises(nki.KernelError, match=r"kernel doubled\[2\] is launched on a grid from inside another kernel"):
        on_a_grid(a)
