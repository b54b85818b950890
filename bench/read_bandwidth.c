/*
 * How fast can this machine stream float32 data from memory, on one core and on all of them?
 *
 * A measurement beside tile_ceiling.c (not part of the package, not a test): the limit a
 * decode step (which reads K and V once) and a softmax over rows that do not fit in cache are
 * held to. It sums an array of MiB megabytes (default 128, the decode case's K+V in the bench)
 * with eight independent 8-lane AVX accumulators per thread (no dependency chain limits the
 * loads), once on one thread and once on every OpenMP thread (each summing a contiguous
 * slice, first touched by the thread that reads it), and prints GB/s (10^9 bytes per second),
 * each the best of 7 passes. The harness's own probe (NumPy `max`, cyattn._bench.machine) can
 * be checked against it: a NumPy reduction slower than this loop would make the bench's
 * "% of read bandwidth" too kind.
 *
 * Build and run on an idle machine (any x86-64 CPU with AVX; OMP_NUM_THREADS sets "all"):
 *   gcc -O2 -mavx -fopenmp bench/read_bandwidth.c -o /tmp/read_bandwidth && /tmp/read_bandwidth [MiB]
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static float sum_slice(const float *x, long n) {
    __m256 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    long i = 0;
    for (; i + 64 <= n; i += 64)
        for (int j = 0; j < 8; j++) acc[j] = _mm256_add_ps(acc[j], _mm256_loadu_ps(x + i + 8 * j));
    for (int j = 1; j < 8; j++) acc[0] = _mm256_add_ps(acc[0], acc[j]);
    float lanes[8], s = 0.0f;
    _mm256_storeu_ps(lanes, acc[0]);
    for (int j = 0; j < 8; j++) s += lanes[j];
    for (; i < n; i++) s += x[i];
    return s;
}

/* Best-of-7 GB/s of reading x[0..n) split over `threads` threads; *check gets the sum. */
static double best_gbs(const float *x, long n, int threads, double *check) {
    double best = 1e30;
    for (int rep = 0; rep < 7; rep++) {
        double total = 0.0;
        double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            long lo = n * t / nt, hi = n * (t + 1) / nt;
            total += sum_slice(x + lo, hi - lo);
        }
        double dt = omp_get_wtime() - t0;
        if (dt < best) best = dt;
        *check = total;
    }
    return (double)n * sizeof(float) / best / 1e9;
}

int main(int argc, char **argv) {
    long mib = argc > 1 ? atol(argv[1]) : 128;
    if (mib < 1) {
        fprintf(stderr, "usage: %s [MiB >= 1]\n", argv[0]);
        return 2;
    }
    long n = mib * 1024 * 1024 / (long)sizeof(float);
    float *x = aligned_alloc(64, n * sizeof(float));
    if (!x) {
        fprintf(stderr, "cannot allocate %ld MiB\n", mib);
        return 1;
    }
    int all = omp_get_max_threads();
#pragma omp parallel for num_threads(all) schedule(static)
    for (long i = 0; i < n; i++) x[i] = 1.0f;   /* first touch by the threads that read it */
    double check;
    printf("read bandwidth, %ld MiB of float32, best of 7 passes\n", mib);
    printf("1 thread:   %6.1f GB/s\n", best_gbs(x, n, 1, &check));
    printf("%d threads: %6.1f GB/s (sum %.0f)\n", all, best_gbs(x, n, all, &check), check);
    free(x);
    return 0;
}
