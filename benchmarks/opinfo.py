"""PyTorch's OpInfo database on the ``neuron`` device, checked against the CPU.

Every OpInfo entry of ``op_db`` (keyed ``name`` or ``name.variant_test_name``) is run
with the same sample inputs on the CPU and on ``neuron`` in four modes:

    fp32        float32 forward
    fp32-grad   float32 gradients of the inputs (torch.autograd.grad with a fixed
                random cotangent), for ops with supports_autograd
    bf16        bfloat16 forward
    int64       int64 forward

An op passes a mode when, for each of its first ``--samples`` sample inputs, both
devices raise, or both succeed with matching outputs (``torch.testing.assert_close``
on the tensor leaves with the OpInfo's tolerance overrides or the defaults,
``equal_nan=True``; other leaves compared for equality; neuron outputs must be on
``neuron``). A dtype the op does not support on the CPU is "not applicable".
Random ops are reseeded (``torch.manual_seed(0)``, which also seeds the neuron
generator) before each call; an op whose CPU result differs between two seeded runs is
"nondet" and only its shapes, dtypes and exceptions are compared.

Each (op, mode) runs in one of ``--workers`` worker processes with a timeout, so a
segfault or a hang is recorded ("crash" / "timeout") and the run goes on.

    python benchmarks/opinfo.py                                  # all ops, all modes
    python benchmarks/opinfo.py --modes fp32 --ops add,mm,nn.functional.conv2d
    python benchmarks/opinfo.py --limit 50 --samples 2

The per-op check is importable (``tests/test_opinfo_slice.py`` uses it)::

    sys.path.insert(0, "benchmarks"); import opinfo
    opinfo.check_op(opinfo.find_ops(["mm"])[0], "fp32")   # -> ("pass", "")
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
import traceback
import warnings

MODES = {
    # mode: (dtype name, gradients?)
    "fp32": ("float32", False),
    "fp32-grad": ("float32", True),
    "bf16": ("bfloat16", False),
    "int64": ("int64", False),
}
DEFAULT_OUT = "benchmarks/opinfo_results.json"
DEFAULT_COVERAGE = "docs/opinfo_coverage.md"
DEVICE = "neuron"

PASS, FAIL, NA, NONDET, CRASH, TIMEOUT = "pass", "fail", "n/a", "nondet", "crash", "timeout"
_REASON_LEN = 240


# ----------------------------------------------------------------------------- op_db

_op_db = None


def op_db() -> list:
    """PyTorch's OpInfo list (loaded once; also registers the neuron device)."""
    global _op_db
    if _op_db is None:
        import torch  # noqa: F401  (autoload registers neuron)
        import trnsim  # noqa: F401

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.testing._internal.common_methods_invocations import op_db as db
        _op_db = list(db)
    return _op_db


def op_key(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def find_ops(names) -> list:
    """OpInfos whose key (``name`` or ``name.variant``) or name is in ``names``, in op_db order."""
    names = set(names)
    return [op for op in op_db() if op_key(op) in names or op.name in names]


def applicable(op, mode: str) -> bool:
    """Whether ``mode`` applies: the dtype is supported on the CPU (and, for gradients,
    the op supports autograd in that dtype)."""
    import torch

    dtype_name, grad = MODES[mode]
    dtype = getattr(torch, dtype_name)
    if dtype not in op.supported_dtypes("cpu"):
        return False
    if grad and (not op.supports_autograd or dtype not in op.supported_backward_dtypes("cpu")):
        return False
    return True


# ----------------------------------------------------------------------------- helpers


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    line = msg[0] if msg else ""
    return f"{type(e).__name__}: {line}"[:_REASON_LEN]


def _tolerances(op, dtype):
    """(atol, rtol) from the OpInfo's toleranceOverride decorators for ``dtype`` (the
    loosest one that applies to the CPU), or None for assert_close's defaults."""
    from torch.testing._internal.common_device_type import toleranceOverride
    from torch.testing._internal.opinfo.core import DecorateInfo

    atol = rtol = None
    for d in op.decorators or ():
        if isinstance(d, DecorateInfo):
            if d.device_type not in (None, "cpu"):
                continue
            if d.dtypes is not None and dtype not in d.dtypes:
                continue
            decs = d.decorators
        else:
            decs = [d]
        for dec in decs:
            if isinstance(dec, toleranceOverride) and dtype in dec.d:
                t = dec.d[dtype]
                atol = t.atol if atol is None else max(atol, t.atol)
                rtol = t.rtol if rtol is None else max(rtol, t.rtol)
    if atol is None:
        return None
    return atol, rtol


def _copy_tensor(x, device, storages: dict):
    """``x`` copied to ``device`` with its strides, storage offset and the rest of its
    storage (``as_strided`` samples read outside the view), detached; tensors of one
    storage stay views of one storage."""
    import torch

    x = x.detach()
    if x.layout != torch.strided or x.is_conj() or x.is_neg() or x.is_quantized or x.is_nested:
        return x.to(device, copy=True)
    st = x.untyped_storage()
    key = (st.data_ptr(), st.nbytes(), x.dtype)
    full = storages.get(key)
    if full is None:
        n = st.nbytes() // x.element_size()
        full = torch.empty(0, dtype=x.dtype).set_(st, 0, (n,), (1,)).to(device, copy=True)
        storages[key] = full
    return full.as_strided(x.shape, x.stride(), x.storage_offset())


def _to_device(tree, device, placement=None):
    """``tree`` with every tensor copied to ``device`` (detached, strides and storage
    kept; requires_grad kept, so tensors that required grad are leaves there) and CPU
    device arguments rewritten. The same tensor twice stays the same tensor.

    ``placement``, the same sample made by ``sample_inputs(device)``, says which tensors
    the OpInfo leaves on the CPU (``tensor_split``'s indices) and which device arguments
    name the device; without it every tensor goes to ``device``."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten(tree)
    where = None
    if placement is not None:
        p_leaves, p_spec = tree_flatten(placement)
        if p_spec == spec and len(p_leaves) == len(leaves):
            where = p_leaves
    memo, storages, out = {}, {}, []
    for i, x in enumerate(leaves):
        p = where[i] if where is not None else None
        if isinstance(x, torch.Tensor):
            dev = p.device if isinstance(p, torch.Tensor) else torch.device(device)
            y = memo.get((id(x), dev))
            if y is None:
                y = _copy_tensor(x, dev, storages.setdefault(dev, {}))
                if x.requires_grad:
                    y.requires_grad_(True)
                memo[(id(x), dev)] = y
            out.append(y)
        elif where is not None:
            out.append(p if _is_device_like(p) and _is_device_like(x) else x)
        elif isinstance(x, torch.device) and x.type == "cpu":
            out.append(torch.device(device))
        else:
            out.append(x)
    return tree_unflatten(out, spec)


def _names_device(x) -> bool:
    """Whether ``x`` is a neuron tensor or a device argument naming neuron."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.device.type == DEVICE
    if _is_device_like(x):
        return torch.device(x).type == DEVICE
    return False


def _is_device_like(x) -> bool:
    import torch

    if isinstance(x, torch.device):
        return True
    if isinstance(x, str):
        try:
            torch.device(x)
            return True
        except RuntimeError:   # torch.device's error for a string that names no device
            return False
    return False


def _fix_device_kwargs(kwargs, device):
    out = dict(kwargs)
    v = out.get("device")
    if isinstance(v, str) and v.startswith("cpu"):
        out["device"] = device
    return out


def _call(op, inp, args, kwargs, grad: bool, output_process_fn_grad):
    """One seeded run; returns the forward outputs, or (for ``grad``) the input gradients
    (or the outputs when nothing differentiable came out)."""
    import torch
    from torch.utils._pytree import tree_leaves

    torch.manual_seed(0)
    out = op(inp, *args, **kwargs)
    if not grad:
        return ("out", out)
    out = output_process_fn_grad(out)
    inputs = [t for t in tree_leaves((inp, args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not inputs or not outs:
        return ("out", out)
    cots = []
    for i, t in enumerate(outs):
        g = torch.Generator().manual_seed(1234 + i)
        cots.append(torch.randn(t.shape, dtype=t.dtype, generator=g).to(t.device))
    torch.manual_seed(0)
    grads = torch.autograd.grad(outs, inputs, cots, allow_unused=True)
    return ("grad", list(grads))


def _compare(expected, actual, tols, *, values=True, check_on_device=True) -> str | None:
    """None if ``actual`` (neuron) matches ``expected`` (CPU), else a short reason."""
    import torch
    from torch.utils._pytree import tree_flatten

    e_leaves, e_spec = tree_flatten(expected)
    a_leaves, a_spec = tree_flatten(actual)
    if len(e_leaves) != len(a_leaves):
        return f"mismatch: output structure differs ({len(e_leaves)} vs {len(a_leaves)} leaves)"
    for i, (e, a) in enumerate(zip(e_leaves, a_leaves)):
        if isinstance(e, torch.Tensor) or isinstance(a, torch.Tensor):
            if not (isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor)):
                return f"mismatch: output {i} is {type(a).__name__}, expected {type(e).__name__}"
            if check_on_device and e.device.type == "cpu" and a.device.type != DEVICE:
                return f"wrong device: output {i} on {a.device}, expected {DEVICE}"
            if a.layout != torch.strided or e.layout != torch.strided:
                try:
                    a = a.to_dense()
                    e = e.to_dense()
                except Exception:  # noqa: BLE001 - a layout that cannot be made dense is compared as it is
                    pass
            try:
                a_cpu = a.detach().cpu()
            except Exception as ex:  # noqa: BLE001 - any failure to copy back is the op's failure, reported
                return f"copy to cpu failed: {_first_line(ex)}"
            if not values:
                if a_cpu.shape != e.shape or a_cpu.dtype != e.dtype:
                    return (f"mismatch: output {i} shape/dtype {tuple(a_cpu.shape)} {a_cpu.dtype}, "
                            f"expected {tuple(e.shape)} {e.dtype}")
                continue
            kw = {}
            if tols is not None and (e.dtype.is_floating_point or e.dtype.is_complex):
                rtol, atol = torch.testing._comparison.default_tolerances(e.dtype)
                kw = dict(rtol=max(tols[1], rtol), atol=max(tols[0], atol))
            try:
                torch.testing.assert_close(a_cpu, e.detach(), equal_nan=True, check_device=False,
                                           check_stride=False, **kw)
            except AssertionError as ex:
                return f"mismatch: output {i}: {_assert_close_summary(ex)}"[:_REASON_LEN]
        elif values or not isinstance(e, float):
            if e is None and a is None:
                continue
            same = e == a
            if isinstance(e, float) and isinstance(a, float) and math.isnan(e) and math.isnan(a):
                same = True
            try:
                same = bool(same)
            except Exception:  # noqa: BLE001 - an equality without one truth value (a tensor, an odd object) is a mismatch
                same = False
            if not same:
                return f"mismatch: output {i}: {a!r} != {e!r}"[:_REASON_LEN]
    if values and e_spec != a_spec:
        return "mismatch: output structure differs"
    return None


def _assert_close_summary(ex: AssertionError) -> str:
    """assert_close's message in one line: its first line, the mismatch count and the
    greatest differences."""
    import re

    lines = [ln.strip() for ln in str(ex).strip().splitlines() if ln.strip()]
    if not lines:
        return "assert_close failed"
    parts = [lines[0].rstrip("!")]
    for ln in lines[1:]:
        m = re.match(r"Mismatched elements: (\S+ / \S+)", ln)
        if m:
            parts.append(f"{m.group(1)} mismatched")
        m = re.match(r"Greatest (absolute|relative) difference: (\S+)", ln)
        if m:
            parts.append(f"max {m.group(1)[:3]} diff {m.group(2)}")
        if not ln.startswith(("Mismatched", "Greatest")) and len(parts) == 1:
            parts.append(ln)
    return "; ".join(parts)


def _run_safely(fn, *args):
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 - an op raising is a result, not an error
        return None, e


# ----------------------------------------------------------------------------- check_op


def check_op(opinfo, mode: str, samples: int = 8) -> tuple[str, str]:
    """Run ``opinfo`` (an OpInfo, or its key) on CPU and neuron in ``mode`` for its
    first ``samples`` sample inputs. Returns ``(status, reason)``: status is "pass",
    "fail", "nondet" (CPU results differ between seeded runs: only shapes, dtypes and
    exceptions compared) or "n/a" (dtype not supported on the CPU); reason is the first
    failing sample's short reason, "" on a pass ("vacuous: ..." when nothing was
    compared because there were no samples or every sample raised on both devices)."""
    import torch
    from torch.utils._pytree import tree_leaves

    if isinstance(opinfo, str):
        found = [op for op in op_db() if op_key(op) == opinfo] or find_ops([opinfo])
        if not found:
            raise KeyError(f"no OpInfo named {opinfo!r}")
        opinfo = found[0]
    op = opinfo
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if not applicable(op, mode):
        return NA, ""
    dtype_name, grad = MODES[mode]
    dtype = getattr(torch, dtype_name)
    tols = _tolerances(op, dtype)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        try:
            sample_list = list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=grad), samples))
        except Exception as e:  # noqa: BLE001 - the OpInfo's own failure is reported as the op's
            return FAIL, f"sample_inputs failed on cpu: {_first_line(e)}"
        # the same samples made for the device, only to see where the OpInfo puts each tensor
        torch.manual_seed(0)
        try:
            placements = list(itertools.islice(op.sample_inputs(DEVICE, dtype, requires_grad=grad), samples))
        except Exception:  # noqa: BLE001 - without the device's samples, tensors go where the CPU's are
            placements = []
        # ops that return uninitialised memory (empty, new_empty_strided, ...) are never comparable
        nondet = "empty" in op.name
        runs = []
        for si, s in enumerate(sample_list):
            proc = getattr(s, "output_process_fn_grad", None) or (lambda x: x)
            # move to neuron before the CPU runs, in case the op writes its inputs
            p = placements[si] if si < len(placements) else None
            p = (p.input, tuple(p.args), dict(p.kwargs)) if p is not None else None
            try:
                n_inp, n_args, n_kwargs = _to_device((s.input, tuple(s.args), dict(s.kwargs)), DEVICE, p)
                n_kwargs = _fix_device_kwargs(n_kwargs, DEVICE)
            except Exception as e:  # noqa: BLE001 - reported as the op's failure
                return FAIL, f"sample {si}: moving inputs to {DEVICE} failed: {_first_line(e)}"
            # the CPU reference, twice (on a fresh copy) to tell nondeterministic ops
            c_inp, c_args, c_kwargs = _to_device((s.input, tuple(s.args), dict(s.kwargs)), "cpu")
            cpu1, cpu_err = _run_safely(_call, op, s.input, tuple(s.args), dict(s.kwargs), grad, proc)
            if cpu_err is None and not nondet:
                cpu2, _ = _run_safely(_call, op, c_inp, c_args, c_kwargs, grad, proc)
                try:
                    nondet = (cpu2 is None or cpu1[0] != cpu2[0]
                              or _compare(cpu1[1], cpu2[1], tols, check_on_device=False) is not None)
                except Exception:  # noqa: BLE001 - CPU results that cannot be compared count as nondeterministic
                    nondet = True
                del cpu2
            runs.append((si, proc, (n_inp, n_args, n_kwargs), cpu1, cpu_err))
        compared = 0
        for si, proc, (n_inp, n_args, n_kwargs), cpu1, cpu_err in runs:
            dev, dev_err = _run_safely(_call, op, n_inp, n_args, n_kwargs, grad, proc)
            if cpu_err is not None and dev_err is not None:
                continue  # both raise: agree
            compared += 1
            if cpu_err is not None:
                return FAIL, f"sample {si}: cpu raised but {DEVICE} succeeded (cpu: {_first_line(cpu_err)})"[:_REASON_LEN]
            if dev_err is not None:
                return FAIL, f"sample {si}: {_first_line(dev_err)}"
            if cpu1[0] != dev[0]:
                return FAIL, f"sample {si}: mismatch: cpu computed {cpu1[0]}, {DEVICE} {dev[0]}"
            # outputs belong on the device when a neuron tensor or device argument went in
            # (a factory call with neither, like arange(2), rightly makes a CPU tensor)
            on_device = any(_names_device(x) for x in tree_leaves((n_inp, n_args, n_kwargs)))
            try:
                reason = _compare(cpu1[1], dev[1], tols, values=not nondet, check_on_device=on_device)
            except Exception as e:  # noqa: BLE001 - reported as the op's failure
                reason = f"compare failed: {_first_line(e)}"
            if reason is not None:
                return FAIL, f"sample {si}: {reason}"[:_REASON_LEN]
    if nondet:
        return NONDET, "cpu results differ between seeded runs: compared shapes/dtypes only"
    if not sample_list:
        return PASS, "vacuous: no sample inputs"
    if not compared:
        return PASS, "vacuous: every sample raised on both devices"
    return PASS, ""


# ----------------------------------------------------------------------------- worker pool


def _worker_main(conn, samples: int) -> None:
    """A worker: load op_db, say ready, then check (index, mode) tasks until told to stop."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch

        torch.set_num_threads(1)
        db = op_db()
    except BaseException:  # noqa: BLE001 - the parent must hear why the worker could not start
        conn.send(("import-error", traceback.format_exc()))
        return
    warnings.simplefilter("ignore")
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        idx, mode = task
        t0 = time.time()
        _inject_fault(op_key(db[idx]))
        try:
            status, reason = check_op(db[idx], mode, samples)
        except BaseException as e:  # noqa: BLE001 - anything an op does is its result; the worker goes on
            status, reason = FAIL, f"harness error: {_first_line(e)}"
        conn.send(("result", (idx, mode, status, reason, time.time() - t0)))


def _inject_fault(key: str) -> None:
    """Test hook: ``OPINFO_INJECT=add=crash,mm=hang`` makes a worker segfault or hang on those ops."""
    spec = os.environ.get("OPINFO_INJECT")
    if not spec:
        return
    faults = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
    if faults.get(key) == "crash":
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)
    elif faults.get(key) == "hang":
        time.sleep(1e6)


class _Worker:
    def __init__(self, ctx, samples: int) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, samples), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.task = None
        self.deadline = None
        self.started = None
        self.done = 0

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


def _signal_name(code) -> str:
    import signal

    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            pass
    return f"exit code {code}"


def run_pool(tasks, *, samples: int, workers: int, timeout: float, max_tasks_per_child: int = 150,
             on_result=None, import_retries: int = 5) -> list[dict]:
    """Check ``tasks`` ((op_db index, mode) pairs) in worker processes; returns one dict per task."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    db = op_db()
    ctx = mp.get_context("spawn")
    pending = list(tasks)
    pending.reverse()
    results = []
    pool = [_Worker(ctx, samples) for _ in range(min(workers, len(pending)) or 1)]
    import_failures = 0

    def record(idx, mode, status, reason, seconds):
        r = dict(op=op_key(db[idx]), mode=mode, status=status, reason=reason, seconds=round(seconds, 3))
        results.append(r)
        if on_result is not None:
            on_result(r)

    def replace(i):
        pool[i].kill()
        pool[i] = _Worker(ctx, samples)

    while pending or any(w.task is not None for w in pool):
        for i, w in enumerate(pool):
            if w.ready and w.task is None and pending:
                if w.done >= max_tasks_per_child:
                    replace(i)
                    continue
                w.task = pending.pop()
                w.started = time.time()
                w.deadline = w.started + timeout
                w.conn.send(w.task)
        now = time.time()
        deadlines = [w.deadline for w in pool if w.task is not None]
        wait_s = max(0.05, min(deadlines) - now) if deadlines else 1.0
        ready = wait([w.conn for w in pool] + [w.proc.sentinel for w in pool], timeout=min(wait_s, 5.0))
        for i, w in enumerate(pool):
            msg = None
            if w.conn in ready:
                try:
                    msg = w.conn.recv()
                except (EOFError, OSError):
                    msg = None
            if msg is not None:
                kind, payload = msg
                if kind == "ready":
                    w.ready = True
                elif kind == "result":
                    record(*payload)
                    w.task = w.deadline = None
                    w.done += 1
                elif kind == "import-error":
                    import_failures += 1
                    print(f"worker failed to import (try {import_failures}):\n{payload}", file=sys.stderr)
                    if import_failures > import_retries:
                        raise RuntimeError("workers cannot import torch/trnsim; giving up")
                    time.sleep(60)  # trnsim may be mid-edit: wait and try again
                    replace(i)
                continue
            if not w.proc.is_alive() and (w.conn not in ready or msg is None):
                if w.task is not None:
                    idx, mode = w.task
                    record(idx, mode, CRASH, f"crash: worker died ({_signal_name(w.proc.exitcode)})",
                           time.time() - w.started)
                replace(i)
            elif w.task is not None and time.time() > w.deadline:
                idx, mode = w.task
                record(idx, mode, TIMEOUT, f"timeout: over {timeout:g} s", time.time() - w.started)
                replace(i)
    for w in pool:
        try:
            w.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
    for w in pool:
        w.proc.join(5)
        w.kill()
    return results


# ----------------------------------------------------------------------------- reporting


def summarise(results: list[dict], modes) -> dict:
    summary = {}
    for mode in modes:
        rs = [r for r in results if r["mode"] == mode]
        n = {s: sum(1 for r in rs if r["status"] == s) for s in (PASS, FAIL, NA, NONDET, CRASH, TIMEOUT)}
        appl = n[PASS] + n[NONDET] + n[FAIL] + n[CRASH] + n[TIMEOUT]
        passed = n[PASS] + n[NONDET]
        vacuous = sum(1 for r in rs if r["status"] == PASS and r["reason"].startswith("vacuous"))
        summary[mode] = dict(applicable=appl, passed=passed, nondet=n[NONDET], vacuous=vacuous,
                             failed=appl - passed,
                             crash=n[CRASH], timeout=n[TIMEOUT], not_applicable=n[NA],
                             pass_rate=round(100.0 * passed / appl, 1) if appl else None,
                             seconds=round(sum(r["seconds"] for r in rs), 1))
    return summary


def format_summary(summary: dict, wall: float) -> str:
    lines = [f"{'mode':<10} {'applicable':>10} {'passed':>7} {'(nondet)':>8} {'(vacuous)':>9} {'failed':>7} "
             f"{'crash':>6} {'timeout':>7} {'n/a':>5} {'pass %':>7} {'op-s':>8}"]
    for mode, s in summary.items():
        rate = f"{s['pass_rate']:.1f}" if s["pass_rate"] is not None else "-"
        lines.append(f"{mode:<10} {s['applicable']:>10} {s['passed']:>7} {s['nondet']:>8} {s['vacuous']:>9} "
                     f"{s['failed']:>7} {s['crash']:>6} {s['timeout']:>7} {s['not_applicable']:>5} {rate:>7} "
                     f"{s['seconds']:>8.1f}")
    lines.append(f"wall time {wall:.1f} s (op-s: seconds spent in the workers per mode; passed counts nondet "
                 "ops, whose values cannot be compared, and vacuous ones, where every sample raised on both)")
    return "\n".join(lines)


def write_coverage(path: str, results: list[dict], summary: dict, meta: dict) -> None:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ").replace("`", "'")

    out = ["# OpInfo coverage of the `neuron` device", "",
           f"Generated by `python benchmarks/opinfo.py` ({meta['samples']} samples per op, torch "
           f"{meta['torch']}, {meta['date']}). Each op of PyTorch's OpInfo database runs on `neuron` and "
           "on the CPU with the same sample inputs; see the script's docstring for what passes.", "",
           "| mode | applicable | passed | of which nondet | of which vacuous | failed | pass rate |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for mode, s in summary.items():
        rate = f"{s['pass_rate']:.1f}%" if s["pass_rate"] is not None else "-"
        out.append(f"| {mode} | {s['applicable']} | {s['passed']} | {s['nondet']} | {s['vacuous']} | "
                   f"{s['failed']} | {rate} |")
    out += ["", "nondet: the CPU result differs between two seeded runs (uninitialised memory), so only "
            "shapes, dtypes and exceptions are compared. vacuous: every sample raised on both devices.", ""]
    for mode in summary:
        nd = sorted(r["op"] for r in results if r["mode"] == mode and r["status"] == NONDET)
        vac = sorted(r["op"] for r in results if r["mode"] == mode and r["status"] == PASS
                     and r["reason"].startswith("vacuous"))
        if nd:
            out.append(f"- {mode} nondet: " + ", ".join(f"`{o}`" for o in nd))
        if vac:
            out.append(f"- {mode} vacuous: " + ", ".join(f"`{o}`" for o in vac))
    for mode in summary:
        fails = sorted((r for r in results if r["mode"] == mode and r["status"] in (FAIL, CRASH, TIMEOUT)),
                       key=lambda r: r["op"])
        out += ["", f"## {mode}: {len(fails)} failures", ""]
        if not fails:
            out.append("None.")
            continue
        out += ["| op | reason |", "|---|---|"]
        out += [f"| `{r['op']}` | {esc(r['reason'])} |" for r in fails]
    from trnsim.atomic import write_atomic

    text = "\n".join(out) + "\n"
    write_atomic(path, lambda f: f.write(text))


# ----------------------------------------------------------------------------- CLI


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--ops", default=None, help="comma-separated op keys or names (default: all)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N ops")
    ap.add_argument("--samples", type=int, default=8, help="sample inputs per op (default 8)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per op and mode (default 60)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--coverage-file", default=DEFAULT_COVERAGE)
    args = ap.parse_args(argv)

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}; use {', '.join(MODES)}")
    t0 = time.time()
    import torch

    db = op_db()
    if args.ops:
        names = [n.strip() for n in args.ops.split(",") if n.strip()]
        ops = find_ops(names)
        missing = [n for n in names if not any(op_key(o) == n or o.name == n for o in ops)]
        if missing:
            print(f"warning: no OpInfo for {', '.join(missing)}", file=sys.stderr)
    else:
        ops = list(db)
    if args.limit is not None:
        ops = ops[: args.limit]
    index = {id(op): i for i, op in enumerate(db)}

    results, tasks = [], []
    for mode in modes:
        for op in ops:
            if applicable(op, mode):
                tasks.append((index[id(op)], mode))
            else:
                results.append(dict(op=op_key(op), mode=mode, status=NA, reason="", seconds=0.0))
    # interleave modes so a partial run covers every mode
    tasks.sort(key=lambda t: (t[0], modes.index(t[1])))
    print(f"{len(ops)} ops x {len(modes)} modes: {len(tasks)} applicable checks, "
          f"{args.workers} workers, {args.samples} samples, timeout {args.timeout:g} s", flush=True)

    jsonl = os.path.splitext(args.out)[0] + ".jsonl"
    os.makedirs(os.path.dirname(jsonl) or ".", exist_ok=True)
    count = [0]
    with open(jsonl, "w") as log:
        def on_result(r):
            log.write(json.dumps(r) + "\n")
            log.flush()
            count[0] += 1
            if r["status"] not in (PASS, NONDET, NA):
                print(f"  [{count[0]}/{len(tasks)}] {r['mode']:<9} {r['op']}: {r['reason']}", flush=True)
            elif count[0] % 100 == 0:
                print(f"  [{count[0]}/{len(tasks)}] {time.time() - t0:.0f} s", flush=True)

        results += run_pool(tasks, samples=args.samples, workers=args.workers, timeout=args.timeout,
                            on_result=on_result)
    wall = time.time() - t0
    summary = summarise(results, modes)
    meta = dict(torch=torch.__version__, samples=args.samples, workers=args.workers, timeout=args.timeout,
                wall_s=round(wall, 1), date=time.strftime("%Y-%m-%d"), modes=modes, ops=len(ops))
    results.sort(key=lambda r: (r["mode"], r["op"]))
    from trnsim.atomic import write_atomic

    write_atomic(args.out, lambda f: json.dump(dict(meta=meta, summary=summary, results=results), f, indent=1))
    os.remove(jsonl)  # the progress log, kept only if the run dies before this point
    if args.coverage_file:
        write_coverage(args.coverage_file, results, summary, meta)
    print(format_summary(summary, wall))
    print(f"results: {args.out}" + (f", failures: {args.coverage_file}" if args.coverage_file else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
