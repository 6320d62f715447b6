"""trnsim validate: the published figures, the table, the summary and the optimisation steps."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from trnsim import dtypes
from trnsim.errors import ConfigError
from trnsim.hw.dma import plan_dma
from trnsim.hw.fabric import Fabric
from trnsim.hw.spec import load_chip
from trnsim.nki import KernelError, jit, language as nl, trace_program, typed
from trnsim.validate import Figure, Sources, all_figures, report, run, steps, summary


def _figure(key="k", published=10.0, kind="kernel", group="check", series=None, order=0, value=12.0, repo=None):
    return Figure(key=key, kind=kind, what=key, chip="trn1", source="a page", published=published, unit="us",
                  group=group, runs="a kernel", simulate=lambda _: value, repo=repo, series=series, order=order)


def test_every_figure_names_its_source_kind_and_group():
    figures = all_figures()
    assert len({f.key for f in figures}) == len(figures)
    assert {f.kind for f in figures} == {"kernel", "dma", "collective", "e2e"}
    assert {f.group for f in figures} == {"fit", "check"}
    assert all(f.source and f.runs and f.published > 0 for f in figures)


def test_a_figure_with_a_bad_kind_group_or_value_is_refused():
    for bad in ({"kind": "speed"}, {"group": "tuned"}, {"published": 0.0}):
        with pytest.raises(ValueError, match="figure k"):
            _figure(**bad)


def test_error_is_simulated_over_published_and_the_summary_takes_median_and_worst():
    results = run([_figure("a", 10.0, value=12.0), _figure("b", 10.0, value=9.0),
                   _figure("c", 10.0, value=10.5, group="fit"), _figure("d", 20.0, kind="dma", value=10.0)])
    assert [round(r.error, 6) for r in results] == [0.2, -0.1, 0.05, -0.5]
    rows = {(k, g): (n, round(med, 6), round(worst, 6)) for k, g, n, med, worst, _ in summary(results)}
    assert rows[("kernel", "check")] == (2, 0.15, 0.2)
    assert rows[("kernel", "fit")] == (1, 0.05, 0.05)
    assert rows[("dma", "check")] == (1, 0.5, 0.5)
    assert rows[("all", "all")] == (4, 0.15, 0.5)


def test_a_reversed_optimisation_step_is_reported():
    # published: 100 -> 50 (2x faster); simulated: 40 -> 60 (slower): reversed
    results = run([_figure("before", 100.0, series="t", order=0, value=40.0),
                   _figure("after", 50.0, series="t", order=1, value=60.0)])
    (step,) = steps(results)
    assert step.published == 2.0 and round(step.simulated, 6) == round(40 / 60, 6) and not step.kept
    assert "REVERSED" in report(results)
    (kept,) = steps(run([_figure("b", 100.0, series="t", value=90.0), _figure("a", 50.0, series="t", order=1,
                                                                              value=45.0)]))
    assert kept.kept and kept.error == pytest.approx(0.0)


def test_code_trnsim_refuses_counts_against_it_and_its_step_is_not_kept():
    def refuse(_):
        raise KernelError("SBUF allocation 'x' does not fit on trn1")

    before = _figure("before", 100.0, series="t", order=0, value=40.0)
    after = Figure(key="after", kind="kernel", what="after", chip="trn1", source="a page", published=50.0, unit="us",
                   group="check", runs="a kernel", simulate=refuse, series="t", order=1)
    results = run([before, after])
    assert results[1].simulated is None and results[1].skipped is None
    assert results[1].refused == "SBUF allocation 'x' does not fit on trn1"
    rows = {(k, g): row for k, g, *row in summary(results)}
    assert rows[("kernel", "check")] == [1, pytest.approx(0.6), pytest.approx(0.6), 1]
    (step,) = steps(results)
    assert step.simulated is None and step.error is None and not step.kept
    text = report(results)
    assert "REFUSED: SBUF allocation 'x'" in text and "NOT RUN (refused)" in text
    # an error that is not trnsim's refusal (a bug in the figure) still raises
    crash = Figure(key="c", kind="kernel", what="c", chip="trn1", source="a page", published=1.0, unit="us",
                   group="check", runs="a kernel", simulate=lambda _: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run([crash])


def test_public_code_without_its_repository_is_skipped_by_name():
    (result,) = run([_figure(repo="aws-neuron-sdk")])
    assert result.simulated is None and result.error is None and "--aws-neuron-sdk" in result.skipped
    assert "skipped: needs --aws-neuron-sdk PATH" in report([result])
    with pytest.raises(ConfigError, match="pass --aws-neuron-sdk PATH"):
        Sources().read("aws-neuron-sdk", "HEAD", "x.py")


def test_public_code_is_read_at_its_commit_from_a_git_repository(tmp_path):
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "k.py").write_text("OLD = 1\n")
    subprocess.run([*git, "add", "k.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    (tmp_path / "k.py").write_text("NEW = 2\n")
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    sources = Sources({"repo": tmp_path})
    assert sources.read("repo", "HEAD~1", "k.py") == "OLD = 1\n"
    assert sources.read("repo", "HEAD", "k.py") == "NEW = 2\n"
    with pytest.raises(ConfigError, match="has no missing.py at HEAD"):
        sources.read("repo", "HEAD", "missing.py")


_FAKE_POOL = """
import neuronxcc.nki.language as nl
from neuronxcc import nki

SEEN = []


@nki.jit
def adaptive_avg_pool2d_kernel(in_tensor, output_size):
    SEEN.append((tuple(in_tensor.shape), str(in_tensor.dtype), output_size))
    out = nl.ndarray((128, 1), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.zeros((128, 1), dtype=in_tensor.dtype))
    return out
"""


def test_the_pool_figures_run_nki_samples_kernel_at_each_perf_case_on_trn2(tmp_path):
    from trnsim.validate.kernels import public_module

    pools = [f for f in all_figures() if f.key.startswith("pool.")]
    assert len(pools) == 9 and {f.chip for f in pools} == {"trn2"} and {f.repo for f in pools} == {"nki-samples"}
    assert [f.published for f in pools] == [65, 109, 88, 152, 327, 14, 103, 564, 255]   # the tests' "N * 1.05"
    (result,) = run(pools[:1])
    assert "needs --nki-samples PATH" in result.skipped
    kernel = tmp_path / "src" / "nki_samples" / "reference" / "vision.py"
    kernel.parent.mkdir(parents=True)
    kernel.write_text(_FAKE_POOL)   # a directory (no git): the file as it stands
    sources = Sources({"nki-samples": tmp_path})
    results = run([pools[2], pools[3]], sources)
    assert all(r.simulated is not None and r.simulated > 0 for r in results)
    seen = public_module(sources, "nki-samples", "0898a77", "src/nki_samples/reference/vision.py").SEEN
    assert seen == [((1, 256, 14, 14), "float16", 7), ((4, 64, 56, 56), "float32", (7, 7))]


def test_collective_figures_are_exact_and_the_fit_figures_lie_within_a_fifth():
    results = run([f for f in all_figures() if f.kind == "collective"])
    by_key = {r.figure.key: r for r in results}
    assert by_key["nccom.allr2.1073741824"].simulated == pytest.approx(17733.5324, abs=1e-3)
    assert by_key["nccom.allg8.1024"].simulated == pytest.approx(9.83475, abs=1e-4)
    fit = [r for r in results if r.figure.group == "fit"]
    assert fit and all(abs(r.error) < 0.2 for r in fit)


def test_the_dma_figure_times_one_engine_for_four_partitions():
    (result,) = run([f for f in all_figures() if f.kind == "dma"])
    assert result.simulated == pytest.approx(1520.696)


def test_a_dma_uses_the_engines_of_the_partitions_it_touches():
    chip = load_chip("trn2")

    @jit
    def load(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(a))
        return out

    def own_ps(rows):
        program = trace_program(load, typed(np.zeros((rows, 4096), np.float32), dtypes.bfloat16), chip="trn2")
        return plan_dma(chip, program.instructions[0]).own_ps

    per = own_ps(1)   # one descriptor (a row of 8 KiB), rounded to the picosecond
    assert own_ps(4) == pytest.approx(4 * per, abs=4)     # one engine serves partitions 0-7
    assert own_ps(8) == pytest.approx(8 * per, abs=8)
    assert own_ps(12) == own_ps(8)                        # partitions 8-11 go to the second engine, at once
    assert own_ps(128) == own_ps(8)                       # 16 engines of 8 partitions each


def test_reducing_collectives_pay_their_own_fixed_cost_and_every_transfer_passes_the_sender_dma():
    fabric = load_chip("trn1").fabric
    f = Fabric("trn1.32xlarge", 2)
    gather, reduce = f.estimate("all_gather", 0), f.estimate("all_reduce", 0)
    assert gather.duration_ns == pytest.approx(fabric.collective_fixed_ns + fabric.intra_chip_hop_latency_ns)
    assert reduce.duration_ns - gather.duration_ns == pytest.approx(
        fabric.reduce_fixed_ns - fabric.collective_fixed_ns + fabric.intra_chip_hop_latency_ns)
    f.collective("all_gather", 1 << 20)
    busy = f.link_busy()
    assert {("cc-dma", 0), ("cc-dma", 1)} <= set(busy)
    # each rank sends its half through its own DMA at collective_dma_gbps
    (start, end), = busy[("cc-dma", 0)]
    assert end - start == pytest.approx((1 << 19) / fabric.collective_dma_gbps)


def test_the_command_prints_the_table_and_refuses_a_missing_repository(tmp_path):
    out = subprocess.run([sys.executable, "-m", "trnsim.cli", "validate", "--kind", "dma", "--json",
                          str(tmp_path / "v.json")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "nki-dma-overview.rst, Example 1" in out.stdout and "median |error|" in out.stdout
    assert '"kind": "dma"' in (tmp_path / "v.json").read_text()
    bad = subprocess.run([sys.executable, "-m", "trnsim.cli", "validate", "--aws-neuron-sdk", str(tmp_path / "no")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "is not a directory" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "trnsim.cli", "validate", "--nki-samples", str(tmp_path / "no")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--nki-samples" in bad.stderr and "aws-neuron/nki-samples" in bad.stderr
