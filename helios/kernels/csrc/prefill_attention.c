/* Prefill attention with bfloat16 products: one sequence's n new queries (the last n of its `context` tokens) against
   its keys, causal, each product of two bfloat16 exact and the sums in float32 (AVX512-BF16's VDPBF16PS), an online
   softmax in float32 between the two matrix products. The `c-blocked-bf16` attention's kernel. Its shape is
   FlashAttention's:
     - 16 queries of one head at a time, against blocks of 32 keys, the blocks in order from the first key;
     - per block, the scores S = Q K^T (16 x 32), scaled; each row's running maximum m and sum l updated;
       P = 2^(S - m) rounded to bfloat16; the row's output O rescaled by 2^(m_old - m), then P V added to it;
     - at the end O / l, where l sums the same rounded P that multiplied V.
   A row's bits depend only on its own query, its position and the keys: a block past a row's position leaves the row
   untouched, and the blocks go in the same order for every row. So a prompt cut into chunks of any size, batched
   with anything, run on any number of threads, gives every row the same bits (for finite inputs: a NaN or an
   infinity makes its row NaN, as in PyTorch's SDPA, and a NaN value past a row's position in the row's last block
   does too). */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


#define QROWS 16    /* queries per task */
#define KBLOCK 32   /* keys per block: two key tiles of 16, one P row of 32 bfloat16 (64 bytes) */
#ifndef MAX_D
#error "build with -DMAX_D=..., the largest head size (helios.kernels.attention's PREFILL_MAX_HEAD)"
#endif
#define TILE 512    /* bfloat16 per tile: 16 pair rows of 16 pairs (64 bytes), the layout of TDPBF16PS's operand */

const char *prefill_attention_isa(void) { return "AVX512-BF16"; }

/* 2^x for x <= 0, elementwise (-inf and anything under -150 give 0 or a denormal: callers zero masked lanes; NaN
   stays NaN): 2^x = 2^n 2^f with n = round(x), |f| <= 1/2, 2^f by its Taylor series to f^6 (relative error under
   2e-7). */
static inline __m512 exp2_ps(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);  /* MAXPS returns its second operand where either is NaN */
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2402265069591007f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931471805599453f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* 16 bfloat16 of a and 16 of b (rounded to nearest even) interleaved as 16 pairs: (a[i], b[i]) in dword i. */
static inline __m512i pairs(__m512 a, __m512 b) {
    const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(a));
    const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(b));
    return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

/* Keys and values of KV head h, block kb, as tiles of pair rows (VNNI layout: one row is one 64-byte operand of
   VDPBF16PS, and 16 rows one tile of AMX's TDPBF16PS), zeros past `context`. K: D/32 tiles for keys 0-15 of the
   block, then D/32 for keys 16-31; tile c's row j holds dims 32c + 2j and 32c + 2j + 1 of its 16 keys. V: D/16 tiles;
   tile e's row j holds dims 16e..16e+15 of keys 2j and 2j + 1. */
static void pack_block(const float *k, const float *v, int64_t context, int64_t hkv, int64_t d, int64_t h, int64_t kb,
                       uint16_t *kt, uint16_t *vt) {
    const int64_t ld = hkv * d, first = kb * KBLOCK;
    for (int t = 0; t < 2; t++) {
        const int64_t key0 = first + 16 * t, keys = context - key0;
        const __mmask16 live = keys >= 16 ? 0xffff : keys <= 0 ? 0 : (__mmask16)((1u << keys) - 1);
        const __m512i keys16 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i index = _mm512_mullo_epi32(keys16, _mm512_set1_epi32((int)ld));
        const float *base = k + (key0 < context ? key0 : 0) * ld + h * d;
        for (int64_t dim = 0; dim < d; dim += 2) {
            const __m512 even = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, index, base + dim, 4);
            const __m512 odd = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, index, base + dim + 1, 4);
            uint16_t *row = kt + (t * (d / 32) + dim / 32) * TILE + (dim % 32) / 2 * 32;
            _mm512_storeu_si512(row, pairs(even, odd));
        }
    }
    for (int64_t j = 0; j < KBLOCK / 2; j++) {
        const int64_t key = first + 2 * j;
        for (int64_t e = 0; e < d; e += 16) {
            const __m512 a = key < context ? _mm512_loadu_ps(v + key * ld + h * d + e) : _mm512_setzero_ps();
            const __m512 b = key + 1 < context ? _mm512_loadu_ps(v + (key + 1) * ld + h * d + e) : _mm512_setzero_ps();
            _mm512_storeu_si512(vt + (e / 16) * TILE + j * 32, pairs(a, b));
        }
    }
}

/* What one task keeps: its 16 queries as bfloat16, the block's scores and P, and per row the running output,
   maximum and sum. */
struct task {
    uint16_t q[QROWS * MAX_D] __attribute__((aligned(64)));
    float s[QROWS * KBLOCK] __attribute__((aligned(64)));
    uint16_t p[QROWS * KBLOCK] __attribute__((aligned(64)));
    float o[QROWS * MAX_D] __attribute__((aligned(64)));
    float m[QROWS] __attribute__((aligned(64)));
    float l[QROWS] __attribute__((aligned(64)));
};

/* Scores of block kb for the task's queries into t->s [16][32]: 8 rows at a time, each row's pair of dims broadcast
   against the pair row of the block's two key tiles, the pairs in order. */
static void scores(struct task *t, const uint16_t *kt, int64_t d) {
    const int64_t second = d / 32 * TILE;  /* keys 16-31's tiles */
    for (int r0 = 0; r0 < QROWS; r0 += 8) {
        __m512 acc[8][2];
        for (int i = 0; i < 8; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        for (int64_t j = 0; j < d / 2; j++) {
            const uint16_t *row = kt + j / 16 * TILE + j % 16 * 32;
            const __m512bh k0 = (__m512bh)_mm512_load_si512(row), k1 = (__m512bh)_mm512_load_si512(row + second);
            for (int i = 0; i < 8; i++) {
                int32_t pair;
                memcpy(&pair, t->q + (r0 + i) * d + 2 * j, sizeof pair);
                const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
                acc[i][0] = _mm512_dpbf16_ps(acc[i][0], x, k0);
                acc[i][1] = _mm512_dpbf16_ps(acc[i][1], x, k1);
            }
        }
        for (int i = 0; i < 8; i++) {
            _mm512_store_ps(t->s + (r0 + i) * KBLOCK, acc[i][0]);
            _mm512_store_ps(t->s + (r0 + i) * KBLOCK + 16, acc[i][1]);
        }
    }
}

/* The online softmax of block kb for each row (position pos[r]): P into t->p, the rows' maximum and sum updated;
   alpha[r] = 2^(m_old - m) the factor O is rescaled by, live[r] = whether the block holds any of the row's keys. */
static void softmax_block(struct task *t, int64_t kb, const int64_t *pos, float log2_scale, float *alpha, int *live) {
    float m_old[QROWS] __attribute__((aligned(64))), sums[QROWS] __attribute__((aligned(64)));
    const __m512 c = _mm512_set1_ps(log2_scale), ninf = _mm512_set1_ps(-__builtin_inff());
    for (int r = 0; r < QROWS; r++) {
        const int64_t seen = pos[r] - kb * KBLOCK + 1;  /* keys of the block at or before the row's position */
        m_old[r] = t->m[r];
        live[r] = seen > 0;
        if (!live[r]) { memset(t->p + r * KBLOCK, 0, KBLOCK * sizeof(uint16_t)); sums[r] = 0; continue; }
        const __mmask16 m0 = seen >= 16 ? 0xffff : (__mmask16)((1u << seen) - 1);
        const __mmask16 m1 = seen >= 32 ? 0xffff : seen <= 16 ? 0 : (__mmask16)((1u << (seen - 16)) - 1);
        const __m512 x0 = _mm512_mask_mul_ps(ninf, m0, _mm512_loadu_ps(t->s + r * KBLOCK), c);
        const __m512 x1 = _mm512_mask_mul_ps(ninf, m1, _mm512_loadu_ps(t->s + r * KBLOCK + 16), c);
        const float top = _mm512_reduce_max_ps(_mm512_max_ps(x0, x1));
        const float m = top > t->m[r] || top != top ? top : t->m[r];  /* a NaN score makes the row NaN */
        t->m[r] = m;
        const __m512 p0 = _mm512_maskz_mov_ps(m0, exp2_ps(_mm512_sub_ps(x0, _mm512_set1_ps(m))));
        const __m512 p1 = _mm512_maskz_mov_ps(m1, exp2_ps(_mm512_sub_ps(x1, _mm512_set1_ps(m))));
        const __m512bh h = _mm512_cvtne2ps_pbh(p1, p0);  /* keys 0-15 from p0, 16-31 from p1 */
        _mm512_storeu_si512(t->p + r * KBLOCK, (__m512i)h);
        const __m512i wide = (__m512i)h;  /* the rounded P back in float32, summed: l adds what multiplies V */
        const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
        const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(wide, _mm512_set1_epi32((int)0xffff0000u)));
        sums[r] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
    }
    const __m512 a = exp2_ps(_mm512_sub_ps(_mm512_load_ps(m_old), _mm512_load_ps(t->m)));  /* m_old = -inf: 0 */
    _mm512_store_ps(alpha, a);
    for (int r = 0; r < QROWS; r++)
        if (live[r]) t->l[r] = t->l[r] * alpha[r] + sums[r];
}

/* Rows r0..r0+3 of O, dims 16 e0 .. 16 (e0 + cols) - 1: O alpha + P V, the 16 pairs of keys in order, each row's pair
   broadcast against the pair row of each value tile. Inlined where cols is a constant (4 or 2), so the 4 x cols sums
   stay in registers. */
static inline __attribute__((always_inline)) void values_block(struct task *t, const uint16_t *vt, int64_t d, int r0,
                                                                int64_t e0, int cols, const float *alpha,
                                                                const int *live) {
    __m512 acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int c = 0; c < cols; c++)
            acc[i][c] = _mm512_mul_ps(_mm512_loadu_ps(t->o + (r0 + i) * d + 16 * (e0 + c)),
                                      _mm512_set1_ps(alpha[r0 + i]));
    for (int j = 0; j < KBLOCK / 2; j++) {
        __m512bh p[4];
        for (int i = 0; i < 4; i++) {
            int32_t pair;
            memcpy(&pair, t->p + (r0 + i) * KBLOCK + 2 * j, sizeof pair);
            p[i] = (__m512bh)_mm512_set1_epi32(pair);
        }
        for (int c = 0; c < cols; c++) {
            const __m512bh w = (__m512bh)_mm512_load_si512(vt + (e0 + c) * TILE + j * 32);
            for (int i = 0; i < 4; i++) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], p[i], w);
        }
    }
    for (int i = 0; i < 4; i++)
        if (live[r0 + i])
            for (int c = 0; c < cols; c++) _mm512_storeu_ps(t->o + (r0 + i) * d + 16 * (e0 + c), acc[i][c]);
}

/* O = O alpha + P V for block kb's values, for the rows whose block is live: 4 rows by 4 tiles of 16 dims at a time
   (by 2 for the last two tiles of a head size that is an odd multiple of 32). */
static void add_values(struct task *t, const uint16_t *vt, int64_t d, const float *alpha, const int *live) {
    const int64_t tiles = d / 16;
    for (int r0 = 0; r0 < QROWS; r0 += 4) {
        int64_t e0 = 0;
        for (; e0 + 4 <= tiles; e0 += 4) values_block(t, vt, d, r0, e0, 4, alpha, live);
        if (e0 < tiles) values_block(t, vt, d, r0, e0, 2, alpha, live);
    }
}

/* Queries i0.. (rows < QROWS of them) of head qh: load them as bfloat16, walk the blocks, write O / l. */
static void run_task(struct task *t, const float *q, int64_t n, int64_t hq, int64_t i0, int64_t qh, int64_t group,
                     const uint16_t *kpack, const uint16_t *vpack, int64_t blocks, int64_t context, int64_t d,
                     float log2_scale, float *out) {
    const int64_t rows = n - i0 < QROWS ? n - i0 : QROWS, kvh = qh / group;
    int64_t pos[QROWS];
    float alpha[QROWS] __attribute__((aligned(64)));
    int live[QROWS];
    for (int r = 0; r < QROWS; r++) {
        pos[r] = context - n + i0 + (r < rows ? r : 0);  /* a missing row copies row 0's position; never written */
        t->m[r] = -__builtin_inff(); t->l[r] = 0;
        memset(t->o + r * d, 0, d * sizeof(float));
        for (int64_t e = 0; e < d; e += 16) {
            const __m512 x = r < rows ? _mm512_loadu_ps(q + ((i0 + r) * hq + qh) * d + e) : _mm512_setzero_ps();
            _mm256_storeu_si256((__m256i *)(t->q + r * d + e), (__m256i)_mm512_cvtneps_pbh(x));
        }
    }
    const int64_t last = pos[rows - 1] / KBLOCK;
    for (int64_t kb = 0; kb <= last; kb++) {
        const int64_t at = (kvh * blocks + kb) * (d / 16) * TILE;
        scores(t, kpack + at, d);
        softmax_block(t, kb, pos, log2_scale, alpha, live);
        add_values(t, vpack + at, d, alpha, live);
    }
    for (int r = 0; r < rows; r++) {
        const __m512 l = _mm512_set1_ps(t->l[r]);
        for (int64_t e = 0; e < d; e += 16)
            _mm512_storeu_ps(out + ((i0 + r) * hq + qh) * d + e, _mm512_div_ps(_mm512_loadu_ps(t->o + r * d + e), l));
    }
}

/* out [n, hq, d] = attention of q [n, hq, d] (the last n of `context` tokens) over k, v [context, hkv, d] (float32,
   consecutive), causal, scores scaled by `scale`; query head h reads KV head h / (hq / hkv). 0, or -1 for a shape
   it does not take (d not a multiple of 32 or over 256, n not in 1..context, hq not a multiple of hkv), -2 if out of
   memory. */
int prefill_attention(const float *q, int64_t n, int64_t hq, const float *k, const float *v, int64_t context,
                      int64_t hkv, int64_t d, float scale, float *out, int threads) {
    if (d % 32 || d > MAX_D || d <= 0 || n < 1 || n > context || hkv < 1 || hq % hkv) return -1;
    if (threads < 1) threads = 1;
    const int64_t blocks = (context + KBLOCK - 1) / KBLOCK, tiles = (n + QROWS - 1) / QROWS, tasks = tiles * hq;
    const size_t packed = (size_t)hkv * blocks * (d / 16) * TILE * sizeof(uint16_t);
    uint16_t *kpack = aligned_alloc(64, packed), *vpack = aligned_alloc(64, packed);
    int failed = !kpack || !vpack;
    if (!failed) {
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t hb = 0; hb < hkv * blocks; hb++) {
            const int64_t at = hb * (d / 16) * TILE;
            pack_block(k, v, context, hkv, d, hb / blocks, hb % blocks, kpack + at, vpack + at);
        }
        const float log2_scale = scale * 1.4426950408889634f;
        #pragma omp parallel num_threads(threads)
        {
            struct task *t = aligned_alloc(64, sizeof(struct task));
            if (!t) {
                #pragma omp atomic write
                failed = 1;
            }
            #pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < tasks; task++) {  /* the last queries (the most keys) first */
                if (!t) continue;
                const int64_t tile = tiles - 1 - task / hq, qh = task % hq;
                run_task(t, q, n, hq, tile * QROWS, qh, hq / hkv, kpack, vpack, blocks, context, d, log2_scale, out);
            }
            free(t);
        }
    }
    free(kpack); free(vpack);
    return failed ? -2 : 0;
}
