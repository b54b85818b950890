# cython: language_level=3
# The avx512 variant of cyattn's kernels: the shared source compiled with this variant's flags
# (see setup.py). Only cyattn._backend imports this module.

VARIANT = "avx512"

# Micro-kernel tiles and blocking for this variant (see the design note atop _gemm.pxi).
cdef enum:
    MR = 8              # float32 micro-kernel rows
    NR = 32            # float32 micro-kernel columns (> 16 trips: see PERF-NOTES)
    MRD = 8            # float64 micro-kernel rows
    NRD = 24           # float64 micro-kernel columns
    MC = 144          # rows of A packed at once (a multiple of MR and MRD)
    NC = 4032         # columns of B packed at once (a multiple of NR and NRD)
    NR_MAX = 32        # the wider of NR and NRD: panel buffers are sized for it
    STAGE_EXPS = 1     # softmax_pair_to stages its exps in local arrays

# The unpacked micro-kernel of small products (gemm_small): 4 rows keep its row pointers
# in registers.
cdef enum:
    DMR = 4
    DNR = 64
    DMRD = 4
    DNRD = 32
    DMR_MAX = 4
    DNR_MAX = 64
    # Products of at most DMR rows by a B of at most this many bytes run unpacked (gemm_small):
    # packing B cost more than the product (M = 1-4 against 1.8-4 MiB: 1.5-2.8x faster
    # unpacked; a 64 MiB B from memory stays packed)
    SMALL_B_BYTES = 1 << 22

include "_kernel_sources.pxi"
