"""Every collective of the neuron process group against what one process computes, in
fp32, bf16 and int64, with uneven splits; prints one "ok" or "FAIL" line per check.
Run with ``torchrun --nproc-per-node=N``."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

dist.init_process_group("neuron")
r, w = dist.get_rank(), dist.get_world_size()
dev = "neuron"


def chk(name, got, want):
    ok = torch.equal(got.cpu(), want)
    print(f"rank{r} {name}: {'ok' if ok else 'FAIL'}", "" if ok else (got.cpu(), want), flush=True)


for dt in (torch.float32, torch.bfloat16, torch.int64):
    x = (torch.arange(4) + r).to(dt).to(dev)
    dist.all_reduce(x)
    chk(f"all_reduce sum {dt}", x, sum((torch.arange(4) + i) for i in range(w)).to(dt))
    x = (torch.arange(4) + r).to(dt).to(dev)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    chk(f"all_reduce max {dt}", x, (torch.arange(4) + w - 1).to(dt))
    if dt.is_floating_point:
        x = (torch.arange(4) + r).to(dt).to(dev)
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        chk(f"all_reduce avg {dt}", x,
            (sum((torch.arange(4) + i) for i in range(w)).to(dt) / w).to(dt))
    out = torch.empty(4 * w, dtype=dt, device=dev)
    dist.all_gather_into_tensor(out, torch.full((4,), r, dtype=dt, device=dev))
    chk(f"all_gather_into_tensor {dt}", out, torch.arange(w).repeat_interleave(4).to(dt))
    outs = [torch.empty(2, dtype=dt, device=dev) for _ in range(w)]
    dist.all_gather(outs, torch.full((2,), r, dtype=dt, device=dev))
    chk(f"all_gather {dt}", torch.stack([o.cpu() for o in outs]), torch.arange(w).to(dt)[:, None].expand(w, 2))
    o = torch.empty(2, dtype=dt, device=dev)
    dist.reduce_scatter_tensor(o, torch.arange(2 * w).to(dt).to(dev))
    chk(f"reduce_scatter_tensor {dt}", o, (torch.arange(2 * w).to(dt) * w)[2 * r:2 * r + 2])
    b = torch.full((3,), r, dtype=dt, device=dev)
    dist.broadcast(b, src=1)
    chk(f"broadcast {dt}", b, torch.full((3,), 1, dtype=dt))
# uneven all_to_all_single
ins = [i + 1 for i in range(w)]           # rank r sends i+1 rows to rank i
inp = torch.arange(sum(ins), dtype=torch.float32).add(100 * r).to(dev)
outs_sizes = [r + 1] * w
out = torch.empty(sum(outs_sizes), device=dev)
dist.all_to_all_single(out, inp, outs_sizes, ins)
want = torch.cat([torch.arange(sum(ins), dtype=torch.float32).add(100 * s)[sum(ins[:r]):sum(ins[:r + 1])] for s in range(w)])
chk("all_to_all_single uneven", out, want)
# gather / scatter / reduce
g = [torch.empty(2, device=dev) for _ in range(w)] if r == 0 else None
dist.gather(torch.full((2,), float(r), device=dev), g, dst=0)
if r == 0:
    chk("gather", torch.stack([t.cpu() for t in g]), torch.arange(w, dtype=torch.float32)[:, None].expand(w, 2))
s = torch.empty(2, device=dev)
dist.scatter(s, [torch.full((2,), float(i), device=dev) for i in range(w)] if r == 0 else None, src=0)
chk("scatter", s, torch.full((2,), float(r)))
x = torch.ones(2, device=dev)
dist.reduce(x, dst=0)
if r == 0:
    chk("reduce", x, torch.full((2,), float(w)))
# send/recv
if r == 0:
    dist.send(torch.arange(3.0, device=dev), dst=1)
elif r == 1:
    y = torch.empty(3, device=dev)
    dist.recv(y, src=0)
    chk("recv", y, torch.arange(3.0))
# async + premul
x = torch.ones(4, device=dev)
wk = dist.all_reduce(x, async_op=True)
wk.wait()
chk("async", x, torch.full((4,), float(w)))
x = torch.ones(4, device=dev)
dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
chk("premul", x, torch.full((4,), 0.5 * w))
sub = dist.new_group([0, 1])
if r in (0, 1):
    x = torch.ones(2, device=dev)
    dist.all_reduce(x, group=sub)
    chk("subgroup", x, torch.full((2,), 2.0))
# list all_to_all, list reduce_scatter, coalesced all-reduce, batched point-to-point
outs = [torch.empty(2, device=dev) for _ in range(w)]
dist.all_to_all(outs, [torch.full((2,), float(10 * r + i), device=dev) for i in range(w)])
chk("all_to_all list", torch.stack([o.cpu() for o in outs]), torch.tensor([[10. * s + r] * 2 for s in range(w)]))
o = torch.empty(3, device=dev)
dist.reduce_scatter(o, [torch.full((3,), float(i + r), device=dev) for i in range(w)])
chk("reduce_scatter list", o, torch.full((3,), float(sum(s + r for s in range(w)))))
a, b = torch.ones(2, device=dev), torch.full((3,), 2.0, device=dev)
dist.all_reduce_coalesced([a, b])
chk("all_reduce_coalesced", torch.cat([a.cpu(), b.cpu()]), torch.tensor([float(w)] * 2 + [2.0 * w] * 3))
right, left = (r + 1) % w, (r - 1) % w
got = torch.empty(2, device=dev)
ops = [dist.P2POp(dist.isend, torch.full((2,), float(r), device=dev), right), dist.P2POp(dist.irecv, got, left)]
for req in dist.batch_isend_irecv(ops):
    req.wait()
chk("batch_isend_irecv", got, torch.full((2,), float(left)))
objs = [None] * w
dist.all_gather_object(objs, {"rank": r})
chk("all_gather_object", torch.tensor([o["rank"] for o in objs]), torch.arange(w))
dist.barrier()
y = fc.all_reduce(torch.ones(3, device=dev), "sum", dist.group.WORLD)
chk("functional", y, torch.full((3,), float(w)))
dist.destroy_process_group()
