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

#endif /* CYATTN_OMP_H */
