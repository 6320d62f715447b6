"""``torch.compile(backend="neuron")``: the Dynamo backend and what it reports
(:mod:`trnsim.backend.compile.metrics`: compilations, recompilations and their causes)."""
