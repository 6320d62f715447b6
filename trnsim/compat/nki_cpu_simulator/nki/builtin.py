"""``nki_cpu_simulator.nki.builtin``: the module that the NKI library's test set-up makes
the global ``builtin``; no NKI library code reads a name from it, so it has none."""
