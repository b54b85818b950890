/*
 * The AVX2 vector pieces (the avx2 variant: -mavx2 -mfma -mf16c), in the vocabulary that the
 * ISA-independent bodies in _cyattn_decode.h and _cyattn_softmax_rows.h are written in:
 *   - decode: the vector type, loads (float32 or 16-bit elements widened in registers) and
 *     masked FMA of cyattn_wsum_rows; the key groups (2 keys) of cyattn_dot_rows and their
 *     lane trees;
 *   - softmax rows: the CYATTN_R* operations on 256-bit vectors with vector masks, and the
 *     32-lane sum and max/min;
 *   - the float32 GEMM micro-kernel's k loop (cyattn_kloop4x24_f32; CYATTN_KLOOP_4X24 is 0 in
 *     every other variant, which keep the loop in _gemm.pxi).
 * Included after _cyattn_vec_avx512.h: each section applies only where that header left its
 * vocabulary undefined (CYATTN_VW, CYATTN_RW), so the avx512 variant uses its own wider
 * vectors. C because Cython cannot express SIMD vector types or intrinsics.
 */
#ifndef CYATTN_VEC_AVX2_H
#define CYATTN_VEC_AVX2_H

#include "_cyattn_common.h"
#include "_cyattn_half.h"

/* ---- decode ---------------------------------------------------------------------------- */
#if !defined(CYATTN_VW) && defined(__AVX2__) && defined(__FMA__) && CYATTN_HAVE_F16C
#include <immintrin.h>
typedef __m256 cyattn_vec;
#define CYATTN_VW 8
#define cyattn_vloadf _mm256_loadu_ps
#define cyattn_vstoref _mm256_storeu_ps
#define cyattn_vset1 _mm256_set1_ps
#define cyattn_vfmadd_nz(w, x, a) _mm256_blendv_ps((a), _mm256_fmadd_ps((w), (x), (a)), \
                                                   _mm256_cmp_ps((w), _mm256_setzero_ps(), _CMP_NEQ_UQ))
CYATTN_INLINE __m256 cyattn_vload(const void* v, ptrdiff_t i, int fmt) {
    if (fmt == 0) return _mm256_loadu_ps((const float*)v + i);
    if (fmt == CYATTN_HALF_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)v + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
        _mm_loadu_si128((const __m128i*)((const uint16_t*)v + i))), 16));
}

/* x[i]: lanes 0-7 of key i after the + 16 and + 8 steps */
static inline __m128 cyattn_tree2(__m256 x0, __m256 x1) {
    __m256 c = _mm256_add_ps(_mm256_permute2f128_ps(x0, x1, 0x20),
                             _mm256_permute2f128_ps(x0, x1, 0x31));   /* + 4: [key0 | key1] */
    c = _mm256_add_ps(c, _mm256_permute_ps(c, 0x4e));
    c = _mm256_add_ps(c, _mm256_permute_ps(c, 0xb1));
    return _mm_unpacklo_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
}
#define CYATTN_DOT_KEYS 2

/* Scores of the nq query rows against the 2 key rows j .. j + 1 (a key group of
   cyattn_dot_rows_fmt, which does the prefetches): see the dot's description in
   _cyattn_decode.h. */
CYATTN_INLINE void cyattn_dot_keys(float* scores, ptrdiff_t ss, const float* q, ptrdiff_t qs,
                                   ptrdiff_t nq, const void* k, ptrdiff_t j, ptrdiff_t ks,
                                   ptrdiff_t n, const int fmt, float scale) {
    ptrdiff_t e, i, r;
    for (r = 0; r < nq; r++) {
        const float* qr = q + r * qs;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;   /* key j: lanes 0-31 */
        __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;                    /* key j + 1 */
        float t[4] = {0, 0, 0, 0};
        __m128 d;
        for (e = 0; e + 32 <= n; e += 32) {
            __m256 x0 = _mm256_loadu_ps(qr + e), x1 = _mm256_loadu_ps(qr + e + 8);
            __m256 x2 = _mm256_loadu_ps(qr + e + 16), x3 = _mm256_loadu_ps(qr + e + 24);
            a0 = _mm256_fmadd_ps(x0, cyattn_vload(k, j * ks + e, fmt), a0);
            a1 = _mm256_fmadd_ps(x1, cyattn_vload(k, j * ks + e + 8, fmt), a1);
            a2 = _mm256_fmadd_ps(x2, cyattn_vload(k, j * ks + e + 16, fmt), a2);
            a3 = _mm256_fmadd_ps(x3, cyattn_vload(k, j * ks + e + 24, fmt), a3);
            b0 = _mm256_fmadd_ps(x0, cyattn_vload(k, (j + 1) * ks + e, fmt), b0);
            b1 = _mm256_fmadd_ps(x1, cyattn_vload(k, (j + 1) * ks + e + 8, fmt), b1);
            b2 = _mm256_fmadd_ps(x2, cyattn_vload(k, (j + 1) * ks + e + 16, fmt), b2);
            b3 = _mm256_fmadd_ps(x3, cyattn_vload(k, (j + 1) * ks + e + 24, fmt), b3);
        }
        for (; e < n; e++)
            for (i = 0; i < 2; i++)
                t[i] = CYATTN_MADD(qr[e], cyattn_widen1(k, (j + i) * ks + e, fmt), t[i]);
        /* + 16: lanes l and l + 16; + 8: lanes l and l + 8; then the rest of the tree */
        d = cyattn_tree2(_mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)),
                         _mm256_add_ps(_mm256_add_ps(b0, b2), _mm256_add_ps(b1, b3)));
        d = _mm_add_ps(d, _mm_loadu_ps(t));
        scores[r * ss + j] = scale * _mm_cvtss_f32(d);
        scores[r * ss + j + 1] = scale * _mm_cvtss_f32(_mm_shuffle_ps(d, d, 0x55));
    }
}
#endif

/* ---- softmax rows ---------------------------------------------------------------------- */
/* 256-bit vectors, 4 per 32 lanes, masks as all-ones lanes (see _cyattn_softmax_rows.h) */
#if !defined(CYATTN_RW) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CYATTN_RV __m256
#define CYATTN_RW 8
#define cyattn_rload _mm256_loadu_ps
#define cyattn_rstore _mm256_storeu_ps
/* non-temporal store of a vector to a 32-byte aligned address (the output rows past the caches) */
#define cyattn_rstream _mm256_stream_ps
#define cyattn_rset1 _mm256_set1_ps
#define cyattn_rmax _mm256_max_ps
#define cyattn_rmin _mm256_min_ps
#define cyattn_radd _mm256_add_ps
#define cyattn_rsub _mm256_sub_ps
#define cyattn_rmul _mm256_mul_ps
#define cyattn_rfma _mm256_fmadd_ps
#define cyattn_rfnma _mm256_fnmadd_ps
#define CYATTN_RK __m256
#define cyattn_rkeep(b) _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_cvtepu8_epi32( \
    _mm_loadl_epi64((const __m128i*)(b))), _mm256_setzero_si256()))
#define cyattn_rsel(kk, v, fill) _mm256_blendv_ps((fill), (v), (kk))
#define cyattn_rzero_unless(kk, v) _mm256_and_ps((kk), (v))
#define cyattn_rpow2(t) _mm256_castsi256_ps(_mm256_add_epi32( \
    _mm256_slli_epi32(_mm256_castps_si256(t), 23), _mm256_castps_si256(_mm256_set1_ps(1.0f))))
/* p * 2**n for n = nn (a float holding an integer) when the product is a normal number, by an
   integer add of n << 23 to p's bits: the same bits as the multiply there (both exact). A NaN
   nn converts to 0x80000000, whose shift is 0: p is returned as it is (see cyattn_rexp_lock_n) */
#define cyattn_rscale2n(p, nn) _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), \
    _mm256_slli_epi32(_mm256_cvttps_epi32(nn), 23)))
/* the exp steps of the softmax rows run in lockstep (cyattn_rexp_nonpos_lock) */
#define CYATTN_RLOCK 1

/* part[0] + ... + part[31] of 32 lane partials held in CYATTN_RN vectors, in lanes_sum's
   order (lane l plus lane l + 16, then + 8, + 4, + 2, then lane 0 plus lane 1) */
static inline float cyattn_rsum32(const CYATTN_RV* v) {
    __m256 c;
    __m128 d;
    c = _mm256_add_ps(_mm256_add_ps(v[0], v[2]), _mm256_add_ps(v[1], v[3]));
    d = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    d = _mm_add_ps(d, _mm_movehl_ps(d, d));
    return _mm_cvtss_f32(d) + _mm_cvtss_f32(_mm_shuffle_ps(d, d, 1));
}

/* max (want_max) or min of 32 lane values held in CYATTN_RN vectors (no NaN among them) */
static inline float cyattn_rmax32(const CYATTN_RV* v, int want_max) {
    __m256 c;
    __m128 d;
    c = want_max ? _mm256_max_ps(_mm256_max_ps(v[0], v[2]), _mm256_max_ps(v[1], v[3]))
                 : _mm256_min_ps(_mm256_min_ps(v[0], v[2]), _mm256_min_ps(v[1], v[3]));
    d = want_max ? _mm_max_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1))
                 : _mm_min_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    d = want_max ? _mm_max_ps(d, _mm_movehl_ps(d, d)) : _mm_min_ps(d, _mm_movehl_ps(d, d));
    d = want_max ? _mm_max_ss(d, _mm_shuffle_ps(d, d, 1)) : _mm_min_ss(d, _mm_shuffle_ps(d, d, 1));
    return _mm_cvtss_f32(d);
}
#endif

/* ---- the float32 micro-kernel's k loop ------------------------------------------------ */
/* The avx2 variant's 4 x 24 micro-kernel (micro_kernel_f32, _gemm.pxi) runs its k steps 1 to
   kc - 1 here, inlined, padded to a 64-byte boundary right before the loop, so the loop of
   12 FMAs (111 bytes with gcc 12) sits in two 64-byte fetch windows in every build (gcc 12
   may put a register move and its own 16-byte alignment after the padding: the loop starts
   at byte 0 or 8 of a line; tools/ab_inprocess.py --windows prints it). Compiled from the
   Cython loop, its place moved with unrelated code; on Zen 3, SDPA (8,8,128,64) at 1 thread
   ran 0.92-0.99 of main's build (medians of six in-process runs) with the loop moved into
   three windows by a change to the softmax rows' exp, and 1.007-1.012 with the same change
   and this loop (bench/results/x86_peers.md, seventh session). -falign-loops=64 does not
   reach it: gcc aligns only loops it counts hot against the hottest block of the function.
   The sums are the micro-kernel's, in the same order (one FMA per update, as gcc contracts
   `acc += a * b` there), so the bits are the same.
   acc: the MR x NR (4 x 24) accumulator tile, row-major, holding step 0's products. */
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__) \
    && (defined(__GNUC__) || defined(__clang__))
#define CYATTN_KLOOP_4X24 1
/* one row of the tile, one k step: its three vectors += A[row][p] * B's 24 columns */
#define CYATTN_K4X24_ROW(ap, r0, r1, r2) {                                              \
    __m256 ai_ = _mm256_broadcast_ss(ap);                                              \
    r0 = _mm256_fmadd_ps(ai_, b0, r0);                                                 \
    r1 = _mm256_fmadd_ps(ai_, b1, r1);                                                 \
    r2 = _mm256_fmadd_ps(ai_, b2, r2); }
CYATTN_INLINE void cyattn_kloop4x24_f32(ptrdiff_t kc, const float* pa, const float* pb,
                                       float* acc) {
    /* twelve named accumulators: as an array of vectors gcc kept them on the stack */
    __m256 c00 = _mm256_loadu_ps(acc), c01 = _mm256_loadu_ps(acc + 8),
           c02 = _mm256_loadu_ps(acc + 16), c10 = _mm256_loadu_ps(acc + 24),
           c11 = _mm256_loadu_ps(acc + 32), c12 = _mm256_loadu_ps(acc + 40),
           c20 = _mm256_loadu_ps(acc + 48), c21 = _mm256_loadu_ps(acc + 56),
           c22 = _mm256_loadu_ps(acc + 64), c30 = _mm256_loadu_ps(acc + 72),
           c31 = _mm256_loadu_ps(acc + 80), c32 = _mm256_loadu_ps(acc + 88);
    if (kc > 1) {
        const float* a = pa + 4;
        const float* b = pb + 24;
        const float* a_end = pa + kc * 4;
        /* the padding to a 64-byte boundary (run once a call) goes right before the loop:
           the asm takes the loop's pointers, so gcc places none of their setup after it */
        __asm__ volatile(".p2align 6" : "+r"(a), "+r"(b), "+r"(a_end));
        do {
            __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
            __m256 b2 = _mm256_loadu_ps(b + 16);
            CYATTN_K4X24_ROW(a, c00, c01, c02)
            CYATTN_K4X24_ROW(a + 1, c10, c11, c12)
            CYATTN_K4X24_ROW(a + 2, c20, c21, c22)
            CYATTN_K4X24_ROW(a + 3, c30, c31, c32)
            a += 4;
            b += 24;
        } while (a != a_end);
    }
    _mm256_storeu_ps(acc, c00); _mm256_storeu_ps(acc + 8, c01); _mm256_storeu_ps(acc + 16, c02);
    _mm256_storeu_ps(acc + 24, c10); _mm256_storeu_ps(acc + 32, c11);
    _mm256_storeu_ps(acc + 40, c12); _mm256_storeu_ps(acc + 48, c20);
    _mm256_storeu_ps(acc + 56, c21); _mm256_storeu_ps(acc + 64, c22);
    _mm256_storeu_ps(acc + 72, c30); _mm256_storeu_ps(acc + 80, c31);
    _mm256_storeu_ps(acc + 88, c32);
}
#else
#define CYATTN_KLOOP_4X24 0     /* other variants: micro_kernel_f32 keeps its k loop */
static inline void cyattn_kloop4x24_f32(ptrdiff_t kc, const float* pa, const float* pb,
                                        float* acc) {
    (void)kc; (void)pa; (void)pb; (void)acc;
}
#endif

#endif /* CYATTN_VEC_AVX2_H */
