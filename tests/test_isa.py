"""The instruction set: views, and the hardware limits a Program enforces."""

import pytest

from trnsim import AllocationError, Program, ProgramError, dtypes
from trnsim.isa import Activation, DmaCopy, Engine, Memory, MultiplyMoving, TensorCopy, TensorTensor, Transpose


def prog():
    return Program("trn1", name="t")


def test_views_slice_partitions_and_free_dims():
    p = prog()
    t = p.sbuf([128, 4, 64], dtypes.bfloat16, "t")
    v = t[32:64, 1, ::2]
    assert v.shape == (32, 32)
    assert v.start_partition == 32 and v.free_offset == 64
    assert v.dims == ((256, 32), (2, 32))
    assert v.max_free_stride_bytes() == 4
    assert t[:, 2:4, :].contiguous_run() == 128
    h = p.hbm([256, 512], dtypes.float32, "h")
    assert h[0:128, :].contiguous_run() == 128 * 512
    assert h[:, 0:128].contiguous_run() == 128
    with pytest.raises(ProgramError, match="index 4 is out of bounds for axis 1 of size 4"):
        t[:, 4]
    with pytest.raises(ProgramError, match="only positive steps"):
        t[:, ::-1]


def test_sbuf_overflow_names_sizes_live_tiles_and_fix():
    p = prog()
    p.sbuf([128, 120 * 256], dtypes.float32, "big")  # 120 KiB per partition
    with pytest.raises(AllocationError) as info:
        p.sbuf([128, 100 * 256], dtypes.float32, "more")
    msg = str(info.value)
    assert "SBUF allocation 'more' of 100 KiB per partition" in msg
    assert "192 KiB per partition" in msg and "big (120 KiB at byte 0)" in msg
    assert "free a tile or make this one smaller" in msg
    with pytest.raises(AllocationError,
                       match="200 KiB per partition exceeds the 192 KiB of each partition on trn1; tile the free dimension"):
        p.sbuf([1, 200 * 256], dtypes.float32)


def test_freed_space_is_reused_and_disjoint_partitions_share_bytes():
    p = prog()
    a = p.sbuf([64, 1024], dtypes.float32, "a")
    b = p.sbuf([64, 1024], dtypes.float32, "b", start_partition=64)
    assert a.byte_offset == b.byte_offset == 0
    p.free(a)
    c = p.sbuf([32, 512], dtypes.float32, "c")
    assert c.byte_offset == 0
    with pytest.raises(AllocationError, match="not allocated"):
        p.free(a)


def test_partition_dimension_above_128():
    p = prog()
    with pytest.raises(ProgramError, match="partition dimension 256 exceeds the 128 partitions of trn1; "
                                           "tile the first axis into pieces of 128"):
        p.sbuf([256, 16], dtypes.float32)


@pytest.mark.parametrize("start, count, allowed", [(32, 64, "0 or 64"), (8, 16, "0, 32, 64 or 96"), (32, 96, "0")])
def test_misaligned_start_partition(start, count, allowed):
    p = prog()
    with pytest.raises(ProgramError, match=f"start partition {start} is misaligned for {count} partitions; it must be {allowed}"):
        p.sbuf([count, 16], dtypes.float32, start_partition=start)


def test_misaligned_operand_view_names_instruction():
    p = prog()
    t = p.sbuf([128, 16], dtypes.float32, "t")
    o = p.sbuf([128, 16], dtypes.float32, "o")
    with pytest.raises(ProgramError,
                       match=r"instruction 0 tensor_tensor operand .*start partition 16 is misaligned for 32 partitions"):
        p.add(TensorTensor(o[16:48], t[16:48], t[16:48], engine=Engine.VECTOR))


def test_psum_bank_limits():
    p = prog()
    with pytest.raises(AllocationError, match="larger than one bank .*2048 bytes"):
        p.psum([128, 768], dtypes.float32)
    acc = p.psum([128, 1024], dtypes.float32, "two_banks")
    assert acc.byte_offset == 0
    s = p.sbuf([128, 128], dtypes.bfloat16, "s")
    m = p.sbuf([128, 1024], dtypes.bfloat16, "m")
    with pytest.raises(ProgramError, match="moving free size 1024 exceeds 512"):
        p.matmul(acc, s, m)
    with pytest.raises(ProgramError, match="crosses a PSUM bank boundary"):
        p.matmul(acc[:, 256:768], s, m[:, 0:512])


def test_matmul_shape_and_memory_checks():
    p = prog()
    s = p.sbuf([128, 128], dtypes.bfloat16, "s")
    m = p.sbuf([64, 512], dtypes.bfloat16, "m")
    acc = p.psum([128, 512], dtypes.float32, "acc")
    bad = p.psum([128, 512], dtypes.bfloat16, "bad")
    with pytest.raises(ProgramError, match="no load_stationary precedes"):
        p.add(MultiplyMoving(acc, m, engine=Engine.TENSOR))
    with pytest.raises(ProgramError, match="moving has 64 partitions but the stationary has 128"):
        p.matmul(acc, s, m)
    with pytest.raises(ProgramError, match="must be a float32 PSUM tile"):
        p.matmul(bad, s, p.sbuf([128, 512], dtypes.bfloat16, "m2"))
    t = p.psum([128, 128], dtypes.float32, "tp")
    with pytest.raises(ProgramError, match=r"instruction 0 transpose: transpose of \[64, 128\] writes \[128, 64\]"):
        p.add(Transpose(t, m[:, 0:128], engine=Engine.TENSOR))
    assert len(p) == 0


def test_engine_and_memory_rules():
    p = prog()
    h = p.hbm([128, 16], dtypes.float32, "h")
    s = p.sbuf([128, 16], dtypes.float32, "s")
    with pytest.raises(ProgramError, match="cannot run on the tensor engine; it runs on: scalar"):
        p.add(Activation(s, s, engine=Engine.TENSOR))
    with pytest.raises(ProgramError, match="is in HBM; engines read and write SBUF/PSUM only"):
        p.add(Activation(s, h, engine=Engine.SCALAR))
    with pytest.raises(ProgramError, match="DMA queue 999 does not exist on trn1; use 0..255"):
        p.add(DmaCopy(s.view(), h.view(), 999))
    with pytest.raises(ProgramError, match="DMA cannot convert float32 to float8_e4m3fn_x4"):
        p.dma(p.sbuf([128, 16], dtypes.float8_e4m3fn_x4), h)
    with pytest.raises(ProgramError, match="dependency 5 must be the index of an earlier instruction"):
        p.dma(s, h, deps=[5])
    other = Program("trn1", name="other").sbuf([128, 16], dtypes.float32, "x")
    with pytest.raises(ProgramError, match="belongs to no tensor of program 't'"):
        p.dma(other, h)
    with pytest.raises(ProgramError, match="tensor name 's' is already used"):
        p.sbuf([1, 1], dtypes.float32, "s")
    with pytest.raises(ProgramError, match="unsupported dtype 'float64'"):
        p.sbuf([1, 1], "float64")


def test_flops_counts_every_multiply():
    p = prog()
    s = p.sbuf([128, 128], dtypes.bfloat16, "s")
    m = p.sbuf([128, 512], dtypes.bfloat16, "m")
    acc = p.psum([128, 512], dtypes.float32, "acc")
    p.matmul(acc, s, m)
    p.matmul(acc, s, m, accumulate=True)
    assert p.flops() == 2 * 2 * 128 * 128 * 512
    assert [i.opcode for i in p] == ["load_stationary", "multiply_moving"] * 2
    assert acc.memory is Memory.PSUM


def test_empty_operands_bad_semaphore_counts_and_hbm_capacity():
    from trnsim.isa import Memset, SemaphoreWait

    p = prog()
    s = p.sbuf([128, 16], dtypes.float32, "s")
    with pytest.raises(ProgramError, match="is empty; drop the instruction or fix the slice"):
        p.add(Memset(s[:, 0:0], 0.0, engine=Engine.VECTOR))
    with pytest.raises(ProgramError, match="semaphore_wait count 0 must be a positive integer"):
        p.add(SemaphoreWait(sem="x", count=0, engine=Engine.SCALAR))
    with pytest.raises(AllocationError, match="does not fit: 0.00 GiB already placed of the 32 GiB on trn1"):
        p.hbm([64, 1024, 1024, 1024], dtypes.float32, "huge")


def test_small_psum_tiles_never_straddle_a_bank():
    p = prog()
    p.psum([128, 1021], dtypes.bfloat16, "a")  # 2042 bytes
    b = p.psum([128, 3], dtypes.bfloat16, "b")
    assert b.byte_offset // 2048 == (b.byte_offset + 5) // 2048


def test_deleting_a_field_of_a_tensor_or_an_instruction_is_refused():
    """``del`` on a tensor's or an instruction's field (added to a Program or not) is a
    ProgramError naming the field, never a TypeError from inside the guard or a field
    silently gone."""
    p = Program("trn2")
    t = p.sbuf([128, 64], dtypes.float32)
    loose = TensorCopy(t.view(), t.view(), engine=Engine.VECTOR)
    added = TensorCopy(t.view(), t.view(), engine=Engine.VECTOR)
    p.add(added)
    for obj, field in ((t, "shape"), (loose, "dst"), (added, "deps")):
        with pytest.raises(ProgramError, match=f"'{field}' cannot be deleted"):
            delattr(obj, field)
        assert hasattr(obj, field)
