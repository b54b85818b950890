# Micro-kernel tiles and blocking of the neon variant (AArch64: 32 128-bit vector registers):
# _kernels_neon.pyx includes this before _kernel_sources.pxi (see the design note atop _gemm.pxi).
# The float32 tile is the 8 x 12 of the best NEON sgemm kernels: 24 accumulator vectors (8 rows
# x 3 vectors of 4 columns), 3 vectors of B per k step and 2 of A (8 values), each a by-element
# or broadcast operand of 24 FMLAs, so 29 of the 32 registers stay live across the k loop
# (tools/aarch64_disasm_check.py checks the shape of the compiled loop). float64: 4 x 12 (24
# accumulators of 2 doubles).
cdef enum:
    MR = 8             # float32 micro-kernel rows
    NR = 12            # float32 micro-kernel columns
    MRD = 4            # float64 micro-kernel rows
    NRD = 12           # float64 micro-kernel columns
    MC = 144          # rows of A packed at once (a multiple of MR and MRD)
    NC = 4032         # columns of B packed at once (a multiple of NR and NRD)
    NR_MAX = 12        # the wider of NR and NRD: panel buffers are sized for it
    STAGE_EXPS = 0     # softmax_pair_to stores its exps straight to the output
    B_PREFETCH = 0     # the float32 micro-kernel does not prefetch B's next panel (see _gemm.pxi)

# The unpacked micro-kernel of small products (gemm_small): the 4 x 24 tile of the baseline
# (24 accumulator vectors here too).
cdef enum:
    DMR = 4
    DNR = 24
    DMRD = 2
    DNRD = 24
    DMR_MAX = 4
    DNR_MAX = 24
    SMALL_B_BYTES = 0
    SMALL_B_ROWS = 0     # so the unpacked path is only for small products
