/* Decode attention over the KV pool's pages, read in place: one query row against its first n tokens. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"
#include "pages.h"
#include "shape.h"
#include "vectors.h"

#define CHUNKS (HEAD_DIM / 8)                 /* 8-float vectors per head */
#define FITS(n) ((n) <= 12 / GROUP && CHUNKS % (n) == 0)  /* GROUP x n accumulators fit in 16 registers */
#define SPAN (FITS(CHUNKS) ? CHUNKS : FITS(4) ? 4 : FITS(2) ? 2 : 1)  /* vectors of a head per pass over values */

/* scores[hq, t] = q[hq] . k[t, hq / GROUP] * scale, for the heads of key/value heads h0..h1-1 and a page's first
   `count` tokens, four tokens at a time. */
static void page_scores(const f8 *q, const kv_t *keys, int64_t count, int h0, int h1, float scale,
                        float *scores, int64_t n) {
    int64_t t = 0;
    for (; t + 4 <= count; t += 4) {
        const kv_t *k = keys + t * TOKEN;
        for (int h = h0; h < h1; h++) {
            f8 acc[GROUP][4] = {0};
            for (int c = 0; c < CHUNKS; c++) {
                const kv_t *kc = k + h * HEAD_DIM + 8 * c;
                const f8 k0 = load_kv8(kc), k1 = load_kv8(kc + TOKEN);
                const f8 k2 = load_kv8(kc + 2 * TOKEN), k3 = load_kv8(kc + 3 * TOKEN);
                for (int g = 0; g < GROUP; g++) {
                    const f8 qc = q[(h * GROUP + g) * CHUNKS + c];
                    acc[g][0] += qc * k0; acc[g][1] += qc * k1; acc[g][2] += qc * k2; acc[g][3] += qc * k3;
                }
            }
            for (int g = 0; g < GROUP; g++)
                *(f4 *)(scores + (h * GROUP + g) * n + t) = sums4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]) * scale;
        }
    }
    for (; t < count; t++)
        for (int hq = h0 * GROUP; hq < h1 * GROUP; hq++) {
            const kv_t *k = keys + t * TOKEN + (hq / GROUP) * HEAD_DIM;
            f8 acc = {0};
            for (int c = 0; c < CHUNKS; c++) acc += q[hq * CHUNKS + c] * load_kv8(k + 8 * c);
            scores[hq * n + t] = sums4(acc, acc, acc, acc)[0] * scale;
        }
}

/* out[hq] += sum over a page's first `count` tokens t of p[hq, t] v[t, hq / GROUP], for key/value heads h0..h1-1;
   SPAN vectors of a head's output at a time, so that they stay in registers. */
static void page_values(const float *p, int64_t n, const kv_t *values, int64_t count, int h0, int h1, f8 *out) {
    for (int h = h0; h < h1; h++)
        for (int c0 = 0; c0 < CHUNKS; c0 += SPAN) {
            f8 acc[GROUP][SPAN] = {0};
            for (int64_t t = 0; t < count; t++) {
                const kv_t *v = values + t * TOKEN + h * HEAD_DIM + 8 * c0;
                f8 vc[SPAN];
                for (int c = 0; c < SPAN; c++) vc[c] = load_kv8(v + 8 * c);
                for (int g = 0; g < GROUP; g++) {
                    const float pt = p[(h * GROUP + g) * n + t];
                    for (int c = 0; c < SPAN; c++) acc[g][c] += pt * vc[c];
                }
            }
            for (int g = 0; g < GROUP; g++)
                for (int c = 0; c < SPAN; c++) out[(h * GROUP + g) * CHUNKS + c0 + c] += acc[g][c];
        }
}

/* s[0:n] <- e^(s[0:n] - max(s)); returns their sum, by which the weighted values are divided afterwards (n
   divisions become HEAD_DIM multiplications). The maximum is taken eight lanes at a time, by a bitwise select. */
static float exp_shifted(float *s, int64_t n) {
    f8 best = (f8){0} - INFINITY;
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const f8 v = *(const f8 *)(s + t);
        const i8 above = v > best;
        best = (f8)(((i8)v & above) | ((i8)best & ~above));
    }
    float top = -INFINITY, total = 0.f;
    for (int i = 0; i < 8; i++) top = best[i] > top ? best[i] : top;
    for (int64_t i = t; i < n; i++) top = s[i] > top ? s[i] : top;
    f8 sum = {0};
    for (t = 0; t + 8 <= n; t += 8) { const f8 e = exp8(*(f8 *)(s + t) - top); *(f8 *)(s + t) = e; sum += e; }
    for (; t < n; t++) { s[t] = expf(s[t] - top); total += s[t]; }
    return total + sums4(sum, sum, sum, sum)[0];
}

/* One row's query heads of key/value heads h0..h1-1 attend to the row's first n tokens, page by page. */
static int attend(const float *q, const kv_t *k_pages, const kv_t *v_pages, const int64_t *table, int64_t n,
                  int h0, int h1, float *out, int64_t page_size, float scale) {
    float *scores = malloc(sizeof(float) * HEADS * n);   /* [HEADS, n]; rows of other heads unused */
    if (!scores) return 1;
    for (int64_t start = 0; start < n; start += page_size) {
        const int64_t count = n - start < page_size ? n - start : page_size;
        page_scores((const f8 *)q, k_pages + table[start / page_size] * page_size * TOKEN, count, h0, h1, scale,
                    scores + start, n);
    }
    float totals[HEADS];
    for (int hq = h0 * GROUP; hq < h1 * GROUP; hq++) totals[hq] = exp_shifted(scores + hq * n, n);
    for (int i = h0 * GROUP * CHUNKS; i < h1 * GROUP * CHUNKS; i++) ((f8 *)out)[i] = (f8){0};
    for (int64_t start = 0; start < n; start += page_size) {
        const int64_t count = n - start < page_size ? n - start : page_size;
        page_values(scores + start, n, v_pages + table[start / page_size] * page_size * TOKEN, count, h0, h1, (f8 *)out);
    }
    for (int hq = h0 * GROUP; hq < h1 * GROUP; hq++) {                   /* softmax's division, once per output */
        const float scale = totals[hq] > 0.f ? 1.f / totals[hq] : 0.f;  /* no context (n = 0): zeros */
        for (int c = 0; c < CHUNKS; c++) ((f8 *)out)[hq * CHUNKS + c] *= scale;
    }
    free(scores);
    return 0;
}

/* Decode attention over pages. q, out: [rows, HEADS, HEAD_DIM]; k_pages, v_pages: one layer's
   [pages, page_size, KV_HEADS, HEAD_DIM]; page_tables: [rows, table_stride]; row r attends to its first
   context_lens[r] tokens. Work items are rows, or slices of a row's heads when there are fewer rows than
   threads. Returns 0, or 1 if memory ran out. */
int paged_decode_attention(const float *q, const kv_t *k_pages, const kv_t *v_pages, const int64_t *page_tables,
                           int64_t table_stride, const int64_t *context_lens, float *out, int64_t rows,
                           int64_t page_size, float scale, int threads) {
    if (rows <= 0) return 0;
    const int slices = rows >= threads ? 1 : (threads + rows - 1) / rows < KV_HEADS ? (threads + rows - 1) / rows : KV_HEADS;
    int failed = 0;
    #pragma omp parallel for schedule(dynamic) num_threads(threads) reduction(|:failed)
    for (int64_t item = 0; item < rows * slices; item++) {
        const int64_t r = item / slices, s = item % slices;
        const int h0 = s * KV_HEADS / slices, h1 = (s + 1) * KV_HEADS / slices;
        failed |= attend(q + r * HEADS * HEAD_DIM, k_pages, v_pages, page_tables + r * table_stride, context_lens[r],
                         h0, h1, out + r * HEADS * HEAD_DIM, page_size, scale);
    }
    return failed;
}
