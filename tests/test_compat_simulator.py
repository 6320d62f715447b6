"""``neuron_dtypes`` and ``nki_cpu_simulator`` without AWS's packages, as AWS's NKI
library's tests use them in their simulation mode (``--test-mode simulation``)."""

import importlib
import sys

import ml_dtypes
import numpy as np
import pytest

from tests.test_nki_compat import run_python
from trnsim import cli


# -- neuron_dtypes ----------------------------------------------------------------

def test_static_cast_rounds_to_nearest_even_in_one_step():
    import neuron_dtypes as dt
    import nki.language as nl

    # 1 + 2**-8 is halfway between two bfloat16 values: ties go to the even one (1.0);
    # a hair above it rounds up, which a cast through float32 would lose
    x = np.array([1 + 2**-8, 1 + 2**-8 + 2**-30, 1 + 3 * 2**-8, -2.0**-130])
    for target in (dt.bfloat16, nl.bfloat16):
        out = dt.static_cast(x, target)
        assert out.dtype == np.dtype(ml_dtypes.bfloat16)
        assert out.astype(np.float64).tolist() == [1.0, 1 + 2**-7, 1 + 2**-6, -2.0**-130]
    e5m2 = dt.static_cast(np.array([1.125, 1.375, 1e6]), nl.float8_e5m2)
    assert e5m2.astype(np.float64).tolist() == [1.0, 1.5, np.inf]


def test_finite_only_formats_saturate():
    import neuron_dtypes as dt
    import nki.language as nl

    out = dt.static_cast(np.array([500.0, -1e9, np.inf, np.nan, 0.3]), nl.float8_e4m3fn)
    assert out.dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    values = out.astype(np.float64)
    assert values[:3].tolist() == [448.0, -448.0, 448.0] and np.isnan(values[3]) and values[4] == 0.3125
    # the NeuronCore's own e4m3 is IEEE 754 style: it overflows to infinity past 240
    ieee = dt.static_cast(np.array([500.0, -1e9, 240.0]), nl.float8_e4m3)
    assert ieee.dtype == np.dtype(ml_dtypes.float8_e4m3)
    assert ieee.astype(np.float64).tolist() == [np.inf, -np.inf, 240.0]


def test_static_cast_to_integers_truncates():
    import neuron_dtypes as dt
    import nki.language as nl

    assert dt.static_cast(np.array([1.7, -1.7, 2.0]), nl.int32).tolist() == [1, -1, 2]
    assert dt.static_cast(np.array([1.7]), np.int32).dtype == np.int32


@pytest.mark.parametrize("name, storage, first_bits", [("float8_e4m3fn_x4", np.uint32, 0x38),
                                                       ("float8_e5m2_x4", np.uint32, 0x3C),
                                                       ("float4_e2m1fn_x4", np.uint16, 0x2)])
def test_mx_types_pack_four_values_of_the_last_axis(name, storage, first_bits):
    import neuron_dtypes as dt
    import nki.language as nl

    x = np.array([[1.0, -2.0, 0.5, 3.0, 0.0, 1.5, -1.0, 4.0]], np.float32)
    for target in (getattr(dt, name), getattr(nl, name)):
        packed = dt.static_cast(x, target)
        assert packed.shape == (1, 2) and packed.dtype == storage and packed.dtype.metadata["neuron_dtype"] == name
        width = 8 if storage is np.uint32 else 4
        assert int(packed[0, 0]) & ((1 << width) - 1) == first_bits   # 1.0, the first value, in the lowest bits
        np.testing.assert_array_equal(dt.static_cast(packed, np.float32), x)
    with pytest.raises(ValueError, match=r"last axis that is not a multiple of 4"):
        dt.static_cast(np.ones((2, 6)), getattr(dt, name))


def test_sizes_limits_and_kinds():
    import neuron_dtypes as dt
    import nki.language as nl

    assert [dt.sizeinbytes(d) for d in (np.float32, nl.bfloat16, nl.float8_e4m3, nl.float8_e4m3fn_x4,
                                        dt.float4_e2m1fn_x4)] == [4, 2, 1, 4, 2]
    assert dt.finfo(nl.bfloat16).dtype == np.dtype(ml_dtypes.bfloat16) and float(dt.finfo(nl.float8_e4m3).max) == 240
    assert float(dt.finfo(nl.float8_e4m3fn).max) == 448
    assert float(dt.finfo(dt.float8_e5m2_x4).max) == 57344
    assert dt.is_float_type(np.dtype(dt.bfloat16)) and dt.is_float_type(np.float16)
    assert dt.is_float_type(dt.float8_e4m3fn_x4) and not dt.is_float_type(np.int32)
    assert not dt.is_float_type(np.dtype(np.bool_))


def test_nki_dtypes_work_as_numpy_dtypes():
    """The library's tests hand nki.language's dtypes to numpy."""
    import nki.language as nl

    assert np.full((2, 3), 7, dtype=nl.int32).dtype == np.int32
    # ml_dtypes' bfloat16, as in NKI: the library's convert_to_torch tests a.dtype == nl.bfloat16
    assert np.zeros(4, dtype=nl.bfloat16).dtype == nl.bfloat16 != np.float32
    assert np.ones(2, dtype=nl.float8_e4m3fn_x4).dtype == np.uint32


def test_neuron_dtypes_costs_import_trnsim_nothing(tmp_path):
    r = run_python("import sys, torch, trnsim, importlib.util\n"
                   "assert importlib.util.find_spec('neuron_dtypes') is not None\n"
                   "assert 'ml_dtypes' not in sys.modules\n"
                   "import neuron_dtypes\n"
                   "assert 'ml_dtypes' in sys.modules and neuron_dtypes.bfloat16.__name__ == 'bfloat16'\n"
                   "print('ok')", tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# -- kernels on ml_dtypes arrays ------------------------------------------------------

def _scale_kernel():
    import nki
    import nki.isa as nisa
    import nki.language as nl

    @nki.jit
    def scale(x, factor):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
        u = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=u, src=t)
        nisa.dma_copy(dst=out, src=u)
        return out

    return scale


def test_simulate_takes_bfloat16_arrays():
    import neuron_dtypes as dt
    import nki
    import nki.language as nl

    x = dt.static_cast(np.linspace(-3, 3, 128 * 8, dtype=np.float32).reshape(128, 8), nl.bfloat16)
    out = nki.simulate(_scale_kernel())(x, 3.0)
    expected = dt.static_cast(x.astype(np.float32) * 3.0, nl.bfloat16)
    np.testing.assert_array_equal(np.asarray(out, dtype=expected.dtype), expected)


# -- nki_cpu_simulator ----------------------------------------------------------------

SIM_MODULES = ["nki_cpu_simulator.nki.builtin", "nki_cpu_simulator.nki.compiler", "nki_cpu_simulator.nki.isa",
               "nki_cpu_simulator.nki.isa.constants", "nki_cpu_simulator.nki.language",
               "nki_cpu_simulator.nki.language.dtypes", "nki_cpu_simulator.nki.tensor",
               "nki_cpu_simulator.nki.typing"]


def test_simulator_modules_import_as_the_library_imports_them():
    import nki.language as nl

    mods = {name: importlib.import_module(name) for name in SIM_MODULES}
    from nki_cpu_simulator import nki as sim_nki

    assert mods["nki_cpu_simulator.nki.isa"] is importlib.import_module("trnsim.nki.isa")
    assert mods["nki_cpu_simulator.nki.isa.constants"] is importlib.import_module("trnsim.nki.isa.constants")
    assert mods["nki_cpu_simulator.nki.compiler"] is importlib.import_module("trnsim.nki.compiler")
    sim_nl = mods["nki_cpu_simulator.nki.language"]
    assert sim_nl.ndarray is nl.ndarray and sim_nl.bfloat16 is nl.bfloat16
    assert mods["nki_cpu_simulator.nki.language.dtypes"].float8_e4m3fn_x4 is nl.float8_e4m3fn_x4
    assert sim_nki.jit is importlib.import_module("trnsim.nki").jit and callable(sim_nki.cpu_simulate)
    assert not hasattr(importlib.import_module("nki"), "cpu_simulate")   # the simulator's name only
    np.testing.assert_array_equal(mods["nki_cpu_simulator.nki.tensor"].identity(3, nl.int8), np.eye(3, dtype=np.int8))


def test_library_setup_then_cpu_simulate(monkeypatch):
    """As the library's test/utils/simulation_setup.py does: the simulator's modules put
    over ``nki``, then ``nki.cpu_simulate(kernel)[lnc](**numpy_inputs)``; ``nki``'s other
    submodules still import after that."""
    import neuron_dtypes as dt
    import nki.language as nl

    mods = {name: importlib.import_module(name) for name in SIM_MODULES}
    from nki_cpu_simulator import nki as sim_nki

    for name in ("nki", "nki.language", "nki.collectives"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "nki", sim_nki)
    monkeypatch.setitem(sys.modules, "nki.language", mods["nki_cpu_simulator.nki.language"])
    import nki
    import nki.collectives

    assert nki is sim_nki and nki.collectives is importlib.import_module("trnsim.nki.collectives")
    monkeypatch.setenv("NKI_NC_VERSION", "gen3")
    x = dt.static_cast(np.arange(128 * 4, dtype=np.float32).reshape(128, 4) / 7, nl.bfloat16)
    out = nki.cpu_simulate(_scale_kernel())[1](x=x, factor=2.0)
    np.testing.assert_array_equal(np.asarray(out, dtype=x.dtype), dt.static_cast(x.astype(np.float32) * 2, nl.bfloat16))
    monkeypatch.setenv("NKI_NC_VERSION", "gen9")
    with pytest.raises(Exception, match="NKI_NC_VERSION='gen9' is not a NeuronCore generation"):
        nki.cpu_simulate(_scale_kernel())


def test_doctor_lists_them(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "neuron_dtypes  aliased to trnsim.compat.neuron_dtypes" in out
    assert "nki_cpu_simulator aliased to trnsim.compat.nki_cpu_simulator" in out


def test_num_programs_takes_axes():
    """NKI's signature is ``num_programs(axes=0)``; AWS's NKI library calls it with
    ``axes=0`` (and ``axis=0``, the older spelling)."""
    import nki
    import nki.language as nl

    seen = []

    @nki.jit
    def k(a):
        seen.append((nl.num_programs(), nl.num_programs(axes=0), nl.num_programs(axis=1), nl.num_programs(axes=(0, 1)),
                     nl.num_programs(axes=None)))
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out

    nki.simulate(k)[2, 3](np.ones((4, 4), np.float32))
    assert set(seen) == {(2, 2, 3, 6, 6)}
    with pytest.raises(nki.KernelError, match=r"num_programs\(2\): the launch grid has 2 axes"):
        nki.simulate(nki.jit(lambda a: nl.num_programs(axes=2)))[2, 3](np.ones((4, 4), np.float32))
