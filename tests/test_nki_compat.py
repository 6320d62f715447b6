"""NKI code written for AWS's tools runs unchanged: the ``nki``, ``neuronxcc.nki`` and
``torch_neuronx`` import names, the legacy and current entry points, ``trnsim doctor``."""

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import trnsim.nki
from trnsim import cli
from trnsim.errors import NotProvidedError
from trnsim.nki import KernelError

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, tmp_path: Path, extra_path: str = "", **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter that imports this checkout's trnsim."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TRNSIM_NO_ALIASES", "PYTHONPATH")}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, str(ROOT)) if p)
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environ, capture_output=True, text=True,
                          timeout=240)


# -- import names ---------------------------------------------------------------

def test_both_namespaces_are_trnsims_modules():
    import nki
    import nki.compiler
    import nki.isa as nisa
    import nki.language as nl
    import nki.typing
    import neuronxcc.nki
    import neuronxcc.nki.isa
    import neuronxcc.nki.language
    import neuronxcc.nki.typing
    from neuronxcc import nki as legacy
    from nki import language

    assert nki is trnsim.nki and legacy is trnsim.nki and neuronxcc.nki is trnsim.nki
    assert nl is trnsim.nki.language is language is neuronxcc.nki.language
    assert nisa is trnsim.nki.isa is neuronxcc.nki.isa
    assert nki.typing is importlib.import_module("trnsim.nki.typing") is neuronxcc.nki.typing
    assert nki.compiler is importlib.import_module("trnsim.nki.compiler")
    # the modules keep their own identity: a reload or a pickle finds trnsim's names
    assert nl.__name__ == nl.__spec__.name == "trnsim.nki.language"
    assert not hasattr(nl, "__path__")


def test_nki_isa_constants_is_a_module_as_in_nki():
    import neuronxcc.nki.isa.constants as legacy
    import nki.isa as nisa
    import nki.isa.constants
    from nki.isa.constants import dge_mode, engine

    assert nki.isa.constants is nisa.constants is legacy is importlib.import_module("trnsim.nki.isa.constants")
    assert dge_mode is nisa.dge_mode and engine.vector is nisa.vector_engine


def test_torch_neuronx_is_found_as_hugging_face_looks_for_it(monkeypatch):
    # as in a fresh process, even when an earlier test imported it
    monkeypatch.delitem(sys.modules, "torch_neuronx", raising=False)
    spec = importlib.util.find_spec("torch_neuronx")
    assert spec is not None and spec.name == "torch_neuronx"
    import torch_neuronx

    assert torch_neuronx is importlib.import_module("trnsim.compat.torch_neuronx")
    assert torch_neuronx.device_count() == torch.neuron.device_count() == 64 and torch_neuronx.is_available()
    from transformers.utils import is_torch_neuron_available

    assert is_torch_neuron_available(check_device=True)


def test_unknown_submodules_are_not_invented():
    with pytest.raises(ModuleNotFoundError, match="'nki.no_such_module'"):
        importlib.import_module("nki.no_such_module")


def test_the_guides_example_modules_load_the_users_own_copy(tmp_path):
    """``from neuronxcc.nki.docs.examples.<tutorial>.<module> import f`` (AWS's layernorm
    tutorial imports its neighbour file so) loads ``<module>.py`` from the path."""
    (tmp_path / "my_kernels.py").write_text("def scale(x):\n    return 2 * x\n")
    r = run_python("import trnsim\n"
                   "from neuronxcc.nki.docs.examples.tut.my_kernels import scale\n"
                   "import neuronxcc.nki.docs.examples.tut as tut\n"
                   "print(scale(21), tut.__name__)\n"
                   "try:\n"
                   "    import neuronxcc.nki.docs.examples.tut.missing_module\n"
                   "except ModuleNotFoundError as e:\n"
                   "    print(e.name)", tmp_path, extra_path=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["42", "neuronxcc.nki.docs.examples.tut", "neuronxcc.nki.docs.examples.tut.missing_module"]


def test_no_aliases_turns_them_off(tmp_path):
    r = run_python("import importlib.util, torch, trnsim\n"
                   "assert importlib.util.find_spec('torch_neuronx') is None\n"
                   "for name in ('nki', 'neuronxcc', 'torch_neuronx'):\n"
                   "    try:\n"
                   "        __import__(name)\n"
                   "    except ModuleNotFoundError:\n"
                   "        continue\n"
                   "    raise SystemExit(name + ' was importable')\n"
                   "print('off')", tmp_path, TRNSIM_NO_ALIASES="1")
    assert r.returncode == 0 and r.stdout.strip() == "off", r.stderr


@pytest.mark.parametrize("value, on", [("", True), ("0", True), ("false", True), ("1", False), ("yes", False)])
def test_no_aliases_values(monkeypatch, value, on):
    from trnsim.compat import aliases

    monkeypatch.setenv("TRNSIM_NO_ALIASES", value)
    assert aliases.enabled() is on


def test_an_installed_package_wins_untouched(tmp_path):
    real = tmp_path / "site"
    (real / "nki").mkdir(parents=True)
    (real / "nki" / "__init__.py").write_text("REAL = True\n")
    r = run_python("import torch, trnsim.nki, nki\n"
                   "assert nki.REAL and nki is not trnsim.nki\n"
                   "try:\n"
                   "    import nki.language\n"
                   "except ModuleNotFoundError:\n"
                   "    pass\n"
                   "else:\n"
                   "    raise SystemExit('trnsim answered for a submodule of the real nki')\n"
                   "import neuronxcc.nki, torch_neuronx\n"
                   "assert neuronxcc.nki is trnsim.nki\n"
                   "from trnsim.cli import main\n"
                   "main(['doctor'])", tmp_path, extra_path=str(real), PYTHONDONTWRITEBYTECODE="1")
    assert r.returncode == 0, r.stderr
    assert f"nki            the installed package wins: {real / 'nki' / '__init__.py'}" in r.stdout
    assert "torch_neuronx  aliased to trnsim.compat.torch_neuronx" in r.stdout
    assert list(real.rglob("*")) == [real / "nki", real / "nki" / "__init__.py"]   # nothing written there


def test_doctor_names_aliases_chip_fidelity_and_versions(capsys, monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen2")
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "nki            aliased to trnsim.nki" in out
    assert "neuronxcc      aliased to trnsim.nki (as neuronxcc.nki)" in out
    assert "NKI kernels    trn1 ($NEURON_PLATFORM_TARGET_OVERRIDE)" in out
    assert f"torch {torch.__version__}" in out and "fidelity       op" in out
    assert "settings       every TRNSIM_* variable set is valid" in out


def test_doctor_reports_every_bad_setting_and_fails(capsys, monkeypatch):
    """Other commands stop at the first bad TRNSIM_* variable; doctor, run to find out
    what is wrong, reports every one (and names it), then exits 1."""
    monkeypatch.setenv("TRNSIM_CHIP", "bogus")
    monkeypatch.setenv("TRNSIM_FIDELITY", "fast")
    monkeypatch.setenv("TRNSIM_PROGRES", "0")
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "chip           none: $TRNSIM_CHIP is bad (below)" in out
    assert "fidelity       none: $TRNSIM_FIDELITY is bad (below)" in out
    assert "settings       TRNSIM_CHIP: TRNSIM_CHIP='bogus': unknown chip 'bogus'" in out
    assert "settings       TRNSIM_FIDELITY: TRNSIM_FIDELITY='fast' is not a fidelity" in out
    assert "TRNSIM_PROGRES is not a variable trnsim reads" in out and "TRNSIM_PROGRESS" in out
    assert "versions       python" in out   # the rest of the report still comes


# -- torch_neuronx --------------------------------------------------------------

def test_op_tracking_separates_kernels_from_estimates():
    import torch_neuronx

    torch_neuronx.clear_op_tracking()
    assert torch_neuronx.get_executed_ops() == [] and torch_neuronx.get_fallback_ops() == []
    a = torch.ones(128, 256, device="neuron")
    (a @ a.T).flip(0)
    executed, fallback = torch_neuronx.get_executed_ops(), torch_neuronx.get_fallback_ops()
    assert {"aten::mm", "aten::flip"} <= set(executed)
    assert "aten::flip" in fallback and "aten::mm" not in fallback
    assert set(fallback) <= set(executed)
    torch_neuronx.clear_op_tracking()
    assert torch_neuronx.get_executed_ops() == []
    torch.compile(lambda x: (x * 2 + 1).relu(), backend="neuron")(a)
    assert torch_neuronx.get_executed_ops() == ["fused[mul+add+relu]"] and torch_neuronx.get_fallback_ops() == []


def test_unprovided_submodule_names_are_refused_by_name():
    import torch_neuronx

    with pytest.raises(NotProvidedError,
                       match=r"torch_neuronx\.distributed\.ProcessGroupNeuron is not provided.*backend=\"neuron\""):
        _ = torch_neuronx.distributed.ProcessGroupNeuron
    with pytest.raises(NotProvidedError, match=r"torch_neuronx\.profiling\.start .*issue 14.*trnsim\.profile"):
        _ = torch_neuronx.profiling.start
    assert not hasattr(torch_neuronx.profiling, "__wrapped__")
    assert callable(torch_neuronx.nki_op) and callable(torch_neuronx.wrap_nki)


# -- entry points ---------------------------------------------------------------

nki, nl = trnsim.nki, trnsim.nki.language
A = np.arange(128 * 512, dtype=np.float32).reshape(128, 512) / 1000
B = np.ones((128, 512), np.float32)


@nki.jit
def add(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out


def test_legacy_entry_points_give_the_same_numbers():
    expected = A + B
    np.testing.assert_array_equal(nki.simulate_kernel(add, A, B), expected)
    np.testing.assert_array_equal(nki.baremetal(add)(A, B), expected)
    np.testing.assert_array_equal(nki.baremetal()(add.fn)(A, B), expected)
    np.testing.assert_array_equal(nki.simulate(add)(A, B), expected)
    np.testing.assert_array_equal(nki.jit(add.fn, mode="simulation")(A, B), expected)


def _rows_kernel(namespace):
    """A kernel of a grid of 2: instance i adds its rows [64 i, 64 i + 64) of a and b."""
    nl_ = namespace.language

    def add_rows(a, b, out):
        i = nl_.program_id(0)
        rows = nl_.ds(i * 64, 64)
        nl_.store(out[rows, :], nl_.add(nl_.load(a[rows, :]), nl_.load(b[rows, :])))

    return add_rows


@pytest.mark.parametrize("name", ["nki", "neuronxcc.nki"])
def test_legacy_wrappers_take_a_launch_grid(name, tmp_path):
    ns = importlib.import_module(name)
    fn = _rows_kernel(ns)
    expected = A + B

    def run(wrapped):
        out = np.zeros_like(A)
        result = wrapped[2](A, B, out)
        np.testing.assert_array_equal(out, expected)
        return result

    run(ns.baremetal(fn))
    run(ns.baremetal()(fn))
    run(ns.simulate(fn))
    bench = ns.benchmark(warmup=2, iters=3)(fn)
    result = run(bench)
    launched = [ns.benchmark(ns.jit(fn)[g])(A, B, np.zeros_like(A)) for g in (1, 2)]
    assert result.nc_latency.get_latency_percentile(50) == launched[1].latency_us
    # both instances ran, at once: kernel[2] on trn2 runs one on each core of its logical NeuronCore
    assert result.latency_ns == launched[0].latency_ns
    one_core = ns.benchmark(ns.jit(fn)[2], chip="trn1")(A, B, np.zeros_like(A))   # trn1: one core, in turn
    assert one_core.latency_ns > ns.benchmark(ns.jit(fn)[1], chip="trn1")(A, B, np.zeros_like(A)).latency_ns
    profiled = ns.profile(working_directory=tmp_path / "p", num_execs=2, profile_nth=2)(fn)
    run(profiled[2])
    assert json.loads((tmp_path / "p" / "json_reports" / "profile_exec_2.json").read_text())["kernel"] == "add_rows"
    out = np.zeros_like(A)
    ns.simulate_kernel(ns.baremetal(fn)[2], A, B, out)
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(KernelError, match="launch grid"):
        ns.baremetal(fn)[-1]


def test_benchmark_percentiles_are_the_simulated_latency():
    exact = nki.benchmark(add)(A, B).latency_ns / 1000
    bench = nki.benchmark(warmup=5, iters=10)(add)
    with pytest.raises(AttributeError, match="call the benchmarked kernel first"):
        _ = bench.benchmark_result
    result = bench(A, B)
    assert bench.benchmark_result is result and (result.warmup, result.iters) == (5, 10)
    lat = bench.benchmark_result.nc_latency
    assert [lat.get_latency_percentile(p) for p in (0, 1, 50, 99, 100)] == [exact] * 5
    np.testing.assert_array_equal(result.outputs, A + B)
    assert nki.jit(mode="benchmark")(add.fn)(A, B).latency_ns == exact * 1000
    np.testing.assert_array_equal(nki.simulate_kernel(bench, A, B), A + B)
    with pytest.raises(KernelError, match="percentile 101"):
        lat.get_latency_percentile(101)
    with pytest.raises(KernelError, match="iters=0"):
        nki.benchmark(iters=0)


def test_jit_modes_are_checked():
    for mode in ("auto", "baremetal", "simulation", "torchxla", "jax"):
        assert nki.jit(add.fn, mode=mode).mode == mode
    with pytest.raises(KernelError, match="mode 'hardware' is not one of 'auto'"):
        nki.jit(add.fn, mode="hardware")


def test_platform_target_override_picks_the_chip(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    assert nki.trace_program(add, A, B).chip.name == "trn1"
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen4")
    assert nki.trace_program(add, A, B).chip.name == "trn3"
    assert nki.trace_program(add, A, B, chip="trn2").chip.name == "trn2"   # an explicit chip still wins
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    with pytest.raises(KernelError, match="NEURON_PLATFORM_TARGET_OVERRIDE='trn9'"):
        nki.trace_program(add, A, B)


def test_profile_captures_every_nth_of_num_execs_executions_of_a_call(tmp_path):
    work = tmp_path / "work"   # made by the call, as the device's profiler makes it
    profiled = nki.profile(working_directory=work, save_trace_name="custom.ntff", save_neff_name="k.neff",
                           num_execs=20, profile_nth=10)(add.fn)
    np.testing.assert_array_equal(profiled(A, B), A + B)
    assert sorted(p.name for p in work.iterdir()) == ["custom_exec_10.ntff", "custom_exec_20.ntff", "json_reports",
                                                     "k.neff"]
    reports = sorted((work / "json_reports").iterdir())
    assert [p.name for p in reports] == ["custom_exec_10.json", "custom_exec_20.json"]
    latency = nki.benchmark(add)(A, B).latency_us
    for path, execution in zip(reports, (10, 20)):
        report = json.loads(path.read_text())
        assert (report["kernel"], report["execution"], report["latency_us"]) == ("add", execution, latency)
    # the trace is Chrome trace-event JSON under the name asked for; the "NEFF" is the Program's listing
    assert json.loads((work / "custom_exec_20.ntff").read_text())["traceEvents"]
    listing = (work / "k.neff").read_text().splitlines()
    assert listing[0].startswith("# add on ") and len(listing) == 1 + len(nki.trace_program(add, A, B).instructions)
    with pytest.raises(KernelError, match="overwrite=True"):
        profiled(A, B)
    profiled_again = nki.profile(working_directory=work, save_trace_name="custom.ntff", save_neff_name="k.neff",
                                 num_execs=20, profile_nth=10, overwrite=True)(add.fn)
    np.testing.assert_array_equal(profiled_again(A, B), A + B)


def test_profile_defaults_and_bad_arguments(tmp_path):
    # one execution, captured: the trace under its own name (n = 1 has no _exec_ suffix)
    nki.profile(working_directory=tmp_path)(add.fn)(A, B)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.neff", "json_reports", "profile.ntff"]
    # fewer executions than profile_nth: the profile_nth-th still runs and is captured
    nki.profile(working_directory=tmp_path / "few", num_execs=1, profile_nth=3)(add.fn)(A, B)
    assert [p.name for p in (tmp_path / "few" / "json_reports").iterdir()] == ["profile_exec_3.json"]
    with pytest.raises(KernelError, match="working_directory="):
        nki.profile(add)
    with pytest.raises(KernelError, match="num_execs"):
        nki.profile(working_directory=tmp_path, num_execs=0)
    with pytest.raises(KernelError, match="save_trace_name='a/b.ntff'"):
        nki.profile(working_directory=tmp_path, save_trace_name="a/b.ntff")


def test_baremetal_saves_a_trace(tmp_path):
    kernel = nki.baremetal(save_trace_name=tmp_path / "run.json")(add.fn)
    np.testing.assert_array_equal(kernel(A, B), A + B)
    assert json.loads((tmp_path / "run.json").read_text())["traceEvents"]


def test_a_legacy_style_test_file_runs_unchanged_under_pytest(pytester):
    # a copy under another module name, outside this suite's conftest, run by pytest itself
    pytester.makepyfile(test_legacy_copy=(ROOT / "tests" / "nki_legacy" / "test_legacy_kernels.py").read_text())
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)


def test_the_dtype_class_is_named_as_in_nki():
    """AWS's NKI library annotates parameters with ``nki.dtype`` (``dtype: nki.dtype =
    nl.bfloat16``), evaluated when the module loads: the name is the class of the data
    types, in ``nki`` and ``nki.language``."""
    import nki
    import nki.language as nl

    assert nki.dtype is nl.dtype
    assert all(isinstance(t, nki.dtype) for t in (nl.bfloat16, nl.float32, nl.int32, nl.float8_e4m3))

    def kernel_params(x, compute_dtype: nki.dtype = nl.bfloat16) -> None:
        return None

    assert kernel_params.__annotations__["compute_dtype"] is nki.dtype


def test_nki_standalone_traces_a_kernel_for_the_library_frameworks_trace_only_mode(tmp_path):
    from neuronxcc.nki_standalone import (NKI_IR_VERSION, _compile_nki_ir_to_tensorizer_ir, _write_tensorizer_ir,
                                          compile_nki_ir_kernel_to_neff)

    def kernel(out, rows: int):
        t = nl.ndarray((rows, 8), nl.float32, buffer=nl.sbuf)
        assert t.shape[0] == 4, f"rows {rows}"
        nl.store(out, nl.add(nl.zeros((rows, 8), nl.float32), 1.0))
        return out

    out = np.zeros((4, 8), np.float32)
    ir, _ = _compile_nki_ir_to_tensorizer_ir(kernel, "trn2", 1, {"out.must_alias_input": out, "rows": 4}, [],
                                             NKI_IR_VERSION.beta2)
    assert ir.program.chip.name == "trn2" and len(ir.program.instructions) > 0
    listing = _write_tensorizer_ir(ir, tmp_path).read_text().splitlines()
    assert listing[0].startswith("# kernel traced by trnsim for trn2") and len(listing) == 1 + len(ir.program.instructions)
    assert compile_nki_ir_kernel_to_neff(kernel, {"out": out, "rows": 4}, [], "trn1", 1, tmp_path / "c").exists()
    with pytest.raises(AssertionError, match="rows 5"):   # the kernel's own check fails the "compile"
        _compile_nki_ir_to_tensorizer_ir(kernel, "trn2", 1, {"out": np.zeros((5, 8), np.float32), "rows": 5}, [])
