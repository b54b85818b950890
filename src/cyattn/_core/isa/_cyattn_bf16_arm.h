/*
 * bfloat16 dot products with the semantics of AArch64's BFDOT / BFMMLA (FEAT_BF16), in
 * portable C (the model every host runs, so the rule is tested on x86 too), and the neonbf16
 * variant's micro-kernel on BFDOT by element (compiled where the compiler targets FEAT_BF16:
 * -march=armv8.2-a+bf16, cyattn._kernels_neonbf16; CYATTN_HAVE_BF16_ARM is 0 elsewhere and the
 * kernel is the model).
 *
 * The rule, from the Arm Architecture Reference Manual's pseudocode (BFDotAdd with
 * FPCR.EBF == 0, which is how Linux starts every thread and what CPUs without FEAT_EBF16
 * always do), per float32 lane and per pair of k (the pair layout of _cyattn_bf16_emul.h:
 * two bf16 of consecutive k in one uint32):
 *   p1 = BFMul(a_2q, b_2q); p2 = BFMul(a_2q+1, b_2q+1)    products as float32
 *   acc = BFAdd(acc, BFAdd(p1, p2))                        the pair summed first, then added
 * where every operation ignores FPCR (rounding mode, FZ, DN) and:
 *   - rounds to odd (truncate; set the last bit if anything was cut off), an exact result
 *     kept; an exponent past float32's range gives infinity (an exact value below 2^128 keeps
 *     the largest float, whose last bit is already odd);
 *   - reads subnormal inputs (the bf16 values, and a float32 acc) as zeros of their sign, and
 *     flushes a result below 2^-126 in magnitude to a zero of its sign;
 *   - gives the default NaN (0x7FC00000) for any NaN result.
 * A product of two bf16 has at most 16 significant bits, so BFMul rounds only by flushing a
 * product below 2^-126 or overflowing one of 2^128 or more. BFMMLA (a 2 x 4 by 4 x 2 block)
 * is two BFDotAdd steps per output element, k pairs in order, so a kernel on it gives the same
 * bits as this one on BFDOT. FEAT_EBF16 with FPCR.EBF == 1 would change the rule (one
 * rounding of the fused pair, to nearest even, FPCR's FZ): cyattn never sets that bit.
 *
 * The sums use float32 arithmetic with an exact error term (Knuth's TwoSum), so the model
 * needs no rounding mode of its own; C because the bit tests on floats must not be
 * reassociated by a compiler.
 */
#ifndef CYATTN_BF16_ARM_H
#define CYATTN_BF16_ARM_H

#include "_cyattn_bf16_emul.h"
#include "_cyattn_common.h"
#include <float.h>

#define CYATTN_BFA_NAN 0x7fc00000u

CYATTN_INLINE uint32_t cyattn_bfa_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}

CYATTN_INLINE float cyattn_bfa_float(uint32_t b) {
    float x;
    memcpy(&x, &b, 4);
    return x;
}

/* A float32 with a zero exponent (zero or subnormal) read as a zero of its sign. */
CYATTN_INLINE float cyattn_bfa_flush(float x) {
    uint32_t b = cyattn_bfa_bits(x);
    return (b & 0x7f800000u) == 0 ? cyattn_bfa_float(b & 0x80000000u) : x;
}

/* BFMul: the product of two bf16 (the low 16 bits of a and b), DAZ, flushed below 2^-126,
   infinity from 2^128; exact otherwise. */
CYATTN_INLINE float cyattn_bfa_mul(uint32_t a, uint32_t b) {
    /* cyattn_bf16_daz reads a subnormal bf16 as zero; the double product is exact */
    double p = (double)cyattn_bf16_daz(a) * (double)cyattn_bf16_daz(b);
    if (p != p) return cyattn_bfa_float(CYATTN_BFA_NAN);
    if (fabs(p) < 0x1p-126) return signbit(p) ? -0.0f : 0.0f;
    if (fabs(p) >= 0x1p128) return signbit(p) ? -INFINITY : INFINITY;
    return (float)p;
}

/* BFAdd of two float32 that are normal, zero, infinite or NaN (flushed already): rounded to
   odd, flushed below 2^-126, default NaN. */
CYATTN_INLINE float cyattn_bfa_add(float x, float y) {
    float s = x + y, t, e;
    uint32_t sb;
    if (s != s) return cyattn_bfa_float(CYATTN_BFA_NAN);
    if (isinf(s)) {
        if (isinf(x) || isinf(y)) return s;
        /* rounding to nearest overflowed: both are above 2^103 (else the sum rounds to at most
           FLT_MAX), so their double sum is exact; to odd, below 2^128 it is FLT_MAX */
        return fabs((double)x + (double)y) >= 0x1p128 ? s : (s < 0 ? -FLT_MAX : FLT_MAX);
    }
    t = s - x;
    e = (x - (s - t)) + (y - t);     /* x + y == s + e exactly (TwoSum) */
    sb = cyattn_bfa_bits(s);
    if (e != 0.0f) {
        /* inexact: truncate (one step toward zero where s was rounded away), then odd */
        if ((e < 0.0f) != (s < 0.0f)) sb -= 1;
        sb |= 1;
    }
    /* a sum of normal floats below 2^-126 is exact (a multiple of 2^-149), so flushing the
       rounded result is flushing the exact one, as the rule says */
    if ((sb & 0x7f800000u) == 0) sb &= 0x80000000u;
    return cyattn_bfa_float(sb);
}

/* One BFDOT lane: acc + (a_hi b_hi + a_lo b_lo), the pair summed first, every step rounded
   to odd with subnormals flushed (the pair order does not matter: the sum is commutative). */
static inline float cyattn_bf16_arm_dot_step(float acc, uint32_t a, uint32_t b) {
    float pair = cyattn_bfa_add(cyattn_bfa_mul(a >> 16, b >> 16), cyattn_bfa_mul(a, b));
    return cyattn_bfa_add(cyattn_bfa_flush(acc), pair);
}

/* C[0:m_here, 0:n_here] (+)= alpha * (A panel @ B panel) over kp k pairs by the model (the
   packed panels of _cyattn_bf16_emul.h, kp >= 1). */
static void cyattn_bf16_tile_arm_model(ptrdiff_t kp, const uint32_t* pa, const uint32_t* pb,
                                       float* c, ptrdiff_t rsc, ptrdiff_t csc, ptrdiff_t m_here,
                                       ptrdiff_t n_here, float alpha, int overwrite) {
    cyattn_bf16_tile_by_steps(kp, pa, pb, c, rsc, csc, m_here, n_here, alpha, overwrite,
                              cyattn_bf16_arm_dot_step);
}

#if (defined(__aarch64__) || defined(_M_ARM64)) && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#include <arm_neon.h>
#define CYATTN_HAVE_BF16_ARM 1

/* One lane of the instruction itself (the tests compare it with cyattn_bf16_arm_dot_step). */
static inline float cyattn_bf16_arm_dot_lane_hw(float acc, uint32_t a, uint32_t b) {
    float32x4_t r = vbfdotq_f32(vdupq_n_f32(acc), vreinterpretq_bf16_u32(vdupq_n_u32(a)),
                                vreinterpretq_bf16_u32(vdupq_n_u32(b)));
    return vgetq_lane_f32(r, 0);
}

/* The 8 x 32 tile on BFDOT by element, as four 8 x 8 column strips: 16 accumulators, two B
   vectors (8 column pairs) and two A vectors (8 row pairs) per k pair; the A vectors' lanes
   select the row (BFDOT's indexed form: acc[j] += B pair j . A pair lane). */
static void cyattn_bf16_tile_arm_hw(ptrdiff_t kp, const uint32_t* pa, const uint32_t* pb,
                                    float* c, ptrdiff_t rsc, ptrdiff_t csc, ptrdiff_t m_here,
                                    ptrdiff_t n_here, float alpha, int overwrite) {
    float tile[CYATTN_BF16_MR * CYATTN_BF16_NR];
    int full = m_here == CYATTN_BF16_MR && n_here == CYATTN_BF16_NR && csc == 1;
    float32x4_t va = vdupq_n_f32(alpha);
    int s, i;
    ptrdiff_t q;
    for (s = 0; s < CYATTN_BF16_NR / 8; s++) {
        float32x4_t acc[8][2];
        const uint32_t* bs = pb + 8 * s;
        for (i = 0; i < 8; i++) {
            acc[i][0] = vdupq_n_f32(0.0f);
            acc[i][1] = vdupq_n_f32(0.0f);
        }
        for (q = 0; q < kp; q++) {
            bfloat16x8_t b0 = vreinterpretq_bf16_u32(vld1q_u32(bs + q * CYATTN_BF16_NR));
            bfloat16x8_t b1 = vreinterpretq_bf16_u32(vld1q_u32(bs + q * CYATTN_BF16_NR + 4));
            bfloat16x8_t a0 = vreinterpretq_bf16_u32(vld1q_u32(pa + q * CYATTN_BF16_MR));
            bfloat16x8_t a1 = vreinterpretq_bf16_u32(vld1q_u32(pa + q * CYATTN_BF16_MR + 4));
#define CYATTN_BFA_ROW(i, av, l)                                   \
            acc[i][0] = vbfdotq_laneq_f32(acc[i][0], b0, av, l);   \
            acc[i][1] = vbfdotq_laneq_f32(acc[i][1], b1, av, l);
            CYATTN_BFA_ROW(0, a0, 0) CYATTN_BFA_ROW(1, a0, 1)
            CYATTN_BFA_ROW(2, a0, 2) CYATTN_BFA_ROW(3, a0, 3)
            CYATTN_BFA_ROW(4, a1, 0) CYATTN_BFA_ROW(5, a1, 1)
            CYATTN_BFA_ROW(6, a1, 2) CYATTN_BFA_ROW(7, a1, 3)
#undef CYATTN_BFA_ROW
        }
        if (full) {
            /* the same operations as cyattn_bf16_store_tile: alpha * acc, or one fused
               fma(alpha, acc, c) */
            for (i = 0; i < 8; i++) {
                float* row = c + i * rsc + 8 * s;
                if (overwrite) {
                    vst1q_f32(row, vmulq_f32(va, acc[i][0]));
                    vst1q_f32(row + 4, vmulq_f32(va, acc[i][1]));
                } else {
                    vst1q_f32(row, vfmaq_f32(vld1q_f32(row), va, acc[i][0]));
                    vst1q_f32(row + 4, vfmaq_f32(vld1q_f32(row + 4), va, acc[i][1]));
                }
            }
        } else {
            for (i = 0; i < 8; i++) {
                vst1q_f32(tile + i * CYATTN_BF16_NR + 8 * s, acc[i][0]);
                vst1q_f32(tile + i * CYATTN_BF16_NR + 8 * s + 4, acc[i][1]);
            }
        }
    }
    if (!full) cyattn_bf16_store_tile(tile, c, rsc, csc, m_here, n_here, alpha, overwrite);
}
#else
#define CYATTN_HAVE_BF16_ARM 0
static inline float cyattn_bf16_arm_dot_lane_hw(float acc, uint32_t a, uint32_t b) {
    return cyattn_bf16_arm_dot_step(acc, a, b);
}
static void cyattn_bf16_tile_arm_hw(ptrdiff_t kp, const uint32_t* pa, const uint32_t* pb,
                                    float* c, ptrdiff_t rsc, ptrdiff_t csc, ptrdiff_t m_here,
                                    ptrdiff_t n_here, float alpha, int overwrite) {
    cyattn_bf16_tile_arm_model(kp, pa, pb, c, rsc, csc, m_here, n_here, alpha, overwrite);
}
#endif

/* The bf16 rule a build follows where it has no instruction (precision="fast" without
   BF16_DOT / BF16_ARM): aarch64 builds follow BFDOT's, so that an aarch64 CPU without
   FEAT_BF16 gives the bits of one with it; x86-64 builds vdpbf16ps's. */
#if defined(__aarch64__) || defined(_M_ARM64)
#define CYATTN_BF16_RULE_ARM 1
#else
#define CYATTN_BF16_RULE_ARM 0
#endif

#endif /* CYATTN_BF16_ARM_H */
