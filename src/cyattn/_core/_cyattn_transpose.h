/*
 * Float32 data movement around the packed panels: tile transposes for the packing routines
 * (_gemm.pxi: pack_a, pack_b, pack_a_pairs), the fused attention's output transpose, and the
 * scan of a packed value block for inf / NaN. The transposes:
 * dst[q * ldd + i] = a[i * rsa + q] for i < R (8 or 4), q < 8. With AVX (the avx2 and avx512
 * variants) in 256-bit registers: R row loads, the unpack / shuffle / lane-permute network,
 * 8 stores. With NEON (the neon variant: CYATTN_ISA_NEON on aarch64) in 4 x 4 blocks of
 * 128-bit registers, TRN1/TRN2 on 32- then 64-bit lanes: 8 permutes a block, 16 loads and 16
 * stores for 8 x 8 (gcc's code for the loops below executed about 2.6 instructions an element
 * under qemu, tools/insn_per_flop.py; these about 1). C because Cython cannot express vector
 * types or intrinsics; elsewhere the callers keep their Cython loops (CYATTN_HAVE_TRANSPOSE 0).
 * Only moves bits, so results are those of
 * the loops: on an AVX2 CPU the loops (gcc's code for memcpy into local tiles and constant-trip
 * element copies) were 11 % of a (8, 8, 128, 64) attention call (perf, Zen 5 as an AVX2 CPU).
 */
#ifndef CYATTN_TRANSPOSE_H
#define CYATTN_TRANSPOSE_H

#include <stddef.h>
#include "_cyattn_common.h"

#if defined(__AVX__)
#include <immintrin.h>
#define CYATTN_HAVE_TRANSPOSE 1

/* rows r0..r7 (8 floats each) -> columns, in place in r[] */
CYATTN_INLINE void cyattn_tr8x8_regs(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* dst[q * ldd + i] = a[i * rsa + q] for i, q < 8 */
CYATTN_INLINE void cyattn_transpose_8x8_f32(const float* a, ptrdiff_t rsa, float* dst,
                                            ptrdiff_t ldd) {
    __m256 r[8];
    int i;
    for (i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(a + i * rsa);
    cyattn_tr8x8_regs(r);
    for (i = 0; i < 8; i++)
        _mm256_storeu_ps(dst + i * ldd, r[i]);
}

/* dst[q * ldd + i] = a[i * rsa + q] for i < 4, q < 8 */
CYATTN_INLINE void cyattn_transpose_4x8_f32(const float* a, ptrdiff_t rsa, float* dst,
                                            ptrdiff_t ldd) {
    __m256 r0 = _mm256_loadu_ps(a), r1 = _mm256_loadu_ps(a + rsa);
    __m256 r2 = _mm256_loadu_ps(a + 2 * rsa), r3 = _mm256_loadu_ps(a + 3 * rsa);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    /* columns (q, q + 4) of the 4 rows, as pairs of 128-bit halves */
    __m256 c04 = _mm256_shuffle_ps(t0, t2, 0x44), c15 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 c26 = _mm256_shuffle_ps(t1, t3, 0x44), c37 = _mm256_shuffle_ps(t1, t3, 0xEE);
    if (ldd == 4) {                     /* a packed panel: 32 contiguous floats */
        _mm256_storeu_ps(dst, _mm256_permute2f128_ps(c04, c15, 0x20));
        _mm256_storeu_ps(dst + 8, _mm256_permute2f128_ps(c26, c37, 0x20));
        _mm256_storeu_ps(dst + 16, _mm256_permute2f128_ps(c04, c15, 0x31));
        _mm256_storeu_ps(dst + 24, _mm256_permute2f128_ps(c26, c37, 0x31));
        return;
    }
    _mm_storeu_ps(dst, _mm256_castps256_ps128(c04));
    _mm_storeu_ps(dst + ldd, _mm256_castps256_ps128(c15));
    _mm_storeu_ps(dst + 2 * ldd, _mm256_castps256_ps128(c26));
    _mm_storeu_ps(dst + 3 * ldd, _mm256_castps256_ps128(c37));
    _mm_storeu_ps(dst + 4 * ldd, _mm256_extractf128_ps(c04, 1));
    _mm_storeu_ps(dst + 5 * ldd, _mm256_extractf128_ps(c15, 1));
    _mm_storeu_ps(dst + 6 * ldd, _mm256_extractf128_ps(c26, 1));
    _mm_storeu_ps(dst + 7 * ldd, _mm256_extractf128_ps(c37, 1));
}
#elif defined(CYATTN_ISA_NEON) && (defined(__aarch64__) || defined(_M_ARM64))
#include <arm_neon.h>
#define CYATTN_HAVE_TRANSPOSE 1
#define CYATTN_NEON_TRANSPOSE 1

/* 64-bit halves of two vectors: (a.lo, b.lo) with TRN1, (a.hi, b.hi) with TRN2 */
#define CYATTN_TRN64(trn, a, b) \
    vreinterpretq_f32_f64(trn(vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(b)))
/* r0..r3 (4 floats each) -> columns: r[i] lane q becomes c[q] lane i */
#define CYATTN_TR4X4(r0, r1, r2, r3, c0, c1, c2, c3) {                                  \
    float32x4_t t0_ = vtrn1q_f32((r0), (r1)), t1_ = vtrn2q_f32((r0), (r1));             \
    float32x4_t t2_ = vtrn1q_f32((r2), (r3)), t3_ = vtrn2q_f32((r2), (r3));             \
    c0 = CYATTN_TRN64(vtrn1q_f64, t0_, t2_); c1 = CYATTN_TRN64(vtrn1q_f64, t1_, t3_);   \
    c2 = CYATTN_TRN64(vtrn2q_f64, t0_, t2_); c3 = CYATTN_TRN64(vtrn2q_f64, t1_, t3_); }

/* dst[q * ldd + i] = a[i * rsa + q] for i < 4, q < 8 */
CYATTN_INLINE void cyattn_transpose_4x8_f32(const float* a, ptrdiff_t rsa, float* dst,
                                            ptrdiff_t ldd) {
    float32x4_t c0, c1, c2, c3;
    const float *a1 = a + rsa, *a2 = a + 2 * rsa, *a3 = a + 3 * rsa;
    CYATTN_TR4X4(vld1q_f32(a), vld1q_f32(a1), vld1q_f32(a2), vld1q_f32(a3), c0, c1, c2, c3)
    vst1q_f32(dst, c0); vst1q_f32(dst + ldd, c1);
    vst1q_f32(dst + 2 * ldd, c2); vst1q_f32(dst + 3 * ldd, c3);
    CYATTN_TR4X4(vld1q_f32(a + 4), vld1q_f32(a1 + 4), vld1q_f32(a2 + 4), vld1q_f32(a3 + 4),
                 c0, c1, c2, c3)
    vst1q_f32(dst + 4 * ldd, c0); vst1q_f32(dst + 5 * ldd, c1);
    vst1q_f32(dst + 6 * ldd, c2); vst1q_f32(dst + 7 * ldd, c3);
}

/* dst[q * ldd + i] = a[i * rsa + q] for i, q < 8: rows 0-3 and 4-7 as two 4 x 8 halves */
CYATTN_INLINE void cyattn_transpose_8x8_f32(const float* a, ptrdiff_t rsa, float* dst,
                                            ptrdiff_t ldd) {
    cyattn_transpose_4x8_f32(a, rsa, dst, ldd);
    cyattn_transpose_4x8_f32(a + 4 * rsa, rsa, dst + 4, ldd);
}
#endif

/* out[r * o_rs + e] = ot[e * ot_rs + r] * inv[r] for r < rows, e < n: the fused attention's
   last step, O^T (n rows of query lanes) back into rows of the output, each row scaled by its
   1 / sum. With AVX in 8 x 8 blocks through registers (column reads of O^T, one element per
   row per load, were 3 % of an (8, 8, 128, 64) attention call on an AVX2 CPU); one multiply
   per element either way, so the same bits. ot rows hold at least rows readable lanes. */
static inline void cyattn_transpose_scale_f32(const float* ot, ptrdiff_t ot_rs, float* out,
                                              ptrdiff_t o_rs, ptrdiff_t rows, ptrdiff_t n,
                                              const float* inv) {
    ptrdiff_t r0 = 0, r, e;
#if defined(__AVX__)
    for (; r0 + 8 <= rows; r0 += 8) {
        ptrdiff_t e0 = 0;
        for (; e0 + 8 <= n; e0 += 8) {
            __m256 x[8];
            int i;
            for (i = 0; i < 8; i++)
                x[i] = _mm256_loadu_ps(ot + (e0 + i) * ot_rs + r0);
            cyattn_tr8x8_regs(x);
            for (i = 0; i < 8; i++)
                _mm256_storeu_ps(out + (r0 + i) * o_rs + e0,
                                 _mm256_mul_ps(x[i], _mm256_set1_ps(inv[r0 + i])));
        }
        for (r = r0; r < r0 + 8; r++)
            for (e = e0; e < n; e++)
                out[r * o_rs + e] = ot[e * ot_rs + r] * inv[r];
    }
#elif defined(CYATTN_NEON_TRANSPOSE)
    for (; r0 + 4 <= rows; r0 += 4) {
        ptrdiff_t e0 = 0;
        for (; e0 + 4 <= n; e0 += 4) {
            float32x4_t x0, x1, x2, x3;
            const float* o = ot + e0 * ot_rs + r0;
            CYATTN_TR4X4(vld1q_f32(o), vld1q_f32(o + ot_rs), vld1q_f32(o + 2 * ot_rs),
                         vld1q_f32(o + 3 * ot_rs), x0, x1, x2, x3)
            vst1q_f32(out + r0 * o_rs + e0, vmulq_n_f32(x0, inv[r0]));
            vst1q_f32(out + (r0 + 1) * o_rs + e0, vmulq_n_f32(x1, inv[r0 + 1]));
            vst1q_f32(out + (r0 + 2) * o_rs + e0, vmulq_n_f32(x2, inv[r0 + 2]));
            vst1q_f32(out + (r0 + 3) * o_rs + e0, vmulq_n_f32(x3, inv[r0 + 3]));
        }
        for (r = r0; r < r0 + 4; r++)
            for (e = e0; e < n; e++)
                out[r * o_rs + e] = ot[e * ot_rs + r] * inv[r];
    }
#endif
    for (r = r0; r < rows; r++)
        for (e = 0; e < n; e++)
            out[r * o_rs + e] = ot[e * ot_rs + r] * inv[r];
}

/* 1 if v[0:n] holds an inf or NaN (x - x is then NaN, else 0), else 0: has_nonfinite's unit
   stride rows (_attention_two_pass.pxi), which the fused attention runs on every packed value
   block (gcc left that loop scalar: 2 % of an (8, 8, 128, 64) call on an AVX2 CPU). */
static inline int cyattn_any_nonfinite_f32(const float* v, ptrdiff_t n) {
    ptrdiff_t j = 0;
    int bad = 0;
#if defined(__AVX__)
    __m256 acc = _mm256_setzero_ps();
    for (; j + 16 <= n; j += 16) {
        __m256 x = _mm256_loadu_ps(v + j), y = _mm256_loadu_ps(v + j + 8);
        acc = _mm256_or_ps(acc, _mm256_sub_ps(x, x));
        acc = _mm256_or_ps(acc, _mm256_sub_ps(y, y));
    }
    /* finite x - x is +0 (all bits zero); inf - inf and NaN are NaN (nonzero bits) */
    bad = !_mm256_testz_si256(_mm256_castps_si256(acc), _mm256_castps_si256(acc));
#elif defined(CYATTN_NEON_TRANSPOSE)
    uint32x4_t acc = vdupq_n_u32(0);
    for (; j + 8 <= n; j += 8) {
        float32x4_t x = vld1q_f32(v + j), y = vld1q_f32(v + j + 4);
        acc = vorrq_u32(acc, vreinterpretq_u32_f32(vsubq_f32(x, x)));
        acc = vorrq_u32(acc, vreinterpretq_u32_f32(vsubq_f32(y, y)));
    }
    bad = vmaxvq_u32(acc) != 0;
#endif
    for (; j < n; j++)
        bad |= (v[j] - v[j]) != 0;
    return bad;
}

#if !defined(__AVX__) && !defined(CYATTN_NEON_TRANSPOSE)
#define CYATTN_HAVE_TRANSPOSE 0
static inline void cyattn_transpose_8x8_f32(const float* a, ptrdiff_t rsa, float* dst,
                                            ptrdiff_t ldd) {
    (void)a; (void)rsa; (void)dst; (void)ldd;
}
static inline void cyattn_transpose_4x8_f32(const float* a, ptrdiff_t rsa, float* dst,
                                            ptrdiff_t ldd) {
    (void)a; (void)rsa; (void)dst; (void)ldd;
}
#endif

#endif /* CYATTN_TRANSPOSE_H */
