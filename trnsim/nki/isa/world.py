"""``nki.isa`` instructions between the physical cores of a logical NeuronCore.

A kernel launched over a logical core's cores (``kernel[2]`` on Trainium2/3) runs on
each with its own ``nl.program_id(0)`` (:mod:`trnsim.nki.cores`): ``sendrecv`` sends a
tile to another core's ``dst`` with one DMA, and ``core_barrier`` holds each core's next
instructions until all that every named core issued before it has ended. A kernel on
one core is a world of one: its peer is itself (a DMA copy), and a barrier over core 0
is a sync point.
"""

from __future__ import annotations

from typing import Any

from trnsim.nki import emit as _e
from trnsim.nki.isa._common import fail, take
from trnsim.nki.tiles import NkiTensor


_ONE_CORE = ("this launch runs on one core (launch the kernel over a logical NeuronCore's cores, kernel[2] on trn2 or "
             "trn3, for more)")


def _ranks(value: Any) -> list[int]:
    values = value if isinstance(value, (list, tuple)) else [value]
    return [int(v) for v in values]


def core_barrier(*args: Any, engine: Any = None, name: str | None = None, **kwargs: Any) -> None:
    """Wait until every core in ``cores`` has reached this point, for the HBM tensor ``data``.

    On the cores of a launch over a logical NeuronCore, each named core's next
    instructions wait for everything every named core issued before the barrier. With
    one core the barrier is a sync point: what the kernel issues next starts after
    everything issued so far has ended, and ``cores`` must be ``(0,)``. ``data`` is an
    HBM tensor.
    """
    data, cores = take(kwargs, args, 0, "data"), take(kwargs, args, 1, "cores", (0,))
    if not isinstance(data, NkiTensor) or data.view.tensor.on_chip:
        raise fail(f"core_barrier: data {data!r} must be a tensor in HBM, the data the cores share")
    tracer = _e.tracer()
    if tracer.team is not None:
        tracer.team.barrier(tracer, tuple(_ranks(cores)))
        return
    others = sorted(set(_ranks(cores)) - {0})
    if others:
        raise fail(f"core_barrier over cores {_ranks(cores)}: {_ONE_CORE}, so cores {others} do not exist; "
                    "use cores=(0,)")
    _e.tracer().barrier()


def sendrecv(*args: Any, dma_engine: Any = None, name: str | None = None, **kwargs: Any) -> None:
    """Send ``src`` to rank ``send_to_rank`` and receive ``dst`` from rank ``recv_from_rank``.

    On the cores of a launch over a logical NeuronCore the ranks are the cores
    (``nl.program_id(0)``): ``src`` goes into the peer's ``dst`` with one DMA on this
    core's queue. With one core both peers must be 0, this core: ``dst`` receives
    ``src`` with one DMA. ``src`` and ``dst`` have the same number of elements (any
    memory); ``pipe_id`` is accepted.
    """
    src, dst = take(kwargs, args, 0, "src"), take(kwargs, args, 1, "dst")
    send_to, recv_from = take(kwargs, args, 2, "send_to_rank", 0), take(kwargs, args, 3, "recv_from_rank", 0)
    if not isinstance(src, NkiTensor) or not isinstance(dst, NkiTensor):
        raise fail(f"sendrecv: src {src!r} and dst {dst!r} must be tensors")
    tracer = _e.tracer()
    if tracer.team is not None:
        tracer.team.sendrecv(tracer, src, dst, int(send_to), int(recv_from))
        return
    for what, rank in (("send_to_rank", send_to), ("recv_from_rank", recv_from)):
        if int(rank) != 0:
            raise fail(f"sendrecv: {what}={int(rank)} names another rank; {_ONE_CORE}, so the only peer is "
                        f"rank 0 (run the exchange from PyTorch with torch.distributed)")
    if src.view.size != dst.view.size:
        raise fail(f"sendrecv: src {list(src.shape)} and dst {list(dst.shape)} differ in size; with one rank dst "
                    "receives src")
    _e.tracer().dma(dst.view, src.view if src.shape == dst.shape else src.reshape(dst.shape).view)
