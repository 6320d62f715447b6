"""FlexAttention on ``neuron``: ``flex_attention`` and ``create_block_mask``, eager and compiled.

PyTorch's FlexAttention refuses devices it does not list (``_validate_device`` in
``torch.nn.attention.flex_attention``); :func:`install` adds ``neuron`` to that list
when the module loads (an import hook, so ``import torch`` stays as fast). The
function stays PyTorch's own code, so Dynamo still traces it inside compiled models.

``flex_attention`` runs as its higher-order op, ``flex_attention`` (and
``flex_attention_backward`` for its gradients), which :func:`install` implements for
the ``PrivateUse1`` key: values come from PyTorch's own dense implementation (the CPU's
``flex_attention`` values, computed on the host), and the op is one kernel on the timeline, timed by the block-sparse flash
kernels over the blocks the block mask keeps (:mod:`trnsim.backend.flextiming`). Inside
a graph compiled with ``backend="neuron"`` the op is one of the graph's kernels, timed
the same way by the block mask the call gets. ``create_block_mask`` needs nothing of
its own: its ops run on the device as any others.
"""

from __future__ import annotations

import copy
import importlib
import weakref
from types import ModuleType
from typing import Any

import torch
from torch._C import DispatchKey
from torch.utils._pytree import tree_map

from trnsim.backend import importhook, timeline

# the module (the package's name of the same spelling is the forward op)
hop = importlib.import_module("torch._higher_order_ops.flex_attention")

MODULE = "torch.nn.attention.flex_attention"
#: The higher-order ops' names, as profiles and compiled graphs show them.
FORWARD, BACKWARD = "flex_attention", "flex_attention_backward"


def accept_neuron(module: ModuleType) -> None:
    """Add ``neuron`` to the devices ``module._validate_device`` accepts (its set of
    device names is a constant of the function's code)."""
    fn = module._validate_device
    consts = tuple(c | {"neuron"} if isinstance(c, frozenset) and "cuda" in c else c for c in fn.__code__.co_consts)
    fn.__code__ = fn.__code__.replace(co_consts=consts)


def _put(name: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask: tuple,
         backward: bool) -> None:
    """Put the op on the timeline; inside a compiled graph, report its cost to the graph,
    which charges it in its kernel's place."""
    from trnsim.backend.opcost import estimate, tensor_bytes
    from trnsim.backend.flextiming import attention_cost

    with timeline.simulating:
        cost = attention_cost(query, key, value, block_mask, backward)
    if cost is None:   # the bytes over HBM: q, k, v and the output (backward: with their gradients)
        cost = estimate((tensor_bytes(query) * 2 + tensor_bytes(key) + tensor_bytes(value)) * (2 if backward else 1))
    if timeline.host_only():
        timeline.report_measured(cost)
        return
    qkv = (query, key, value)
    timeline.charge_kernel(name, cost, tuple(tuple(t.shape) for t in qkv),
                           tuple(str(t.dtype).removeprefix("torch.") for t in qkv))


def _is_neuron(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "neuron"


_host_graphs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cpu(x: Any) -> Any:
    if isinstance(x, torch.device) and x.type == "neuron":
        return torch.device("cpu")
    if isinstance(x, str) and x.startswith("neuron"):
        return "cpu"
    return x


def _on_host(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``graph`` (a traced ``score_mod``/``mask_mod``) with the tensors it makes (``full``,
    ``arange``, ... on ``device=neuron``) made on the host, beside the host aliases it is
    given; made once per graph."""
    host = _host_graphs.get(graph)
    if host is None:
        if not any(_cpu(v) is not v for node in graph.graph.nodes for v in (*node.args, *node.kwargs.values())):
            host = graph
        else:
            copied = copy.deepcopy(graph.graph)
            for node in copied.nodes:
                node.args = tuple(_cpu(v) for v in node.args)
                node.kwargs = {k: _cpu(v) for k, v in node.kwargs.items()}
            host = torch.fx.GraphModule(graph, copied)
        _host_graphs[graph] = host
    return host


def _computed(fn: Any, args: tuple, functions: tuple) -> Any:
    """``fn(*args)``, PyTorch's dense implementation, computed on the host: on host
    aliases of the neuron tensors among ``args``, its results taking over the memory of
    what it made (so the score matrix it materialises, which the chip's kernel never
    holds, is no HBM allocation). Where there are no values (``timing`` fidelity), or a
    ``score_mod``/``mask_mod`` among ``functions`` is plain Python (not traced by Dynamo,
    so it may read neuron tensors of its own), it runs on the device, off the timeline."""
    from trnsim.backend import state, storage

    if state.fidelity() == "timing" or not all(isinstance(f, torch.fx.GraphModule) for f in functions):
        with timeline.graph_execution():
            return fn(*args)
    host = tree_map(lambda x: storage.host_alias(x) if _is_neuron(x) else
                    _on_host(x) if isinstance(x, torch.fx.GraphModule) else x, args)
    return tree_map(lambda x: storage.adopt(x) if isinstance(x, torch.Tensor) else x, fn(*host))


def _forward(query, key, value, score_mod, block_mask, scale, kernel_options, score_mod_other_buffers=(),
             mask_mod_other_buffers=()):
    result = _computed(hop.sdpa_dense, (query, key, value, score_mod, block_mask, scale, kernel_options,
                                        score_mod_other_buffers, mask_mod_other_buffers), (score_mod, block_mask[-1]))
    _put(FORWARD, query, key, value, block_mask, backward=False)
    return result


def _backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph, block_mask, scale,
              kernel_options, score_mod_other_buffers=(), mask_mod_other_buffers=()):
    result = _computed(hop.sdpa_dense_backward, (query, key, value, out, logsumexp, grad_out, grad_logsumexp,
                                                 fw_graph, joint_graph, block_mask, scale, kernel_options,
                                                 score_mod_other_buffers, mask_mod_other_buffers),
                       (fw_graph, joint_graph, block_mask[-1]))
    _put(BACKWARD, query, key, value, block_mask, backward=True)
    return result


def install() -> None:
    """Implement the FlexAttention ops for ``neuron`` and let FlexAttention's module
    accept the device (now if it is loaded, else when it loads)."""
    if DispatchKey.PrivateUse1 in hop.flex_attention.py_kernels:
        return
    hop.flex_attention.py_impl(DispatchKey.PrivateUse1)(_forward)
    hop.flex_attention_backward.py_impl(DispatchKey.PrivateUse1)(_backward)
    timeline.MEASURED.update((FORWARD, BACKWARD))
    importhook.when_imported(MODULE, accept_neuron)
