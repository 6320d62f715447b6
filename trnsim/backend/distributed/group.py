"""The ``neuron`` process group: collectives on neuron tensors, data through gloo.

``dist.init_process_group(backend="neuron")`` (or ``"cpu:gloo,neuron:neuron"``) makes a
:class:`NeuronProcessGroup` per group. Each collective

1. meets the group's other ranks (:meth:`NeuronProcessGroup._meet`): one small gloo
   all-gather carries every rank's call (what, dtype, bytes, root, reduction) and the
   simulated time it is ready, so a mismatched call is reported with both sides
   instead of hanging, and all ranks agree on when it starts;
2. moves the data with gloo over the tensors' host memory (zero-copy where the
   layout allows, :mod:`.hostdata`); nothing of trnsim's own is on the wire;
3. is timed by the fabric model and put on the rank's collectives track
   (:mod:`.clocks`); the returned :class:`NeuronWork` makes the compute queue wait
   for its end when waited on.

Reductions gloo lacks are built from ones it has: average is a sum divided by the
group size, premul-sum scales the input first; reduce-scatter with a list input is
the flat reduce-scatter of the stacked inputs.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch.futures import Future

from trnsim.backend import hostshims
from trnsim.backend.distributed import clocks, faults, hostdata, timing
from trnsim.errors import TrnSimError

RedOp = dist.ReduceOp.RedOpType

# the codes a call is described by in the meeting all-gather
KINDS = ("all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter", "reduce_scatter",
         "all_to_all", "barrier")
_KIND_CODE = {k: i + 1 for i, k in enumerate(KINDS)}
# collectives whose per-rank byte count must agree across ranks
_SAME_BYTES = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "barrier", "gather", "scatter"}
_DTYPES: list[torch.dtype] = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
                              torch.int16, torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2,
                              torch.complex64]
_DTYPE_CODE = {d: i + 1 for i, d in enumerate(_DTYPES)}
_OPS = {RedOp.SUM: "sum", RedOp.AVG: "avg", RedOp.PRODUCT: "product", RedOp.MIN: "min", RedOp.MAX: "max",
        RedOp.BAND: "band", RedOp.BOR: "bor", RedOp.BXOR: "bxor", RedOp.PREMUL_SUM: "premul_sum"}
_FIELDS = 6   # ready_ps, kind, dtype, bytes, root, reduction


class CollectiveMismatchError(TrnSimError, RuntimeError):
    """Ranks of one group made different collective calls at the same step."""


class DeviceBackendError(TrnSimError, RuntimeError):
    """A device type the ``neuron`` group does not serve was asked for its backend."""


class NeuronWork(c10d.Work):
    """A collective in flight: its result is computed; waiting on it makes this rank's
    compute queue wait for its simulated end."""

    def __init__(self, result: list[torch.Tensor], end_ps: int, finish: Any = None) -> None:
        super().__init__()
        self._result = result
        self._end_ps = end_ps
        self._finish = finish   # point-to-point: the gloo work still to wait for
        self._done = finish is None

    def _complete(self) -> None:
        if not self._done:
            self._finish()
            self._done = True

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self._complete()
        clocks.wait_for(self._end_ps)
        return True

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done

    def exception(self) -> Any:
        return None

    def source_rank(self) -> int:
        return -1

    def synchronize(self) -> None:
        self.wait()

    def result(self) -> list[torch.Tensor]:
        self._complete()
        return self._result

    def get_future(self) -> Future:
        self.wait()
        fut: Future = Future()
        fut.set_result(self._result)
        return fut


def _code(dtype: torch.dtype) -> int:
    return _DTYPE_CODE.get(dtype, 0)


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _reduction(opts: Any) -> tuple[Any, str]:
    op = opts.reduceOp
    kind = op.op if hasattr(op, "op") else op
    return kind, _OPS.get(kind, str(kind))


class NeuronProcessGroup(dist.ProcessGroup):
    """One group of ranks for collectives on ``neuron`` tensors (see the module docstring)."""

    def __init__(self, options: Any, backend_options: Any = None) -> None:
        super().__init__(options.group_rank, options.group_size)
        hostshims.install_pinned_factories()   # DDP asks for pinned host buffers from C++
        timeout = faults.timeout(options.timeout)
        self._gloo = c10d.ProcessGroupGloo(options.store, options.group_rank, options.group_size, timeout)
        self._name = options.group_id
        self._desc = options.group_id
        global_ranks = list(options.global_ranks_in_group or [])
        self._global_ranks = tuple(global_ranks) if global_ranks else tuple(range(options.group_size))
        self._calls = 0
        self._waited: tuple[int, float] | None = None   # the last arrival at this call's meeting, and our wait
        self._peers = faults.Peers(options.store, options.group_rank, options.group_size, self._global_ranks)
        self._timing = timing.GroupTiming(self._global_ranks)

    # -- identity ------------------------------------------------------------

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc

    def _set_group_name(self, name: str) -> None:
        self._name = name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    def getBackendName(self) -> str:
        return "neuron"

    # the group is its own backend for its one device type; it cannot be split
    supports_splitting = False

    def _get_backend(self, device: torch.device) -> NeuronProcessGroup:
        """The backend of ``device``'s collectives (as ``init_process_group(device_id=...)``
        asks): this group, for ``neuron``."""
        if torch.device(device).type != "neuron":
            raise DeviceBackendError(
                f"No backend type associated with device type {torch.device(device).type}: the 'neuron' process "
                "group serves neuron tensors; for CPU tensors as well, initialise with "
                "backend='cpu:gloo,neuron:neuron'")
        return self

    def name(self) -> str:
        return "neuron"

    # -- the meeting -----------------------------------------------------------

    def _meet(self, kind: str, dtype: torch.dtype | None, nbytes: int, root: int = -1, op: str = "") -> tuple[int, list]:
        """Exchange this rank's call and ready time with the group; returns the start
        time and every rank's call (raises :class:`CollectiveMismatchError` when they differ)."""
        self._calls += 1
        mine = [clocks.ready_ps(), _KIND_CODE[kind], _code(dtype) if dtype is not None else 0, nbytes, root,
                sorted(_OPS.values()).index(op) + 1 if op else 0]
        rows = torch.zeros(self.size(), _FIELDS, dtype=torch.int64)
        self._run(lambda: self._gloo._allgather_base(rows.view(-1), torch.tensor(mine, dtype=torch.int64)))
        calls = rows.tolist()
        first = calls[0]
        for rank, call in enumerate(calls):
            same = call[1:3] == first[1:3] and call[4:] == first[4:]
            if same and kind in _SAME_BYTES:
                same = call[3] == first[3]
            if not same:
                raise CollectiveMismatchError(
                    f"collective mismatch in process group {self._name!r} at call {self._calls}: "
                    f"rank {self._global_ranks[0]} called {_describe(first)} but rank {self._global_ranks[rank]} "
                    f"called {_describe(call)}; every rank of a group must make the same collective calls in "
                    "the same order, with the same dtype and sizes")
        start = max(call[0] for call in calls)
        last = max(range(len(calls)), key=lambda r: (calls[r][0], -r))
        # who this rank waited for, kept for the collective's record (_timed)
        self._waited = (self._global_ranks[last], (start - mine[0]) / 1000)
        return start, calls

    def _run(self, start: Any) -> Any:
        """Start a gloo operation and wait for it, naming a lost peer if it fails."""
        try:
            work = start()
            work.wait()
        except RuntimeError as e:
            raise self._peers.explain(e) from None
        return work

    @property
    def _moves_data(self) -> bool:
        """Whether collectives move values: in ``timing`` fidelity tensors keep none, and
        every rank only times its collectives."""
        from trnsim.backend import state

        return state.fidelity() != "timing"

    def _timed(self, kind: str, start_ps: int, nbytes: int, tensors: list[torch.Tensor], extra: dict | None = None,
               per_rank: list[int] | None = None, root: int | None = None) -> NeuronWork:
        t = self._timing.collective(kind, nbytes, start_ps, per_rank, root)
        # each process books only its own collectives' links, so ranks may see different
        # ends; the group ends together, at the latest
        end_ps = self._latest(start_ps + t.ps)
        clocks.occupy(start_ps, end_ps)
        extra = dict(extra or {})
        waited = self._waited
        if waited is not None:   # set by the _meet of this call: the last rank to arrive, and how long it kept us
            extra["last_rank"], extra["waited_ns"] = waited
            self._waited = None
        info = clocks.CollectiveRecord(kind, t.algorithm, nbytes, self._global_ranks, t.bus_gbps, self._name, extra)
        clocks.record(f"c10d::{kind}", start_ps, end_ps, tuple(tuple(x.shape) for x in tensors),
                      tuple(str(x.dtype).removeprefix("torch.") for x in tensors), info)
        return NeuronWork(tensors, end_ps)

    def _latest(self, ps: int) -> int:
        if self.size() == 1:
            return ps
        value = torch.tensor([ps], dtype=torch.int64)
        o = c10d.AllreduceOptions()
        o.reduceOp = dist.ReduceOp.MAX
        self._run(lambda: self._gloo.allreduce([value], o))
        return int(value.item())

    # -- reductions ------------------------------------------------------------

    def _gloo_opts(self, cls: Any, kind: Any) -> Any:
        o = cls()
        o.reduceOp = dist.ReduceOp.SUM if kind in (RedOp.AVG, RedOp.PREMUL_SUM) else dist.ReduceOp(kind)
        return o

    @staticmethod
    def _premultiply(opts: Any, host: torch.Tensor, in_place: bool) -> torch.Tensor:
        """premul-sum: ``host`` scaled by the reduction's factor (gloo then sums)."""
        op = opts.reduceOp
        if getattr(op, "op", None) != RedOp.PREMUL_SUM:
            return host
        factor = op.factor
        if isinstance(factor, torch.Tensor):
            factor = factor.to("cpu") if factor.device.type != "neuron" else factor.cpu()
        return host.mul_(factor) if in_place else host * factor

    def _average(self, views: list[hostdata.HostView], kind: Any) -> None:
        if kind == RedOp.AVG:
            for v in views:
                if v.host.dtype.is_floating_point or v.host.dtype.is_complex:
                    v.host.div_(self.size())
                else:
                    v.host.copy_(torch.div(v.host, self.size(), rounding_mode="floor"))

    def _all_reduce(self, tensors: list[torch.Tensor], opts: Any, coalesced: bool) -> NeuronWork:
        """All-reduce ``tensors``: as one gloo call (one tensor per device), or one call
        per tensor (``coalesced``: tensors of any sizes)."""
        kind, name = _reduction(opts)
        start, _ = self._meet("all_reduce", tensors[0].dtype, _nbytes(tensors), op=name)
        if self._moves_data:
            views = hostdata.in_place(tensors)
            for v in views:
                self._premultiply(opts, v.host, in_place=True)
            for group in ([[v] for v in views] if coalesced else [views]):
                self._run(lambda g=group: self._gloo.allreduce([v.host for v in g],
                                                               self._gloo_opts(c10d.AllreduceOptions, kind)))
            self._average(views, kind)
            for v in views:
                v.finish()
        extra = {"reduction": name, "coalesced": len(tensors)} if coalesced else {"reduction": name}
        return self._timed("all_reduce", start, _nbytes(tensors), tensors, extra)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> NeuronWork:
        return self._all_reduce(tensors, opts or c10d.AllreduceOptions(), coalesced=False)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> NeuronWork:
        return self._all_reduce(tensors, opts or c10d.AllreduceCoalescedOptions(), coalesced=True)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> NeuronWork:
        opts = opts or c10d.ReduceOptions()
        kind, name = _reduction(opts)
        start, _ = self._meet("reduce", tensors[0].dtype, _nbytes(tensors), root=opts.rootRank, op=name)
        if self._moves_data:
            views = hostdata.in_place(tensors)
            for v in views:
                self._premultiply(opts, v.host, in_place=True)
            o = self._gloo_opts(c10d.ReduceOptions, kind)
            o.rootRank = opts.rootRank
            o.rootTensor = opts.rootTensor
            self._run(lambda: self._gloo.reduce([v.host for v in views], o))
            if self.rank() == opts.rootRank:
                self._average(views, kind)
                for v in views:
                    v.finish()
        return self._timed("reduce", start, _nbytes(tensors), tensors, {"reduction": name, "root": opts.rootRank},
                           root=opts.rootRank)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> NeuronWork:
        opts = opts or c10d.BroadcastOptions()
        start, _ = self._meet("broadcast", tensors[0].dtype, _nbytes(tensors), root=opts.rootRank)
        if self._moves_data:
            views = hostdata.in_place(tensors) if self.rank() == opts.rootRank else hostdata.outputs(tensors)
            o = c10d.BroadcastOptions()
            o.rootRank = opts.rootRank
            o.rootTensor = opts.rootTensor
            self._run(lambda: self._gloo.broadcast([v.host for v in views], o))
            for v in views:
                v.finish()
        return self._timed("broadcast", start, _nbytes(tensors), tensors, {"root": opts.rootRank}, root=opts.rootRank)

    # -- gathers and scatters ----------------------------------------------------

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> NeuronWork:
        start, _ = self._meet("all_gather", inputs[0].dtype, _nbytes(inputs))
        if self._moves_data:
            outs = [hostdata.outputs(lst) for lst in output_lists]
            ins = hostdata.inputs(inputs)
            self._run(lambda: self._gloo.allgather([[v.host for v in lst] for lst in outs], ins))
            for lst in outs:
                for v in lst:
                    v.finish()
        flat = [t for lst in output_lists for t in lst]
        return self._timed("all_gather", start, _nbytes(flat), flat)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002 - c10d's ProcessGroup names it so
                        opts: Any = None) -> NeuronWork:
        if output.numel() != input.numel() * self.size():
            raise TrnSimError(f"all_gather_into_tensor: output of {output.numel()} elements is not the group size "
                              f"{self.size()} x the input's {input.numel()}; size the output world_size * input.numel()")
        start, _ = self._meet("all_gather", input.dtype, _nbytes([input]))
        if self._moves_data:
            (out,) = hostdata.outputs([output])
            (inp,) = hostdata.inputs([input])
            self._run(lambda: self._gloo._allgather_base(out.host, inp))
            out.finish()
        return self._timed("all_gather", start, _nbytes([output]), [output])

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> NeuronWork:
        works = [self.allgather([lst], [t]) for lst, t in zip(output_lists, inputs)]
        return works[-1] if works else NeuronWork([], clocks.queue.free_ps)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> NeuronWork:
        works = [self._allgather_base(o, i) for o, i in zip(outputs, inputs)]
        return works[-1] if works else NeuronWork([], clocks.queue.free_ps)

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> NeuronWork:
        opts = opts or c10d.GatherOptions()
        start, _ = self._meet("gather", inputs[0].dtype, _nbytes(inputs), root=opts.rootRank)
        if self._moves_data:
            root = self.rank() == opts.rootRank
            outs = [hostdata.outputs(lst) for lst in output_lists] if root else []
            o = c10d.GatherOptions()
            o.rootRank = opts.rootRank
            self._run(lambda: self._gloo.gather([[v.host for v in lst] for lst in outs], hostdata.inputs(inputs), o))
            for lst in outs:
                for v in lst:
                    v.finish()
        return self._timed("gather", start, _nbytes(inputs) * self.size(), inputs, {"root": opts.rootRank}, root=opts.rootRank)

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> NeuronWork:
        opts = opts or c10d.ScatterOptions()
        start, _ = self._meet("scatter", outputs[0].dtype, _nbytes(outputs), root=opts.rootRank)
        if self._moves_data:
            root = self.rank() == opts.rootRank
            outs = hostdata.outputs(outputs)
            ins = [hostdata.inputs(lst) for lst in input_lists] if root else []
            o = c10d.ScatterOptions()
            o.rootRank = opts.rootRank
            self._run(lambda: self._gloo.scatter([v.host for v in outs], ins, o))
            for v in outs:
                v.finish()
        return self._timed("scatter", start, _nbytes(outputs) * self.size(), outputs, {"root": opts.rootRank}, root=opts.rootRank)

    def _reduce_scatter_base(self, output: torch.Tensor, input_tensor: torch.Tensor, opts: Any = None) -> NeuronWork:
        opts = opts or c10d.ReduceScatterOptions()
        kind, name = _reduction(opts)
        if input_tensor.numel() != output.numel() * self.size():
            raise TrnSimError(f"reduce_scatter_tensor: input of {input_tensor.numel()} elements is not the group size "
                              f"{self.size()} x the output's {output.numel()}; size the input world_size * output.numel()")
        start, _ = self._meet("reduce_scatter", output.dtype, _nbytes([output]), op=name)
        if self._moves_data:
            (out,) = hostdata.outputs([output])
            (inp,) = hostdata.inputs([input_tensor])
            o = self._gloo_opts(c10d.ReduceScatterOptions, kind)
            inp = self._premultiply(opts, inp, in_place=False)
            self._run(lambda: self._gloo._reduce_scatter_base(out.host, inp.contiguous(), o))
            self._average([out], kind)
            out.finish()
        return self._timed("reduce_scatter", start, _nbytes([input_tensor]), [output], {"reduction": name})

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> NeuronWork:
        opts = opts or c10d.ReduceScatterOptions()
        works = []
        for out, ins in zip(outputs, input_lists):
            if any(t.shape != out.shape for t in ins):
                raise TrnSimError(f"reduce_scatter: every input must have the output's shape {list(out.shape)}, "
                                  f"got {[list(t.shape) for t in ins]}")
            stacked = torch.stack([t.to(out.device) for t in ins])
            works.append(self._reduce_scatter_base(out, stacked.view(-1) if out.is_contiguous() else stacked, opts))
        return works[-1]

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> NeuronWork:
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else NeuronWork([], clocks.queue.free_ps)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002 - c10d's ProcessGroup names it so
                      output_splits: list[int],
                      input_splits: list[int], opts: Any = None) -> NeuronWork:
        n = self.size()
        sent = _split_bytes(input, input_splits, n, "input")
        start, calls = self._meet("all_to_all", input.dtype, sum(sent))
        if self._moves_data:
            (out,) = hostdata.outputs([output])
            (inp,) = hostdata.inputs([input])
            self._run(lambda: self._gloo.alltoall_base(out.host, inp.contiguous(), list(output_splits), list(input_splits),
                                                       c10d.AllToAllOptions()))
            out.finish()
        per_rank = [call[3] for call in calls]
        return self._timed("all_to_all", start, max(per_rank), [output], {"bytes_per_rank": per_rank},
                           per_rank=per_rank)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> NeuronWork:
        if len(outputs) != self.size() or len(inputs) != self.size():
            raise TrnSimError(f"all_to_all takes one input and one output tensor per rank ({self.size()}), "
                              f"got {len(inputs)} inputs and {len(outputs)} outputs")
        flat_in = torch.cat([t.reshape(-1) for t in inputs])
        flat_out = torch.empty(sum(t.numel() for t in outputs), dtype=outputs[0].dtype, device=outputs[0].device)
        work = self.alltoall_base(flat_out, flat_in, [t.numel() for t in outputs], [t.numel() for t in inputs])
        for t, part in zip(outputs, flat_out.split([t.numel() for t in outputs])):
            t.copy_(part.view(t.shape))
        return work

    # PyTorch 2.13's names for the single-tensor forms
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_to_all_single = alltoall_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # -- barrier and point to point ---------------------------------------------

    def barrier(self, opts: Any = None) -> NeuronWork:
        start, _ = self._meet("barrier", None, 0)
        return self._timed("barrier", start, 0, [])

    def monitored_barrier(self, opts: Any = None, wait_all_ranks: bool = False) -> NeuronWork:
        """A barrier whose failure names the lost ranks (every failure here does)."""
        work = self.barrier(opts)
        work.wait()
        return work

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> NeuronWork:
        ready = clocks.ready_ps()
        nbytes = _nbytes(tensors)
        header = torch.tensor([ready, _code(tensors[0].dtype), nbytes], dtype=torch.int64)
        # nothing here waits for the receiver: both sides of an exchange send first
        # (batch_isend_irecv), and a send completes only once its receive is posted
        works = [self._start(lambda: self._gloo.send([header], dst, tag))]
        end = ready + self._timing.point_to_point(nbytes, self.rank(), dst, ready).ps
        clocks.occupy(ready, end)
        if self._moves_data:
            data = hostdata.inputs(tensors)
            works.append(self._start(lambda: self._gloo.send(data, dst, tag)))

        def finish() -> None:
            for work in works:
                self._wait(work)
        return NeuronWork(tensors, end, finish=finish)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> NeuronWork:
        ready = clocks.ready_ps()
        header = torch.zeros(3, dtype=torch.int64)
        self._run(lambda: self._gloo.recv([header], src, tag))
        sent_ready, dtype_code, nbytes = header.tolist()
        if dtype_code != _code(tensors[0].dtype) or nbytes != _nbytes(tensors):
            raise CollectiveMismatchError(
                f"recv from rank {self._global_ranks[src]} expects {_nbytes(tensors)} bytes of {tensors[0].dtype} "
                f"but the matching send has {nbytes} bytes of {_dtype_name(dtype_code)}; size the receive buffer as the send")
        views = hostdata.outputs(tensors) if self._moves_data else []
        work = self._gloo.recv([v.host for v in views], src, tag) if views else None
        start = max(ready, sent_ready)
        t = self._timing.point_to_point(nbytes, src, self.rank(), start)
        end = start + t.ps
        clocks.occupy(start, end)
        info = clocks.CollectiveRecord("recv", t.algorithm, nbytes, (self._global_ranks[src], self._global_ranks[self.rank()]),
                                       t.bus_gbps, self._name)
        clocks.record("c10d::recv", start, end, tuple(tuple(x.shape) for x in tensors),
                      tuple(str(x.dtype).removeprefix("torch.") for x in tensors), info)

        def finish() -> None:
            self._wait(work)
            for v in views:
                v.finish()
        return NeuronWork(tensors, end, finish=finish if work is not None else None)

    def _start(self, start: Any) -> Any:
        """Start a gloo operation without waiting for it, naming a lost peer if it cannot start."""
        try:
            return start()
        except RuntimeError as e:
            raise self._peers.explain(e) from None

    def _wait(self, work: Any) -> None:
        try:
            work.wait()
        except RuntimeError as e:
            raise self._peers.explain(e) from None


def _split_bytes(t: torch.Tensor, splits: list[int], n: int, what: str) -> list[int]:
    rows = t.shape[0] if t.dim() else 1
    row_bytes = (t.numel() // rows if rows else 0) * t.element_size()
    if not splits:
        if rows % n:
            raise TrnSimError(f"all_to_all_single: the {what}'s first dimension {rows} does not split evenly over "
                              f"{n} ranks; pass {what}_split_sizes")
        return [rows // n * row_bytes] * n
    if len(splits) != n or sum(splits) != rows:
        raise TrnSimError(f"all_to_all_single: {what}_split_sizes {list(splits)} must have {n} entries summing to the "
                          f"first dimension {rows}")
    return [s * row_bytes for s in splits]


def _dtype_name(code: int) -> str:
    return str(_DTYPES[code - 1]).removeprefix("torch.") if 0 < code <= len(_DTYPES) else "no dtype"


def _describe(call: list[int]) -> str:
    _, kind, dtype, nbytes, root, op = call
    parts = [_dtype_name(dtype), f"{nbytes} bytes"]
    if root >= 0:
        parts.append(f"root {root}")
    if op:
        parts.append(sorted(_OPS.values())[op - 1])
    return f"{KINDS[kind - 1]}({', '.join(parts)})"


def create(options: Any, backend_options: Any = None) -> NeuronProcessGroup:
    """The creator ``dist.Backend.register_backend`` calls (extended API). DTensor's random
    ops on ``neuron`` meshes, which need such a group, get their RNG tracker here."""
    from trnsim.backend.distributed import dtensor_rng

    dtensor_rng.install()
    return NeuronProcessGroup(options, backend_options)

