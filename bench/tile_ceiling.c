/*
 * How fast can a register-blocked float32 micro-kernel of a given tile run on this CPU?
 *
 * A measurement for choosing MR x NR (not part of the package, not a test). It times, with all
 * operands in L1:
 *   - the register-only FMA peak: 16 independent 16-lane FMA chains, no loads;
 *   - the loop of cyattn's micro_kernel_f32 (the same plain-C form gcc compiles there: an
 *     MR x NR accumulator array, one broadcast of A and NR/16 loads of B per k step) for
 *     several tiles and depths kc, and reports GFLOP/s and the share of the FMA peak.
 * The gap between the two is what the tile shape and the loop leave on the table; the rest of
 * an attention call (packing, softmax, epilogue) is measured by the harness in bench/.
 *
 * Build with the avx512 variant's flags from setup.py and run on an idle core:
 *   gcc -O3 -mavx2 -mfma -mavx512f -mavx512vl -mavx512bw -mavx512dq \
 *       bench/tile_ceiling.c -o /tmp/tile_ceiling && /tmp/tile_ceiling
 * Each figure is the best of 5 runs of about 0.2 s.
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* C[MR x NR] += A panel (kc x MR) @ B panel (kc x NR), as micro_kernel_f32 computes it. */
#define DEFINE_TILE(MR, NR)                                                                  \
    __attribute__((noinline)) static void tile_##MR##x##NR(long kc, const float *pa,         \
                                                           const float *pb, float *c) {      \
        float acc[MR][NR];                                                                   \
        for (int i = 0; i < MR; i++) {                                                       \
            float a = pa[i];                                                                 \
            for (int j = 0; j < NR; j++) acc[i][j] = a * pb[j];                              \
        }                                                                                    \
        for (long p = 1; p < kc; p++)                                                        \
            for (int i = 0; i < MR; i++) {                                                   \
                float a = pa[p * MR + i];                                                    \
                for (int j = 0; j < NR; j++) acc[i][j] += a * pb[p * NR + j];                \
            }                                                                                \
        for (int i = 0; i < MR; i++)                                                         \
            for (int j = 0; j < NR; j++) c[i * NR + j] += acc[i][j];                         \
    }

DEFINE_TILE(8, 32)   /* cyattn's avx512 float32 tile */
DEFINE_TILE(12, 32)
DEFINE_TILE(14, 32)
DEFINE_TILE(8, 48)
DEFINE_TILE(6, 64)
DEFINE_TILE(4, 64)

typedef void (*tile_fn)(long, const float *, const float *, float *);

static double time_tile(tile_fn fn, int mr, int nr, long kc) {
    /* 8 A panels against one B panel (B stays in L1; 8 x 14 x 256 floats of A fit in L2) */
    const long n_a = 8;
    float *pa = aligned_alloc(64, sizeof(float) * 16 * kc * n_a);
    float *pb = aligned_alloc(64, sizeof(float) * 64 * kc);
    float *c = aligned_alloc(64, sizeof(float) * 16 * 64 * n_a);
    double flops = 2.0 * mr * nr * kc * n_a, best = 0;
    long reps;
    if (!pa || !pb || !c) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (long i = 0; i < 16 * kc * n_a; i++) pa[i] = 1e-3f * (float)(i % 7);
    for (long i = 0; i < 64 * kc; i++) pb[i] = 1e-3f * (float)(i % 5);
    memset(c, 0, sizeof(float) * 16 * 64 * n_a);
    reps = (long)(4e10 / flops / 200) + 1;      /* ~0.2 s at 200 GFLOP/s */
    for (int run = 0; run < 5; run++) {
        double t0 = now(), g;
        for (long r = 0; r < reps; r++)
            for (long a = 0; a < n_a; a++) fn(kc, pa + a * mr * kc, pb, c + a * mr * nr);
        g = flops * reps / (now() - t0) / 1e9;
        best = g > best ? g : best;
    }
    if (c[5] > 1e30f) printf(" ");             /* keep the results live */
    free(pa);
    free(pb);
    free(c);
    return best;
}

#define CHAIN_DECL(i) __m512 a##i = _mm512_set1_ps((float)(i) * 1e-3f);
#define CHAIN_STEP(i) a##i = _mm512_fmadd_ps(a##i, b, d);
#define CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) \
                  X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

static double fma_peak(void) {
    __m512 b = _mm512_set1_ps(0.999f), d = _mm512_set1_ps(1e-7f), s;
    const long n = 50000000;
    double best = 0;
    CHAINS(CHAIN_DECL)
    for (int run = 0; run < 5; run++) {
        double t0 = now(), g;
        for (long r = 0; r < n; r++) {
            CHAINS(CHAIN_STEP)
            __asm__ volatile("" : "+v"(a0), "+v"(a8));   /* no folding of the loop */
        }
        g = 16.0 * 32 * n / (now() - t0) / 1e9;
        best = g > best ? g : best;
    }
    s = _mm512_add_ps(a0, a1);
#define CHAIN_SUM(i) s = _mm512_add_ps(s, a##i);
    CHAIN_SUM(2) CHAIN_SUM(3) CHAIN_SUM(4) CHAIN_SUM(5) CHAIN_SUM(6) CHAIN_SUM(7) CHAIN_SUM(8)
    CHAIN_SUM(9) CHAIN_SUM(10) CHAIN_SUM(11) CHAIN_SUM(12) CHAIN_SUM(13) CHAIN_SUM(14)
    CHAIN_SUM(15)
    if (_mm512_reduce_add_ps(s) > 1e30f) printf(" ");
    return best;
}

int main(void) {
    static const struct { tile_fn fn; int mr, nr; } tiles[] = {
        {tile_8x32, 8, 32}, {tile_12x32, 12, 32}, {tile_14x32, 14, 32},
        {tile_8x48, 8, 48}, {tile_6x64, 6, 64}, {tile_4x64, 4, 64},
    };
    static const long depths[] = {64, 256};
    double peak = fma_peak();
    printf("register-only FMA peak: %.1f GFLOP/s\n\n", peak);
    printf("| tile MR x NR | accumulators | kc = 64 | kc = 256 |\n|---|---:|---:|---:|\n");
    for (size_t t = 0; t < sizeof tiles / sizeof tiles[0]; t++) {
        printf("| %d x %d | %d |", tiles[t].mr, tiles[t].nr, tiles[t].mr * tiles[t].nr / 16);
        for (size_t k = 0; k < 2; k++) {
            double g = time_tile(tiles[t].fn, tiles[t].mr, tiles[t].nr, depths[k]);
            printf(" %.0f GFLOP/s (%.0f %%) |", g, 100 * g / peak);
        }
        printf("\n");
    }
    return 0;
}
