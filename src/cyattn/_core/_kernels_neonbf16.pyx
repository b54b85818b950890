# cython: language_level=3
# The neonbf16 variant of cyattn's kernels (AArch64 with FEAT_BF16: Graviton3/4, Neoverse
# N2/V1/V2, Apple M2 and later): the neon variant's sources and flags (CYATTN_ISA_NEON, the
# 8 x 12 float32 tile) compiled with -march=armv8.2-a+bf16 (see setup.py), so that the bf16
# fast path (precision="fast": matmul_accumulate and prefill attention) multiplies on BFDOT
# (isa/_cyattn_bf16_arm.h: the rule, its portable model and the 8 x 32 tile). Opt-in,
# CYATTN_BACKEND=neonbf16, until it has run on an aarch64 CPU. Only cyattn._backend imports
# this module.

VARIANT = "neonbf16"

include "_tiles_8x12.pxi"
include "_kernel_sources.pxi"
