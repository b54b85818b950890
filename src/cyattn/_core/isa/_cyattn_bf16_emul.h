/*
 * bfloat16 dot products with the semantics of AVX512-BF16's vdpbf16ps, in portable C: the
 * emulation that every variant runs for precision="fast" where the CPU has no bf16 dot
 * product, and the reference the hardware kernel (_cyattn_bf16_avx512.h) is tested against
 * bit for bit. C because the rounding rule needs double arithmetic and bit tests on floats
 * that must not be contracted or reassociated by the compiler.
 *
 * Operands are packed in the instruction's pair layout: one uint32 holds two bf16 values of
 * consecutive k, k = 2q in the HIGH half and k = 2q + 1 in the low half (a pad of +0 in the
 * low half when K is odd). The instruction adds the high halves' product first, so the sum
 * runs over k in order.
 *
 * One step, per float32 lane, as measured on an AMD EPYC Zen 5 (family 26; 2 M random and
 * adversarial cases, 0 mismatches, against 0.42-0.82 M for the other orders and roundings:
 * bench/bf16_dot_probe.c; tests/test_bf16_fast.py keeps the single cases):
 *   acc = FTZ(RNE(acc + hi(a) * hi(b)));  acc = FTZ(RNE(acc + lo(a) * lo(b)))
 * - each product is exact, with no exponent limit (2^127 * 2^127 added to -FLT_MAX cancels;
 *   2^-200 added to 1 is exact), and rounded once together with the add (as an FMA would);
 * - rounding is always to nearest even (MXCSR's rounding mode is ignored);
 * - DAZ: bf16 inputs with a zero exponent (subnormals) are read as zero of their sign, and so
 *   is a subnormal float32 accumulator;
 * - FTZ: a result that is tiny AFTER rounding (its value rounded to 24 bits with an unbounded
 *   exponent is below 2^-126 in magnitude) becomes a zero of its sign; 2^-126 - 2^-151
 *   rounds to 2^-126 and stays, 2^-126 - 2^-150 is flushed;
 * - NaN results are NaN (x86 propagates an operand's NaN quietened, or makes 0xFFC00000);
 *   their sign and payload are not part of cyattn's contract.
 * The emulation forms acc + product in double, which is exact for the product (16 significant
 * bits) and, rounded to float after that, correctly rounded (53 >= 2 * 24 + 2: double
 * rounding through double is innocuous for a sum of two numbers of at most 24 bits).
 */
#ifndef CYATTN_BF16_EMUL_H
#define CYATTN_BF16_EMUL_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>
#include "_cyattn_common.h"

/* The micro-kernel tile of the bf16 fast path, every variant (the packed layouts do not
   depend on the CPU). 8 x 32 reached 472 GFLOP/s in cache on a Zen 5 core; 14 x 32, 6 x 64,
   4 x 64 and 8 x 48 were within 4 % of it (the instruction's throughput bound). */
#define CYATTN_BF16_MR 8
#define CYATTN_BF16_NR 32

/* bf16 bits (the low 16 of h) -> float32, a subnormal read as zero (DAZ). */
static inline float cyattn_bf16_daz(uint32_t h) {
    uint32_t b = ((h & 0x7f80u) == 0 ? (h & 0x8000u) : (h & 0xffffu)) << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* s (double, the exact sum rounded to double) rounded to float32 with the instruction's
   rule: nearest even, then a result tiny after rounding is flushed to a zero of its sign. */
static inline float cyattn_bf16_round_ftz(double s) {
    float r = (float)s;
    if (fabs(s) < 0x1p-126) {
        /* below the normal range before rounding: rounded to 24 bits with an unbounded
           exponent (scaled into range, exactly), it is 2^-126 or tiny */
        float t = (float)(s * 0x1p100);
        r = (fabsf(t) >= 0x1p-26f) ? 0x1p-126f : 0.0f;
        r = (s < 0 || (s == 0 && signbit(s))) ? -r : r;
    }
    return r;
}

/* One vdpbf16ps lane: acc plus the products of the two bf16 pairs a and b (high halves
   first); a subnormal acc is read as zero (in the GEMM it never is one: it starts at +0
   and every step flushes). */
static inline float cyattn_bf16_dot_step(float acc, uint32_t a, uint32_t b) {
    uint32_t acc_bits;
    double p_hi = (double)cyattn_bf16_daz(a >> 16) * (double)cyattn_bf16_daz(b >> 16);
    double p_lo = (double)cyattn_bf16_daz(a) * (double)cyattn_bf16_daz(b);
    memcpy(&acc_bits, &acc, 4);
    if ((acc_bits & 0x7f800000u) == 0) acc = (acc_bits >> 31) ? -0.0f : 0.0f;
    acc = cyattn_bf16_round_ftz((double)acc + p_hi);
    return cyattn_bf16_round_ftz((double)acc + p_lo);
}

/* The tile's result into C: c = alpha * acc (overwrite) or c = fma(alpha, acc, c), one
   rounding, the same on every variant (an explicit fmaf, which gcc would otherwise contract
   only where the variant has FMA). */
static inline void cyattn_bf16_store_tile(const float* acc, float* c, ptrdiff_t rsc,
                                          ptrdiff_t csc, ptrdiff_t m_here, ptrdiff_t n_here,
                                          float alpha, int overwrite) {
    ptrdiff_t i, j;
    for (i = 0; i < m_here; i++) {
        float* row = c + i * rsc;
        const float* arow = acc + i * CYATTN_BF16_NR;
        if (overwrite) {
            for (j = 0; j < n_here; j++) row[j * csc] = alpha * arow[j];
        } else if (csc == 1) {
            for (j = 0; j < n_here; j++) row[j] = fmaf(alpha, arow[j], row[j]);
        } else {
            for (j = 0; j < n_here; j++) row[j * csc] = fmaf(alpha, arow[j], row[j * csc]);
        }
    }
}

/* C[0:m_here, 0:n_here] (+)= alpha * (A panel @ B panel) over kp k pairs by one lane rule
   `step` (acc, a pair, b pair -> acc): pa holds kp x CYATTN_BF16_MR pairs, pb kp x
   CYATTN_BF16_NR pairs (the packed panels), kp >= 1. The models of every bf16 dot-product
   rule share it (inlined with `step` a constant). */
CYATTN_INLINE void cyattn_bf16_tile_by_steps(ptrdiff_t kp, const uint32_t* pa,
                                             const uint32_t* pb, float* c, ptrdiff_t rsc,
                                             ptrdiff_t csc, ptrdiff_t m_here, ptrdiff_t n_here,
                                             float alpha, int overwrite,
                                             float (*step)(float, uint32_t, uint32_t)) {
    float acc[CYATTN_BF16_MR * CYATTN_BF16_NR];
    ptrdiff_t q, i, j;
    for (i = 0; i < CYATTN_BF16_MR * CYATTN_BF16_NR; i++) acc[i] = 0.0f;
    for (q = 0; q < kp; q++) {
        const uint32_t* bq = pb + q * CYATTN_BF16_NR;
        for (i = 0; i < m_here; i++) {
            uint32_t a = pa[q * CYATTN_BF16_MR + i];
            float* arow = acc + i * CYATTN_BF16_NR;
            for (j = 0; j < n_here; j++) arow[j] = step(arow[j], a, bq[j]);
        }
    }
    cyattn_bf16_store_tile(acc, c, rsc, csc, m_here, n_here, alpha, overwrite);
}

/* The tile emulated by vdpbf16ps's rule (cyattn_bf16_dot_step). */
static void cyattn_bf16_tile_emul(ptrdiff_t kp, const uint32_t* pa, const uint32_t* pb,
                                  float* c, ptrdiff_t rsc, ptrdiff_t csc, ptrdiff_t m_here,
                                  ptrdiff_t n_here, float alpha, int overwrite) {
    cyattn_bf16_tile_by_steps(kp, pa, pb, c, rsc, csc, m_here, n_here, alpha, overwrite,
                              cyattn_bf16_dot_step);
}

#endif /* CYATTN_BF16_EMUL_H */
