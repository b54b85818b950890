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
    const float* a0 = pa;
    const float* a1 = pa + ps;
    const float* a2 = pa + 2 * ps;
    const __m256 z = _mm256_setzero_ps();
    __m256 b = _mm256_loadu_ps(pb), va;
    __m256 c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23;
    ptrdiff_t p;
    int i;
    c00 = _mm256_fmadd_ps(_mm256_broadcast_ss(a0), b, z);
    c01 = _mm256_fmadd_ps(_mm256_broadcast_ss(a0 + 1), b, z);
    c02 = _mm256_fmadd_ps(_mm256_broadcast_ss(a0 + 2), b, z);
    c03 = _mm256_fmadd_ps(_mm256_broadcast_ss(a0 + 3), b, z);
    c10 = _mm256_fmadd_ps(_mm256_broadcast_ss(a1), b, z);
    c11 = _mm256_fmadd_ps(_mm256_broadcast_ss(a1 + 1), b, z);
    c12 = _mm256_fmadd_ps(_mm256_broadcast_ss(a1 + 2), b, z);
    c13 = _mm256_fmadd_ps(_mm256_broadcast_ss(a1 + 3), b, z);
    c20 = _mm256_fmadd_ps(_mm256_broadcast_ss(a2), b, z);
    c21 = _mm256_fmadd_ps(_mm256_broadcast_ss(a2 + 1), b, z);
    c22 = _mm256_fmadd_ps(_mm256_broadcast_ss(a2 + 2), b, z);
    c23 = _mm256_fmadd_ps(_mm256_broadcast_ss(a2 + 3), b, z);
    for (p = 1; p < kc; p++) {
        const float* x0 = a0 + p * 4;
        const float* x1 = a1 + p * 4;
        const float* x2 = a2 + p * 4;
        b = _mm256_loadu_ps(pb + p * pbs);
        c00 = _mm256_fmadd_ps(_mm256_broadcast_ss(x0), b, c00);
        c01 = _mm256_fmadd_ps(_mm256_broadcast_ss(x0 + 1), b, c01);
        c02 = _mm256_fmadd_ps(_mm256_broadcast_ss(x0 + 2), b, c02);
        c03 = _mm256_fmadd_ps(_mm256_broadcast_ss(x0 + 3), b, c03);
        c10 = _mm256_fmadd_ps(_mm256_broadcast_ss(x1), b, c10);
        c11 = _mm256_fmadd_ps(_mm256_broadcast_ss(x1 + 1), b, c11);
        c12 = _mm256_fmadd_ps(_mm256_broadcast_ss(x1 + 2), b, c12);
        c13 = _mm256_fmadd_ps(_mm256_broadcast_ss(x1 + 3), b, c13);
        c20 = _mm256_fmadd_ps(_mm256_broadcast_ss(x2), b, c20);
        c21 = _mm256_fmadd_ps(_mm256_broadcast_ss(x2 + 1), b, c21);
        c22 = _mm256_fmadd_ps(_mm256_broadcast_ss(x2 + 2), b, c22);
        c23 = _mm256_fmadd_ps(_mm256_broadcast_ss(x2 + 3), b, c23);
    }
    va = _mm256_set1_ps(alpha);
    {
        __m256 acc[12];
        acc[0] = c00; acc[1] = c01; acc[2] = c02; acc[3] = c03;
        acc[4] = c10; acc[5] = c11; acc[6] = c12; acc[7] = c13;
        acc[8] = c20; acc[9] = c21; acc[10] = c22; acc[11] = c23;
        for (i = 0; i < 12; i++) {
            float* cr = c + i * rsc;
            if (overwrite)
                _mm256_storeu_ps(cr, _mm256_mul_ps(va, acc[i]));
            else
                _mm256_storeu_ps(cr, _mm256_fmadd_ps(va, acc[i], _mm256_loadu_ps(cr)));
        }
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
