"""Chip descriptions: frozen dataclasses and the one loader of ``chips/*.toml``.

A chip file holds every figure the hardware model uses, each with its unit in
the key. A file may name another chip with ``extends = "trn1"`` and then only
write what differs; tables merge key by key, arrays of tables replace. A user's
own TOML (what-if hardware) works the same way: ``extends = "trn2"`` plus the
figures to change.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from trnsim.errors import ChipSpecError

CHIPS_DIR = Path(__file__).parent / "chips"
DEFAULT_CHIP = "trn2"


@dataclass(frozen=True)
class TensorEngineSpec:
    """The PE array: a matmul streams the moving tile past a loaded stationary tile."""

    clock_ghz: float
    pe_rows: int
    pe_cols: int
    moving_free_max: int
    stationary_free_max: int
    fixed_cycles: int
    stationary_min_cycles: int
    fp32_cycle_factor: int
    fp8_rows_factor: int
    stationary_load_speedup: int

    def peak_flops(self, fp32: bool = False) -> float:
        """Peak multiply-accumulate throughput in FLOP/s (2 FLOPs per MAC)."""
        rate = 2.0 * self.pe_rows * self.pe_cols * self.clock_ghz * 1e9
        return rate / self.fp32_cycle_factor if fp32 else rate


@dataclass(frozen=True)
class VectorEngineSpec:
    """A 128-lane engine (vector or scalar): one lane per partition."""

    clock_ghz: float
    lanes: int
    min_cycles: int
    sbuf_access_cycles: int
    dependent_issue_cycles: int
    bf16_speedup: int
    reciprocal_cycle_factor: int
    large_stride_bytes: int


@dataclass(frozen=True)
class GpSimdSpec:
    """General-purpose SIMD cores, each serving a group of partitions."""

    clock_ghz: float
    cores: int
    partitions_per_core: int
    fixed_cycles: int
    cycles_per_element: int


@dataclass(frozen=True)
class SbufSpec:
    """State buffer: on-chip scratchpad of ``partitions`` x ``partition_kib``."""

    partitions: int
    partition_kib: int

    @property
    def partition_bytes(self) -> int:
        return self.partition_kib * 1024


@dataclass(frozen=True)
class PsumSpec:
    """Partial-sum buffer: matmul accumulators, split into ``banks`` per partition."""

    partitions: int
    partition_kib: int
    banks: int

    @property
    def partition_bytes(self) -> int:
        return self.partition_kib * 1024

    @property
    def bank_bytes(self) -> int:
        return self.partition_bytes // self.banks


@dataclass(frozen=True)
class HbmSpec:
    """Device memory of the whole chip, shared by its cores."""

    capacity_gib: float
    bw_gbps: float

    @property
    def capacity_bytes(self) -> int:
        return int(self.capacity_gib * 1024**3)


@dataclass(frozen=True)
class DmaSpec:
    """DMA engines of one core; queues feed them, descriptors are contiguous chunks."""

    engines: int
    queues_per_engine: int
    engine_bw_gbps: float
    fixed_ns: float
    descriptor_overhead_ns: float
    max_descriptor_kib: int
    semaphore_to_start_ns: float


@dataclass(frozen=True)
class SyncSpec:
    """Cross-engine synchronisation through semaphores."""

    semaphore_wait_ns: float


@dataclass(frozen=True)
class RuntimeSpec:
    """The host runtime driving one core in eager mode."""

    op_launch_us: float

    @property
    def op_launch_ps(self) -> int:
        return round(self.op_launch_us * 1_000_000)


@dataclass(frozen=True)
class NeuronLinkSpec:
    """Chip-to-chip links for collectives."""

    version: int
    chip_bw_gbps: float
    hop_latency_ns: float
    inter_instance_hop_latency_ns: float


@dataclass(frozen=True)
class InstanceSpec:
    """A machine built from several chips and how they are wired."""

    name: str
    chips: int
    topology: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ChipSpec:
    """One Trainium chip: identity, memories, engines, links and instances."""

    name: str
    generation: str
    neuron_core: str
    cores_per_chip: int
    logical_core_size: int
    published_peak_bf16_tflops: float
    published_peak_fp32_tflops: float
    hbm: HbmSpec
    tensor_engine: TensorEngineSpec
    vector_engine: VectorEngineSpec
    scalar_engine: VectorEngineSpec
    gpsimd: GpSimdSpec
    sbuf: SbufSpec
    psum: PsumSpec
    dma: DmaSpec
    sync: SyncSpec
    runtime: RuntimeSpec
    neuronlink: NeuronLinkSpec
    instances: tuple[InstanceSpec, ...]
    source: str

    @property
    def device_hbm_bytes(self) -> int:
        """HBM one logical core (one process's ``neuron`` device) owns: its cores' share."""
        return self.hbm.capacity_bytes * self.logical_core_size // self.cores_per_chip

    @property
    def hbm_bw_per_core_gbps(self) -> float:
        """Each physical core's share of the chip's HBM bandwidth."""
        return self.hbm.bw_gbps / self.cores_per_chip

    @property
    def dma_bw_gbps(self) -> float:
        """Aggregate DMA bandwidth of one core (all engines together)."""
        return self.dma.engines * self.dma.engine_bw_gbps

    def instance(self, name: str) -> InstanceSpec:
        """The instance called ``name``; raises ChipSpecError listing the known ones."""
        for inst in self.instances:
            if inst.name == name:
                return inst
        known = ", ".join(i.name for i in self.instances)
        raise ChipSpecError(f"chip {self.name} has no instance {name!r}; known: {known}")


# Each TOML table and the dataclass it fills.
_TABLES: dict[str, type] = {
    "hbm": HbmSpec,
    "tensor_engine": TensorEngineSpec,
    "vector_engine": VectorEngineSpec,
    "scalar_engine": VectorEngineSpec,
    "gpsimd": GpSimdSpec,
    "sbuf": SbufSpec,
    "psum": PsumSpec,
    "dma": DmaSpec,
    "sync": SyncSpec,
    "runtime": RuntimeSpec,
    "neuronlink": NeuronLinkSpec,
}


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ChipSpecError(f"{path}: not valid TOML: {e}") from None


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _resolve_path(name_or_path: str | os.PathLike) -> Path:
    text = os.fspath(name_or_path)
    if text.endswith(".toml") or os.sep in text or "/" in text:
        path = Path(text)
        if not path.is_file():
            raise ChipSpecError(f"chip file {path} does not exist; pass a shipped chip name ({', '.join(shipped_chips())}) or a path to a TOML file")
        return path
    path = CHIPS_DIR / f"{text}.toml"
    if not path.is_file():
        raise ChipSpecError(f"unknown chip {text!r}; shipped chips: {', '.join(shipped_chips())}, or pass a path to a TOML file")
    return path


def _load_raw(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    if path.resolve() in seen:
        chain = " -> ".join(str(p) for p in seen + (path,))
        raise ChipSpecError(f"{path}: 'extends' forms a cycle: {chain}")
    data = _read_toml(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ChipSpecError(f"{path}: key 'extends' must be a chip name or path (str), got {type(parent).__name__}")
    beside = path.parent / parent
    parent_path = beside if parent.endswith(".toml") and beside.is_file() else _resolve_path(parent)
    return _merge(_load_raw(parent_path, seen + (path.resolve(),)), data)


def _check_value(path: Path, key: str, value: object, expected: object) -> object:
    if expected is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ChipSpecError(f"{path}: key '{key}' must be a number (float), got {value!r}")
        if value < 0:
            raise ChipSpecError(f"{path}: key '{key}' must not be negative, got {value!r}")
        return float(value)
    if expected is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ChipSpecError(f"{path}: key '{key}' must be an integer (int), got {value!r}")
        if value < 0:
            raise ChipSpecError(f"{path}: key '{key}' must not be negative, got {value!r}")
        return value
    if expected is str:
        if not isinstance(value, str):
            raise ChipSpecError(f"{path}: key '{key}' must be a string (str), got {value!r}")
        return value
    if typing.get_origin(expected) is tuple:
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ChipSpecError(f"{path}: key '{key}' must be a list of integers, got {value!r}")
        return tuple(value)
    raise ChipSpecError(f"{path}: key '{key}' has unsupported type {expected}")  # pragma: no cover


def _build(cls: type, table: object, path: Path, where: str) -> object:
    if not isinstance(table, dict):
        raise ChipSpecError(f"{path}: '{where}' must be a table, got {table!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(table) - set(names))
    if unknown:
        raise ChipSpecError(f"{path}: unknown key '{where}.{unknown[0]}'; keys of [{where}] are: {', '.join(names)}")
    values = {}
    for name in names:
        if name not in table:
            raise ChipSpecError(f"{path}: missing key '{where}.{name}' ({hints[name].__name__ if isinstance(hints[name], type) else hints[name]})")
        values[name] = _check_value(path, f"{where}.{name}", table[name], hints[name])
    return cls(**values)


def _positive(path: Path, chip: ChipSpec) -> None:
    must_be_positive = {
        "tensor_engine.clock_ghz": chip.tensor_engine.clock_ghz,
        "vector_engine.clock_ghz": chip.vector_engine.clock_ghz,
        "scalar_engine.clock_ghz": chip.scalar_engine.clock_ghz,
        "gpsimd.clock_ghz": chip.gpsimd.clock_ghz,
        "dma.engine_bw_gbps": chip.dma.engine_bw_gbps,
        "dma.engines": chip.dma.engines,
        "dma.queues_per_engine": chip.dma.queues_per_engine,
        "dma.max_descriptor_kib": chip.dma.max_descriptor_kib,
        "tensor_engine.pe_rows": chip.tensor_engine.pe_rows,
        "tensor_engine.pe_cols": chip.tensor_engine.pe_cols,
        "tensor_engine.fp32_cycle_factor": chip.tensor_engine.fp32_cycle_factor,
        "tensor_engine.fp8_rows_factor": chip.tensor_engine.fp8_rows_factor,
        "tensor_engine.stationary_load_speedup": chip.tensor_engine.stationary_load_speedup,
        "vector_engine.bf16_speedup": chip.vector_engine.bf16_speedup,
        "scalar_engine.bf16_speedup": chip.scalar_engine.bf16_speedup,
        "psum.partitions": chip.psum.partitions,
        "psum.partition_kib": chip.psum.partition_kib,
        "hbm.capacity_gib": chip.hbm.capacity_gib,
        "hbm.bw_gbps": chip.hbm.bw_gbps,
        "sbuf.partitions": chip.sbuf.partitions,
        "sbuf.partition_kib": chip.sbuf.partition_kib,
        "psum.banks": chip.psum.banks,
        "chip.cores_per_chip": chip.cores_per_chip,
    }
    for key, value in must_be_positive.items():
        if value <= 0:
            raise ChipSpecError(f"{path}: key '{key}' must be positive, got {value!r}")
    if chip.psum.partition_kib * 1024 % chip.psum.banks:
        raise ChipSpecError(f"{path}: psum.partition_kib ({chip.psum.partition_kib}) must split evenly into psum.banks ({chip.psum.banks})")


def _from_dict(data: dict, path: Path) -> ChipSpec:
    known = set(_TABLES) | {"chip", "instance"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ChipSpecError(f"{path}: unknown table or key '{unknown[0]}'; a chip file has: extends, {', '.join(sorted(known))}")
    if "chip" not in data:
        raise ChipSpecError(f"{path}: missing table [chip]")
    ident = _build(_ChipIdent, data["chip"], path, "chip")
    tables = {key: _build(cls, data.get(key, {}), path, key) for key, cls in _TABLES.items()}
    raw_instances = data.get("instance", [])
    if not isinstance(raw_instances, list):
        raise ChipSpecError(f"{path}: 'instance' must be an array of tables ([[instance]])")
    instances = tuple(_build(InstanceSpec, t, path, f"instance[{i}]") for i, t in enumerate(raw_instances))
    chip = ChipSpec(**dataclasses.asdict(ident), **tables, instances=instances, source=str(path))
    _positive(path, chip)
    return chip


@dataclass(frozen=True)
class _ChipIdent:
    name: str
    generation: str
    neuron_core: str
    cores_per_chip: int
    logical_core_size: int
    published_peak_bf16_tflops: float
    published_peak_fp32_tflops: float


@lru_cache(maxsize=64)
def _load_cached(path: Path, mtime: float) -> ChipSpec:
    del mtime  # part of the cache key only: an edited file is read again
    return _from_dict(_load_raw(path), path)


def load_chip(chip: str | os.PathLike | ChipSpec | None = None) -> ChipSpec:
    """Load a chip by shipped name (``"trn1"``), by path to a TOML file, or pass one through.

    ``None`` means ``$TRNSIM_CHIP`` or the default chip (trn2).
    """
    if isinstance(chip, ChipSpec):
        return chip
    if chip is None:
        chip = os.environ.get("TRNSIM_CHIP") or DEFAULT_CHIP
    path = _resolve_path(chip)
    return _load_cached(path.resolve(), path.stat().st_mtime)


def shipped_chips() -> list[str]:
    """Names of the chip files shipped with trnsim."""
    return sorted(p.stem for p in CHIPS_DIR.glob("*.toml"))
