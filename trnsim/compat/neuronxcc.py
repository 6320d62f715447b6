"""``neuronxcc`` when the Neuron compiler is not installed: only ``neuronxcc.nki``,
which is :mod:`trnsim.nki` (see :mod:`trnsim.compat.aliases`)."""

from __future__ import annotations

# a package, so that the import system looks for neuronxcc.nki below it
__path__: list[str] = []
