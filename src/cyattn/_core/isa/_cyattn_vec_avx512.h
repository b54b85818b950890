/*
 * The AVX-512 vector pieces (the avx512 variant: -mavx512f/bw/vl/dq with AVX2, FMA, F16C), in
 * the vocabulary that the ISA-independent bodies in _cyattn_decode.h and
 * _cyattn_softmax_rows.h are written in:
 *   - decode: the vector type, loads (float32 or 16-bit elements widened in registers) and
 *     masked FMA of cyattn_wsum_rows; the key groups (4 keys) of cyattn_dot_rows and their
 *     lane trees;
 *   - softmax rows: the CYATTN_R* operations on 512-bit vectors with k-register masks, and the
 *     32-lane sum and max/min.
 * Each section defines its vocabulary only where its ISA macros hold; _cyattn_vec_avx2.h then
 * fills in what is still undefined, and without either the bodies fall back to scalar code.
 * Code for newer AVX-512 extensions (e.g. AVX512-BF16) belongs here, under its own feature
 * test. C because Cython cannot express SIMD vector types or intrinsics.
 */
#ifndef CYATTN_VEC_AVX512_H
#define CYATTN_VEC_AVX512_H

#include "_cyattn_common.h"
#include "_cyattn_half.h"

/* ---- decode ---------------------------------------------------------------------------- */
/* One vector type per ISA for cyattn_wsum_rows: CYATTN_VW float lanes, loads of float32 or
   16-bit elements (widened in registers), and the FMA. */
#if defined(__AVX512F__) && CYATTN_HAVE_F16C
typedef __m512 cyattn_vec;
#define CYATTN_VW 16
#define cyattn_vloadf _mm512_loadu_ps
#define cyattn_vstoref _mm512_storeu_ps
#define cyattn_vset1 _mm512_set1_ps
/* a + w * x where w != 0 (or NaN), else a unchanged (w: a broadcast weight) */
#define cyattn_vfmadd_nz(w, x, a) \
    _mm512_mask3_fmadd_ps((w), (x), (a), _mm512_cmp_ps_mask((w), _mm512_setzero_ps(), _CMP_NEQ_UQ))
CYATTN_INLINE __m512 cyattn_vload(const void* v, ptrdiff_t i, int fmt) {
    if (fmt == 0) return _mm512_loadu_ps((const float*)v + i);
    if (fmt == CYATTN_HALF_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)v + i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
        _mm256_loadu_si256((const __m256i*)((const uint16_t*)v + i))), 16));
}

/* 32 partial sums in two registers -> four dots: x[i] holds lanes 0-15 + lanes 16-31 of key i */
static inline __m128 cyattn_tree4(__m512 x0, __m512 x1, __m512 x2, __m512 x3) {
    /* + 8: [x0 lo256 | x1 lo256] + [x0 hi256 | x1 hi256] */
    __m512 a = _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x44), _mm512_shuffle_f32x4(x0, x1, 0xee));
    __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(x2, x3, 0x44), _mm512_shuffle_f32x4(x2, x3, 0xee));
    /* + 4: blocks [a0 a1 a2 a3] = [x0 lo, x0 hi, x1 lo, x1 hi] (128 bits each) */
    __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
    /* + 2 and + 1 within each 128-bit block: block i holds key i */
    c = _mm512_add_ps(c, _mm512_permute_ps(c, 0x4e));
    c = _mm512_add_ps(c, _mm512_permute_ps(c, 0xb1));
    /* lane 0 of each block */
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(
        _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), c));
}
#define CYATTN_DOT_KEYS 4

/* Scores of the nq query rows against the 4 key rows j .. j + 3 (a key group of
   cyattn_dot_rows_fmt, which does the prefetches): see the dot's description in
   _cyattn_decode.h. */
CYATTN_INLINE void cyattn_dot_keys(float* scores, ptrdiff_t ss, const float* q, ptrdiff_t qs,
                                   ptrdiff_t nq, const void* k, ptrdiff_t j, ptrdiff_t ks,
                                   ptrdiff_t n, const int fmt, float scale) {
    ptrdiff_t e, i, r;
    for (r = 0; r < nq; r++) {         /* the 4 key rows stay in L1 across the query rows */
        const float* qr = q + r * qs;
        __m512 lo0 = _mm512_setzero_ps(), lo1 = lo0, lo2 = lo0, lo3 = lo0;   /* lanes 0-15 */
        __m512 hi0 = lo0, hi1 = lo0, hi2 = lo0, hi3 = lo0;                    /* 16-31 */
        float t[4] = {0, 0, 0, 0};
        for (e = 0; e + 32 <= n; e += 32) {
            __m512 qa = _mm512_loadu_ps(qr + e), qb = _mm512_loadu_ps(qr + e + 16);
            lo0 = _mm512_fmadd_ps(qa, cyattn_vload(k, j * ks + e, fmt), lo0);
            hi0 = _mm512_fmadd_ps(qb, cyattn_vload(k, j * ks + e + 16, fmt), hi0);
            lo1 = _mm512_fmadd_ps(qa, cyattn_vload(k, (j + 1) * ks + e, fmt), lo1);
            hi1 = _mm512_fmadd_ps(qb, cyattn_vload(k, (j + 1) * ks + e + 16, fmt), hi1);
            lo2 = _mm512_fmadd_ps(qa, cyattn_vload(k, (j + 2) * ks + e, fmt), lo2);
            hi2 = _mm512_fmadd_ps(qb, cyattn_vload(k, (j + 2) * ks + e + 16, fmt), hi2);
            lo3 = _mm512_fmadd_ps(qa, cyattn_vload(k, (j + 3) * ks + e, fmt), lo3);
            hi3 = _mm512_fmadd_ps(qb, cyattn_vload(k, (j + 3) * ks + e + 16, fmt), hi3);
        }
        for (; e < n; e++)
            for (i = 0; i < 4; i++)
                t[i] = CYATTN_MADD(qr[e], cyattn_widen1(k, (j + i) * ks + e, fmt), t[i]);
        /* + 16 (lo + hi), the rest of the tree, + tail, * scale */
        _mm_storeu_ps(scores + r * ss + j, _mm_mul_ps(_mm_set1_ps(scale), _mm_add_ps(
            cyattn_tree4(_mm512_add_ps(lo0, hi0), _mm512_add_ps(lo1, hi1),
                         _mm512_add_ps(lo2, hi2), _mm512_add_ps(lo3, hi3)),
            _mm_loadu_ps(t))));
    }
}
#endif

/* ---- softmax rows ---------------------------------------------------------------------- */
/* 512-bit vectors, 2 per 32 lanes, masks as k-registers (see _cyattn_softmax_rows.h) */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__)
#include <immintrin.h>
#define CYATTN_RV __m512
#define CYATTN_RW 16
#define cyattn_rload _mm512_loadu_ps
#define cyattn_rstore _mm512_storeu_ps
/* non-temporal store of a vector to a 64-byte aligned address (the output rows past the caches) */
#define cyattn_rstream _mm512_stream_ps
#define cyattn_rset1 _mm512_set1_ps
#define cyattn_rmax _mm512_max_ps
#define cyattn_rmin _mm512_min_ps
#define cyattn_radd _mm512_add_ps
#define cyattn_rsub _mm512_sub_ps
#define cyattn_rmul _mm512_mul_ps
#define cyattn_rfma _mm512_fmadd_ps
#define cyattn_rfnma _mm512_fnmadd_ps
#define CYATTN_RK __mmask16
#define cyattn_rkeep(b) _mm_test_epi8_mask(_mm_loadu_si128((const __m128i*)(b)), \
    _mm_set1_epi8((char)-1))
#define cyattn_rsel(kk, v, fill) _mm512_mask_blend_ps((kk), (fill), (v))
#define cyattn_rzero_unless(kk, v) _mm512_maskz_mov_ps((kk), (v))
#define cyattn_rpow2(t) _mm512_castsi512_ps(_mm512_add_epi32( \
    _mm512_slli_epi32(_mm512_castps_si512(t), 23), _mm512_castps_si512(_mm512_set1_ps(1.0f))))

/* part[0] + ... + part[31] of 32 lane partials held in CYATTN_RN vectors, in lanes_sum's
   order (lane l plus lane l + 16, then + 8, + 4, + 2, then lane 0 plus lane 1) */
static inline float cyattn_rsum32(const CYATTN_RV* v) {
    __m256 c;
    __m128 d;
    __m512 w = _mm512_add_ps(v[0], v[1]);
    c = _mm256_add_ps(_mm512_castps512_ps256(w),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1)));
    d = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    d = _mm_add_ps(d, _mm_movehl_ps(d, d));
    return _mm_cvtss_f32(d) + _mm_cvtss_f32(_mm_shuffle_ps(d, d, 1));
}

/* max (want_max) or min of 32 lane values held in CYATTN_RN vectors (no NaN among them) */
static inline float cyattn_rmax32(const CYATTN_RV* v, int want_max) {
    return want_max ? _mm512_reduce_max_ps(_mm512_max_ps(v[0], v[1]))
                    : _mm512_reduce_min_ps(_mm512_min_ps(v[0], v[1]));
}
#endif

#endif /* CYATTN_VEC_AVX512_H */
