# cython: language_level=3
# The avx512 variant of cyattn's kernels: the shared source compiled with this variant's flags
# (see setup.py). Only cyattn._backend imports this module.

VARIANT = "avx512"

include "_tiles_avx512.pxi"
include "_kernel_sources.pxi"
