/*
 * A portable model of the AMX tile operations cyattn uses (TILELOADD, TILEZERO, TDPBF16PS,
 * TILESTORED, LDTILECFG, TILERELEASE) that gives the hardware's bits: the tile loops of
 * _cyattn_amx_loop.h are compiled once over this model (every variant, every host: how the
 * tile kernels are built and tested without an AMX CPU) and, in the amx variant only, once
 * over the instructions (_cyattn_amx.h). C because the rounding needs bit tests on floats and
 * arithmetic the compiler must not reassociate.
 *
 * The model's state is a struct of eight tiles (16 rows of 64 bytes each) and their
 * configured shapes, one per worker, on its stack: no global state.
 *
 * TDPBF16PS C, A, B, as recorded on an Intel Xeon with AMX-BF16 (shared/amx/README.md; the
 * 140 recorded tile products are the fixture tests/data/amx_bf16_golden.bin, and
 * tests/test_amx_model.py holds this model to them). Row m of A holds the K pairs of output
 * row m (bf16 element (m, 2k + p)); row k of B holds the pairs of the output columns
 * (element (k, 2n + p)). Per output element (m, n), it is NOT a chain of fused steps:
 *   even = 0; odd = 0;
 *   for k in order: even = FTZ(RNE(even + a(m,2k) b(k,2n)));
 *                   odd  = FTZ(RNE(odd + a(m,2k+1) b(k,2n+1)));
 *   C(m,n) = FTZ(RNE(DAZ(C(m,n)) + FTZ(RNE(even + odd))))
 * - products are exact (16 significant bits; no exponent limit of their own), each rounded
 *   once together with its add, to nearest even whatever the MXCSR says;
 * - bf16 inputs with a zero exponent (subnormals) are read as zeros of their sign (DAZ), and
 *   so is a subnormal C; results tiny after rounding become zeros of their sign (FTZ), by
 *   integer bit tests (cyattn_bf16_round_ftz), not the MXCSR;
 * - each add is formed in double: the product is exact there and the sum of a 24-bit and a
 *   16-bit number rounded to double and then to float is correctly rounded (53 >= 2 * 24 + 2),
 *   so a compiler that contracts the double multiply-add into an FMA changes nothing (the
 *   product is exact either way): no fp-contract pragma or flag is needed;
 * - where products or sums pass float32's range the hardware keeps a wider range inside and
 *   returns +-inf where this model may give NaN (inf - inf): real attention scores and GEMM
 *   data never get there, and the tests of such inputs expect a non-finite value only.
 */
#ifndef CYATTN_AMX_MODEL_H
#define CYATTN_AMX_MODEL_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "_cyattn_bf16_emul.h"

#define CYATTN_AMX_TILES 8
#define CYATTN_AMX_ROWS 16        /* the rows of a palette-1 tile, at most */
#define CYATTN_AMX_COLSB 64       /* the bytes of a tile row, at most */

/* The 64-byte tile configuration of LDTILECFG, palette 1: colsb[t] bytes per row and rows[t]
   rows of tile t. */
typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} cyattn_amx_cfg;

/* The model's tile registers and their configured shapes. */
typedef struct {
    uint32_t t[CYATTN_AMX_TILES][CYATTN_AMX_ROWS * CYATTN_AMX_COLSB / 4];
    int rows[CYATTN_AMX_TILES];
    int colsb[CYATTN_AMX_TILES];
} cyattn_amx_model;

/* Bytes of the model's state, for callers that allocate it (the attention's workers). */
#define CYATTN_AMX_MODEL_BYTES ((int)sizeof(cyattn_amx_model))

/* A configuration with every tile of rows x colsb (16 x 64: what cyattn's loops use). */
static inline void cyattn_amx_cfg_uniform(cyattn_amx_cfg* cfg, int rows, int colsb) {
    int i;
    memset(cfg, 0, sizeof(*cfg));
    cfg->palette = 1;
    for (i = 0; i < CYATTN_AMX_TILES; i++) {
        cfg->colsb[i] = (uint16_t)colsb;
        cfg->rows[i] = (uint8_t)rows;
    }
}

static inline void cyattn_amxm_config(cyattn_amx_model* m, const cyattn_amx_cfg* cfg) {
    int i;
    for (i = 0; i < CYATTN_AMX_TILES; i++) {
        m->rows[i] = cfg->rows[i] > CYATTN_AMX_ROWS ? CYATTN_AMX_ROWS : cfg->rows[i];
        m->colsb[i] = cfg->colsb[i] > CYATTN_AMX_COLSB ? CYATTN_AMX_COLSB : cfg->colsb[i];
    }
    memset(m->t, 0, sizeof(m->t));
}

static inline void cyattn_amxm_release(cyattn_amx_model* m) {
    memset(m->rows, 0, sizeof(m->rows));
    memset(m->colsb, 0, sizeof(m->colsb));
}

static inline void cyattn_amxm_zero(cyattn_amx_model* m, int tile) {
    memset(m->t[tile], 0, sizeof(m->t[tile]));
}

/* TILELOADD: row r of the tile from base + r * stride (bytes). */
static inline void cyattn_amxm_load(cyattn_amx_model* m, int tile, const void* base,
                                    ptrdiff_t stride) {
    int r;
    for (r = 0; r < m->rows[tile]; r++)
        memcpy((char*)m->t[tile] + r * CYATTN_AMX_COLSB, (const char*)base + r * stride,
               (size_t)m->colsb[tile]);
}

/* TILESTORED: row r of the tile to base + r * stride (bytes). */
static inline void cyattn_amxm_store(const cyattn_amx_model* m, int tile, void* base,
                                     ptrdiff_t stride) {
    int r;
    for (r = 0; r < m->rows[tile]; r++)
        memcpy((char*)base + r * stride, (const char*)m->t[tile] + r * CYATTN_AMX_COLSB,
               (size_t)m->colsb[tile]);
}

/* float32 bits read as a float, a subnormal read as a zero of its sign (DAZ). */
static inline float cyattn_amx_f32_daz(uint32_t b) {
    float f;
    if ((b & 0x7f800000u) == 0) b &= 0x80000000u;
    memcpy(&f, &b, 4);
    return f;
}

/* One output element of TDPBF16PS: c plus the kp pairs of arow and bcol (bcol's pairs
   bstride uint32 apart), as the header describes. */
static inline float cyattn_amx_dot_elem(float c, const uint32_t* arow, const uint32_t* bcol,
                                        ptrdiff_t bstride, int kp) {
    float even = 0.0f, odd = 0.0f;
    int k;
    for (k = 0; k < kp; k++) {
        uint32_t a = arow[k], b = bcol[k * bstride];
        /* the pair's element 2k is the low half (lower address), 2k + 1 the high half */
        double pe = (double)cyattn_bf16_daz(a & 0xffffu) * (double)cyattn_bf16_daz(b & 0xffffu);
        double po = (double)cyattn_bf16_daz(a >> 16) * (double)cyattn_bf16_daz(b >> 16);
        even = cyattn_bf16_round_ftz((double)even + pe);
        odd = cyattn_bf16_round_ftz((double)odd + po);
    }
    return cyattn_bf16_round_ftz((double)c + (double)cyattn_bf16_round_ftz((double)even + odd));
}

/* TDPBF16PS tc, ta, tb: M = rows(tc), N = colsb(tc) / 4, K pairs = colsb(ta) / 4. */
static inline void cyattn_amxm_dpbf16ps(cyattn_amx_model* m, int tc, int ta, int tb) {
    int rows = m->rows[tc], n = m->colsb[tc] / 4, kp = m->colsb[ta] / 4;
    int i, j;
    if (kp > m->rows[tb]) kp = m->rows[tb];
    for (i = 0; i < rows; i++) {
        uint32_t* crow = m->t[tc] + i * (CYATTN_AMX_COLSB / 4);
        const uint32_t* arow = m->t[ta] + i * (CYATTN_AMX_COLSB / 4);
        for (j = 0; j < n; j++) {
            float c = cyattn_amx_f32_daz(crow[j]), r;
            r = cyattn_amx_dot_elem(c, arow, m->t[tb] + j, CYATTN_AMX_COLSB / 4, kp);
            memcpy(crow + j, &r, 4);
        }
    }
}

#endif /* CYATTN_AMX_MODEL_H */
