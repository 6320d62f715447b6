"""Draw the plot images of docs/profiling.md from real runs: ``python docs/images/plots.py``
(writes docs/images/*.png; the job plots run a 2-rank job with ``trnsim run --nproc 2``)."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib
import torch

import trnsim
import trnsim.trace as T

matplotlib.use("Agg")
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


class Block(torch.nn.Module):
    """An MLP and an attention-like product: addmm, bmm, mm, gelu and softmax ops."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(1024, 4096), torch.nn.Linear(4096, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(torch.nn.functional.gelu(self.up(x)))
        q = h.view(8, 128, 1024)
        scores = torch.softmax(torch.bmm(q, q.transpose(1, 2)), dim=-1)
        return torch.bmm(scores, q).view(1024, 1024)[:64] @ self.down.weight


def profile(model: torch.nn.Module, x: torch.Tensor) -> T.Trace:
    model(x)   # compile (if compiled) and warm up outside the profile
    with trnsim.profile() as prof:
        model(x).float().sum().item()
    return prof.trace()


def main() -> None:
    torch.manual_seed(0)
    model = Block().to("neuron").to(torch.bfloat16)
    x = torch.randn(1024, 1024, device="neuron", dtype=torch.bfloat16)
    eager = profile(model, x)
    compiled = profile(torch.compile(model, backend="neuron"), x)
    T.plot_timeline(eager, HERE / "timeline.png")
    T.plot_timeline(eager, HERE / "timeline_op.png", op="aten::softmax")
    T.plot_utilisation(eager, HERE / "utilisation.png")
    T.plot_roofline(eager, HERE / "roofline.png")
    T.plot_memory(eager, HERE / "memory.png")
    T.plot_comparison(eager, compiled, HERE / "comparison.png", labels=("eager", "compiled"))
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        subprocess.run([sys.executable, "-m", "trnsim.cli", "run", "--nproc", "2", "--trace", str(job),
                        str(REPO / "tests" / "dist_jobs" / "allreduce_step.py")], check=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL)
        T.plot_timeline(T.load(job), HERE / "timeline_job.png")


if __name__ == "__main__":
    main()
