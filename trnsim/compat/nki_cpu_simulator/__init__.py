"""``nki_cpu_simulator`` without AWS's package: AWS's CPU simulator of NKI kernels, which
the NKI library's tests run in their simulation mode (``--test-mode simulation``).

Its :mod:`.nki` is a stand-in for the ``nki`` package that the library's test set-up
installs over ``nki``: trnsim's NKI (every name of :mod:`trnsim.nki`) plus the
simulator's entry point ``nki.cpu_simulate(kernel)[lnc](**numpy_inputs)``, which runs
the kernel on trnsim's simulator (:func:`trnsim.nki.simulate`) and returns its outputs
as numpy arrays. ``nki_cpu_simulator.nki.isa``, ``.isa.constants``, ``.compiler`` and
``.typing`` are trnsim's own modules; ``.language``, ``.language.dtypes``, ``.tensor``
and ``.builtin`` are small modules here (see each).
"""
