"""General matmul: any K, M, N (and a batch), with partial tiles at the edges.

``matmul_general`` computes ``result[M, N] = lhsT.T @ rhs`` for ``lhsT`` [K, M] and
``rhs`` [K, N] of any sizes, or a batch of them (``lhsT`` [B, K, M], ``rhs``
[B, K, N], either one may stay 2-D and is then shared by every batch entry). It
is :func:`trnsim.kernels.matmul.matmul_optimized` without the divisibility rules:

- outputs are made in blocks of up to 2048 x 1024 (16 M tiles of 128 by 2 N tiles
  of 512); the last block, tile and K tile of each axis are as large as what is
  left (a K tile of 3 rows contracts over 3 partitions);
- K streams through in chunks of 1024 rows (512 in fp32): the chunk's [128, block]
  tiles of both operands are loaded with one DMA each (2-4 KiB rows), and while one
  chunk is multiplied the next one loads (loads rotate over 12 DMA queues, stores
  use the other 4);
- within a chunk each stationary [128, 128] tile serves both N tiles of the block
  before the next one is loaded, and the partial sums of a chunk accumulate in
  PSUM;
- when N spans several blocks and all of K for one M block of lhsT takes at most
  32 KiB per partition (a matrix-vector product, or a short K), that panel is
  loaded once and every N block of rhs streams under it; with M at most 128 the
  N blocks are 2048 wide;
- a single chunk (K <= 1024) goes from PSUM straight to the output dtype; with
  several, the first chunk's partial sums are copied into an fp32 SBUF
  accumulator, later ones added to it (vector engine), and the last addition
  writes the output dtype.

``matmul_rows`` computes ``lhs @ rhs`` for ``lhs`` [M, K] as it lies in memory, rows
first (an activation, as a model makes it): per block and K chunk each 128 rows of
``lhs`` are loaded with one DMA (the chunk's K in each row: 2 KiB rows, where ``lhsT``'s
[128, 128] tiles have 256-byte rows in bf16) and each [128, 128] piece is transposed
through the PE array into PSUM ("low-latency data reshape", NKI's architecture guide)
and copied into the stationary tile in SBUF.
"""

import numpy as np

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl

TILE_K = 128          # nl.tile_size.pmax
TILE_M = 128          # nl.tile_size.gemm_stationary_fmax
TILE_N = 512          # nl.tile_size.gemm_moving_fmax
BLOCK_M = 16 * TILE_M
BLOCK_N = 2 * TILE_N
WIDE_BLOCK_N = 4 * TILE_N  # when M is one tile: 4 KiB rows of rhs per DMA, four PSUM banks per block
RESIDENT_BYTES = 32 * 1024  # per partition: an lhsT panel [K, M block] this small is loaded once
CHUNK_K_BYTES = 2048  # K rows per chunk times the operand itemsize: 1024 rows of bf16, 512 of fp32
ENGINES = (nisa.vector_engine, nisa.scalar_engine)  # PSUM evacuation alternates between them


def _operand(t, b, what, who):
    """Batch entry ``b`` of an HBM operand (``what``, named with its layout: "lhs [M, K]"),
    or the operand itself when 2-D; ``who`` is the kernel that refuses any other rank."""
    if len(t.shape) == 2:
        return t
    if len(t.shape) == 3:
        return t[b]
    name, layout = what.split(" ", 1)
    raise nki.KernelError(f"{who}: {name} is {list(t.shape)}; give {layout} or [batch, {layout[1:]}")


@nki.jit
def matmul_general(lhsT, rhs, dtype=None):
    """``lhsT.T @ rhs`` for any sizes, batched when either operand is 3-D.

    Args:
        lhsT: [K, M] or [B, K, M] in HBM, the left operand transposed (contraction
            first), any chip float dtype (fp32, bf16, fp16, fp8).
        rhs: [K, N] or [B, K, N] in HBM, of any chip float dtype.
        dtype: of the result; ``lhsT``'s by default (torch's matmul keeps the
            operand dtype). Products accumulate in fp32 whatever it is.

    Returns:
        [M, N], or [B, M, N] when either operand is 3-D, in HBM. All batch entries run
        in one Program, one after another (their loads overlap the previous entry's
        multiplies).

    Memories: per block and K chunk, the operand tiles [<= 128 K rows, block] are
    loaded into SBUF; each [<= 128, <= 512] output tile accumulates in one PSUM bank
    (fp32); the output block is assembled in SBUF (an fp32 accumulator [<= 128,
    <= 1024] per M tile when K spans several chunks) and stored to HBM one
    [<= 128, <= 1024] tile at a time.
    """
    batched, batch, M, N = matmul_shapes(lhsT, rhs, "matmul_general")
    out_dtype = dtype if dtype is not None else lhsT.dtype
    result = nl.ndarray((batch, M, N) if batched else (M, N), out_dtype, buffer=nl.shared_hbm)
    matmul_blocks(lhsT, rhs, lambda b: result[b] if batched else result)
    return result


@nki.jit
def matmul_rows(lhs, rhs, dtype=None):
    """``lhs @ rhs`` for ``lhs`` [M, K] in rows, batched when either operand is 3-D.

    Args:
        lhs: [M, K] or [B, M, K] in HBM, rows first, any chip float dtype.
        rhs: [K, N] or [B, K, N] in HBM, of any chip float dtype.
        dtype: of the result; ``lhs``'s by default. Products accumulate in fp32.

    Returns:
        [M, N], or [B, M, N] when either operand is 3-D, in HBM.

    Memories: as :func:`matmul_general`, and per block and K chunk [<= 128, chunk]
    row tiles of ``lhs`` in SBUF, each [<= 128, <= 128] piece transposed into PSUM
    (its dtype) and copied into the [K tile, block] stationary tile in SBUF.
    """
    batched, batch, M, N = matmul_shapes(lhs, rhs, "matmul_rows", rows=True)
    out_dtype = dtype if dtype is not None else lhs.dtype
    result = nl.ndarray((batch, M, N) if batched else (M, N), out_dtype, buffer=nl.shared_hbm)
    matmul_blocks(lhs, rhs, lambda b: result[b] if batched else result, rows=True)
    return result


def matmul_shapes(lhsT, rhs, who, rows=False):
    """(batched, batch, M, N) of ``lhsT.T @ rhs`` (of ``lhsT @ rhs`` for ``rows``: the
    first operand [M, K]); raises KernelError naming ``who`` for operands that do not
    go together."""
    first = "lhs" if rows else "lhsT"
    batched = len(lhsT.shape) == 3 or len(rhs.shape) == 3
    batch = max(lhsT.shape[0] if len(lhsT.shape) == 3 else 1, rhs.shape[0] if len(rhs.shape) == 3 else 1)
    for t, what in ((lhsT, first), (rhs, "rhs")):
        if len(t.shape) == 3 and t.shape[0] != batch:
            raise nki.KernelError(f"{who}: {what} has batch {t.shape[0]}, the other operand {batch}; "
                                  "give both the same batch or one of them 2-D")
    M, K = lhsT.shape[-2:] if rows else lhsT.shape[-2:][::-1]
    K2, N = rhs.shape[-2:]
    if K != K2:
        layout = "lhs is [M, K], rhs [K, N]" if rows else "both put K first (lhsT is the left operand transposed)"
        raise nki.KernelError(f"{who}: {first} {list(lhsT.shape)} contracts over K={K}, rhs {list(rhs.shape)} "
                              f"over K={K2}; {layout}")
    return batched, batch, M, N


def matmul_blocks(lhsT, rhs, sink, rows=False, tiled=False):
    """Trace ``lhsT.T @ rhs`` block by block (``lhsT @ rhs`` for ``rows``: the first
    operand [M, K], transposed on chip). ``tiled``: ``rhs``'s memory holds its elements
    in the order the kernel loads them (:func:`tiled_rhs`), each chunk of K tiles of a
    block one DMA with every partition's bytes contiguous. ``sink(b)`` is where batch entry ``b``'s
    [M, N] product goes: an HBM view stored in the output dtype, or an epilogue
    ``finish(rows, parts)`` called per output row tile of a block with the fp32
    products ``parts`` [(tile [rows, <= 512] in PSUM or SBUF, first column, width)],
    which computes and stores whatever it makes of them."""
    batched, batch, M, N = matmul_shapes(lhsT, rhs, "matmul_rows" if rows else "matmul_general", rows=rows)
    K = rhs.shape[-2]
    itemsize = max(lhsT.dtype.itemsize, rhs.dtype.itemsize)
    chunk_k = max(TILE_K, CHUNK_K_BYTES // itemsize // TILE_K * TILE_K)
    k_tiles = [(k, min(TILE_K, K - k)) for k in range(0, K, TILE_K)]
    block_n = WIDE_BLOCK_N if M <= TILE_M else BLOCK_N
    # a panel kept for several N blocks saves reloading it; for one, streaming K overlaps better
    resident = N > block_n and len(k_tiles) * min(M, BLOCK_M) * lhsT.dtype.itemsize <= RESIDENT_BYTES
    for b in nl.affine_range(batch):
        who = "matmul_rows" if rows else "matmul_general"
        a = _operand(lhsT, b, "lhs [M, K]" if rows else "lhsT [K, M]", who)
        w = _operand(rhs, b, "rhs [K, N]", who)
        out = sink(b)
        if resident:
            for m0 in nl.affine_range(0, M, BLOCK_M):
                bm = min(BLOCK_M, M - m0)
                panel = _stationary(a, m0, bm, k_tiles, rows) if rows else \
                    [nl.load(a[k:k + kp, m0:m0 + bm]) for k, kp in k_tiles]
                for n0 in nl.affine_range(0, N, block_n):
                    _block(a, w, out, m0, bm, n0, min(block_n, N - n0), chunk_k, rows, panel, tiled)
        else:
            for n0 in nl.affine_range(0, N, block_n):
                for m0 in nl.affine_range(0, M, BLOCK_M):
                    _block(a, w, out, m0, min(BLOCK_M, M - m0), n0, min(block_n, N - n0), chunk_k, rows, tiled=tiled)


def tiled_rhs(K):
    """Whether :func:`matmul_blocks` can read a [K, N] right operand ``tiled``, and the
    order of its elements then: block by block of the kernel's N blocks (which depend
    on M: :func:`tile_rhs`), partition by partition within a block, each partition's
    rows of the block's K tiles one after another. A compiled graph's weights are stored so (the
    compiler lays out the parameters it loads, "weight layout optimization" in NxD
    Inference's model builder; the exact layout is the kernel's choice here)."""
    return K % TILE_K == 0


def tile_rhs(w, M):
    """``w`` [K, N] (a numpy array) with its elements in the order a ``tiled`` right
    operand holds them (:func:`tiled_rhs`) for a product of ``M`` rows: how a host lays
    out a weight for :func:`matmul_blocks` ``(tiled=True)``."""
    K, N = w.shape
    if not tiled_rhs(K):
        raise nki.KernelError(f"tile_rhs: K={K} is not a multiple of {TILE_K}; a tiled rhs needs whole K tiles")
    block_n = WIDE_BLOCK_N if M <= TILE_M else BLOCK_N
    blocks = [w[:, n0:n0 + block_n] for n0 in range(0, N, block_n)]
    flat = [b.reshape(K // TILE_K, TILE_K, b.shape[1]).transpose(1, 0, 2).reshape(-1) for b in blocks]
    return np.concatenate(flat).reshape(K, N)


def _rhs_chunk(rhs, k_tiles, n0, bn):
    """The K tiles ``k_tiles`` of block ``n0:n0+bn`` of a ``tiled`` ``rhs``, loaded with one
    DMA, as one [128, bn] view each."""
    K = rhs.shape[0]
    t0, count = k_tiles[0][0] // TILE_K, len(k_tiles)
    chunk = nl.load(rhs.ap([[K // TILE_K * bn, TILE_K], [1, count * bn]], offset=n0 * K + t0 * bn))
    return [chunk[:, i * bn:(i + 1) * bn] for i in range(count)]


def _stationary(lhs, m0, bm, k_tiles, rows):
    """The stationary tiles [kp, bm] of rows ``m0:m0+bm`` for each K tile ``(k, kp)`` of
    ``k_tiles`` (consecutive) from ``lhs`` [M, K] in rows: 128 rows at a time loaded with
    one DMA, each [<= 128, kp] piece transposed through the PE array into PSUM and
    copied into its tile (the compiler's choice of engine)."""
    k0 = k_tiles[0][0]
    k1 = k_tiles[-1][0] + k_tiles[-1][1]
    tiles = [nl.ndarray((kp, bm), lhs.dtype) for _, kp in k_tiles]
    for mt in range(0, bm, TILE_M):
        mp = min(TILE_M, bm - mt)
        row_tile = nl.load(lhs[m0 + mt:m0 + mt + mp, k0:k1])
        for tile, (k, kp) in zip(tiles, k_tiles):
            piece = nisa.nc_transpose(row_tile[:, k - k0:k - k0 + kp])
            nisa.tensor_copy(dst=tile[:, mt:mt + mp], src=piece)
    return tiles


def _block(lhsT, rhs, out, m0, bm, n0, bn, chunk_k, rows, panel=None, tiled=False):
    """Output block ``out[m0:m0+bm, n0:n0+bn]``, K streamed in chunks of ``chunk_k`` rows;
    ``panel`` holds all K tiles of ``lhsT[:, m0:m0+bm]`` when they are already in SBUF;
    ``rows``: the first operand is ``lhs`` [M, K] (see :func:`_stationary`); ``tiled``:
    ``rhs`` is stored as :func:`tiled_rhs` says. An epilogue ``out`` (see
    :func:`matmul_blocks`) gets the fp32 sums of the last chunk."""
    K = rhs.shape[0]
    chunks = list(range(0, K, chunk_k))
    m_tiles = list(range(0, bm, TILE_M))
    n_tiles = [(j, min(TILE_N, bn - j)) for j in range(0, bn, TILE_N)]
    acc = [None] * len(m_tiles)
    evacuations = 0
    for c, k0 in enumerate(chunks):
        k_tiles = [(k, min(TILE_K, K - k)) for k in range(k0, min(k0 + chunk_k, K), TILE_K)]
        # each K tile's two operands in turn: the first multiplies wait for one pair, not all
        if tiled and panel is None:
            rhs_tiles = _rhs_chunk(rhs, k_tiles, n0, bn)
            lhs_tiles = _stationary(lhsT, m0, bm, k_tiles, rows) if rows else \
                [nl.load(lhsT[k:k + kp, m0:m0 + bm]) for k, kp in k_tiles]
        elif tiled:
            lhs_tiles = panel[k0 // TILE_K:k0 // TILE_K + len(k_tiles)]
            rhs_tiles = _rhs_chunk(rhs, k_tiles, n0, bn)
        elif panel is None and rows:
            lhs_tiles = _stationary(lhsT, m0, bm, k_tiles, rows)
            rhs_tiles = [nl.load(rhs[k:k + kp, n0:n0 + bn]) for k, kp in k_tiles]
        elif panel is None:
            pairs = [(nl.load(lhsT[k:k + kp, m0:m0 + bm]), nl.load(rhs[k:k + kp, n0:n0 + bn])) for k, kp in k_tiles]
            lhs_tiles, rhs_tiles = [p[0] for p in pairs], [p[1] for p in pairs]
        else:
            lhs_tiles = panel[k0 // TILE_K:k0 // TILE_K + len(k_tiles)]
            rhs_tiles = [nl.load(rhs[k:k + kp, n0:n0 + bn]) for k, kp in k_tiles]
        for i, mt in enumerate(m_tiles):
            mp = min(TILE_M, bm - mt)
            parts = [nl.zeros((mp, nsz), nl.float32, buffer=nl.psum) for _, nsz in n_tiles]
            for lhs_t, rhs_t in zip(lhs_tiles, rhs_tiles):
                stationary = lhs_t[:, mt:mt + mp]
                for part, (j, nsz) in zip(parts, n_tiles):
                    part += nl.matmul(stationary, rhs_t[:, j:j + nsz], transpose_x=True)
            last = c == len(chunks) - 1
            if last and callable(out):
                if c:
                    parts = [nisa.tensor_tensor(acc[i][:, j:j + nsz], part, op=nl.add, dtype=nl.float32)
                             for part, (j, nsz) in zip(parts, n_tiles)]
                out((m0 + mt, mp), [(part, n0 + j, nsz) for part, (j, nsz) in zip(parts, n_tiles)])
                acc[i] = None
                continue
            target = nl.ndarray((mp, bn), out.dtype) if last else acc[i] if c else nl.ndarray((mp, bn), nl.float32)
            for part, (j, nsz) in zip(parts, n_tiles):
                cols = slice(j, j + nsz)
                if c == 0:
                    nisa.tensor_copy(dst=target[:, cols], src=part, engine=ENGINES[evacuations % 2])
                    evacuations += 1
                else:
                    nisa.tensor_tensor(dst=target[:, cols], data1=acc[i][:, cols], data2=part, op=nl.add)
            if last:
                nl.store(out[m0 + mt:m0 + mt + mp, n0:n0 + bn], value=target)
                acc[i] = None
            else:
                acc[i] = target
