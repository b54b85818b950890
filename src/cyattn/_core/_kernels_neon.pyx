# cython: language_level=3
# The neon variant of cyattn's kernels (AArch64 Advanced SIMD, in every aarch64 CPU): the shared
# source compiled with -march=armv8-a and CYATTN_ISA_NEON (see setup.py), so that the softmax rows
# and the decode's value pass use the NEON vocabulary of isa/_cyattn_vec_neon.h, with the 8 x 12
# micro-kernel tile of _tiles_8x12.pxi. Only cyattn._backend imports this module.

VARIANT = "neon"

include "_tiles_8x12.pxi"
include "_kernel_sources.pxi"
