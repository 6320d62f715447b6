"""Shared fixtures."""

pytest_plugins = ["pytester"]

import numpy as np
import pytest

from trnsim import dtypes


@pytest.fixture
def small_matmul():
    """Makes the optimised matmul kernel's Program for [256, 256] x [256, 512] in bf16 on trn1."""
    from trnsim.kernels.matmul import matmul_optimized
    from trnsim.nki import trace_program, typed

    def make():
        return trace_program(matmul_optimized, typed(np.ones((256, 256)), dtypes.bfloat16),
                             typed(np.ones((256, 512)), dtypes.bfloat16), chip="trn1")

    return make
