"""The ``nki.isa`` instructions trnsim refuses by name with the reason, and the documented
differences of the ones it implements (both read by :mod:`trnsim.nki.apitable`)."""

from __future__ import annotations

from trnsim.nki.refused import Refused


_REASONS = {
    "quantize_mx": "MX quantization needs the microscaling fp8/fp4 dtypes and per-block scales, which trnsim does not model",
    "nc_matmul_mx": "MX matmul needs the microscaling fp8/fp4 dtypes and per-block scales, which trnsim does not model",
    "register_load": "it reads a tensor value into a register at run time (data-dependent control), and trnsim traces "
                     "a kernel before it runs",
    "register_store": "it writes a run-time register value to memory, and trnsim's registers hold trace-time integers",
    "tensor_copy_dynamic_src": "it addresses memory through run-time register values, and trnsim traces a kernel before "
                               "it runs; index with nl.arange expressions or use nisa.nc_n_gather",
    "tensor_copy_dynamic_dst": "it addresses memory through run-time register values, and trnsim traces a kernel before "
                               "it runs; index with nl.arange expressions",
    "topk": "its 16-partition snake input layout is not modelled; take the top 8 with nisa.max8 and "
            "nisa.nc_match_replace8 rounds",
    "builtin_custom_op": "custom GpSimd code cannot run in trnsim",
    "NkiInstruction": "instruction handles are not exposed; the nki.isa functions return their output tiles",
}


#: Refused ``nki.isa`` names: each raises KernelError naming itself and saying why.
REFUSED: dict[str, Refused] = {name: Refused(f"nki.isa.{name}", why) for name, why in _REASONS.items()}


#: Documented names that trnsim implements with a difference (read by ``trnsim.nki.apitable``).
DIFFERENCES: dict[str, str] = {
    "dma_compute": ("timed as the DMAs plus one vector-engine add per extra source (the chip adds inside the DMA "
                    "engine); HBM operands of more than 128 rows refused"),
    "nc_matmul": "tile_position and tile_size accepted and not modelled (the whole PE array is timed)",
    "activation": "reduce_cmd idle/reset_reduce only (the scalar engine's accumulator is not carried across "
                  "instructions; the others refused)",
    "tensor_partition_reduce": "add, max and min only (average and bitwise ops refused)",
    "tensor_scalar": "reverse1 refused",
    "reciprocal": "vector engine, costed max(64, 8N) like the scalar engine's reciprocal",
    "nonzero_with_count": "partitions 0, 16, ..., 112 only",
    "activate2": "NeuronCore-v4+ (KernelError before trn3); costed as a scalar-engine tensor_scalar + activation "
                 "(two instructions); relu_param and reverse1 refused",
    "tensor_scalar_reduce": "one instruction (the operation and its reduction in one pass) when it starts afresh "
                            "(reset_reduce into an fp32 reduce_res, or idle); otherwise costed as tensor_scalar + "
                            "tensor_reduce plus the accumulator's [P, 1] vector ops (see reduce_cmd); no nl.multiply "
                            "reduction",
    "tensor_scalar_cumulative": "costed as tensor_scalar + tensor_tensor_scan (two vector instructions) plus a "
                                "[P, 1] copy of the last running value into the accumulator (and a copy to dst when "
                                "dst is not fp32); reduce_cmd idle refused",
    "exponential": "exp(src - max_value) runs as a scalar-engine activation (NKI: vector engine), plus a "
                   "memset/negate of the bias and the accumulator's [P, 1] vector ops (see reduce_cmd)",
    "dropout": "random stream is numpy PCG64 (seeded 0 per run, reseeded by set_rng_seed), not the hardware's "
               "XORWOW; no 1/(1-p) scaling, as NKI",
    "range_select": "on_false_value must be FP32_MIN and reduce_op nl.maximum (as NKI); plus the accumulator's "
                    "[P, 1] vector ops (see reduce_cmd)",
    "select_reduce": "the reduction is costed as a separate tensor_reduce, plus the accumulator's [P, 1] vector "
                     "ops (see reduce_cmd)",
    "local_gather": "semantics as NKI's numpy equivalent; the index may be any integer dtype",
    "dma_copy": "dst_rmw_op=nl.add is timed as DMAs plus a vector-engine add, as dma_compute is; "
                "converts between dtypes (MX formats aside) through fp32; dge_mode, priority and engine accepted; an indirect "
                "side (a tile as index, .ap(vector_offset=/scalar_offset=)) is timed as software DGE whatever "
                "the mode (a register scalar_offset refused); a scatter with dst_rmw_op gathers, adds and "
                "scatters, so a row indexed twice gets one sum",
    "dma_transpose": "any permutation of the axes (NKI's default per rank without axes); an SBUF/PSUM source "
                     "goes through an HBM scratch tensor (two DMAs)",
    "register_alloc": "a trace-time integer (VirtualRegister); not usable as a run-time loop bound",
    "register_move": "trace-time integers only",
    "rng": "32 random bits per element (integer dst) from numpy PCG64, not XORWOW",
    "rand2": "NeuronCore-v4+ (KernelError before trn3); uniform [min, max) from numpy PCG64; min/max numbers only "
             "(tile bounds refused)",
    "rand_set_state": "seeds the numpy generator from the tile's values (not XORWOW state words)",
    "rand_get_state": "dst holds the 32-bit words of the simulated generator's state (numpy PCG64: state then "
                      "increment, repeated along the row, the same in every partition), not the hardware's XORWOW "
                      "state; rand_set_state of it seeds a new stream rather than restoring this one",
    "set_rng_seed": "seeds the numpy generator from the tile's values",
    "VirtualRegister": "a trace-time integer",
    "reduce_cmd": "the vector engine's accumulator registers (range_select, select_reduce, tensor_scalar_reduce, "
                  "tensor_scalar_cumulative, exponential) are a [128, 1] fp32 SBUF tile carried across instructions; "
                  "carrying costs [P, 1] vector ops the chip does not run (a combine under reduce or load_reduce from "
                  "a tile, a copy out to reduce_res); reduce after idle or before any reduction refused; activation "
                  "(scalar engine) takes idle/reset_reduce only",
    "dge_mode": "enum; all modes timed alike",
    "matmul_perf_mode": "none and double_row (fp8 [K, 2, X] operands at twice the bf16 rate, NC-v3 and later); "
                        "the name double_row_gen3 of earlier releases is also taken",
    "constants": "the module of the enums (nki.isa.constants), also an attribute of nki.isa",
    "core_barrier": "between the cores of a launch over a logical NeuronCore (kernel[2] on trn2/trn3): each core's "
                    "next instructions wait for all that every named core issued before (semaphore latency); on one "
                    "core, cores must be (0,) and the barrier is a sync point",
    "sendrecv": "between the cores of a launch over a logical NeuronCore (kernel[2] on trn2/trn3), the ranks being "
                "the cores: one DMA on the sender's queue into the peer's dst; on one core the peer must be 0 (a "
                "DMA copy); pipe_id accepted",
}
