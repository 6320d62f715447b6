"""Chip descriptions: the shipped chips, what-if overrides and loader errors."""

import pytest

from trnsim import ChipSpecError, load_chip, shipped_chips
from trnsim.hw.spec import DEFAULT_CHIP

PUBLISHED_PER_CORE_BF16_TFLOPS = {"trn1": 92, "trn2": 79, "trn3": 79}
PUBLISHED_PER_CORE_FP32_TFLOPS = {"trn1": 23, "trn2": 20, "trn3": 20}


def test_shipped_chips():
    assert shipped_chips() == ["trn1", "trn2", "trn3"]
    assert DEFAULT_CHIP == "trn2"


@pytest.mark.parametrize("name", ["trn1", "trn2", "trn3"])
def test_derived_peak_matches_published(name):
    chip = load_chip(name)
    assert chip.name == name
    assert chip.tensor_engine.peak_flops() / 1e12 == pytest.approx(PUBLISHED_PER_CORE_BF16_TFLOPS[name], abs=0.5)
    assert chip.tensor_engine.peak_flops(fp32=True) / 1e12 == pytest.approx(PUBLISHED_PER_CORE_FP32_TFLOPS[name], abs=0.5)


def test_generations_inherit_and_override():
    trn1, trn2, trn3 = load_chip("trn1"), load_chip("trn2"), load_chip("trn3")
    assert (trn1.sbuf.partition_kib, trn2.sbuf.partition_kib, trn3.sbuf.partition_kib) == (192, 224, 256)
    assert trn2.psum == trn1.psum  # inherited unchanged
    assert trn1.tensor_engine.clock_ghz == 2.8 and trn2.tensor_engine.clock_ghz == 2.4
    assert trn2.hbm.bw_gbps == 2900 and trn2.logical_core_size == 2
    assert trn1.dma_bw_gbps == 272 and trn2.dma_bw_gbps == 368 and trn3.dma_bw_gbps == 528
    assert trn2.instance("trn2.48xlarge").shape == (4, 4)
    with pytest.raises(ChipSpecError, match="no instance 'p5'.*trn2.48xlarge"):
        trn2.instance("p5")


def test_default_chip_from_environment(monkeypatch):
    monkeypatch.setenv("TRNSIM_CHIP", "trn1")
    assert load_chip().name == "trn1"
    monkeypatch.delenv("TRNSIM_CHIP")
    assert load_chip().name == "trn2"


def test_what_if_chip_overrides_a_shipped_one(tmp_path):
    path = tmp_path / "bigsbuf.toml"
    path.write_text('extends = "trn2"\n[chip]\nname = "trn2-bigsbuf"\n[sbuf]\npartition_kib = 512\n[hbm]\nbw_gbps = 5800\n')
    chip = load_chip(path)
    assert chip.name == "trn2-bigsbuf"
    assert chip.sbuf.partition_kib == 512 and chip.hbm.bw_gbps == 5800
    assert chip.tensor_engine == load_chip("trn2").tensor_engine


@pytest.mark.parametrize("body, message", [
    ('extends = "trn2"\n[sbuf]\npartition_kib = "big"\n',
     r"key 'sbuf.partition_kib' is 'big' \(a string\); allowed: a whole number from 1 to 16,384 \(KiB\)"),
    ('extends = "trn2"\n[tensor_engine]\nclock_ghz = true\n', r"key 'tensor_engine.clock_ghz' is True \(a boolean\)"),
    ('extends = "trn2"\n[sbuf]\npartition_kb = 512\n',
     r"unknown key 'sbuf.partition_kb'; did you mean 'partition_kib'\? \[sbuf\] has: partitions, partition_kib"),
    ('extends = "trn2"\n[sbufs]\npartition_kib = 512\n', r"unknown table 'sbufs'; did you mean 'sbuf'\?"),
    ('extends = "trn9"\n',
     r"key 'extends' names unknown chip 'trn9'; did you mean 'trn\d'\? pass a shipped chip \(trn1, trn2, trn3\)"),
    ('[chip]\nname = "x"\n', r"missing key 'chip.generation' \(a string\); write it, or start from a shipped chip"),
    ('extends = "trn2"\n[dma]\nengine_bw_gbps = 0\n',
     r"key 'dma.engine_bw_gbps' is 0 \(an integer\); allowed: a finite number from 0.1"),
    ('extends = "trn2"\n[hbm]\nbw_gbps = -1\n', r"key 'hbm.bw_gbps' is -1"),
    ('extends = "trn2"\n[hbm]\ncapacity_gib = inf\n',
     r"key 'hbm.capacity_gib' is inf \(a float\); allowed: a finite number from 0.001 to 65,536 \(GiB\)"),
    ('extends = "trn2"\n[hbm]\nbw_gbps = nan\n', r"key 'hbm.bw_gbps' is nan"),
    ('extends = "trn2"\n[hbm]\ncapacity_gib = 1e30\n', r"key 'hbm.capacity_gib' is 1e\+30"),
    ('extends = "trn2"\n[sbuf]\npartitions = 100000000000000000000\n', r"key 'sbuf.partitions' is 100000000000000000000"),
    ('extends = "trn2"\n[tensor_engine]\nclock_ghz = 1e9\n', r"key 'tensor_engine.clock_ghz' is 1000000000.0 .* to 100 \(GHz\)"),
    ('extends = "trn2"\n[sbuf]\npartitions = 128.0\n',
     r"key 'sbuf.partitions' is 128.0 \(a float\); allowed: a whole number .*; write 128"),
    ('extends = "trn2"\n[chip]\nlogical_core_size = 0\n', r"key 'chip.logical_core_size' is 0"),
    ('extends = "trn2"\n[chip]\nlogical_core_size = 64\n',
     r"key 'chip.logical_core_size' is 64; allowed: a divisor of cores_per_chip \(8\): 1, 2, 4, 8"),
    ('extends = "trn2"\n[chip]\nname = "a\\nb"\n', r"key 'chip.name' is 'a\\nb' \(a string\); allowed: a printable name"),
    ('extends = "trn2"\n[psum]\nbanks = 7\n', r"key 'psum.banks' is 7; allowed: a count that splits partition_kib"),
    ('extends = "trn2"\n[[instance]]\nname = "x"\nchips = 2\ntopology = "ring"\nshape = "2"\n',
     r"key 'instance\[0\].shape' is '2' \(a string\); allowed: an array of 1 to 8 whole numbers"),
    ('extends = "trn2"\n[[instance]]\nname = "x"\nchips = 2\ntopology = "ring"\nshape = [3]\n',
     r"key 'instance\[0\].shape' is \[3\]; allowed: a layout of exactly chips \(2\) chips"),
    ('extends = "trn2"\n[[instance]]\nname = "x"\nchips = 1\ntopology = "ring"\nshape = [1]\n'
     '[[instance]]\nname = "x"\nchips = 1\ntopology = "ring"\nshape = [1]\n', r"key 'instance' names 'x' twice"),
    ('extends = "trn2"\ninstance = 3\n', r"key 'instance' is 3 \(an integer\); allowed: an array of tables"),
    ('extends = "trn2"\n[instance]\nname = "x"\n', r"key 'instance' is \{'name': 'x'\} \(a table\); allowed: an array of tables"),
    ('extends = "trn2"\n[sbuf\n', r"not valid TOML"),
    ('extends = "trn2"\nx = [' + '[' * 5000 + '\n', r"not valid TOML"),
    ('extends = 3\n', r"key 'extends' is 3 \(an integer\)"),
    ('extends = "nope.toml"\n', r"key 'extends' is 'nope.toml', but .*nope.toml does not exist"),
])
def test_errors_name_file_key_and_type(tmp_path, body, message):
    path = tmp_path / "mine.toml"
    path.write_text(body)
    with pytest.raises(ChipSpecError, match=message) as info:
        load_chip(path)
    assert str(info.value).startswith(str(path)), "the message names the file first"
    assert "\n" not in str(info.value)


def test_unknown_chip_name_and_missing_file(tmp_path):
    with pytest.raises(ChipSpecError, match="unknown chip 'trn4'; did you mean"):
        load_chip("trn4")
    with pytest.raises(ChipSpecError, match="does not exist"):
        load_chip(tmp_path / "nope.toml")


def test_extends_cycle_is_reported(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(ChipSpecError, match="cycle"):
        load_chip(tmp_path / "a.toml")


def test_specs_are_frozen():
    chip = load_chip("trn1")
    with pytest.raises(AttributeError):
        chip.sbuf.partition_kib = 1  # type: ignore[misc]


def test_every_figure_has_a_documented_range():
    import dataclasses
    import typing

    from trnsim.hw.spec import FIGURE_RANGES, _TABLES, ChipSpec, InstanceSpec

    for cls in [*_TABLES.values(), InstanceSpec, ChipSpec]:
        for field in dataclasses.fields(cls):
            hint = typing.get_type_hints(cls)[field.name]
            if hint in (int, float) or hint == tuple[int, ...]:
                r = FIGURE_RANGES[field.name]
                assert 0 <= r.low < r.high < 1e10 and r.unit, (cls.__name__, field.name)
