"""A representative slice of PyTorch's OpInfo database on ``neuron``, against the CPU.

Runs ``check_op`` from ``benchmarks/opinfo.py`` in-process (the full benchmark, every
op in worker processes, is ``python benchmarks/opinfo.py``): float32 forward and
float32 gradients, up to 8 sample inputs each.
"""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("expecttest")  # torch.testing._internal needs it

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import opinfo

OPS = [
    # elementwise and activations
    "add", "mul", "where", "clamp", "exp", "tanh", "sigmoid", "masked_fill",
    "nn.functional.gelu", "nn.functional.silu",
    # matmul family
    "matmul", "mm", "bmm", "addmm", "baddbmm", "nn.functional.linear",
    # normalisation, attention, convolution
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.group_norm",
    "nn.functional.scaled_dot_product_attention", "nn.functional.conv2d", "nn.functional.cross_entropy",
    # indexing
    "nn.functional.embedding", "index_select", "index_put", "index_add", "gather", "scatter", "scatter_add",
    "take_along_dim",
    # reductions, scans, sorting
    "sum", "mean", "amax", "argmax", "cumsum", "sort", "topk",
    # joining and views
    "cat", "stack", "transpose", "reshape", "view", "expand", "narrow", "flip",
]

# (op, mode) pairs that fail today, with the cause; strict, so a fix turns one into an
# XPASS failure (then drop the entry). None at present.
XFAIL: dict[tuple[str, str], str] = {}

MODES = ("fp32", "fp32-grad")


def _cases():
    for name in OPS:
        for mode in MODES:
            marks = []
            if (name, mode) in XFAIL:
                marks.append(pytest.mark.xfail(strict=True, reason=XFAIL[(name, mode)]))
            yield pytest.param(name, mode, marks=marks, id=f"{name}-{mode}")


def _op(name):
    found = [op for op in opinfo.op_db() if opinfo.op_key(op) == name]
    assert found, f"no OpInfo {name!r} in op_db"
    return found[0]


@pytest.mark.parametrize("name,mode", list(_cases()))
def test_opinfo_matches_cpu(name, mode):
    op = _op(name)
    if not opinfo.applicable(op, mode):
        pytest.skip(f"{name} does not support {mode} on the CPU")
    status, reason = opinfo.check_op(op, mode, samples=8)
    assert status in (opinfo.PASS, opinfo.NONDET), f"{name} [{mode}]: {reason}"


def test_check_op_reports_not_applicable():
    assert opinfo.check_op(_op("argmax"), "fp32-grad") == (opinfo.NA, "")


def test_check_op_accepts_keys():
    assert opinfo.check_op("mm", "fp32", samples=2)[0] == opinfo.PASS


FOREACH = ["_foreach_add", "_foreach_mul", "_foreach_addcmul", "_foreach_addcdiv", "_foreach_lerp", "_foreach_sqrt",
           "_foreach_norm", "_foreach_zero"]


def _foreach_op(name):
    from torch.testing._internal import common_methods_invocations as cmi

    dbs = [getattr(cmi, n) for n in dir(cmi) if n.startswith("foreach_") and n.endswith("_op_db")]
    found = [op for db in dbs for op in db if op.name == name]
    assert found, f"no foreach OpInfo {name!r}"
    return found[0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", FOREACH)
def test_foreach_opinfo_matches_cpu(name, mode):
    """_foreach_ ops run whole on neuron (one device op per call): PyTorch's foreach
    OpInfos, the same check as op_db's."""
    op = _foreach_op(name)
    if not opinfo.applicable(op, mode):
        pytest.skip(f"{name} does not support {mode} on the CPU")
    status, reason = opinfo.check_op(op, mode, samples=4)
    assert status in (opinfo.PASS, opinfo.NONDET), f"{name} [{mode}]: {reason}"
