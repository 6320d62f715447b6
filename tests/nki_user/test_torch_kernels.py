"""A PyTorch script calling NKI kernels on ``neuron`` tensors and comparing them with
torch, as scripts written for TorchNeuron do."""

import torch

import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def gelu_rows(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range(x.shape[0] // 128):
        tile = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x[t * 128:(t + 1) * 128, :])
        y = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=y, op=nl.gelu, data=tile)
        nisa.dma_copy(dst=out[t * 128:(t + 1) * 128, :], src=y)
    return out


def test_kernel_on_neuron_tensors_matches_torch():
    torch.manual_seed(0)
    x = torch.randn(256, 128, device="neuron")
    out = gelu_rows(x)
    assert isinstance(out, torch.Tensor) and out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), torch.nn.functional.gelu(x.cpu()), rtol=1e-5, atol=1e-5)


def test_kernel_on_cpu_tensors_returns_cpu_tensors():
    x = torch.randn(128, 64)
    out = gelu_rows(x)
    assert isinstance(out, torch.Tensor) and out.device.type == "cpu"
    torch.testing.assert_close(out, torch.nn.functional.gelu(x), rtol=1e-5, atol=1e-5)
