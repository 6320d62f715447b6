"""nki.isa's constants, registers and target queries, and the instructions it refuses by name.

Each is checked against an independent numpy computation."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.nki import KernelError
from tests.nki_isa_support import run

RNG = np.random.default_rng(11)
X = RNG.standard_normal((128, 64)).astype(np.float32)


def test_constants_registers_and_version():
    assert nisa.reduce_cmd.reset_reduce.value == 3 and nisa.dge_mode.hwdge.value == 2
    assert nisa.oob_mode.skip.value == 1 and nisa.constants.dge_mode is nisa.dge_mode
    assert nisa.engine.vector is nisa.vector_engine
    seen = {}

    @nki.jit(chip="trn2")
    def k(a):
        seen["v"] = nisa.get_nc_version()
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a, dge_mode=nisa.dge_mode.hwdge)
        return out
    np.testing.assert_array_equal(k(X), X)
    assert seen["v"] is nisa.nc_version.gen3
    r = nisa.register_alloc(4)
    nisa.register_move(r, 9)
    assert int(r) == 9


@pytest.mark.parametrize("name", ["quantize_mx", "register_load", "topk", "NkiInstruction"])
def test_refused_by_name(name):
    with pytest.raises(KernelError, match=rf"nki\.isa\.{name} is not supported by trnsim"):
        getattr(nisa, name)()
    with pytest.raises(KernelError, match=rf"nki\.isa\.{name} is not supported"):
        run(lambda x: getattr(nisa, name)(x), X)
