"""Names of AWS's own packages that trnsim stands in for.

:mod:`trnsim.compat.aliases` makes ``import nki``, ``import neuronxcc.nki`` and
``import torch_neuronx`` (and ``torch_xla``) give trnsim's modules when the real packages
are not installed; :mod:`trnsim.compat.torch_neuronx` is trnsim's ``torch_neuronx``,
:mod:`trnsim.compat.torch_xla` its ``torch_xla``.
Importing this package imports nothing else.
"""
