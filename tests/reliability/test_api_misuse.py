"""Public entry points misused: the probes of a second adversarial survey, one per fix.

Instruction fidelity and out-of-range dims, numbers taken as file descriptors, a
profile exited without being entered, trace helpers given what is not a trace,
torch.neuron events and generator states, NKI launch grids, and the pytest plugin's
options and marker.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import trnsim
import trnsim.nki as nki
import trnsim.nki.language as nl
from trnsim import trace as T
from trnsim.errors import ChipSpecError, ConfigError, FileWriteError, PathTypeError, TraceFileError, TrnSimError

from .conftest import assert_one_line_error, clean_error, cli


@pytest.fixture
def instruction_fidelity():
    trnsim.set_fidelity("instruction")
    yield
    trnsim.set_fidelity("op")


@pytest.fixture(scope="module")
def saved_trace() -> Path:
    """A small eager trace on disk."""
    path = Path(tempfile.mkdtemp()) / "t.json"
    with trnsim.profile(path):
        x = torch.randn(64, 64, device="neuron")
        (x @ x).sum().item()
    return path


# -- instruction fidelity: a call the CPU refuses is refused, never reinterpreted ----------

_REFUSED_CALLS = {
    "sum dim -3 of 2-d": lambda x: x.sum(-3),
    "mean dim 5": lambda x: x.mean(5),
    "amax dim 2": lambda x: x.amax(2),
    "sum dim listed twice": lambda x: x.sum((0, 0)),
    "softmax dim 3": lambda x: x.softmax(3),
    "log_softmax dim -3": lambda x: x.log_softmax(-3),
    "index_select dim 2": lambda x: x.index_select(2, torch.zeros(1, dtype=torch.long, device=x.device)),
    "cat dim 2": lambda x: torch.cat([x, x], 2),
    "cat mismatched": lambda x: torch.cat([x, x.T]),
}


@pytest.mark.parametrize("name", sorted(_REFUSED_CALLS))
def test_instruction_fidelity_refuses_what_the_cpu_refuses(instruction_fidelity: None, name: str) -> None:
    """An out-of-range dim was wrapped modulo the rank (x.sum(-3) of a 2-d tensor summed
    dim 1): a silent wrong result where the CPU raises IndexError."""
    call = _REFUSED_CALLS[name]
    x = torch.arange(12.).reshape(3, 4)
    with pytest.raises(Exception) as cpu:
        call(x)
    with pytest.raises(type(cpu.value)) as neuron:
        call(x.to("neuron"))
    assert str(neuron.value) == str(cpu.value)


def test_instruction_fidelity_still_computes_valid_dims(instruction_fidelity: None) -> None:
    x = torch.arange(12.).reshape(3, 4)
    n = x.to("neuron")
    assert torch.equal(n.sum(-1).cpu(), x.sum(-1))
    assert torch.allclose(n.softmax(-2).cpu(), x.softmax(-2))


# -- paths: a number is not a file descriptor --------------------------------------------

@pytest.mark.parametrize("bad", [1, 0, None, True, b"t.json", ""])
def test_trace_load_refuses_what_is_not_a_path(bad: object) -> None:
    """trace.load(1) read fd 1 (stdout) and closed it."""
    clean_error(lambda: T.load(bad), "not a path", types=PathTypeError)
    os.fstat(1)   # still open


@pytest.mark.parametrize("bad", [1, 2, True, b"x.json", ""])
def test_writers_refuse_what_is_not_a_path(bad: object, saved_trace: Path) -> None:
    tr = T.load(saved_trace)
    clean_error(lambda: T.save(tr, bad), "not a path", types=PathTypeError)
    clean_error(lambda: trnsim.profile(bad), "not a path", types=PathTypeError)
    clean_error(lambda: T.plot_busy(tr, bad), "not a path", types=PathTypeError)
    os.fstat(1)
    os.fstat(2)


# -- profiles ---------------------------------------------------------------------------

def _ops_recorded() -> int:
    with trnsim.profile() as prof:
        (torch.ones(4, device="neuron") + 1).cpu()
    return len(prof.records)


@pytest.mark.parametrize("misuse", ["exit without enter", "exit twice"])
def test_a_profile_misused_does_not_stop_later_profiles_recording(misuse: str) -> None:
    """__exit__ without __enter__ set the recording count to -1: every later profile
    silently recorded nothing."""
    expected = _ops_recorded()
    assert expected > 0
    prof = trnsim.profile()
    if misuse == "exit twice":
        prof.__enter__()
        prof.__exit__(None, None, None)
    clean_error(lambda: prof.__exit__(None, None, None), "not recording", types=TrnSimError)
    assert _ops_recorded() == expected


# -- trace helpers: what is not a trace, windows that are not windows ----------------------

@pytest.mark.parametrize("bad", [None, 3, [1, 2]])
def test_trace_helpers_refuse_what_is_not_a_trace(bad: object) -> None:
    for fn in (T.summarize, T.plot_busy, T.plot_timeline):
        clean_error(lambda fn=fn: fn(bad), "Trace", type(bad).__name__, types=TrnSimError)
    clean_error(lambda: T.busy_ns(bad), "Slice", types=TrnSimError)


def test_trace_helpers_take_a_saved_trace_path(saved_trace: Path) -> None:
    assert T.summarize(str(saved_trace)) == T.summarize(T.load(saved_trace))
    assert T.plot_busy(saved_trace) is not None


@pytest.mark.parametrize("start, end", [(1e6, 0.0), (-5.0, -1.0), (math.nan, None), ("a", None),
                                        (0.0, math.inf), (10.0, 10.0), (True, None)])
def test_plot_timeline_refuses_windows_that_are_not_windows(saved_trace: Path, start: object, end: object) -> None:
    """start_ns > end_ns and negative windows drew an empty axis; a string start raised
    a raw TypeError from inside the loop."""
    clean_error(lambda: T.plot_timeline(T.load(saved_trace), start_ns=start, end_ns=end), "start_ns",
                types=TrnSimError)


def test_plot_timeline_draws_an_empty_trace() -> None:
    with trnsim.profile() as prof:
        pass
    assert T.plot_timeline(prof.trace()) is not None


# -- fidelity, events, generator states ---------------------------------------------------

@pytest.mark.parametrize("bad", [None, "fast", 1, ""])
def test_set_fidelity_refuses_with_a_config_error(bad: object) -> None:
    before = torch.neuron.fidelity()
    clean_error(lambda: trnsim.set_fidelity(bad), repr(bad), "instruction", types=ConfigError)
    clean_error(lambda: torch.neuron.set_fidelity(bad), repr(bad), types=ValueError)
    assert torch.neuron.fidelity() == before


def test_set_fidelity_takes_a_name_in_any_case() -> None:
    before = torch.neuron.fidelity()
    try:
        trnsim.set_fidelity("OP")
        assert torch.neuron.fidelity() == "op"
        clean_error(lambda: trnsim.set_fidelity("instrution"), "set_fidelity('instrution')",
                    "did you mean 'instruction'?", types=ConfigError)
    finally:
        trnsim.set_fidelity(before)


def test_an_event_never_recorded_is_complete() -> None:
    """As torch.cuda.Event: query() of an unrecorded event is True (it was False)."""
    assert torch.neuron.Event().query() is True


def test_elapsed_time_refuses_what_is_not_an_event() -> None:
    start = torch.neuron.Event(enable_timing=True)
    start.record()
    clean_error(lambda: start.elapsed_time(None), "torch.neuron.Event", types=TypeError)


@pytest.mark.parametrize("device", ["neuron:64", 64, "cpu"])
def test_rng_state_of_a_device_that_is_not_there_is_refused(device: object) -> None:
    """get_rng_state('neuron:1') returned neuron:0's state (now neuron:1 is another core
    with its own generator, and neuron:64 is past device_count())."""
    clean_error(lambda: torch.neuron.get_rng_state(device), types=(RuntimeError, ValueError))
    state = torch.neuron.get_rng_state()
    clean_error(lambda: torch.neuron.set_rng_state(state, device), types=(RuntimeError, ValueError))
    assert torch.equal(torch.neuron.get_rng_state("neuron:0"), state)


def test_another_cores_generator_is_its_own_and_fork_rng_restores_every_one() -> None:
    torch.neuron.manual_seed_all(7)
    mine, other = torch.neuron.get_rng_state(), torch.neuron.get_rng_state(1)
    assert torch.equal(mine, other)               # seeded alike, as manual_seed_all seeds every device
    torch.neuron.set_rng_state(torch.Generator().manual_seed(3).get_state(), 1)
    assert torch.equal(torch.neuron.get_rng_state(), mine)            # this core's untouched
    assert not torch.equal(torch.neuron.get_rng_state(1), other)
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count() and torch.equal(states[0], mine)
    with torch.random.fork_rng(devices=range(torch.neuron.device_count()), device_type="neuron"):
        torch.rand(3, device="neuron")
    assert torch.equal(torch.neuron.get_rng_state(), mine)
    torch.rand(3, device="neuron")
    torch.neuron.set_rng_state_all(states)
    assert all(torch.equal(a, b) for a, b in zip(torch.neuron.get_rng_state_all(), states))


# -- NKI launch grids ---------------------------------------------------------------------

@nki.jit
def _copy(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


def test_a_grid_of_numpy_integers_launches() -> None:
    x = np.ones((128, 64), np.float32)
    assert np.array_equal(np.asarray(_copy[np.int64(2)](x)), x)


@pytest.mark.parametrize("grid", [True, (2, False), 10**9, (65536, 2)])
def test_grids_that_are_not_counts_or_too_large_are_refused(grid: object) -> None:
    """kernel[10**9] traced instance after instance until host memory ran out;
    kernel[True] ran one instance."""
    clean_error(lambda: _copy[grid], "launch grid", types=nki.KernelError)


# -- the pytest plugin --------------------------------------------------------------------

_PLUGIN_TESTS = """
    import os, pytest

    @pytest.mark.nki("trn1")
    def test_positional():
        assert os.environ["TRNSIM_CHIP"] == "trn1"

    @pytest.mark.nki(chip=trnsim_chip)
    def test_chipspec():
        assert os.environ["TRNSIM_CHIP"].endswith("trn3.toml")

    @pytest.mark.nki(chip="trn9")
    def test_bad_marker():
        pass

    @pytest.mark.nki(chips="trn1")
    def test_misspelt_marker():
        pass
"""


def test_plugin_marker(pytester: pytest.Pytester) -> None:
    """@pytest.mark.nki('trn1') (the chip as a positional argument) was silently ignored,
    a ChipSpec was passed on as its repr, and a bad chip failed deep inside the kernel."""
    pytester.makepyfile("import trnsim\ntrnsim_chip = trnsim.load_chip('trn3')\n" + _PLUGIN_TESTS.replace("\n    ", "\n"))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(["*@pytest.mark.nki: unknown chip 'trn9'*", "*the marker takes one chip*"])
    assert "Traceback" not in result.stdout.str()


@pytest.mark.parametrize("option, fragment", [("--trnsim-chip=trn9", "unknown chip 'trn9'"),
                                              ("--trnsim-trace-dir=/dev/null", "trnsim-trace-dir")])
def test_plugin_refuses_bad_options_once(pytester: pytest.Pytester, option: str, fragment: str) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest(option, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: *{fragment}*"])


# -- names the file system refuses ----------------------------------------------------------

@pytest.mark.parametrize("name", ["x" * 5000, "trn2\0", "a/" + "y" * 5000 + ".toml"])
def test_chip_names_the_os_refuses_are_unknown_chips(name: str) -> None:
    """A 5000-character --chip raised a raw OSError (File name too long) from the lookup."""
    clean_error(lambda: trnsim.load_chip(name), "pass a shipped chip", types=ChipSpecError)


@pytest.mark.parametrize("name", ["y" * 5000 + ".json", "d" * 300 + "/x.json", "a\0b.json"])
def test_output_names_the_os_refuses_are_file_errors(name: str, tmp_path: Path, saved_trace: Path) -> None:
    """Too long a name raised a raw OSError, a NUL byte a raw ValueError."""
    path = str(tmp_path / name)
    tr = T.load(saved_trace)
    for write in (lambda: T.save(tr, path), lambda: trnsim.profile(path).__enter__(),
                  lambda: T.plot_busy(tr, path[:-5] + ".png")):
        clean_error(write, types=(FileWriteError, PathTypeError))
    clean_error(lambda: T.load(path), types=(TraceFileError, PathTypeError))


def test_cli_refuses_an_over_long_chip_name() -> None:
    rc, _, err = cli("demo", "--chip", "x" * 5000, "--size", "128", "128", "512")
    assert_one_line_error(rc, err, "unknown chip")


# -- streams and events take streams and events ----------------------------------------------

@pytest.mark.parametrize("misuse", ["stream(1)", "wait_stream(1)", "wait_event(None)", "record(1)", "priority='x'"])
def test_streams_and_events_refuse_what_is_not_one(misuse: str) -> None:
    """Each was accepted and ignored; torch.neuron.stream(1) even made 1 the current stream."""
    N = torch.neuron
    call = {"stream(1)": lambda: N.stream(1), "wait_stream(1)": lambda: N.Stream().wait_stream(1),
            "wait_event(None)": lambda: N.Stream().wait_event(None), "record(1)": lambda: N.Event().record(1),
            "priority='x'": lambda: N.Stream(priority="x")}[misuse]
    clean_error(call, "torch.neuron" if misuse != "priority='x'" else "priority", types=TypeError)
    assert N.current_stream() is N.default_stream()


def test_a_stream_on_a_cpu_device_is_refused() -> None:
    """Stream(device='cpu') made a neuron:0 stream."""
    clean_error(lambda: torch.neuron.Stream(device="cpu"), "neuron device", types=ValueError)


# -- nki.typed: integer arguments are integers ---------------------------------------------

@pytest.mark.parametrize("values, dtype, first", [([[300.5, -1.5]], nl.int8, "300.5"), ([[300, -129]], nl.int8, "300"),
                                                  ([[-1, 7]], nl.uint8, "-1"), ([[math.nan]], nl.int32, "nan"),
                                                  ([[2**40]], nl.int32, "1099511627776"), ([[0.5]], nl.int16, "0.5")])
def test_typed_refuses_values_an_integer_dtype_cannot_hold(values: list, dtype: object, first: str) -> None:
    """nki.typed(array, int8) saturated 300 to 127, rounded 2.5 to 2 and made NaN 0, silently."""
    clean_error(lambda: nki.typed(np.array(values), dtype), first, "np.clip", types=nki.KernelError)


def test_typed_takes_integral_floats_and_the_full_range() -> None:
    x = np.array([[1.0, -3.0, 127.0, -128.0]])
    assert np.array_equal(np.asarray(_copy(nki.typed(x, nl.int8))), x.astype(np.int8))
    big = np.array([[0, 4294967295]])
    assert np.array_equal(np.asarray(_copy(nki.typed(big, nl.uint32))), big.astype(np.uint32))


def test_program_inputs_refuse_values_an_integer_tensor_cannot_hold() -> None:
    """simulate(..., inputs=) saturated and rounded them silently, as typed() did."""
    p = nki.trace_program(_copy, nki.typed(np.zeros((128, 4)), nl.int8))
    clean_error(lambda: trnsim.simulate(p, {"x": np.full((128, 4), 300.0)}, fidelity="instruction"),
                "not int8 values", "300.0", types=trnsim.ProgramError)
    out = trnsim.simulate(p, {"x": np.full((128, 4), -7)}, fidelity="instruction").outputs
    assert (next(iter(out.values())) == -7).all()


# -- TRNSIM_CHIP: one reader ---------------------------------------------------------------

def test_an_empty_trnsim_chip_means_the_default_everywhere() -> None:
    """load_chip took TRNSIM_CHIP='' as unset, NKI kernels (and so `trnsim demo`) as
    chip '' and refused it."""
    rc, out, err = cli("demo", "--size", "128", "128", "512", "--trace", os.devnull, env={"TRNSIM_CHIP": ""})
    assert rc == 0, err
    assert "trn2" in out


def test_a_bad_trnsim_chip_is_named_as_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRNSIM_CHIP", "trn9")
    clean_error(lambda: trnsim.load_chip(), "TRNSIM_CHIP='trn9'", "unknown chip", types=ChipSpecError)
    rc, _, err = cli("demo", "--size", "128", "128", "512", "--trace", os.devnull)
    assert_one_line_error(rc, err, "TRNSIM_CHIP='trn9'")


# -- timing fidelity: dims the meta kernels do not check ----------------------------------

_DIM_OPS = {
    "softmax": lambda a, i: a.softmax(5), "log_softmax": lambda a, i: a.log_softmax(5), "cumsum": lambda a, i: a.cumsum(5),
    "sort": lambda a, i: a.sort(5), "argsort": lambda a, i: a.argsort(5), "sort stable": lambda a, i: a.sort(stable=True, dim=5),
    "topk": lambda a, i: a.topk(1, 5), "flip": lambda a, i: a.flip(5), "roll": lambda a, i: a.roll(1, 5),
    "select": lambda a, i: a.select(5, 0), "squeeze": lambda a, i: a.squeeze(5), "transpose": lambda a, i: a.transpose(0, 5),
    "mean": lambda a, i: a.mean(5), "var": lambda a, i: a.var(5), "logsumexp": lambda a, i: a.logsumexp(5),
    "gather": lambda a, i: a.gather(5, i), "index_select": lambda a, i: a.index_select(5, i[0]),
    "cat": lambda a, i: torch.cat([a, a], 5), "max": lambda a, i: a.max(5), "argmax": lambda a, i: a.argmax(5),
    "kthvalue": lambda a, i: a.kthvalue(1, 5), "median": lambda a, i: a.median(5), "cummax": lambda a, i: a.cummax(5),
    "prod": lambda a, i: a.prod(5), "norm": lambda a, i: a.norm(dim=5), "unbind": lambda a, i: a.unbind(5),
}


@pytest.mark.parametrize("name", sorted(_DIM_OPS))
def test_timing_fidelity_refuses_dims_out_of_range(name: str) -> None:
    """softmax, sort and argsort took dim 5 of a 2-d tensor under timing fidelity (their
    meta kernels do not check it), timing an op the CPU refuses."""
    call = _DIM_OPS[name]
    with pytest.raises(IndexError) as cpu:
        call(torch.ones(3, 4), torch.zeros(3, 4, dtype=torch.long))
    trnsim.set_fidelity("timing")
    try:
        a = torch.ones(3, 4, device="neuron")
        i = torch.zeros(3, 4, dtype=torch.long, device="neuron")
        with pytest.raises(IndexError) as neuron:
            call(a, i)
    finally:
        trnsim.set_fidelity("op")
    if str(cpu.value).startswith("Dimension out of range"):
        assert str(neuron.value) == str(cpu.value)


def test_timing_fidelity_still_times_valid_dims() -> None:
    trnsim.set_fidelity("timing")
    try:
        a = torch.ones(3, 4, device="neuron")
        assert a.softmax(-1).shape == (3, 4) and a.sort(0).values.shape == (3, 4)
        assert a.argsort(dim=1, stable=True).shape == (3, 4)
    finally:
        trnsim.set_fidelity("op")


def test_report_refuses_an_empty_plot_path(tmp_path: Path) -> None:
    from trnsim.trace.events import Slice, Trace

    trace = Trace(process="p")
    trace.slices.append(Slice("ops", "aten::add", 0.0, 10.0, {}))
    path = T.save(trace, tmp_path / "t.json")
    rc, out, err = cli("report", str(path), "--plot", "")
    assert_one_line_error(rc, err, "image path ''")
    assert out == ""


def test_assert_kernel_matches_needs_a_reference_function() -> None:
    from trnsim.testing import assert_kernel_matches

    clean_error(lambda: assert_kernel_matches(lambda x: x, None, np.ones((128, 4), np.float32)),
                "needs a reference function", "not NoneType", types=TypeError)
