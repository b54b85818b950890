/*
 * The AArch64 Advanced SIMD (NEON) vector pieces of the neon variant (-march=armv8-a, and
 * CYATTN_ISA_NEON defined by setup.py for that variant only: the aarch64 baseline module is
 * compiled from the same flags' portable loops), in the vocabulary that the ISA-independent
 * bodies in _cyattn_decode.h and _cyattn_softmax_rows.h are written in (see
 * _cyattn_vec_avx2.h, whose sections these mirror with 128-bit vectors):
 *   - decode: the vector type, loads (float32, or fp16 widened by FCVTL and bf16 by a 16-bit
 *     shift, as cyattn_half_to_float does) and the masked FMA of cyattn_wsum_rows (a zero
 *     weight keeps the accumulator as it is, so a masked key's inf/NaN value never enters);
 *   - softmax rows: the CYATTN_R* operations on 4-lane vectors with all-ones lane masks, and
 *     the 32-lane sum and max/min in lanes_sum's order.
 * Lane semantics that differ from x86 and are written out here: x86 maxps(a, b) is `a if
 * a > b else b` (b when either is NaN); AArch64 FMAX returns NaN for a NaN operand, so
 * cyattn_rmax / cyattn_rmin are a compare and a bit select, not vmaxq_f32. The multiply-adds
 * are FMLA / FMLS (fused), as gcc contracts the scalar loops' a * b + c on aarch64, so each
 * lane does the operations of the module's scalar code.
 *   - the 8 x 12 float32 GEMM tile (cyattn_tile8x12_f32; CYATTN_NEON_TILE is 0 elsewhere).
 * No key groups (CYATTN_DOT_KEYS): the decode's dot products stay the portable loop.
 * C because Cython cannot express SIMD vector types or intrinsics.
 */
#ifndef CYATTN_VEC_NEON_H
#define CYATTN_VEC_NEON_H

#include "_cyattn_common.h"
#include "_cyattn_half.h"

#if defined(CYATTN_ISA_NEON) && (defined(__aarch64__) || defined(_M_ARM64)) && \
    !defined(CYATTN_VW) && !defined(CYATTN_RW)
#include <arm_neon.h>
#include <string.h>

/* ---- decode ---------------------------------------------------------------------------- */
typedef float32x4_t cyattn_vec;
#define CYATTN_VW 4
#define cyattn_vloadf vld1q_f32
#define cyattn_vstoref vst1q_f32
#define cyattn_vset1 vdupq_n_f32
/* a + w x where w != 0 (NaN counts as != 0, as _CMP_NEQ_UQ does), a elsewhere */
#define cyattn_vfmadd_nz(w, x, a) vbslq_f32(vmvnq_u32(vceqzq_f32(w)), vfmaq_f32((a), (w), (x)), (a))
CYATTN_INLINE float32x4_t cyattn_vload(const void* v, ptrdiff_t i, int fmt) {
    if (fmt == 0) return vld1q_f32((const float*)v + i);
    if (fmt == CYATTN_HALF_F16)
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t*)v + i)));
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t*)v + i), 16));
}

/* ---- softmax rows ---------------------------------------------------------------------- */
#define CYATTN_RV float32x4_t
#define CYATTN_RW 4
#define cyattn_rload vld1q_f32
#define cyattn_rstore vst1q_f32
/* the streamed rows' store (cyattn_rowk_out_nt): ACLE has no non-temporal store intrinsic (STNP
   needs inline assembly, and no aarch64 host is at hand to measure it), so an ordinary store:
   the same bits; the rule never streams here anyway (CYATTN_ROWS_STREAM is 0 for NEON),
   only an explicit stream_min takes that path, as the tests do */
#define cyattn_rstream vst1q_f32
#define cyattn_rset1 vdupq_n_f32
/* x86 maxps / minps semantics: the first operand where the comparison holds, else the second */
#define cyattn_rmax(a, b) vbslq_f32(vcgtq_f32((a), (b)), (a), (b))
#define cyattn_rmin(a, b) vbslq_f32(vcltq_f32((a), (b)), (a), (b))
#define cyattn_radd vaddq_f32
#define cyattn_rsub vsubq_f32
#define cyattn_rmul vmulq_f32
#define cyattn_rfma(a, b, c) vfmaq_f32((c), (a), (b))      /* a b + c, fused */
#define cyattn_rfnma(a, b, c) vfmsq_f32((c), (a), (b))     /* c - a b, fused */
#define CYATTN_RK uint32x4_t
/* lanes whose keep byte is nonzero: 4 bytes widened to 32-bit lanes */
CYATTN_INLINE uint32x4_t cyattn_rkeep(const uint8_t* b) {
    uint32_t w;
    memcpy(&w, b, 4);
    return vtstq_u32(vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(w))))),
                     vdupq_n_u32(0xffu));
}
#define cyattn_rsel(kk, v, fill) vbslq_f32((kk), (v), (fill))
#define cyattn_rzero_unless(kk, v) vreinterpretq_f32_u32(vandq_u32((kk), vreinterpretq_u32_f32(v)))
#define cyattn_rpow2(t) vreinterpretq_f32_s32(vaddq_s32(vshlq_n_s32(vreinterpretq_s32_f32(t), 23), \
    vreinterpretq_s32_f32(vdupq_n_f32(1.0f))))

/* part[0] + ... + part[31] of 32 lane partials held in CYATTN_RN (8) vectors, in lanes_sum's
   order (lane l plus lane l + 16, then + 8, + 4, + 2, then lane 0 plus lane 1) */
static inline float cyattn_rsum32(const CYATTN_RV* v) {
    float32x4_t c0 = vaddq_f32(v[0], v[4]), c1 = vaddq_f32(v[1], v[5]);
    float32x4_t c2 = vaddq_f32(v[2], v[6]), c3 = vaddq_f32(v[3], v[7]);   /* + 16 */
    float32x4_t d = vaddq_f32(vaddq_f32(c0, c2), vaddq_f32(c1, c3));      /* + 8, + 4 */
    float32x2_t e = vadd_f32(vget_low_f32(d), vget_high_f32(d));           /* + 2 */
    return vget_lane_f32(e, 0) + vget_lane_f32(e, 1);
}

/* max (want_max) or min of 32 lane values held in CYATTN_RN vectors (no NaN among them) */
static inline float cyattn_rmax32(const CYATTN_RV* v, int want_max) {
    float32x4_t c0, c1, d;
    float32x2_t e;
    float a, b;
    if (want_max) {
        c0 = cyattn_rmax(cyattn_rmax(v[0], v[4]), cyattn_rmax(v[2], v[6]));
        c1 = cyattn_rmax(cyattn_rmax(v[1], v[5]), cyattn_rmax(v[3], v[7]));
        d = cyattn_rmax(c0, c1);
    } else {
        c0 = cyattn_rmin(cyattn_rmin(v[0], v[4]), cyattn_rmin(v[2], v[6]));
        c1 = cyattn_rmin(cyattn_rmin(v[1], v[5]), cyattn_rmin(v[3], v[7]));
        d = cyattn_rmin(c0, c1);
    }
    e = want_max ? vbsl_f32(vcgt_f32(vget_low_f32(d), vget_high_f32(d)), vget_low_f32(d), vget_high_f32(d))
                 : vbsl_f32(vclt_f32(vget_low_f32(d), vget_high_f32(d)), vget_low_f32(d), vget_high_f32(d));
    a = vget_lane_f32(e, 0);
    b = vget_lane_f32(e, 1);
    return want_max ? (a > b ? a : b) : (a < b ? a : b);
}
#endif

/* ---- the 8 x 12 float32 GEMM micro-kernel tile ----------------------------------------- */
/* acc[i * 12 + j] = sum over p = 0 .. kc-1, in order, of pa[p * 8 + i] * pb[p * 12 + j]: the
   k loop of micro_kernel_f32 (_gemm.pxi) for the neon variant's MR x NR = 8 x 12, whose
   Cython loops gcc compiled with the tile in memory (a load and store of the accumulators per
   row and k step). Here the 24 accumulators (8 rows x 3 vectors of 4 columns) stay in
   registers: per k step 2 loads of A (8 rows), 3 of B and 24 FMLAs by element (B vector times
   lane i % 4 of A's vector i / 4), 29 of the 32 vector registers. Each accumulator starts at 0
   and takes one fused multiply-add per k step in order, as the loop does (its first step is
   a b + 0, fused), so the tile's bits are the loop's. kc >= 1. */
#if defined(CYATTN_ISA_NEON) && (defined(__aarch64__) || defined(_M_ARM64))
#include <arm_neon.h>
#define CYATTN_NEON_TILE 1
#define CYATTN_T8X12_ROW(i, av, lane)                                            \
    c##i##0 = vfmaq_laneq_f32(c##i##0, b0, av, lane);                            \
    c##i##1 = vfmaq_laneq_f32(c##i##1, b1, av, lane);                            \
    c##i##2 = vfmaq_laneq_f32(c##i##2, b2, av, lane);
/* k step s of the pass: A's 8 values at pa + 8 s, B's 12 at pb + 12 s */
#define CYATTN_T8X12_STEP(s) {                                                   \
        float32x4_t a0 = vld1q_f32(pa + (s) * 8), a1 = vld1q_f32(pa + (s) * 8 + 4); \
        float32x4_t b0 = vld1q_f32(pb + (s) * 12), b1 = vld1q_f32(pb + (s) * 12 + 4); \
        float32x4_t b2 = vld1q_f32(pb + (s) * 12 + 8);                           \
        CYATTN_T8X12_ROW(0, a0, 0) CYATTN_T8X12_ROW(1, a0, 1)                    \
        CYATTN_T8X12_ROW(2, a0, 2) CYATTN_T8X12_ROW(3, a0, 3)                    \
        CYATTN_T8X12_ROW(4, a1, 0) CYATTN_T8X12_ROW(5, a1, 1)                    \
        CYATTN_T8X12_ROW(6, a1, 2) CYATTN_T8X12_ROW(7, a1, 3) CYATTN_T8X12_FENCE }
/* keeps the compiler from hoisting the next step's loads above this step's FMLAs: with 24
   accumulators and 5 operands live, gcc 12 otherwise hoisted the second step's loads and
   added register moves to the loop */
#if defined(__GNUC__)
#define CYATTN_T8X12_FENCE __asm__ volatile("" ::: "memory");
#else
#define CYATTN_T8X12_FENCE
#endif
#if defined(__GNUC__)
/* The k loop in inline assembly (GNU C: gcc and clang): the compiler's register allocation of
   the intrinsics below depended on the caller it was inlined into -- in the fused attention's
   task gcc 12 added 4 register moves a pass (62 instructions instead of 58), so the attention's
   two products ran 7 % more instructions than the GEMM's loop (tools/insn_per_flop.py). Here
   the registers are fixed: accumulator (i, j) (rows i < 8, column vector j < 3) is v(8 + 3 i +
   j), A's two vectors v0 v1, B's three v2-v5; loads post-increment their pointer, and the two
   steps of a pass share five LDP (20 + 20 floats), so a pass is 5 LDP + 48 FMLA + compare and
   branch = 55 instructions, 27.5 a step. The same FMLA by element, accumulator by
   accumulator, in the same k order from zero as the intrinsics: the same bits. */
/* one k step: accumulator v(8 + 3 i + j) += B's vector j (registers b0 b1 b2) times lane i % 4
   of A's vector i / 4 (v0, v1), rows i = 0 .. 7 */
#define CYATTN_T8X12_FMLA3(c0, c1, c2, a, l, b0, b1, b2)                                  \
    "fmla v" #c0 ".4s, v" #b0 ".4s, v" #a ".s[" #l "]\n\t"                               \
    "fmla v" #c1 ".4s, v" #b1 ".4s, v" #a ".s[" #l "]\n\t"                               \
    "fmla v" #c2 ".4s, v" #b2 ".4s, v" #a ".s[" #l "]\n\t"
#define CYATTN_T8X12_FMLA24(b0, b1, b2)                                                   \
    CYATTN_T8X12_FMLA3(8, 9, 10, 0, 0, b0, b1, b2) CYATTN_T8X12_FMLA3(11, 12, 13, 0, 1, b0, b1, b2) \
    CYATTN_T8X12_FMLA3(14, 15, 16, 0, 2, b0, b1, b2) CYATTN_T8X12_FMLA3(17, 18, 19, 0, 3, b0, b1, b2) \
    CYATTN_T8X12_FMLA3(20, 21, 22, 1, 0, b0, b1, b2) CYATTN_T8X12_FMLA3(23, 24, 25, 1, 1, b0, b1, b2) \
    CYATTN_T8X12_FMLA3(26, 27, 28, 1, 2, b0, b1, b2) CYATTN_T8X12_FMLA3(29, 30, 31, 1, 3, b0, b1, b2)
/* the k loop: accumulators zeroed, then kc steps (two a pass, the odd one after); operands
   pa, pb (advanced), pa_end = pa + 8 (kc - kc % 2), kc */
#define CYATTN_T8X12_KLOOP_ASM \
        "movi v8.16b, #0\n\t" "movi v9.16b, #0\n\t" "movi v10.16b, #0\n\t" "movi v11.16b, #0\n\t" "movi v12.16b, #0\n\t" "movi v13.16b, #0\n\t" \
        "movi v14.16b, #0\n\t" "movi v15.16b, #0\n\t" "movi v16.16b, #0\n\t" "movi v17.16b, #0\n\t" "movi v18.16b, #0\n\t" "movi v19.16b, #0\n\t" \
        "movi v20.16b, #0\n\t" "movi v21.16b, #0\n\t" "movi v22.16b, #0\n\t" "movi v23.16b, #0\n\t" "movi v24.16b, #0\n\t" "movi v25.16b, #0\n\t" \
        "movi v26.16b, #0\n\t" "movi v27.16b, #0\n\t" "movi v28.16b, #0\n\t" "movi v29.16b, #0\n\t" "movi v30.16b, #0\n\t" "movi v31.16b, #0\n\t" \
        "cmp %[pa], %[pa_end]\n\t" \
        "b.eq 2f\n" \
        "1:\n\t" \
        /* step 0 of the pass: A in v0 v1, B in v2 v3 v4 (v5: step 1's first B vector) */ \
        "ldp q0, q1, [%[pa]], #32\n\t" "ldp q2, q3, [%[pb]], #32\n\t" "ldp q4, q5, [%[pb]], #32\n\t" \
        CYATTN_T8X12_FMLA24(2, 3, 4) \
        /* step 1: A in v0 v1, B in v5 v2 v3 */ \
        "ldp q0, q1, [%[pa]], #32\n\t" "ldp q2, q3, [%[pb]], #32\n\t" \
        CYATTN_T8X12_FMLA24(5, 2, 3) \
        "cmp %[pa], %[pa_end]\n\t" \
        "b.ne 1b\n" \
        "2:\n\t" \
        "tbz %[kc], #0, 3f\n\t" \
        "ldp q0, q1, [%[pa]]\n\t" "ldp q2, q3, [%[pb]]\n\t" "ldr q4, [%[pb], #32]\n\t" \
        CYATTN_T8X12_FMLA24(2, 3, 4) \
        "3:\n\t"
#define CYATTN_T8X12_CLOBBERS "v0", "v1", "v2", "v3", "v4", "v5", "v8", "v9", "v10", "v11", "v12", \
    "v13", "v14", "v15", "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", \
    "v26", "v27", "v28", "v29", "v30", "v31", "memory", "cc"
static inline void cyattn_tile8x12_f32(ptrdiff_t kc, const float* pa, const float* pb,
                                       float* acc) {
    const float* pa_end = pa + (kc - kc % 2) * 8;
    __asm__ volatile(
        CYATTN_T8X12_KLOOP_ASM
        "st1 {v8.4s, v9.4s, v10.4s, v11.4s}, [%[acc]], #64\n\t"
        "st1 {v12.4s, v13.4s, v14.4s, v15.4s}, [%[acc]], #64\n\t"
        "st1 {v16.4s, v17.4s, v18.4s, v19.4s}, [%[acc]], #64\n\t"
        "st1 {v20.4s, v21.4s, v22.4s, v23.4s}, [%[acc]], #64\n\t"
        "st1 {v24.4s, v25.4s, v26.4s, v27.4s}, [%[acc]], #64\n\t"
        "st1 {v28.4s, v29.4s, v30.4s, v31.4s}, [%[acc]], #64\n\t"
        : [pa] "+r"(pa), [pb] "+r"(pb), [acc] "+r"(acc)
        : [pa_end] "r"(pa_end), [kc] "r"(kc)
        : CYATTN_T8X12_CLOBBERS);
}
/* A whole 8 x 12 tile of a row-major C (unit column stride): the k loop above, then C's rows
   written from the registers, row i = alpha * acc row i (overwrite) or fma(acc row i, alpha,
   C row i) (FMUL / FMLA by element: the operations of cyattn_tile_out_f32, so the same bits),
   instead of the accumulators' trip through memory (6 stores, 24 loads a tile). */
#define CYATTN_T8X12_OUT_ROW(a, b, c)                                                   \
    "ld1 {v0.4s, v1.4s, v2.4s}, [%[c]]\n\t"                                            \
    "fmla v0.4s, v" #a ".4s, %[va].s[0]\n\t" "fmla v1.4s, v" #b ".4s, %[va].s[0]\n\t"  \
    "fmla v2.4s, v" #c ".4s, %[va].s[0]\n\t"                                           \
    "st1 {v0.4s, v1.4s, v2.4s}, [%[c]], %[rsb]\n\t"
#define CYATTN_T8X12_SET_ROW(a, b, c)                                                   \
    "fmul v" #a ".4s, v" #a ".4s, %[va].s[0]\n\t" "fmul v" #b ".4s, v" #b ".4s, %[va].s[0]\n\t" \
    "fmul v" #c ".4s, v" #c ".4s, %[va].s[0]\n\t"                                      \
    "st1 {v" #a ".4s, v" #b ".4s, v" #c ".4s}, [%[c]], %[rsb]\n\t"
/* the k loop, then ROW (one of the two above) for each of the 8 rows of accumulators */
#define CYATTN_T8X12_OUT_ASM(ROW)                                                       \
    __asm__ volatile(                                                                   \
        CYATTN_T8X12_KLOOP_ASM                                                          \
        ROW(8, 9, 10) ROW(11, 12, 13) ROW(14, 15, 16) ROW(17, 18, 19)                   \
        ROW(20, 21, 22) ROW(23, 24, 25) ROW(26, 27, 28) ROW(29, 30, 31)                 \
        : [pa] "+r"(pa), [pb] "+r"(pb), [c] "+r"(c)                                     \
        : [pa_end] "r"(pa_end), [kc] "r"(kc), [rsb] "r"(rsb), [va] "w"(va)              \
        : CYATTN_T8X12_CLOBBERS)
#define CYATTN_TILE8X12_OUT 1
static inline void cyattn_tile8x12_out_f32(ptrdiff_t kc, const float* pa, const float* pb,
                                           float* c, ptrdiff_t rsc, float alpha, int overwrite) {
    const float* pa_end = pa + (kc - kc % 2) * 8;
    ptrdiff_t rsb = rsc * (ptrdiff_t)sizeof(float);
    float32x4_t va = vdupq_n_f32(alpha);
    if (overwrite)
        CYATTN_T8X12_OUT_ASM(CYATTN_T8X12_SET_ROW);
    else
        CYATTN_T8X12_OUT_ASM(CYATTN_T8X12_OUT_ROW);
}
#undef CYATTN_T8X12_OUT_ASM
#undef CYATTN_T8X12_OUT_ROW
#undef CYATTN_T8X12_SET_ROW
#undef CYATTN_T8X12_KLOOP_ASM
#undef CYATTN_T8X12_FMLA24
#undef CYATTN_T8X12_FMLA3
#undef CYATTN_T8X12_CLOBBERS
#else
#define CYATTN_TILE8X12_OUT 0   /* no inline assembly: micro_kernel_f32 writes C from acc */
static inline void cyattn_tile8x12_out_f32(ptrdiff_t kc, const float* pa, const float* pb,
                                           float* c, ptrdiff_t rsc, float alpha, int overwrite) {
    (void)kc; (void)pa; (void)pb; (void)c; (void)rsc; (void)alpha; (void)overwrite;
}
static inline void cyattn_tile8x12_f32(ptrdiff_t kc, const float* pa, const float* pb,
                                       float* acc) {
    float32x4_t z = vdupq_n_f32(0.0f);
    float32x4_t c00 = z, c01 = z, c02 = z, c10 = z, c11 = z, c12 = z;
    float32x4_t c20 = z, c21 = z, c22 = z, c30 = z, c31 = z, c32 = z;
    float32x4_t c40 = z, c41 = z, c42 = z, c50 = z, c51 = z, c52 = z;
    float32x4_t c60 = z, c61 = z, c62 = z, c70 = z, c71 = z, c72 = z;
    /* two k steps per pass: the pointer updates, compare and branch once per two steps (the
       loads take offsets from the panels' pointers), 29 instructions a step instead of 31;
       then the step left when kc is odd. (Four per pass: gcc 12 added register moves.) */
    const float* pa_end = pa + (kc - kc % 2) * 8;
    while (pa != pa_end) {
        CYATTN_T8X12_STEP(0) CYATTN_T8X12_STEP(1)
        pa += 16;
        pb += 24;
    }
    if (kc % 2) {
        CYATTN_T8X12_STEP(0)
    }
    vst1q_f32(acc + 0, c00); vst1q_f32(acc + 4, c01); vst1q_f32(acc + 8, c02);
    vst1q_f32(acc + 12, c10); vst1q_f32(acc + 16, c11); vst1q_f32(acc + 20, c12);
    vst1q_f32(acc + 24, c20); vst1q_f32(acc + 28, c21); vst1q_f32(acc + 32, c22);
    vst1q_f32(acc + 36, c30); vst1q_f32(acc + 40, c31); vst1q_f32(acc + 44, c32);
    vst1q_f32(acc + 48, c40); vst1q_f32(acc + 52, c41); vst1q_f32(acc + 56, c42);
    vst1q_f32(acc + 60, c50); vst1q_f32(acc + 64, c51); vst1q_f32(acc + 68, c52);
    vst1q_f32(acc + 72, c60); vst1q_f32(acc + 76, c61); vst1q_f32(acc + 80, c62);
    vst1q_f32(acc + 84, c70); vst1q_f32(acc + 88, c71); vst1q_f32(acc + 92, c72);
}
#endif
#undef CYATTN_T8X12_ROW
#undef CYATTN_T8X12_STEP
#undef CYATTN_T8X12_FENCE

/* The fused attention's column maximum and minimum of a score panel (panel_online_softmax in
   _attention_fused.pxi): for each lane j < nr, over p < kb in order,
       col_max[j] = s if s > col_max[j] else col_max[j]     (s = panel[p * nr + j])
       col_min[j] = s if s < col_min[j] else col_min[j]
   On x86 gcc makes maxps / minps of the Cython loop (the same selection); on aarch64 it may
   not use FMAX / FMIN (a NaN operand gives NaN there) and left one compare and branch per
   score and bound, about a third of the neon attention worker's instructions under qemu
   (tools/insn_per_flop.py). Here a compare and a bit select per 4 lanes (as cyattn_rmax /
   cyattn_rmin: the same selection, NaN included), so the same bits. nr % 4 == 0, nr <= 16
   (the neon NR is 12); other widths keep the scalar loop. */
#define CYATTN_NEON_COLMAX 1
/* keep[lane] = x[lane] where the mask's lane is all ones, else keep[lane]: vbslq_f32(mask, x,
   keep), written as BIT so that the running bound is its own destination. (gcc 12 chose BSL,
   which overwrites the mask, and then copied its result back: 7 register moves per 12 lanes in
   the loop below.) */
static inline float32x4_t cyattn_neon_take_if(float32x4_t keep, float32x4_t x, uint32x4_t mask) {
#if defined(__GNUC__)
    __asm__("bit %0.16b, %1.16b, %2.16b" : "+w"(keep) : "w"(x), "w"(mask));
    return keep;
#else
    return vbslq_f32(mask, x, keep);
#endif
}
static inline void cyattn_col_maxmin_f32(const float* panel, ptrdiff_t kb, ptrdiff_t nr,
                                         float* col_max, float* col_min) {
    ptrdiff_t p, j, nv = nr / 4;
    if (nr % 4 == 0 && nv <= 4) {
        float32x4_t mx[4], mn[4];
        for (j = 0; j < nv; j++) {
            mx[j] = vld1q_f32(col_max + 4 * j);
            mn[j] = vld1q_f32(col_min + 4 * j);
        }
        for (p = 0; p < kb; p++)
            for (j = 0; j < nv; j++) {
                float32x4_t x = vld1q_f32(panel + p * nr + 4 * j);
                mx[j] = cyattn_neon_take_if(mx[j], x, vcgtq_f32(x, mx[j]));
                mn[j] = cyattn_neon_take_if(mn[j], x, vcltq_f32(x, mn[j]));
            }
        for (j = 0; j < nv; j++) {
            vst1q_f32(col_max + 4 * j, mx[j]);
            vst1q_f32(col_min + 4 * j, mn[j]);
        }
        return;
    }
    for (p = 0; p < kb; p++)
        for (j = 0; j < nr; j++) {
            float x = panel[p * nr + j];
            col_max[j] = x > col_max[j] ? x : col_max[j];
            col_min[j] = x < col_min[j] ? x : col_min[j];
        }
}
#else
#define CYATTN_NEON_TILE 0      /* other variants: micro_kernel_f32 keeps its loops */
static inline void cyattn_tile8x12_f32(ptrdiff_t kc, const float* pa, const float* pb,
                                       float* acc) {
    (void)kc; (void)pa; (void)pb; (void)acc;
}
#define CYATTN_TILE8X12_OUT 0
static inline void cyattn_tile8x12_out_f32(ptrdiff_t kc, const float* pa, const float* pb,
                                           float* c, ptrdiff_t rsc, float alpha, int overwrite) {
    (void)kc; (void)pa; (void)pb; (void)c; (void)rsc; (void)alpha; (void)overwrite;
}
#define CYATTN_NEON_COLMAX 0    /* other variants: panel_online_softmax keeps its loops */
static inline void cyattn_col_maxmin_f32(const float* panel, ptrdiff_t kb, ptrdiff_t nr,
                                         float* col_max, float* col_min) {
    (void)panel; (void)kb; (void)nr; (void)col_max; (void)col_min;
}
#endif

/* ---- the micro-kernels' last step on aarch64: C (+)= alpha * acc, fused ------------------ */
/* c[i * rsc + j * csc] = alpha * acc[i * ras + j] (overwrite) or fma(alpha, acc[...], c[...])
   (one rounding) for i < m, j < n: the last step of every float32 / float64 GEMM micro-kernel
   of both aarch64 modules (micro_kernel_f32/_f64, micro_kernel_direct, micro_kernel_row in
   _gemm.pxi; CYATTN_TILE_OUT_FMA is 1 here, 0 elsewhere, where the Cython loops stay).
   Why explicit: the x86 FMA variants compute C = fma(alpha, sum, C) in every micro-kernel, as
   gcc contracts each kernel's `c += alpha * acc` (_cyattn_tile_narrow.h writes the same out);
   for aarch64 gcc 12 left the update of the packed kernels (micro_kernel_f32 / _f64: the
   product alpha * acc shared by their overwrite and accumulate branches) as FMUL + FADD but
   fused it in the unpacked ones, so the packed and unpacked paths of one product, and so the
   tilings that thread counts choose, differed by an ulp (12 neon tests under qemu). Written
   with FMLA / FMADD, every path rounds the same way, whatever gcc makes of the loops; the sums
   themselves (acc) are fused multiply-adds in every kernel (FMLA, as the neon tile and gcc's
   contraction of the Cython k loops both give). */
#include <stddef.h>
#if defined(__aarch64__) || defined(_M_ARM64)
#include <arm_neon.h>
#include <math.h>
#define CYATTN_TILE_OUT_FMA 1
static inline void cyattn_tile_out_f32(const float* acc, ptrdiff_t ras, float* c, ptrdiff_t rsc,
                                       ptrdiff_t csc, ptrdiff_t m, ptrdiff_t n, float alpha,
                                       int overwrite) {
    ptrdiff_t i, j;
    for (i = 0; i < m; i++) {
        const float* a = acc + i * ras;
        float* ci = c + i * rsc;
        j = 0;
        if (csc == 1) {
            if (overwrite)
                for (; j + 4 <= n; j += 4)
                    vst1q_f32(ci + j, vmulq_n_f32(vld1q_f32(a + j), alpha));
            else
                for (; j + 4 <= n; j += 4)
                    vst1q_f32(ci + j, vfmaq_n_f32(vld1q_f32(ci + j), vld1q_f32(a + j), alpha));
        }
        if (overwrite)
            for (; j < n; j++)
                ci[j * csc] = alpha * a[j];
        else
            for (; j < n; j++)
                ci[j * csc] = fmaf(alpha, a[j], ci[j * csc]);
    }
}
static inline void cyattn_tile_out_f64(const double* acc, ptrdiff_t ras, double* c,
                                       ptrdiff_t rsc, ptrdiff_t csc, ptrdiff_t m, ptrdiff_t n,
                                       double alpha, int overwrite) {
    ptrdiff_t i, j;
    for (i = 0; i < m; i++) {
        const double* a = acc + i * ras;
        double* ci = c + i * rsc;
        j = 0;
        if (csc == 1) {
            if (overwrite)
                for (; j + 2 <= n; j += 2)
                    vst1q_f64(ci + j, vmulq_n_f64(vld1q_f64(a + j), alpha));
            else
                for (; j + 2 <= n; j += 2)
                    vst1q_f64(ci + j, vfmaq_n_f64(vld1q_f64(ci + j), vld1q_f64(a + j), alpha));
        }
        if (overwrite)
            for (; j < n; j++)
                ci[j * csc] = alpha * a[j];
        else
            for (; j < n; j++)
                ci[j * csc] = fma(alpha, a[j], ci[j * csc]);
    }
}
#else
#define CYATTN_TILE_OUT_FMA 0   /* x86: the Cython loops (fused by gcc with FMA, else not) */
static inline void cyattn_tile_out_f32(const float* acc, ptrdiff_t ras, float* c, ptrdiff_t rsc,
                                       ptrdiff_t csc, ptrdiff_t m, ptrdiff_t n, float alpha,
                                       int overwrite) {
    (void)acc; (void)ras; (void)c; (void)rsc; (void)csc; (void)m; (void)n; (void)alpha;
    (void)overwrite;
}
static inline void cyattn_tile_out_f64(const double* acc, ptrdiff_t ras, double* c,
                                       ptrdiff_t rsc, ptrdiff_t csc, ptrdiff_t m, ptrdiff_t n,
                                       double alpha, int overwrite) {
    (void)acc; (void)ras; (void)c; (void)rsc; (void)csc; (void)m; (void)n; (void)alpha;
    (void)overwrite;
}
#endif

#endif /* CYATTN_VEC_NEON_H */
