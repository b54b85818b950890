/*
 * The few things the Cython kernels need that Cython cannot express, one header per concern;
 * the kernels include this umbrella (cdef extern from "_cyattn_support.h" in _kernel_decls.pxi):
 *   _cyattn_cpu.h            CPU feature detection (CPUID leaves 1 and 7, XGETBV), CYATTN_X86
 *   _cyattn_omp.h            whether the module has OpenMP; runtime wrappers (stubs without)
 *   _cyattn_common.h         CYATTN_INLINE, the prefetch hints, CYATTN_MADD
 *   _cyattn_half.h           float16/bfloat16 <-> float32 (F16C where the variant has it)
 *   _cyattn_vec_avx512.h     AVX-512 vectors of the decode helpers and the softmax rows
 *   _cyattn_vec_avx2.h       AVX2 vectors of the same, where AVX-512's are not defined
 *   _cyattn_decode.h         decode: dot products of query and key rows, weighted value sums
 *   _cyattn_softmax_rows.h   float32 softmax rows (single and pipelined), stubs without vectors
 *   _cyattn_transpose.h      float32 register transposes (packing, the attention output), the
 *                            inf/NaN scan of a packed block (AVX, NEON; the callers' loops without)
 *   _cyattn_tile_narrow.h    the 12 x 8 tile of narrow query panels (AVX2 + FMA; a stub without)
 *   _cyattn_bf16_emul.h      bf16 dot products as vdpbf16ps computes them, portable (emulation)
 *   _cyattn_bf16_avx512.h    the bf16 GEMM micro-kernel on AVX512-BF16 (a stub without it)
 *   _cyattn_amx_model.h      the AMX tile operations as the hardware computes them, portable
 *   _cyattn_amx.h            the tile loops (_cyattn_amx_loop.h) over the model and, in the
 *                            amx variant, over the instructions
 * Code for a new ISA goes into a _cyattn_vec_<isa>.h of its own (included before the ones it
 * overrides), new kernels using those vectors into a header of the kernel's concern.
 * Everything here is a pure function of its arguments or of the CPU: no mutable state.
 */
#ifndef CYATTN_SUPPORT_H
#define CYATTN_SUPPORT_H

#include "_cyattn_cpu.h"
#include "_cyattn_omp.h"
#include "_cyattn_common.h"
#include "_cyattn_half.h"
#include "_cyattn_vec_avx512.h"
#include "_cyattn_vec_avx2.h"
#include "_cyattn_vec_neon.h"
#include "_cyattn_decode.h"
#include "_cyattn_softmax_rows.h"
#include "_cyattn_transpose.h"
#include "_cyattn_tile_narrow.h"
#include "_cyattn_bf16_emul.h"
#include "_cyattn_bf16_avx512.h"
#include "_cyattn_bf16_arm.h"
#include "_cyattn_amx.h"

#endif /* CYATTN_SUPPORT_H */
