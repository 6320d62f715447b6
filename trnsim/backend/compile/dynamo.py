"""The Dynamo backend function and the options it takes."""

from __future__ import annotations

import functools
import itertools
import warnings
from typing import Any

import torch
import torch.fx as fx

from trnsim.errors import CompileError, CompileModeWarning

_names = itertools.count()


@functools.cache
def decompositions() -> dict:
    """Core aten decompositions, keeping whole the ops that run as one kernel: the fused
    attention op (not in the table), and the backward of batch norm and of group norm,
    which the compiler runs as one kernel each (``batchnorm_backward_kernel``,
    ``groupnorm_backward_kernel``), as eager does, instead of their decompositions'
    separate reductions over the batch, group and spatial axes."""
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    for op in (torch.ops.aten.native_batch_norm_backward.default, torch.ops.aten.native_group_norm_backward.default):
        del table[op]
    return table


# the simulator's own code, which Dynamo must run rather than trace: with a frame of the
# user's code left to eager (after a graph break), every Python function the device calls
# would otherwise be compiled too (trnsim.models.tinyllama, a model, is not in the list)
INTERNAL = ("trnsim.backend", "trnsim.hw", "trnsim.kernels", "trnsim.nki", "trnsim.compute", "trnsim.trace",
            "trnsim.testing", "trnsim.atomic", "trnsim.dtypes", "trnsim.errors", "trnsim.isa", "trnsim.program")


@functools.cache
def skip_internal_frames() -> None:
    """Tell Dynamo to skip the frames of trnsim's device and simulator code (once)."""
    from torch._dynamo import trace_rules

    for name in INTERNAL:
        trace_rules.add(name)


def _check_options(mode: str | None, options: dict | None) -> None:
    # Python's warning filters say how often (by default once per line of the caller's
    # code), not a set kept here: a set would hide the warning from a later test or caller
    if mode is not None and mode != "default":
        warnings.warn(f"torch.compile(mode={mode!r}) has no meaning on the neuron backend, which compiles every "
                      "graph the one way; compiling as mode='default'", CompileModeWarning, stacklevel=3)
    if options:
        warnings.warn(f"torch.compile(options={options!r}): the neuron backend takes no options; ignoring "
                      f"{', '.join(map(repr, options))}", CompileModeWarning, stacklevel=3)
    if not torch._dynamo.config.assume_static_by_default:
        raise CompileError("torch.compile(dynamic=True) is not supported by the neuron backend: it compiles static "
                           "shapes, one graph per shape, as the Neuron compiler does. Use dynamic=False (the "
                           "default) and keep shapes fixed: pad inputs to a few fixed lengths and use static caches "
                           "(generate(..., cache_implementation='static')).")


def _user_name(placeholder: str) -> str:
    """The user's name of a Dynamo graph input (``L_x_`` and ``l_x_`` are ``x``)."""
    if placeholder[:2] in ("L_", "l_") and placeholder.endswith("_"):
        return placeholder[2:-1]
    return placeholder


def neuron_backend(gm: fx.GraphModule, example_inputs: list, mode: str | None = None,
                   options: dict | None = None) -> Any:
    """The ``neuron`` Dynamo backend: ``torch.compile(model, backend="neuron")``."""
    from functorch.compile import make_boxed_compiler
    from torch._dynamo.backends.common import aot_autograd

    from trnsim.backend.compile.runtime import CompiledGraph

    from trnsim.backend.compile import metrics

    _check_options(mode, options)
    event = metrics.on_compile(gm, example_inputs)
    name = f"graph{next(_names)}"
    inputs = [_user_name(n.name) for n in gm.graph.nodes if n.op == "placeholder"]
    # the model's parameters among the inputs: the compiler lays them out as its kernels load them
    params = {i for i, x in enumerate(example_inputs) if isinstance(x, torch.nn.Parameter)}

    def compiler(kind: str):
        def compile_graph(graph: fx.GraphModule, example: list) -> CompiledGraph:
            if kind != "backward":
                mark_parameters(graph, params, len(inputs))
            compiled = CompiledGraph(graph, f"{name} {kind}", kind, event, inputs if kind != "backward" else None)
            metrics.finish(event, nodes=compiled.nodes, kind=kind, has_collectives=compiled.has_collectives)
            return compiled
        return make_boxed_compiler(compile_graph)

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                        inference_compiler=compiler("inference"), decompositions=decompositions(),
                        keep_inference_input_mutations=True)(gm, example_inputs)


def mark_parameters(graph: fx.GraphModule, params: set[int], count: int) -> None:
    """Mark the inputs of an AOT forward or inference graph that are the model's
    parameters (``params``: their places among the Dynamo graph's ``count`` inputs, which
    AOT keeps in order when it adds none)."""
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != count:
        return
    for i in params:
        placeholders[i].meta["trnsim_parameter"] = True


skip_internal_frames()   # as soon as backend="neuron" is looked up, before its first graph
