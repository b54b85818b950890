/*
 * Macros the other headers share: CYATTN_INLINE (forced inlining), the prefetch hints, and
 * CYATTN_MADD (an update as gcc contracts it in the module). C because Cython has no way to
 * spell a function attribute, a compiler builtin or a test of the target's ISA macros.
 */
#ifndef CYATTN_COMMON_H
#define CYATTN_COMMON_H

/* Helpers that must be inlined into their caller. A helper whose only effects are prefetches
   must be: gcc's interprocedural pure-const analysis counts a prefetch as no side effect and
   deletes the call to such a helper (gcc 12 at -O2 and -O3), so the prefetches vanish. */
#if defined(__GNUC__) || defined(__clang__)
#define CYATTN_INLINE static inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define CYATTN_INLINE static __forceinline
#else
#define CYATTN_INLINE static inline
#endif
#if defined(__GNUC__) || defined(__clang__)
#define cyattn_prefetch_w(p) __builtin_prefetch((const void *)(p), 1, 3)
/* read, keep in L2 (prefetcht2 on x86): streaming rows that are read once */
#define cyattn_prefetch_r(p) __builtin_prefetch((const void *)(p), 0, 1)
#else
#define cyattn_prefetch_w(p) ((void)(p))
#define cyattn_prefetch_r(p) ((void)(p))
#endif

/* c + a * b as gcc's contraction of `c += a * b` gives it in the module: one fused
   multiply-add where the module is built with FMA, else a multiply then an add. Spelled out,
   because gcc does not contract every such update in these helpers (a dot's tail, whose
   operand comes from cyattn_widen1, stayed a multiply and an add). */
#if defined(__FMA__)
#include <math.h>
#define CYATTN_MADD(a, b, c) fmaf((a), (b), (c))
#else
#define CYATTN_MADD(a, b, c) ((c) + (a) * (b))
#endif

#endif /* CYATTN_COMMON_H */
