/*
 * The AMX tile operations on the hardware (AMX-TILE, AMX-BF16), and the tile loops of
 * _cyattn_amx_loop.h compiled twice: over the portable model (_cyattn_amx_model.h; functions
 * suffixed _model, in every variant) and over the instructions (suffixed _hw, only where the
 * compiler targets AMX: the amx variant, built with -mamx-tile -mamx-bf16; elsewhere, and
 * with compilers that lack the flags or the intrinsics, CYATTN_HAVE_AMX is 0 and the _hw
 * functions are the model's).
 *
 * A program must be granted the tile data state by Linux before its first tile instruction
 * (cyattn_amx_request_perm in _cyattn_cpu.h; cyattn._backend asks before it loads the amx
 * variant); each worker loads the tile configuration when it starts its tile work and
 * releases the tiles when it ends (an idle core that holds tile state costs the others
 * turbo), in the loops themselves.
 */
#ifndef CYATTN_AMX_H
#define CYATTN_AMX_H

#include "_cyattn_amx_model.h"
#include "_cyattn_half.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__x86_64__) \
    && !defined(_MSC_VER)
#include <immintrin.h>
#define CYATTN_HAVE_AMX 1
#else
#define CYATTN_HAVE_AMX 0
#endif

/* Each copy of the loops: CYATTN_AMX_FN and the CYATTN_TL_* operations are defined, the loop
   file included, and the loop file's end undefines them all (see the end of _cyattn_amx_loop.h). */

/* --- the loops over the model --- */
#define CYATTN_AMX_FN(name) name##_model
#define CYATTN_TL_DECLARE cyattn_amx_model tl_state_; cyattn_amx_model* tl_ = &tl_state_
#define CYATTN_TL_USE(ctx) cyattn_amx_model* tl_ = (ctx)
#define CYATTN_TL_CONFIG(cfg) cyattn_amxm_config(tl_, (cfg))
#define CYATTN_TL_ZERO(t) cyattn_amxm_zero(tl_, (t))
#define CYATTN_TL_LOAD(t, p, s) cyattn_amxm_load(tl_, (t), (p), (s))
#define CYATTN_TL_STORE(t, p, s) cyattn_amxm_store(tl_, (t), (p), (s))
#define CYATTN_TL_DP(c, a, b) cyattn_amxm_dpbf16ps(tl_, (c), (a), (b))
#define CYATTN_TL_RELEASE() cyattn_amxm_release(tl_)
#include "_cyattn_amx_loop.h"

/* --- the same loops over the instructions (tile numbers are immediates: macros) --- */
#if CYATTN_HAVE_AMX
/* gcc's _tile_loadd and _tile_loadconfig are asm statements that do not tell the compiler
   they read memory (the configuration's operand covers only its first 8 bytes): a compiler
   barrier before each keeps the packing stores and the configuration's 64 bytes before them. */
#define CYATTN_AMX_BARRIER() __asm__ __volatile__("" ::: "memory")
#define CYATTN_AMX_FN(name) name##_hw
#define CYATTN_TL_DECLARE (void)0
#define CYATTN_TL_USE(ctx) (void)(ctx)
#define CYATTN_TL_CONFIG(cfg) \
    do { CYATTN_AMX_BARRIER(); _tile_loadconfig((const void*)(cfg)); } while (0)
#define CYATTN_TL_ZERO(t) _tile_zero(t)
#define CYATTN_TL_LOAD(t, p, s) \
    do { CYATTN_AMX_BARRIER(); _tile_loadd(t, (const void*)(p), (s)); } while (0)
#define CYATTN_TL_STORE(t, p, s) _tile_stored(t, (void*)(p), (s))
#define CYATTN_TL_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define CYATTN_TL_RELEASE() _tile_release()
#include "_cyattn_amx_loop.h"
#else
#define cyattn_amx_tile_product_hw cyattn_amx_tile_product_model
#define cyattn_amx_gemm_panel_hw cyattn_amx_gemm_panel_model
#define cyattn_amx_begin_hw cyattn_amx_begin_model
#define cyattn_amx_end_hw cyattn_amx_end_model
#define cyattn_amx_scores_hw cyattn_amx_scores_model
#define cyattn_amx_pv_hw cyattn_amx_pv_model
#endif

#endif /* CYATTN_AMX_H */
