# cython: language_level=3
# The amx variant of cyattn's kernels (opt-in: CYATTN_BACKEND=amx): the avx512bf16 variant's
# source, tiles and flags plus -mamx-tile -mamx-bf16 (see setup.py), so that the bf16 fast
# path of matmul_accumulate runs on AMX tiles (_gemm_amx.pxi over isa/_cyattn_amx.h); every
# other kernel is the avx512bf16 variant's code. cyattn._backend loads it only where CPUID
# reports AMX-BF16 and AMX-TILE, XCR0 enables the tile state and Linux grants it, and never
# by default until it has run on an AMX CPU. Only cyattn._backend imports this module.

VARIANT = "amx"

include "_tiles_avx512.pxi"
include "_kernel_sources.pxi"
