"""The comparison of printed output (tests/printed.py) ignores the host's rounding noise
and nothing else."""

import pytest

from tests.printed import differences

RUN = """\
result         matches numpy (max abs error 0.000114, relative 7.2e-07)
ops            160 calls, 1,343.858 us (67.0% of the simulated time)
losses         7.07513 6.20641 5.37329 on neuron
"""


@pytest.mark.parametrize("other", [
    RUN,
    RUN.replace("7.2e-07", "8.3e-07").replace("0.000114", "0.000131"),
    RUN.replace("7.07513", "7.07514"),
    RUN.rstrip("\n"),
    RUN.replace("160 calls,", "160  calls,"),
])
def test_noise_matches(other):
    assert differences(RUN, other) == []


def test_host_times_are_not_compared():
    line = "compilation    1 graph, 5.1 s on this host; the Neuron compiler would take about 6 s\n"
    assert differences(line, line.replace("5.1 s", "13.7 s")) == []
    assert differences(line, line.replace("about 6 s", "about 7 s")) != []
    assert differences("trnsim host 1.48 s\n", "trnsim host 0.91 s\n") == []


def test_temporary_folders_are_not_compared():
    assert differences("adapter /tmp/trl_sft_.../adapter ok\n", "adapter /tmp/trl_sft_x81k2/adapter ok\n") == []
    assert differences("adapter /tmp/a/adapter ok\n", "adapter /tmp/a/model ok\n") != []


@pytest.mark.parametrize("other, says", [
    (RUN.replace("1,343.858", "1,375.374"), "1,343.858 became 1,375.374"),
    (RUN.replace("67.0%", "66.9%"), "67.0 became 66.9"),
    (RUN.replace("1,343.858", "1,343.859"), "1,343.858 became 1,343.859"),
    (RUN.replace("160 calls", "161 calls"), "160 became 161"),
    (RUN.replace("on neuron", "on cpu"), "line 3"),
    (RUN.replace("losses         7.07513 6.20641", "losses         7.07513"), "line 3"),
    (RUN + "trace          t.json\n", "got 1 more line(s), from 'trace          t.json'"),
    (RUN.split("\n", 1)[1], "line 1"),
])
def test_real_changes_are_found(other, says):
    found = differences(RUN, other)
    assert found and says in "\n".join(found)
