"""Chip descriptions: frozen dataclasses and the one loader of ``chips/*.toml``.

A chip file holds every figure the hardware model uses, each with its unit in
the key. A file may name another chip with ``extends = "trn1"`` and then only
write what differs; tables merge key by key, arrays of tables replace. A user's
own TOML (what-if hardware) works the same way: ``extends = "trn2"`` plus the
figures to change. ``extends`` names a shipped chip or a path relative to the
folder of the file that writes it; a chain may be at most
:data:`MAX_EXTENDS_DEPTH` files deep and must not loop.

Every figure is checked when a spec is built, whether from a file or in code:
its type (an integer count is never a float, no figure is a boolean) and its
range. The ranges in :data:`FIGURE_RANGES` are generous bounds of physical
sense, wide enough for any what-if chip and narrow enough that the model's
arithmetic stays finite and exact: clocks from 10 MHz to 100 GHz, bandwidths
from 0.1 GB/s to 1 PB/s, HBM from 1 MiB to 64 TiB per chip, a partition's
on-chip memory up to 16 MiB, at most 1024 partitions, lanes, PE rows or
cores, latencies up to one second. A bad figure raises :class:`ChipSpecError`
naming the file that wrote it, the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import sys
import threading
import typing
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from trnsim.errors import ChipSpecError

if typing.TYPE_CHECKING:
    from _typeshed import DataclassInstance

CHIPS_DIR = Path(__file__).parent / "chips"
DEFAULT_CHIP = "trn2"
MAX_EXTENDS_DEPTH = 16
MAX_FILE_BYTES = 1 << 20
MAX_NAME_CHARS = 64


@dataclass(frozen=True)
class Range:
    """The allowed values of one kind of figure, both ends included."""

    low: float
    high: float
    unit: str

    def describe(self, integer: bool) -> str:
        kind = "a whole number" if integer else "a finite number"
        return f"{kind} from {_number(self.low)} to {_number(self.high)} ({self.unit})"


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


_CLOCK = Range(0.01, 100, "GHz")
_BANDWIDTH = Range(0.1, 1e6, "GB/s")
_LATENCY_NS = Range(0, 1e9, "ns")
_CYCLES = Range(0, 1e6, "cycles")
_FACTOR = Range(1, 64, "times")
_WIDTH = Range(1, 1024, "128 on every Trainium so far")
_FREE = Range(1, 65536, "elements")
_TFLOPS = Range(0.001, 1e6, "TFLOP/s")

#: The range of every numeric figure, by field name (a name means the same kind
#: of figure in every table it appears in).
FIGURE_RANGES: dict[str, Range] = {
    "clock_ghz": _CLOCK,
    "cores_per_chip": Range(1, 1024, "physical NeuronCores"),
    "logical_core_size": Range(1, 1024, "physical cores per logical core"),
    "published_peak_bf16_tflops": _TFLOPS,
    "published_peak_fp32_tflops": _TFLOPS,
    "capacity_gib": Range(0.001, 65536, "GiB"),
    "bw_gbps": _BANDWIDTH,
    "pe_rows": _WIDTH,
    "pe_cols": _WIDTH,
    "moving_free_max": _FREE,
    "stationary_free_max": _FREE,
    "fixed_cycles": _CYCLES,
    "stationary_min_cycles": _CYCLES,
    "fp32_cycle_factor": _FACTOR,
    "fp8_rows_factor": _FACTOR,
    "stationary_load_speedup": _FACTOR,
    "lanes": _WIDTH,
    "min_cycles": _CYCLES,
    "sbuf_access_cycles": _CYCLES,
    "dependent_issue_cycles": _CYCLES,
    "bf16_speedup": _FACTOR,
    "bf16_contiguous_speedup": _FACTOR,
    "reciprocal_cycle_factor": _FACTOR,
    "large_stride_bytes": Range(0, 1 << 20, "bytes"),
    "cores": Range(1, 1024, "GpSimd cores"),
    "partitions_per_core": _WIDTH,
    "cycles_per_element": Range(0, 1e6, "cycles"),
    "partitions": _WIDTH,
    "partition_kib": Range(1, 16384, "KiB"),
    "banks": Range(1, 1024, "banks per partition"),
    "engines": Range(1, 1024, "DMA engines per core"),
    "queues_per_engine": Range(1, 1024, "queues per DMA engine"),
    "engine_bw_gbps": _BANDWIDTH,
    "fixed_ns": _LATENCY_NS,
    "descriptor_overhead_ns": _LATENCY_NS,
    "max_descriptor_kib": Range(1, 1 << 20, "KiB"),
    "semaphore_to_start_ns": _LATENCY_NS,
    "swdge_descriptor_ns": _LATENCY_NS,
    "transpose_pct_from_hbm": Range(0, 100, "% of a copy's throughput; 0 where the DMA engines do not transpose"),
    "semaphore_wait_ns": _LATENCY_NS,
    "op_launch_us": Range(0, 1e6, "us"),
    "graph_base_s": Range(0, 86400, "s"),
    "per_node_ms": Range(0, 1e6, "ms"),
    "graph_max_s": Range(0, 86400, "s"),
    "version": Range(1, 100, "NeuronLink generation"),
    "chip_bw_gbps": _BANDWIDTH,
    "hop_latency_ns": _LATENCY_NS,
    "inter_instance_hop_latency_ns": _LATENCY_NS,
    "chips": Range(1, 65536, "chips"),
    "shape": Range(1, 65536, "chips along one dimension"),
    "servers": Range(1, 4096, "servers (EC2 instances) joined by NeuronLink"),
    "link_bw_gbps": Range(0, 1e6, "GB/s; 0 takes [neuronlink] chip_bw_gbps"),
    "inter_server_bw_gbps": Range(0, 1e6, "GB/s; 0 where the servers are not joined by NeuronLink"),
    "efa_bw_gbps": Range(0, 1e6, "GB/s; 0 where the server has no EFA"),
    "intra_chip_bw_gbps": _BANDWIDTH,
    "intra_chip_hop_latency_ns": _LATENCY_NS,
    "efa_hop_latency_ns": _LATENCY_NS,
    "collective_fixed_ns": _LATENCY_NS,
    "reduce_fixed_ns": _LATENCY_NS,
    "collective_dma_gbps": _BANDWIDTH,
    "mesh_max_kib": Range(0, 1 << 20, "KiB"),
    "rdh_max_kib": Range(0, 1 << 20, "KiB"),
}

# Text fields that name something; they appear in messages and traces, so one short line.
_NAMES = {"name", "generation", "neuron_core", "topology"}


class _FigureError(ChipSpecError):
    """A field holds a bad value; the loader puts the file and the table in front of ``key``."""

    def __init__(self, owner: str, key: str, detail: str) -> None:
        super().__init__(f"{owner}: key '{key}' {detail}")
        self.key = key
        self.detail = detail


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_TOML_TYPES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
               tuple: "an array", dict: "a table"}


def _is_a(value: object) -> str:
    return f"is {_show(value)} ({_TOML_TYPES.get(type(value), type(value).__name__)})"


def _check_number(owner: str, key: str, value: object, integer: bool, allowed: Range) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and isinstance(value, float))
            or not allowed.low <= value <= allowed.high):  # NaN fails the comparison too
        hint = f"; write {int(value)}" if integer and isinstance(value, float) and value.is_integer() else ""
        raise _FigureError(owner, key, f"{_is_a(value)}; allowed: {allowed.describe(integer)}{hint}")


def _check_field(owner: str, key: str, value: object, hint: object) -> object:
    """Check one field against its type hint and range; return it as stored (ints in
    float fields become floats, lists become tuples)."""
    name = key.rsplit(".", 1)[-1].split("[", 1)[0]
    if hint is float or hint is int:
        _check_number(owner, key, value, hint is int, FIGURE_RANGES[name])
        return float(value) if hint is float else value  # type: ignore[arg-type]
    if hint is str:
        if not isinstance(value, str):
            raise _FigureError(owner, key, f"{_is_a(value)}; allowed: a string")
        if name in _NAMES and not (0 < len(value) <= MAX_NAME_CHARS and value.isprintable()):
            raise _FigureError(owner, key,
                               f"{_is_a(value)}; allowed: a printable name of 1 to {MAX_NAME_CHARS} characters")
        return value
    if isinstance(hint, type):  # a nested spec
        if not isinstance(value, hint):
            raise _FigureError(owner, key, f"{_is_a(value)}; allowed: a {hint.__name__}")
        return value
    (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}  # tuple[X, ...]
    if not isinstance(value, (list, tuple)) or (item is int and not 0 < len(value) <= 8):
        allowed = "an array of 1 to 8 whole numbers" if item is int else f"an array of {item.__name__}"
        raise _FigureError(owner, key, f"{_is_a(value)}; allowed: {allowed}")
    return tuple(_check_field(owner, f"{key}[{i}]", v, item) for i, v in enumerate(value))


@functools.cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


class _Checked:
    """Checks every field of a spec dataclass when it is built, from a file or in code."""

    def __post_init__(self) -> None:
        cls: type = type(self)
        owner = cls.__name__
        for field in dataclasses.fields(self):  # type: ignore[arg-type]  # a mixin: what it is mixed into is a dataclass
            value = _check_field(owner, field.name, getattr(self, field.name), _hints(cls)[field.name])
            object.__setattr__(self, field.name, value)


@dataclass(frozen=True)
class TensorEngineSpec(_Checked):
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
class VectorEngineSpec(_Checked):
    """A 128-lane engine (vector or scalar): one lane per partition."""

    clock_ghz: float
    lanes: int
    min_cycles: int
    sbuf_access_cycles: int
    dependent_issue_cycles: int
    bf16_speedup: int
    #: bf16/fp16 tensor_copy and tensor_scalar with every operand in SBUF and its
    #: innermost free axis contiguous (NC-v3's performance mode); ``bf16_speedup`` is
    #: the other cases the mode speeds up
    bf16_contiguous_speedup: int
    reciprocal_cycle_factor: int
    large_stride_bytes: int


@dataclass(frozen=True)
class GpSimdSpec(_Checked):
    """General-purpose SIMD cores, each serving a group of partitions."""

    clock_ghz: float
    cores: int
    partitions_per_core: int
    fixed_cycles: int
    cycles_per_element: int


@dataclass(frozen=True)
class SbufSpec(_Checked):
    """State buffer: on-chip scratchpad of ``partitions`` x ``partition_kib``."""

    partitions: int
    partition_kib: int

    @property
    def partition_bytes(self) -> int:
        return self.partition_kib * 1024


@dataclass(frozen=True)
class PsumSpec(_Checked):
    """Partial-sum buffer: matmul accumulators, split into ``banks`` per partition."""

    partitions: int
    partition_kib: int
    banks: int

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.partition_bytes % self.banks:
            raise _FigureError(type(self).__name__, "banks", f"is {self.banks}; allowed: a count that splits "
                               f"partition_kib ({self.partition_kib} KiB) into banks of whole bytes")

    @property
    def partition_bytes(self) -> int:
        return self.partition_kib * 1024

    @property
    def bank_bytes(self) -> int:
        return self.partition_bytes // self.banks


@dataclass(frozen=True)
class HbmSpec(_Checked):
    """Device memory of the whole chip, shared by its cores."""

    capacity_gib: float
    bw_gbps: float

    @property
    def capacity_bytes(self) -> int:
        return int(self.capacity_gib * 1024**3)


@dataclass(frozen=True)
class DmaSpec(_Checked):
    """DMA engines of one core; queues feed them, descriptors are contiguous chunks."""

    engines: int
    queues_per_engine: int
    engine_bw_gbps: float
    fixed_ns: float
    descriptor_overhead_ns: float
    max_descriptor_kib: int
    semaphore_to_start_ns: float
    swdge_descriptor_ns: float
    #: the engines' own 2-D transpose from HBM into SBUF (the source's contiguous axis
    #: becomes the destination's partitions, 2- and 4-byte elements): its throughput
    #: against a copy's; 0 where a transposing DMA moves element by element
    transpose_pct_from_hbm: float


@dataclass(frozen=True)
class SyncSpec(_Checked):
    """Cross-engine synchronisation through semaphores."""

    semaphore_wait_ns: float


@dataclass(frozen=True)
class RuntimeSpec(_Checked):
    """The host runtime driving one core in eager mode."""

    op_launch_us: float

    @property
    def op_launch_ps(self) -> int:
        return round(self.op_launch_us * 1_000_000)


@dataclass(frozen=True)
class CompilerSpec(_Checked):
    """The graph compiler behind ``torch.compile``: what one new graph costs to compile,
    on the host, before it first runs (not device time)."""

    graph_base_s: float
    per_node_ms: float
    graph_max_s: float

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.graph_max_s < self.graph_base_s:
            raise _FigureError(type(self).__name__, "graph_max_s", f"is {_number(self.graph_max_s)}; allowed: "
                               f"at least graph_base_s ({_number(self.graph_base_s)} s)")

    def graph_ps(self, nodes: int) -> int:
        """Simulated compile time of a graph of ``nodes`` operator nodes, in picoseconds:
        ``graph_base_s + nodes * per_node_ms``, at most ``graph_max_s``."""
        seconds = min(self.graph_base_s + max(nodes, 0) * self.per_node_ms / 1000, self.graph_max_s)
        return round(seconds * 1e12)


@dataclass(frozen=True)
class NeuronLinkSpec(_Checked):
    """Chip-to-chip links for collectives."""

    version: int
    chip_bw_gbps: float
    hop_latency_ns: float
    inter_instance_hop_latency_ns: float


@dataclass(frozen=True)
class FabricSpec(_Checked):
    """What collectives cost besides the NeuronLink links: the path between the cores of
    one chip, the EFA network between servers, the fixed cost of one collective, the rate
    at which one physical core's collective DMA sends, and the message sizes at which
    Neuron's collective library changes algorithm."""

    intra_chip_bw_gbps: float
    intra_chip_hop_latency_ns: float
    efa_hop_latency_ns: float
    collective_fixed_ns: float
    reduce_fixed_ns: float
    collective_dma_gbps: float
    mesh_max_kib: int
    rdh_max_kib: int

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rdh_max_kib < self.mesh_max_kib:
            raise _FigureError(type(self).__name__, "rdh_max_kib", f"is {self.rdh_max_kib}; allowed: at least "
                               f"mesh_max_kib ({self.mesh_max_kib} KiB)")


@dataclass(frozen=True)
class InstanceSpec(_Checked):
    """A machine built from several chips and how they are wired; ``shape`` lays the chips out.

    ``chips`` counts every chip joined by NeuronLink, across ``servers`` EC2 instances
    (more than one for an UltraServer). ``link_bw_gbps`` is one chip's NeuronLink bandwidth
    to the other chips of its server (0: the chip's ``[neuronlink] chip_bw_gbps``),
    ``inter_server_bw_gbps`` one chip's bandwidth to the other servers, ``efa_bw_gbps`` one
    server's EFA network bandwidth (all in GB/s; 0: none). The last four may be left out.
    """

    name: str
    chips: int
    topology: str
    shape: tuple[int, ...]
    servers: int = 1
    link_bw_gbps: float = 0.0
    inter_server_bw_gbps: float = 0.0
    efa_bw_gbps: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        if math.prod(self.shape) != self.chips:
            raise _FigureError(owner, "shape", f"is {list(self.shape)}; allowed: a layout of "
                               f"exactly chips ({self.chips}) chips, e.g. [{self.chips}]")
        if self.chips % self.servers:
            raise _FigureError(owner, "servers", f"is {self.servers}; allowed: a count that divides chips "
                               f"({self.chips}) into servers of equal size")
        if self.servers > 1 and self.inter_server_bw_gbps == 0:
            raise _FigureError(owner, "inter_server_bw_gbps", f"is 0 with {self.servers} servers; allowed: the "
                               "NeuronLink bandwidth between them (GB/s per chip), or servers = 1")

    @property
    def chips_per_server(self) -> int:
        """Chips in one server (one EC2 instance)."""
        return self.chips // self.servers


@dataclass(frozen=True)
class _ChipIdent(_Checked):
    """The ``[chip]`` table: what a ChipSpec holds besides its other tables."""

    name: str
    generation: str
    neuron_core: str
    cores_per_chip: int
    logical_core_size: int
    published_peak_bf16_tflops: float
    published_peak_fp32_tflops: float


@dataclass(frozen=True)
class ChipSpec(_ChipIdent):
    """One Trainium chip: identity (the ``[chip]`` table), memories, engines, links and
    instances."""

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
    compiler: CompilerSpec
    neuronlink: NeuronLinkSpec
    fabric: FabricSpec
    instances: tuple[InstanceSpec, ...]
    source: str

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cores_per_chip % self.logical_core_size:
            divisors = [d for d in range(1, self.cores_per_chip + 1) if self.cores_per_chip % d == 0]
            raise _FigureError(type(self).__name__, "logical_core_size", f"is {self.logical_core_size}; allowed: "
                               f"a divisor of cores_per_chip ({self.cores_per_chip}): {', '.join(map(str, divisors))}")
        names = [i.name for i in self.instances]
        for name in names:
            if names.count(name) > 1:
                raise _FigureError(type(self).__name__, "instance",
                                   f"names {name!r} twice; allowed: one [[instance]] per name")

    @property
    def device_hbm_bytes(self) -> int:
        """HBM one logical core (one process's ``neuron`` device) owns: its cores' share."""
        return self.hbm.capacity_bytes * self.logical_core_size // self.cores_per_chip

    @property
    def logical_cores_per_chip(self) -> int:
        """Logical NeuronCores per chip: one process (one rank) drives each."""
        return self.cores_per_chip // self.logical_core_size

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
_TABLES: dict[str, type[DataclassInstance]] = {
    "chip": _ChipIdent,
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
    "compiler": CompilerSpec,
    "neuronlink": NeuronLinkSpec,
    "fabric": FabricSpec,
}
_TOP_KEYS = ["extends", *_TABLES, "instance"]

# One file as read: where it is, its stamp (inode, mtime, size) and its tables.
_Stamp = tuple[int, int, int]
# A TOML table as read: keys to values of any TOML type.
_Table = dict[str, typing.Any]
_S = typing.TypeVar("_S", bound="DataclassInstance")


def _stamp(st: os.stat_result) -> _Stamp:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _read_toml(path: Path) -> tuple[_Stamp, _Table]:
    try:
        with open(path, "rb") as f:
            stamp = _stamp(os.fstat(f.fileno()))
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ChipSpecError(f"{path}: cannot read the chip file ({e.strerror or e}); "
                            "pass a readable TOML file") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ChipSpecError(f"{path}: larger than {MAX_FILE_BYTES // 1024} KiB; a chip file is a few KiB of TOML")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ChipSpecError(f"{path}: not valid UTF-8 (byte {raw[e.start:e.start + 1]!r} at offset {e.start}); "
                            "save the file as UTF-8") from None
    try:
        return stamp, tomllib.loads(text)
    except (ValueError, RecursionError) as e:  # TOMLDecodeError is a ValueError; so are over-long integers
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ChipSpecError(f"{path}: not valid TOML: {reason}") from None


def _shipped_hint() -> str:
    return f"a shipped chip ({', '.join(shipped_chips())}) or a path to a TOML file"


def _file_state(path: Path) -> str | None:
    """None if ``path`` is a file; otherwise why not, in words. Names the OS refuses (too
    long, a NUL byte) are "not a valid file name" rather than an OSError from deep inside."""
    try:
        if path.is_file():
            return None
        return "is not a file" if path.exists() else "does not exist"
    except (OSError, ValueError) as e:
        return f"is not a valid file name ({getattr(e, 'strerror', None) or e})"


def _locate(text: str, folder: Path | None, referrer: Path | None) -> Path:
    """The file a chip name or path means; a relative path is taken from ``folder``
    (the current directory for the top file, the extending file's folder for ``extends``)."""
    where = f"{referrer}: key 'extends' is {text!r}, but" if referrer else "chip file"
    if text.endswith(".toml") or os.sep in text or "/" in text:
        path = Path(text) if folder is None else folder / text
        state = _file_state(path)
        if state is not None:
            raise ChipSpecError(f"{where} {str(path)[:200]} {state}; pass {_shipped_hint()}")
        return path
    path = CHIPS_DIR / f"{text.lower()}.toml"   # AWS writes Trn2: chip names are taken in any case
    if not text or _file_state(path) is not None:
        close = difflib.get_close_matches(text.lower(), shipped_chips(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        what = f"{referrer}: key 'extends' names unknown chip" if referrer else "unknown chip"
        raise ChipSpecError(f"{what} {text[:200]!r}; {hint}pass {_shipped_hint()}")
    return path


def _read_chain(path: Path) -> list[tuple[Path, _Stamp, _Table]]:
    """The file and every file it extends, the file first."""
    chain: list[tuple[Path, _Stamp, _Table]] = []
    seen: list[Path] = []
    while True:
        if path.resolve() in seen:
            loop = " -> ".join(str(p) for p in [*seen, path.resolve()])
            raise ChipSpecError(f"{chain[-1][0]}: key 'extends' forms a cycle: {loop}; remove one link")
        if len(chain) == MAX_EXTENDS_DEPTH:
            raise ChipSpecError(f"{chain[0][0]}: 'extends' chain is deeper than {MAX_EXTENDS_DEPTH} files "
                                f"(at {path}); extend a shipped chip directly")
        seen.append(path.resolve())
        stamp, data = _read_toml(path)
        chain.append((path, stamp, data))
        parent = data.pop("extends", None)
        if parent is None:
            return chain
        if not isinstance(parent, str):
            raise ChipSpecError(f"{path}: key 'extends' {_is_a(parent)}; allowed: {_shipped_hint()}")
        path = _locate(parent, path.parent, path)


def _check_keys(data: _Table, path: Path) -> None:
    for key, value in data.items():
        if key not in _TOP_KEYS:
            close = difflib.get_close_matches(key, _TOP_KEYS, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ChipSpecError(f"{path}: unknown {'table' if isinstance(value, dict) else 'key'} '{key}'; "
                                f"{hint}a chip file has: {', '.join(_TOP_KEYS)}")
        if key == "instance" and not (isinstance(value, list) and all(isinstance(t, dict) for t in value)):
            raise ChipSpecError(f"{path}: key 'instance' {_is_a(value)}; allowed: an array of tables ([[instance]])")
        cls = _TABLES.get(key)
        if cls is None:
            continue
        if not isinstance(value, dict):
            raise ChipSpecError(f"{path}: key '{key}' {_is_a(value)}; allowed: a table [{key}]")
        names = [f.name for f in dataclasses.fields(cls)]
        for inner in value:
            if inner not in names:
                close = difflib.get_close_matches(inner, names, n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                raise ChipSpecError(f"{path}: unknown key '{key}.{inner}'; {hint}[{key}] has: {', '.join(names)}")


def _merge(chain: list[tuple[Path, _Stamp, _Table]]) -> tuple[_Table, dict[str, Path]]:
    """The tables of a chain merged (the file wins over what it extends), and which
    file wrote each key (``table.key``, or ``instance`` for the array)."""
    merged: _Table = {}
    origin: dict[str, Path] = {}
    for path, _, data in reversed(chain):
        _check_keys(data, path)
        for key, value in data.items():
            if isinstance(value, dict):  # a table: merged key by key
                merged[key] = {**merged.get(key, {}), **value}
                origin.update({f"{key}.{inner}": path for inner in value})
            else:
                merged[key] = value
                origin[key] = path
    return merged, origin


def _build(cls: type[_S], table: _Table, where: str, origin: dict[str, Path], top: Path) -> _S:
    for field in dataclasses.fields(cls):
        if field.name not in table and field.default is dataclasses.MISSING:
            hint = _hints(cls)[field.name]
            kind = (FIGURE_RANGES[field.name].describe(hint is int) if hint in (int, float)
                    else "a string" if hint is str else "an array")
            file = origin.get(where.split("[", 1)[0], top)  # an [[instance]] entry: the file that wrote the array
            raise ChipSpecError(f"{file}: missing key '{where}.{field.name}' ({kind}); write it, or start from "
                                f"a shipped chip with extends = \"{DEFAULT_CHIP}\"")
    try:
        return cls(**table)
    except _FigureError as e:
        key = e.key if e.key in _TOP_KEYS else f"{where}.{e.key}"
        file = origin.get(key, origin.get(key.split("[", 1)[0], top))
        raise ChipSpecError(f"{file}: key '{key}' {e.detail}") from None


def _from_chain(chain: list[tuple[Path, _Stamp, _Table]]) -> ChipSpec:
    top = chain[0][0]
    data, origin = _merge(chain)
    tables = {key: _build(cls, data.get(key, {}), key, origin, top) for key, cls in _TABLES.items()}
    raw = data.get("instance", [])
    instances = tuple(_build(InstanceSpec, t, f"instance[{i}]", origin, top) for i, t in enumerate(raw))
    ident = dataclasses.asdict(tables.pop("chip"))
    return _build(ChipSpec, {**ident, **tables, "instances": instances, "source": str(top)}, "chip", origin, top)


# Loaded chips by resolved path, with the stamp of every file in their chain: a spec is
# reused only while none of those files has changed.
_cache: dict[Path, tuple[tuple[tuple[Path, _Stamp], ...], ChipSpec]] = {}
_cache_lock = threading.Lock()
_CACHE_SIZE = 64


def _unchanged(files: tuple[tuple[Path, _Stamp], ...]) -> bool:
    try:
        return all(_stamp(os.stat(path)) == stamp for path, stamp in files)
    except OSError:
        return False


#: What names a chip where one is asked for: a shipped name (``"trn1"``), the path of a
#: chip file, a loaded :class:`ChipSpec`, or None (``$TRNSIM_CHIP`` or the default).
ChipLike = str | os.PathLike[str] | ChipSpec | None


def load_chip(chip: ChipLike = None) -> ChipSpec:
    """Load a chip by shipped name (``"trn1"``), by path to a TOML file, or pass one through.

    ``None`` means ``$TRNSIM_CHIP`` or the default chip (trn2). A file is read again
    when it, or any file it extends, has changed since it was last loaded.
    """
    if isinstance(chip, ChipSpec):
        return chip
    if chip is None:
        env = os.environ.get("TRNSIM_CHIP", "").strip()
        if not env:
            return load_chip(DEFAULT_CHIP)
        return load_chip_from(env, f"TRNSIM_CHIP={env[:200]!r}", "; or unset TRNSIM_CHIP")
    if not isinstance(chip, (str, os.PathLike)):
        raise ChipSpecError(f"chip {_show(chip)} is not a chip; pass {_shipped_hint()} or a ChipSpec")
    path = _locate(os.fspath(chip), None, None)
    key = path.resolve()
    hit = _cache.get(key)
    if hit is not None and _unchanged(hit[0]):
        return hit[1]
    chain = _read_chain(path)
    spec = _from_chain(chain)
    with _cache_lock:
        if len(_cache) >= _CACHE_SIZE:
            _cache.pop(next(iter(_cache)))
        _cache[key] = (tuple((p.resolve(), stamp) for p, stamp, _ in chain), spec)
    return spec


def load_chip_from(value: str, label: str, fix: str) -> ChipSpec:
    """:func:`load_chip` of ``value``, its errors beginning with ``label``, where the value
    came from (``--chip 'x'``, ``TRNSIM_CHIP='x'``, ``set_chip('x')``), and ending with
    ``fix``. A damaged chip file's error names the file already."""
    try:
        return load_chip(value)
    except ChipSpecError as e:
        if str(value) and str(e).startswith(str(value)):   # a damaged file, named by its path already
            raise
        raise ChipSpecError(f"{label}: {e}{fix}") from None


def shipped_chips() -> list[str]:
    """Names of the chip files shipped with trnsim."""
    return sorted(p.stem for p in CHIPS_DIR.glob("*.toml"))
