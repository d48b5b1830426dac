/* The model shape a library is built for, as compile-time constants (-DHEAD_DIM=64 -DGROUP=3 -DKV_HEADS=3), so
   that every inner loop has a known length and unrolls. */
#ifndef HELIOS_SHAPE_H
#define HELIOS_SHAPE_H

#if !defined(HEAD_DIM) || !defined(GROUP) || !defined(KV_HEADS)
#error "build with -DHEAD_DIM=... -DGROUP=... -DKV_HEADS=... (head size, query heads per KV head, KV heads)"
#endif
#if HEAD_DIM % 8
#error "HEAD_DIM must be a multiple of 8"
#endif

#define HEADS (KV_HEADS * GROUP)              /* query heads */
#define TOKEN (KV_HEADS * HEAD_DIM)           /* floats per token in a page */
#define QKV ((HEADS + 2 * KV_HEADS) * HEAD_DIM) /* floats per token of the fused q/k/v projection */

/* Row-parallel loops use one thread below PARALLEL_MIN floats of work, where waking the other threads costs more
   than it saves. */
#define PARALLEL_MIN 65536

#endif
