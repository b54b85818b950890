# Micro-kernel tiles and blocking shared by the baseline and avx2 variants (16 vector
# registers each): both .pyx include this before _kernel_sources.pxi (see the design note
# atop _gemm.pxi; the avx512 variant defines its own).
cdef enum:
    MR = 4             # float32 micro-kernel rows
    NR = 24            # float32 micro-kernel columns (> 16 trips: see PERF-NOTES)
    MRD = 2            # float64 micro-kernel rows
    NRD = 24           # float64 micro-kernel columns
    MC = 144          # rows of A packed at once (a multiple of MR and MRD)
    NC = 4032         # columns of B packed at once (a multiple of NR and NRD)
    NR_MAX = 24        # the wider of NR and NRD: panel buffers are sized for it
    STAGE_EXPS = 0     # softmax_pair_to stores its exps straight to the output
    B_PREFETCH = 0     # the float32 micro-kernel does not prefetch B's next panel (see _gemm.pxi)

# The unpacked micro-kernel of small products (gemm_small): the same tile here.
cdef enum:
    DMR = 4
    DNR = 24
    DMRD = 2
    DNRD = 24
    DMR_MAX = 4
    DNR_MAX = 24
    # Products of at most DMR rows take the unpacked path only when small (SMALL_MNK): its
    # 24-column tile reads a row of B 1.5 cache lines at a time, and against a B of 2-4 MiB it
    # ran at 0.7-0.8x the packed path (1.27x at 1.8 MiB: too narrow a margin to keep).
    SMALL_B_BYTES = 0
    SMALL_B_ROWS = 0     # so the unpacked path is only for small products
