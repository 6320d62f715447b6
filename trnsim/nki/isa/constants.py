"""The configuration enums and target queries of ``nki.isa``: engines, accumulator
commands, DMA modes and NeuronCore versions, with NKI's names and values.

Also the module ``nki.isa.constants`` itself (``from nki.isa.constants import
dge_mode``; ``nisa.constants.engine``), as NKI's legacy namespace of these enums."""

from __future__ import annotations

import enum
import re

from trnsim.isa import Engine
from trnsim.nki import emit as _e


tensor_engine = Engine.TENSOR


vector_engine = Engine.VECTOR


scalar_engine = Engine.SCALAR


gpsimd_engine = Engine.GPSIMD


unknown_engine = None


class engine:
    """NKI's ``nisa.engine``: pass one as ``engine=``; ``unknown`` lets trnsim pick."""

    tensor = Engine.TENSOR
    vector = Engine.VECTOR
    scalar = Engine.SCALAR
    gpsimd = Engine.GPSIMD
    sync = Engine.SYNC
    dma = "dma"
    unknown = None


class reduce_cmd(enum.Enum):
    """What an instruction does with its engine's accumulator registers."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):
    """How a DMA's descriptors are generated; trnsim times every mode alike."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):
    """What a DMA does with an access outside its tensor."""

    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):
    """Tensor engine performance modes."""

    none = "none"
    double_row = "double_row"


class nc_version(enum.IntEnum):
    """NeuronCore generations: gen2 is Trn1/Inf2, gen3 Trn2, gen4 Trn3; ordered, as kernels
    compare them (``get_nc_version() >= nc_version.gen3``)."""

    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.Enum):
    """Which DMA moves data for a collective transfer."""

    dma = 1
    gpsimd_dma = 2


def get_nc_version() -> nc_version:
    """The NeuronCore generation of the chip the kernel is traced for (trn1: gen2, trn2: gen3, trn3: gen4)."""
    tr = _e.tracer()
    found = re.search(r"(\d+)$", tr.chip.neuron_core)
    number = int(found.group(1)) if found else 0
    try:
        return nc_version(number)
    except ValueError:
        raise tr.fail(f"chip {tr.chip.name!r} has NeuronCore {tr.chip.neuron_core!r}, which nki.isa.nc_version does not "
                      "name; use trn1, trn2 or trn3") from None


def get_nc_sub_version() -> int:
    """The NeuronCore sub-version; trnsim models none, so 0."""
    return 0
