"""``nki.typing`` (``nt``): parameter annotations for kernels.

``def kernel(a: nt.tensor[128, 512], out: nt.mutable_tensor)`` is accepted: the
annotations document the expected shapes; trnsim takes shapes and dtypes from the
arguments a kernel is called with, so they are not checked.
"""

from __future__ import annotations

from typing import Any

__all__ = ["tensor", "mutable_tensor", "TensorType"]


class TensorType:
    """An annotation for a kernel parameter: ``nt.tensor``, ``nt.tensor[shape]`` or
    ``nt.tensor[shape, dtype]``. ``mutable`` marks a tensor the kernel writes."""

    def __init__(self, mutable: bool, shape: tuple[Any, ...] | None = None, dtype: Any = None) -> None:
        self.mutable = mutable
        self.shape = shape
        self.dtype = dtype

    def __getitem__(self, spec: Any) -> TensorType:
        spec = spec if isinstance(spec, tuple) else (spec,)
        dtype = None
        if spec and not isinstance(spec[-1], (int, tuple)):
            spec, dtype = spec[:-1], spec[-1]
        shape = spec[0] if len(spec) == 1 and isinstance(spec[0], tuple) else spec
        return TensorType(self.mutable, tuple(shape), dtype)

    def __call__(self, *args: Any) -> TensorType:
        return self[args]

    def __repr__(self) -> str:
        kind = "mutable_tensor" if self.mutable else "tensor"
        return f"nt.{kind}" + (f"[{', '.join(map(str, self.shape))}]" if self.shape is not None else "")


#: Documented names that trnsim implements with a difference (read by ``trnsim.nki.apitable``).
DIFFERENCES: dict[str, str] = {
    "tensor": "accepted as an annotation; shapes and dtypes come from the arguments and are not checked against it",
    "mutable_tensor": "accepted as an annotation; every HBM argument can be written in trnsim",
}

tensor = TensorType(mutable=False)
mutable_tensor = TensorType(mutable=True)
