# Micro-kernel tiles and blocking of the avx512 and avx512bf16 variants (32 zmm registers):
# both .pyx include this before _kernel_sources.pxi (see the design note atop _gemm.pxi).
cdef enum:
    MR = 8              # float32 micro-kernel rows
    NR = 32            # float32 micro-kernel columns (> 16 trips: see PERF-NOTES)
    MRD = 8            # float64 micro-kernel rows
    NRD = 24           # float64 micro-kernel columns
    MC = 144          # rows of A packed at once (a multiple of MR and MRD)
    NC = 4032         # columns of B packed at once (a multiple of NR and NRD)
    NR_MAX = 32        # the wider of NR and NRD: panel buffers are sized for it
    STAGE_EXPS = 1     # softmax_pair_to stages its exps in local arrays
    B_PREFETCH = 1     # the float32 micro-kernel prefetches B's next panel (see _gemm.pxi)

# The unpacked micro-kernel of small products (gemm_small): 4 rows keep its row pointers
# in registers.
cdef enum:
    DMR = 4
    DNR = 64
    DMRD = 4
    DNRD = 32
    DMR_MAX = 4
    DNR_MAX = 64
    # Products of at most SMALL_B_ROWS rows by a B of at most SMALL_B_BYTES run unpacked
    # (gemm_small): packing B cost more than the product (M = 1-4 against 1.8-4 MiB: 1.5-2.8x
    # faster unpacked; a 64 MiB B from memory stays packed). Up to 24 rows (issue 25: the
    # encoder's one-text requests, 11-20 tokens against 24 weight matrices of 0.6-2.3 MiB that
    # come from memory): 1.3-1.6x faster at M = 8-20 and 1.1x at 24 on a Zen 5 core, 1.1x at
    # 2 threads; with B in cache the unpacked tile is 0.92x the packed one at 24 rows and wins
    # below 16 (alternating builds, a sweep over the model's 24 weight matrices, M = 8-32).
    SMALL_B_BYTES = 1 << 22
    SMALL_B_ROWS = 24
