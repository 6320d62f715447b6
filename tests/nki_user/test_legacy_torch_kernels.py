"""A PyTorch script of the older style: kernels wrapped by ``torch_neuronx``'s
``nki_jit``, outputs allocated by the caller and passed in (destination passing)."""

import torch
from torch_neuronx.xla_impl.ops import nki_jit

import neuronxcc.nki.language as nl


@nki_jit
def tensor_add(a_input, b_input, c_output):
    assert a_input.shape == b_input.shape == c_output.shape
    assert a_input.shape[0] <= nl.tile_size.pmax
    nl.store(c_output, value=nl.add(nl.load(a_input), nl.load(b_input)))


def scaled_rows(x_input, y_output, scale):
    # one grid instance per block of 128 rows
    i_p = nl.program_id(0) * 128 + nl.arange(128)[:, None]
    i_f = nl.arange(x_input.shape[1])[None, :]
    nl.store(y_output[i_p, i_f], value=nl.multiply(nl.load(x_input[i_p, i_f]), scale))


def test_add_on_neuron_tensors_writes_the_output_tensor():
    a = torch.ones((4, 3), dtype=torch.float16).to(device="neuron")
    b = torch.ones((4, 3), dtype=torch.float16).to(device="neuron")
    c = torch.zeros((4, 3), dtype=torch.float16).to(device="neuron")
    tensor_add(a, b, c)
    torch.testing.assert_close(c.cpu(), torch.full((4, 3), 2.0, dtype=torch.float16))


def test_grid_launch_through_nki_jit():
    torch.manual_seed(0)
    x = torch.randn(384, 64, device="neuron")
    y = torch.empty_like(x)
    nki_jit()(scaled_rows)[3](x, y, 0.5)
    torch.testing.assert_close(y.cpu(), x.cpu() * 0.5, rtol=0, atol=0)
