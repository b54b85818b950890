/*
 * The bf16 fast path's micro-kernel on AVX512-BF16: vdpbf16ps, 32 bf16 products per
 * instruction summed pairwise into 16 float32 lanes, on the pair-packed panels described in
 * _cyattn_bf16_emul.h (whose emulation gives the same bits). Intrinsics, hence C; compiled
 * only in the variant built with -mavx512bf16 (cyattn._kernels_avx512bf16): elsewhere
 * CYATTN_HAVE_BF16_DOT is 0 and the kernel is a stub that no caller reaches.
 *
 * Tile CYATTN_BF16_MR x CYATTN_BF16_NR = 8 x 32: 16 zmm accumulators, two B vectors per k
 * pair, A's pair broadcast from memory into each instruction ({1to16}).
 */
#ifndef CYATTN_BF16_AVX512_H
#define CYATTN_BF16_AVX512_H

#include "_cyattn_bf16_emul.h"
#include "_cyattn_common.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define CYATTN_HAVE_BF16_DOT 1

/* One lane of the instruction itself (the tests of its semantics compare it with
   cyattn_bf16_dot_step). */
static inline float cyattn_bf16_dot_lane_hw(float acc, uint32_t a, uint32_t b) {
    __m128 r = _mm_dpbf16_ps(_mm_set1_ps(acc), (__m128bh)_mm_set1_epi32((int)a),
                             (__m128bh)_mm_set1_epi32((int)b));
    return _mm_cvtss_f32(r);
}

static void cyattn_bf16_tile_avx512(ptrdiff_t kp, const uint32_t* pa, const uint32_t* pb,
                                    float* c, ptrdiff_t rsc, ptrdiff_t csc, ptrdiff_t m_here,
                                    ptrdiff_t n_here, float alpha, int overwrite) {
    __m512 acc[CYATTN_BF16_MR][2];
    ptrdiff_t q;
    int i;
    for (i = 0; i < CYATTN_BF16_MR; i++) {
        cyattn_prefetch_w(c + i * rsc);
        if (!overwrite && csc == 1) cyattn_prefetch_w(c + i * rsc + CYATTN_BF16_NR - 1);
        acc[i][0] = _mm512_setzero_ps();
        acc[i][1] = _mm512_setzero_ps();
    }
    for (q = 0; q < kp; q++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void*)(pb + q * CYATTN_BF16_NR));
        __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void*)(pb + q * CYATTN_BF16_NR + 16));
        cyattn_prefetch_r(pb + (q + 128) * CYATTN_BF16_NR);
        cyattn_prefetch_r(pb + (q + 128) * CYATTN_BF16_NR + 16);
        for (i = 0; i < CYATTN_BF16_MR; i++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)pa[q * CYATTN_BF16_MR + i]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], a, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], a, b1);
        }
    }
    if (m_here == CYATTN_BF16_MR && n_here == CYATTN_BF16_NR && csc == 1) {
        __m512 va = _mm512_set1_ps(alpha);
        for (i = 0; i < CYATTN_BF16_MR; i++) {
            float* row = c + i * rsc;
            if (overwrite) {
                _mm512_storeu_ps(row, _mm512_mul_ps(va, acc[i][0]));
                _mm512_storeu_ps(row + 16, _mm512_mul_ps(va, acc[i][1]));
            } else {
                _mm512_storeu_ps(row, _mm512_fmadd_ps(va, acc[i][0], _mm512_loadu_ps(row)));
                _mm512_storeu_ps(row + 16,
                                 _mm512_fmadd_ps(va, acc[i][1], _mm512_loadu_ps(row + 16)));
            }
        }
    } else {
        float tile[CYATTN_BF16_MR * CYATTN_BF16_NR];
        for (i = 0; i < CYATTN_BF16_MR; i++) {
            _mm512_storeu_ps(tile + i * CYATTN_BF16_NR, acc[i][0]);
            _mm512_storeu_ps(tile + i * CYATTN_BF16_NR + 16, acc[i][1]);
        }
        cyattn_bf16_store_tile(tile, c, rsc, csc, m_here, n_here, alpha, overwrite);
    }
}
#else
#define CYATTN_HAVE_BF16_DOT 0
static inline float cyattn_bf16_dot_lane_hw(float acc, uint32_t a, uint32_t b) {
    return cyattn_bf16_dot_step(acc, a, b);
}
static void cyattn_bf16_tile_avx512(ptrdiff_t kp, const uint32_t* pa, const uint32_t* pb,
                                    float* c, ptrdiff_t rsc, ptrdiff_t csc, ptrdiff_t m_here,
                                    ptrdiff_t n_here, float alpha, int overwrite) {
    cyattn_bf16_tile_emul(kp, pa, pb, c, rsc, csc, m_here, n_here, alpha, overwrite);
}
#endif

#endif /* CYATTN_BF16_AVX512_H */
