"""DeviceMesh and DTensor on ``neuron``: run with ``torchrun --nproc-per-node=2`` (or 4).

1-D mesh of every rank; with 4 ranks also a named 2-D (2, 2) mesh and its sub-meshes.
DTensors are distributed, redistributed between Shard, Replicate and Partial, and
gathered back; each result is compared exactly with the same computation on one process.
DTensor's random ops (in-place fills, ``randn``, dropout, a user's generator) on even,
uneven and 2-D shardings give the whole tensor, and the generator state after, of the
same draw on the CPU with the same seed.
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
import torch.distributed.tensor as dtensor
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard


def check(name, got, want, atol=0.0):
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape or not torch.allclose(got, want, rtol=0, atol=atol):
        raise SystemExit(f"rank {dist.get_rank()}: {name} differs:\n{got}\nwanted\n{want}")


def shard(t, n, dim, i):
    """Piece ``i`` of ``t`` split ``n`` ways along ``dim`` as DTensor's Shard does (torch.chunk; empty past the end)."""
    pieces = t.chunk(n, dim)
    return pieces[i] if i < len(pieces) else t.narrow(dim, 0, 0)


def one_d(world):
    mesh = init_device_mesh("neuron", (world,), mesh_dim_names=("dp",))
    if mesh.device_type != "neuron" or mesh.size() != world or mesh.get_local_rank("dp") != dist.get_rank():
        raise SystemExit(f"1-D mesh: {mesh}")
    torch.manual_seed(0)
    full = torch.randn(4 * world, 6)
    d = distribute_tensor(full.to("neuron"), mesh, [Shard(0)])
    check("Shard(0) local", d.to_local(), full.chunk(world)[dist.get_rank()])
    check("Shard(0) full_tensor", d.full_tensor(), full)
    r = d.redistribute(mesh, [Replicate()])
    check("Shard(0)->Replicate", r.to_local(), full)
    s1 = r.redistribute(mesh, [Shard(1)])
    check("Replicate->Shard(1)", s1.to_local(), shard(full, world, 1, dist.get_rank()))
    check("Shard(1)->Shard(0)", s1.redistribute(mesh, [Shard(0)]).to_local(), full.chunk(world)[dist.get_rank()])
    # uneven shards
    odd = torch.arange(5 * 3, dtype=torch.float32).view(5, 3)
    u = distribute_tensor(odd.to("neuron"), mesh, [Shard(0)])
    check("uneven Shard(0) full_tensor", u.full_tensor(), odd)
    # Partial: each rank holds a summand
    part = DTensor.from_local(torch.full((3, 2), float(dist.get_rank() + 1), device="neuron"), mesh, [Partial()])
    total = float(sum(range(1, world + 1)))
    check("Partial->Replicate", part.redistribute(mesh, [Replicate()]).to_local(), torch.full((3, 2), total))
    check("Partial->Shard(0)", part.redistribute(mesh, [Shard(0)]).full_tensor(), torch.full((3, 2), total))
    # ops on DTensors
    a = distribute_tensor(full.to("neuron"), mesh, [Shard(0)])
    b = distribute_tensor(torch.ones(6, 5).to("neuron"), mesh, [Replicate()])
    check("sharded matmul", (a @ b).full_tensor(), full @ torch.ones(6, 5))
    # summed in a different order than on one process
    check("sum to Partial", a.sum().full_tensor(), full.sum(), atol=1e-5)
    for dt in (torch.bfloat16, torch.int64):
        x = (torch.arange(4 * world * 2) % 7).to(dt).view(4 * world, 2)
        check(f"{dt} round trip", distribute_tensor(x.to("neuron"), mesh, [Shard(0)]).full_tensor(), x)


def random_ops(mesh, placements):
    """Each random op on a DTensor with ``placements`` against the same draw on the CPU:
    every rank holds its shard of the CPU's tensor (compared shard by shard, as
    ``full_tensor`` of an uneven 2-D sharding of one dimension is not the tensor in
    PyTorch 2.13), and the generator state after the op is the CPU's."""
    name = f"{placements}"

    def check_draw(what, d, want):
        want_shard = distribute_tensor(want.to("neuron"), mesh, placements, src_data_rank=None).to_local()
        check(f"{name} {what}", d.to_local(), want_shard.cpu())

    for shape, op in (((5, 3), lambda t, g=None: t.uniform_(-1, 1, generator=g)),
                      ((7, 6), lambda t, g=None: t.normal_(generator=g)),
                      ((9, 4), lambda t, g=None: t.bernoulli_(0.3, generator=g))):
        torch.manual_seed(3)
        d = op(dtensor.empty(*shape, device_mesh=mesh, placements=placements))
        after = torch.rand(3, device="neuron")
        torch.manual_seed(3)
        check_draw(f"{shape} draw", d, op(torch.empty(*shape)))
        check(f"{name} {shape} generator state after the draw", after, torch.rand(3))
        d = op(dtensor.empty(*shape, device_mesh=mesh, placements=placements), torch.Generator("neuron").manual_seed(9))
        check_draw(f"{shape} draw with a generator", d, op(torch.empty(*shape), torch.Generator().manual_seed(9)))
    torch.manual_seed(4)
    check_draw("randn", dtensor.randn(6, 5, device_mesh=mesh, placements=placements), torch.randn(6, 5))
    x = distribute_tensor(torch.ones(8, 6, device="neuron"), mesh, placements)
    torch.manual_seed(5)
    y = torch.nn.functional.dropout(x, 0.5)
    torch.manual_seed(5)
    check_draw("dropout", y, torch.nn.functional.dropout(torch.ones(8, 6), 0.5))


def two_d():
    mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    dp, tp = mesh["dp"], mesh["tp"]
    if (dp.size(), tp.size()) != (2, 2) or list(mesh.get_coordinate()) != [rank // 2, rank % 2]:
        raise SystemExit(f"2-D mesh: {mesh} coordinate {mesh.get_coordinate()}")
    if tp.mesh.tolist() != [rank // 2 * 2, rank // 2 * 2 + 1] or dp.mesh.tolist() != [rank % 2, rank % 2 + 2]:
        raise SystemExit(f"sub-meshes: dp {dp.mesh.tolist()} tp {tp.mesh.tolist()}")
    # a collective on each sub-mesh's group
    x = torch.full((2,), float(rank), device="neuron")
    dist.all_reduce(x, group=tp.get_group())
    check("tp all_reduce", x, torch.full((2,), float(rank // 2 * 4 + 1)))
    y = torch.full((2,), float(rank), device="neuron")
    dist.all_reduce(y, group=dp.get_group())
    check("dp all_reduce", y, torch.full((2,), float(rank % 2 * 2 + 2)))
    torch.manual_seed(1)
    full = torch.randn(8, 4)
    d = distribute_tensor(full.to("neuron"), mesh, [Shard(0), Shard(1)])
    check("2-D Shard(0),Shard(1) local", d.to_local(), full.chunk(2, 0)[rank // 2].chunk(2, 1)[rank % 2])
    check("2-D full_tensor", d.full_tensor(), full)
    r = d.redistribute(mesh, [Replicate(), Shard(0)])
    check("2-D -> Replicate,Shard(0)", r.to_local(), full.chunk(2, 0)[rank % 2])
    part = DTensor.from_local(torch.full((2, 2), float(rank), device="neuron"), mesh, [Partial(), Replicate()])
    check("2-D Partial over dp", part.full_tensor(), torch.full((2, 2), float(rank % 2 * 2 + 2)))
    flat = mesh["dp", "tp"]._flatten("dp_tp")
    check("flattened mesh", distribute_tensor(full.to("neuron"), flat, [Shard(0)]).full_tensor(), full)
    # the last: FSDP2 over tensor parallel (dp shards the tp shards of dim 0 again)
    for placements in ([Shard(0), Shard(1)], [Shard(0), Shard(0)], [Replicate(), Shard(1)],
                       [_StridedShard(0, split_factor=2), Shard(0)]):
        random_ops(mesh, placements)


def main():
    dist.init_process_group("neuron")
    world = dist.get_world_size()
    one_d(world)
    mesh = init_device_mesh("neuron", (world,))
    for placements in ([Shard(0)], [Shard(1)], [Replicate()]):
        random_ops(mesh, placements)
    if world == 4:
        two_d()
    dist.barrier()
    print(f"rank {dist.get_rank()}: mesh_dtensor ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
