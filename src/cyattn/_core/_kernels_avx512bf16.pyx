# cython: language_level=3
# The avx512bf16 variant of cyattn's kernels: the avx512 variant's source, tiles and flags plus
# -mavx512bf16 (see setup.py), so that the bf16 fast path of matmul_accumulate
# (precision="fast", _gemm_bf16.pxi) multiplies on vdpbf16ps (_cyattn_bf16_avx512.h); every
# other kernel is the avx512 variant's code. Only cyattn._backend imports this module.

VARIANT = "avx512bf16"

include "_tiles_avx512.pxi"
include "_kernel_sources.pxi"
