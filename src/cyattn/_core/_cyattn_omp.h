/*
 * Whether this module was compiled with OpenMP, and thin wrappers over the OpenMP runtime
 * that also compile (as single-threaded stubs) when it was not. C because the choice is made
 * by the preprocessor (_OPENMP), which Cython cannot test.
 */
#ifndef CYATTN_OMP_H
#define CYATTN_OMP_H

#if defined(_OPENMP)
#include <omp.h>
static int cyattn_openmp_enabled(void) { return 1; }
static int cyattn_omp_max_threads(void) { return omp_get_max_threads(); }
static int cyattn_omp_num_procs(void) { return omp_get_num_procs(); }
/* Release the runtime's thread pool (OpenMP 5.0); returns 0 on success, nonzero if unsupported. */
static int cyattn_omp_pause(void) {
#if _OPENMP >= 201811
    return omp_pause_resource_all(omp_pause_hard);
#else
    return -1;
#endif
}
#else
static int cyattn_openmp_enabled(void) { return 0; }
static int cyattn_omp_max_threads(void) { return 1; }
static int cyattn_omp_num_procs(void) { return 1; }
static int cyattn_omp_pause(void) { return -1; }
#endif

/* The next task of a call's shared counter *c (then one more): the threads of one parallel
   region take tasks in order, each the next one as it finishes its last, so a thread slowed
   by anything else on its core is not left holding a fixed share while the other waits at the
   region's barrier. The counter is the caller's local, shared by its region only. Relaxed:
   only the count is shared; each task's inputs and outputs are ordered by the region's
   barrier. */
#include <stddef.h>
#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
static inline ptrdiff_t cyattn_next_task(ptrdiff_t* c) {
#if defined(_WIN64)
    return (ptrdiff_t)_InterlockedExchangeAdd64((volatile __int64*)c, 1);
#else
    return (ptrdiff_t)_InterlockedExchangeAdd((volatile long*)c, 1);
#endif
}
#else
static inline ptrdiff_t cyattn_next_task(ptrdiff_t* c) {
    return __atomic_fetch_add(c, 1, __ATOMIC_RELAXED);
}
#endif

#endif /* CYATTN_OMP_H */
