/*
 * A 12 x 8 float32 tile for the fused attention's narrow query panels (_attention_fused.pxi),
 * in the 4 x 24 variants' packed layouts (avx2: MR = 4, NR = 24). A task's last query panel
 * often holds few query lanes (L = 128 and 512: 8 of 24), and the 4 x 24 micro-kernel spent
 * two thirds of that panel's FMAs on padding lanes: 12.5 % of all the FMAs of an L = 128
 * call. Here three 4-row A panels (12 keys, or 12 value dimensions) times the panel's first 8
 * lanes: 12 accumulators, one B vector and one broadcast of the 16 AVX2 registers. C because
 * Cython's scalar tiles of 8 columns are fully unrolled and spill (PERF-NOTES); the AVX2 + FMA
 * build only (CYATTN_HAVE_TILE12X8 0 elsewhere, where the caller keeps the 4 x 24 kernel).
 *
 * Per element the operations of micro_kernel_f32 (_gemm.pxi) as gcc compiles it with FMA:
 * sum = fma(a_0, b_0, +0), sum = fma(a_p, b_p, sum) for p = 1 .. kc-1 in order, then
 * C = alpha * sum (overwrite) or C = fma(alpha, sum, C): the same bits.
 */
#ifndef CYATTN_TILE_NARROW_H
#define CYATTN_TILE_NARROW_H

#include <stddef.h>
#include "_cyattn_common.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CYATTN_HAVE_TILE12X8 1

/* C[i * rsc + j] (+)= alpha * sum_p A[i][p] * pb[p * pbs + j], i < 12, j < 8, p < kc (kc >= 1),
   A[i][p] = pa[(i / 4) * ps + p * 4 + i % 4]: three MR = 4 packed panels ps floats apart. */
static inline void cyattn_tile12x8_f32(ptrdiff_t kc, const float* pa, ptrdiff_t ps,
                                       const float* pb, ptrdiff_t pbs, float* c, ptrdiff_t rsc,
                                       float alpha, int overwrite) {
    /* the sums start at +0: fma(a_0, b_0, +0) is the 4 x 24 kernel's first step */
    __m256 acc[12], va = _mm256_set1_ps(alpha);
    ptrdiff_t p;
    int g, i;
    for (i = 0; i < 12; i++)
        acc[i] = _mm256_setzero_ps();
    for (p = 0; p < kc; p++) {
        __m256 b = _mm256_loadu_ps(pb + p * pbs);
        for (g = 0; g < 3; g++)
            for (i = 0; i < 4; i++)
                acc[4 * g + i] = _mm256_fmadd_ps(_mm256_broadcast_ss(pa + g * ps + p * 4 + i), b,
                                                 acc[4 * g + i]);
    }
    for (i = 0; i < 12; i++) {
        float* cr = c + i * rsc;
        if (overwrite)
            _mm256_storeu_ps(cr, _mm256_mul_ps(va, acc[i]));
        else
            _mm256_storeu_ps(cr, _mm256_fmadd_ps(va, acc[i], _mm256_loadu_ps(cr)));
    }
}
#else
#define CYATTN_HAVE_TILE12X8 0
static inline void cyattn_tile12x8_f32(ptrdiff_t kc, const float* pa, ptrdiff_t ps,
                                       const float* pb, ptrdiff_t pbs, float* c, ptrdiff_t rsc,
                                       float alpha, int overwrite) {
    (void)kc; (void)pa; (void)ps; (void)pb; (void)pbs; (void)c; (void)rsc; (void)alpha;
    (void)overwrite;
}
#endif

#endif /* CYATTN_TILE_NARROW_H */
