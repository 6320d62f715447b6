"""What the parallel jobs check against one process: loss lists equal within a tolerance."""

import torch.distributed as dist


def close(name, got, want, tol=1e-5):
    """Exit this rank with a message naming ``name`` unless ``got`` matches ``want`` within ``tol``."""
    if any(abs(a - b) > tol for a, b in zip(got, want)):
        raise SystemExit(f"rank {dist.get_rank()}: {name}: {got} != one process {want}")
