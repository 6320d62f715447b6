"""torchrun as ``trnsim run --nproc`` starts it: ``torch.distributed.run``, except that a
job whose rank failed, or that was stopped, ends with an exit status instead of
torchrun's own traceback and failure table. The ranks print their tracebacks
themselves, and the launcher (:mod:`trnsim.backend.distributed.launch`) sums the job
up in one line.

``python -m trnsim.backend.distributed.torchrun ARGS`` takes torchrun's arguments.
"""

from __future__ import annotations

import runpy
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError


def main(argv: list[str]) -> int:
    """Run torchrun with ``argv``; 0 if every rank succeeded, else the first failed
    rank's exit status (1 if it died of a signal), or 128 + the signal that stopped torchrun."""
    sys.argv = ["torchrun", *argv]
    try:   # as `python -m torch.distributed.run` runs, its messages as they read there
        runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
    except ChildFailedError as e:
        _, failure = e.get_first_failure()
        return failure.exitcode if failure.exitcode > 0 else 1
    except SignalException as e:
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
