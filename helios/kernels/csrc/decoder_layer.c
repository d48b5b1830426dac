/* A whole decoder layer as one call: the functions of layer_ops.c, the attention of decode_attention.c and the
   matmul the layer is handed, in the order chapter 03's DecoderLayer.forward runs them. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "shape.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void timed_matmul(const struct layer_weights *lw, const struct tick *t, const float *x, int64_t M,
                         int64_t K, const uint16_t *w, int64_t N, float *y) {
    const double start = now_s();
    lw->matmul(x, M, K, w, N, y, t->threads);
    t->clocks[0] += now_s() - start;
}

/* The decoder layer applied to x [n, hidden]: k and v of all n tokens written to the layer's pages, and out
   [m, hidden] the outputs of the m <= n tokens rows[0..m) (the last layer: where logits are taken), or of all
   n when rows is NULL and m = n (m = 0: none, out is not written). Returns 0, or 1 if memory ran out. */
int decoder_layer(const struct layer_weights *w, const struct tick *t, const float *x, float *out,
                  const int64_t *rows, int64_t m) {
    const int64_t n = t->n, H = w->hidden, I = w->inter, A = HEADS * HEAD_DIM;
    kv_t *k_pages = t->k_pages + w->layer * t->layer_elements, *v_pages = t->v_pages + w->layer * t->layer_elements;
    float *h = t->scratch, *qkv = h + n * H, *q = qkv + n * QKV, *att = q + n * A, *mid = att + n * A;
    float *gate_up = mid + n * H, *act = gate_up + n * 2 * I;
    rms_norm(x, NULL, w->input_norm, NULL, h, n, H, w->eps, t->threads);             /* h = norm(x) */
    timed_matmul(w, t, h, n, H, w->qkv, QKV, qkv);
    if (w->qkv_bias)
        for (int64_t r = 0; r < n; r++) for (int64_t i = 0; i < QKV; i++) qkv[r * QKV + i] += w->qkv_bias[i];
    rope_store(qkv, QKV, n, t->cos, t->sin, w->q_norm, w->k_norm, w->qk_eps, q, k_pages, v_pages, t->slots,
               t->threads);                                                           /* q; k, v to the pages */
    if (m == 0) return 0;  /* no row wanted (a tick of prompt chunks that sample nothing): only the K/V writes */
    const int64_t *tables = t->tables, *lens = t->lens;
    int64_t *picked = NULL;
    if (rows) {      /* from here on only rows[0..m): their queries, inputs, tables and lengths, gathered */
        picked = malloc(sizeof(int64_t) * m * (t->table_stride + 1));
        if (!picked) return 1;
        float *q_rows = qkv, *x_rows = mid;   /* free until written: qkv is read, mid is the norm's sum (in place) */
        for (int64_t i = 0; i < m; i++) {
            memcpy(q_rows + i * A, q + rows[i] * A, sizeof(float) * A);
            memcpy(x_rows + i * H, x + rows[i] * H, sizeof(float) * H);
            memcpy(picked + i * t->table_stride, t->tables + rows[i] * t->table_stride, sizeof(int64_t) * t->table_stride);
            picked[m * t->table_stride + i] = t->lens[rows[i]];
        }
        q = q_rows, x = x_rows, tables = picked, lens = picked + m * t->table_stride;
    } else m = n;
    const double start = now_s();
    const int failed = paged_decode_attention(q, k_pages, v_pages, tables, t->table_stride, lens, att, m,
                                              t->page_size, t->scale, t->threads);
    t->clocks[1] += now_s() - start;
    free(picked);
    if (failed) return 1;
    timed_matmul(w, t, att, m, A, w->o, H, out);                                       /* out = o_proj(att) */
    rms_norm(x, out, w->post_norm, mid, h, m, H, w->eps, t->threads);                 /* mid = x + out, h = norm */
    timed_matmul(w, t, h, m, H, w->gate_up, 2 * I, gate_up);
    silu_mul(gate_up, m, I, act, t->threads);
    timed_matmul(w, t, act, m, I, w->down, H, out);                                    /* out = down(act) */
    #pragma omp parallel for num_threads(m * H >= PARALLEL_MIN ? t->threads : 1)
    for (int64_t i = 0; i < m * H; i++) out[i] += mid[i];
    return 0;
}

/* The engine ran out of work (CKernels.idle, on the engine's thread): end the OpenMP workers of this thread's team.
   Kept, they wait for the team's next region, and libgomp counts them among the process's threads: once a process
   has more such threads than cores (a second engine's team, on its own thread), every team stops spinning at its
   barriers and sleeps in the kernel instead, a wake-up per parallel region. The next region starts a new team. */
#ifdef _OPENMP
int omp_pause_resource_all(int kind) __attribute__((weak));  /* OpenMP 5 (libgomp of GCC 9 on): NULL before */
#endif
void release_threads(void) {
#ifdef _OPENMP
    if (omp_pause_resource_all) omp_pause_resource_all(1);   /* omp_pause_soft */
#endif
}

/* The structs' layout as this compiler lays them out, for the check against Python's ctypes Structures: their
   sizes, and each field's offset in the order the fields are declared (-1 past the last field). */
#define AT(offsets, field) ((field) >= 0 && (field) < (int64_t)(sizeof offsets / sizeof *offsets) ? offsets[field] : -1)

#define W(name) offsetof(struct layer_weights, name)
static const int64_t layer_weights_offsets[] = {W(input_norm), W(post_norm), W(q_norm), W(k_norm), W(eps), W(qk_eps),
    W(qkv), W(o), W(gate_up), W(down), W(qkv_bias), W(hidden), W(inter), W(layer), W(matmul)};
size_t helios_sizeof_layer_weights(void) { return sizeof(struct layer_weights); }
int64_t helios_offsetof_layer_weights(int64_t field) { return AT(layer_weights_offsets, field); }

#define T(name) offsetof(struct tick, name)
static const int64_t tick_offsets[] = {T(n), T(cos), T(sin), T(slots), T(tables), T(lens), T(table_stride),
    T(page_size), T(k_pages), T(v_pages), T(layer_elements), T(scratch), T(scale), T(threads), T(clocks)};
size_t helios_sizeof_tick(void) { return sizeof(struct tick); }
int64_t helios_offsetof_tick(int64_t field) { return AT(tick_offsets, field); }
