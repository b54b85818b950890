# cython: language_level=3
# The avx2 variant of cyattn's kernels: the shared source compiled with this variant's flags
# (see setup.py). Only cyattn._backend imports this module.

VARIANT = "avx2"

include "_tiles_4x24.pxi"
include "_kernel_sources.pxi"
