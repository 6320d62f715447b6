"""What the nki.isa tests share: running an expression of tiles in a kernel."""

import trnsim.nki as nki
import trnsim.nki.language as nl


def run(body, *arrays, shape=(128, 64), dtype=nl.float32):
    """Run ``body(tiles...) -> tile`` in a kernel that loads the arrays and stores the result."""
    @nki.jit
    def kernel(*xs):
        out = nl.ndarray(shape, dtype, buffer=nl.shared_hbm)
        nl.store(out, value=body(*[nl.load(x) for x in xs]))
        return out

    return kernel(*arrays)


def run_on(chip, body, *arrays, shape=(128, 64), dtype=nl.float32):
    @nki.jit(chip=chip)
    def kernel(*xs):
        out = nl.ndarray(shape, dtype, buffer=nl.shared_hbm)
        nl.store(out, value=body(*[nl.load(x) for x in xs]))
        return out

    return kernel(*arrays)
