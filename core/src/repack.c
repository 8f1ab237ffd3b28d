/* repack.c: load-time copies of weights in layouts the kernels read faster: mul_mat's interleaved
 * rows (see arch/rows8.c, arch/q8_0x16.c, arch/kx16.c; types whose traits name a repacked_type and whose level has a
 * repack kernel for it (Q6_K: the AVX-512 levels only), 2-d, a multiple of its group's 8 or 16 rows, unless the
 * level's tile kernels read only the file's layout) and
 * the sparse FFN's per-neuron packing (see arch/q4_0r.c). */
#include "internal.h"

#include <string.h>

int64_t pi_repack_bytes(const pi_tensor *w) {
    if (!w || pi_check_tensor(w, "repack") != PI_OK) { pi_clear_error(); return 0; }
    const pi_type_traits *tr = pi_traits(w->type);
    if (!tr->repacked_type || !tr->repack || w->n_dims != 2 || w->ne[1] % pi_group_rows(tr->repacked_type) ||
        w->ne[0] % pi_traits(tr->repacked_type)->block_size)   /* F16X8: rows of whole 8-element chunks */
        return 0;
    /* where the file's layout has tile kernels (AMX) and the interleaved one none, the file's layout is faster */
    if (tr->tiles_rows && !pi_traits(tr->repacked_type)->tiles) return 0;
    return pi_row_bytes(tr->repacked_type, w->ne[0]) * w->ne[1];
}

typedef struct { const pi_tensor *w; char *dst; int32_t type; } repack_args;

static void repack_task(void *p, int ith, int nth) {
    const repack_args *a = p;
    const int64_t K = a->w->ne[0], R = pi_group_rows(a->type), G = a->w->ne[1] / R;
    const int64_t group_bytes = R * pi_row_bytes(a->type, K);
    for (int64_t g = G * ith / nth; g < G * (ith + 1) / nth; g++) {
        const void *rows[16];
        for (int k = 0; k < R; k++) rows[k] = (const char *)a->w->data + (R * g + k) * a->w->nb[1];
        pi_traits(a->w->type)->repack(K, rows, a->dst + g * group_bytes);   /* the source type's rows -> a group */
    }
}

pi_status pi_repack_on(pi_threadpool *pool, const pi_tensor *w, void *dst, int64_t dst_bytes, pi_tensor *out) {
    if (!w || !dst || !out) return pi_fail(PI_ERR_INVALID_ARG, "repack: NULL argument");
    pi_status st = pi_check_tensor(w, "repack w");
    if (st != PI_OK) return st;
    const int64_t bytes = pi_repack_bytes(w);
    if (bytes == 0)
        return pi_fail(PI_ERR_UNSUPPORTED, "repack: no interleaved layout for this %s tensor on this CPU",
                       pi_type_name(w->type));
    if (dst_bytes < bytes) return pi_fail(PI_ERR_INVALID_ARG, "repack: dst holds %lld bytes, %lld needed",
                                          (long long)dst_bytes, (long long)bytes);
    repack_args a = { w, dst, pi_traits(w->type)->repacked_type };
    pi_threadpool_run(pool, repack_task, &a);
    *out = pi_tensor_view(a.type, dst, 2, w->ne);
    return PI_OK;
}

pi_status pi_repack(const pi_tensor *w, void *dst, int64_t dst_bytes, pi_tensor *out) {
    return pi_repack_on(NULL, w, dst, dst_bytes, out);
}

/* ---- the sparse FFN's per-neuron packing ---- */

static bool is_2d(const pi_tensor *t, int32_t type, int64_t ne0, int64_t ne1) {
    return t->data && pi_check_tensor(t, "sparse pack") == PI_OK && t->type == type && t->n_dims == 2 &&
           t->ne[0] == ne0 && t->ne[1] == ne1;
}
static bool is_q4_0_2d(const pi_tensor *t, int64_t ne0, int64_t ne1) { return is_2d(t, PI_TYPE_Q4_0, ne0, ne1); }

/* The column-block layout of the file's down matrix [F, E] (arch/q4_0c.c, arch/kc.c), 0 where it has none:
 * Q4_0 -> Q4_0C (F a multiple of 32), Q4_K -> Q4_KC, Q6_K -> Q6_KC (F a multiple of 256); E a multiple of 64. */
static int32_t cols_type(const pi_tensor *down) {
    if (!down->data || down->n_dims != 2 || down->ne[1] % 64) return 0;
    const int32_t t = is_2d(down, PI_TYPE_Q4_0, down->ne[0], down->ne[1]) ? PI_TYPE_Q4_0C
                    : is_2d(down, PI_TYPE_Q4_K, down->ne[0], down->ne[1]) ? PI_TYPE_Q4_KC
                    : is_2d(down, PI_TYPE_Q6_K, down->ne[0], down->ne[1]) ? PI_TYPE_Q6_KC : 0;
    return t && down->ne[0] % pi_traits(t)->cols_unit == 0 ? t : 0;
}

/* The packing's shape: E outputs, F neurons (or inputs), which parts, and the bytes of each; 0 bytes: none. The down
 * step is read from w->down (the file's Q4_0, Q4_K or Q6_K matrix [F, E], laid out by neuron as Q4_0C / Q4_KC / Q6_KC:
 * nothing re-quantized) where it has such a layout (cols_type), else from down_t as Q4_0R rows. Gate and up rows are
 * packed as Q4_0R (Q4_0, E a multiple of 256); where they cannot be and the down step is a column layout, it alone is
 * packed and they stay where they are (rows_in_place). */
typedef struct {
    int64_t E, F;
    int n_rows_r;         /* Q4_0R rows per neuron: gate, up, down_t as packed */
    int32_t cols;         /* the down step's column layout (Q4_0C, Q4_KC, Q6_KC), 0: none */
    bool rows_in_place;   /* gate and up are w's */
    int64_t row_r, row_c, stride, scales, bytes;
} pack_shape;

static pack_shape sparse_pack_shape(const pi_sparse_ffn_weights *w, int32_t gate_mode) {
    pack_shape p = { 0 };
    if (!w || gate_mode < PI_FFN_PAR || gate_mode > PI_FFN_SEQ) return p;
    const int32_t cols = cols_type(&w->down);
    const int64_t E = cols ? w->down.ne[1] : w->down_t.ne[0], F = cols ? w->down.ne[0] : w->down_t.ne[1];
    const bool gate = gate_mode != PI_FFN_SEQ, up = w->up.data != NULL;
    const bool rows = up ? E % 256 == 0 && is_q4_0_2d(&w->up, E, F) && (!gate || is_q4_0_2d(&w->gate, E, F))
                         : !gate && !w->gate.data;
    const bool in_place = !rows && cols && up && w->up.ne[0] == E && w->up.ne[1] == F && (!gate || w->gate.data);
    const bool ok = (cols || (E % 256 == 0 && is_q4_0_2d(&w->down_t, E, F))) && (rows || in_place);
    pi_clear_error();
    if (!ok) return p;
    p.E = E, p.F = F, p.cols = cols, p.rows_in_place = in_place;
    p.n_rows_r = (up && !in_place ? gate ? 2 : 1 : 0) + !cols;   /* gate, up, down_t rows as Q4_0R */
    p.row_r = pi_row_bytes(PI_TYPE_Q4_0R, E);
    p.row_c = cols ? pi_row_bytes(cols, E) : 0;
    p.stride = p.n_rows_r * p.row_r + p.row_c;
    p.scales = cols ? F / pi_traits(cols)->cols_unit * E * pi_traits(cols)->cols_aux : 0;
    p.bytes = p.stride * F + p.scales;
    return p;
}

/* With up NULL (an input-sparse matmul: gate mode seq, no gate) the down step alone is packed: down_t [n_out, F]
 * (n_out a multiple of 256; its rows are only added, with the same bits as the file layout's Q4_0 axpy) or down. */
int64_t pi_sparse_pack_bytes(const pi_sparse_ffn_weights *w, int32_t gate_mode) {
    return sparse_pack_shape(w, gate_mode).bytes;
}

typedef struct { const pi_sparse_ffn_weights *w; const pi_sparse_ffn_weights *out; pack_shape p; } pack_args;

static void pack_task(void *p, int ith, int nth) {
    const pack_args *a = p;
    const pi_tensor *src[3] = { &a->w->gate, &a->w->up, &a->w->down_t }, *dst[3] = { &a->out->gate, &a->out->up,
                                                                                   &a->out->down_t };
    const int64_t E = a->p.E, F = a->p.F;
    for (int64_t i = F * ith / nth; i < F * (ith + 1) / nth; i++)
        for (int m = 0; m < 3; m++)
            if (dst[m]->data && dst[m]->type == PI_TYPE_Q4_0R)   /* not rows left in place, nor Q4_0C */
                pi_cpu()->q4_0r_from_q4_0(E, (const char *)src[m]->data + i * src[m]->nb[1],
                                          (char *)dst[m]->data + i * a->p.stride);
    if (!a->p.cols) return;
    const pi_tensor *down = &a->w->down, *cols = &a->out->down_t;
    const int64_t unit = pi_traits(a->p.cols)->cols_unit, aux = pi_traits(a->p.cols)->cols_aux * E;
    for (int64_t b = F / unit * ith / nth; b < F / unit * (ith + 1) / nth; b++) {   /* units of 32 / 256 neurons */
        void *rows[256];
        for (int64_t k = 0; k < unit; k++) rows[k] = (char *)cols->data + (unit * b + k) * a->p.stride;
        pi_traits(a->p.cols)->cols_pack(E, down->data, down->nb[1], b, rows, (char *)a->out->down_t_scales + b * aux);
    }
}

pi_status pi_sparse_pack_on(pi_threadpool *pool, const pi_sparse_ffn_weights *w, int32_t gate_mode, void *dst,
                            int64_t dst_bytes, pi_sparse_ffn_weights *out) {
    if (!w || !dst || !out) return pi_fail(PI_ERR_INVALID_ARG, "sparse pack: NULL argument");
    const pack_shape s = sparse_pack_shape(w, gate_mode);
    if (s.bytes == 0)
        return pi_fail(PI_ERR_UNSUPPORTED, "sparse pack: needs 2-d q4_0 gate (unless the gate mode "
                       "is seq), up and down_t of the same shape, with n_embd a multiple of 256, or a q4_0 (q4_K, "
                       "q6_K) down [n_ff, n_embd] instead of down_t with n_embd a multiple of 64 and n_ff of 32 "
                       "(256) (or, up NULL, a q4_0 down_t alone with rows of a multiple of 256, or such a down)");
    if (dst_bytes < s.bytes) return pi_fail(PI_ERR_INVALID_ARG, "sparse pack: dst holds %lld bytes, %lld needed",
                                            (long long)dst_bytes, (long long)s.bytes);
    const bool up = w->up.data != NULL && !s.rows_in_place;
    pi_sparse_ffn_weights o = { .up_bias = w->up_bias, .down_bias = w->down_bias, .act_scale = w->act_scale };
    if (s.rows_in_place) o.gate = w->gate, o.up = w->up;
    pi_tensor *parts[3] = { up && gate_mode != PI_FFN_SEQ ? &o.gate : NULL, up ? &o.up : NULL, &o.down_t };
    char *p = dst;
    for (int m = 0; m < 3; m++) {   /* neuron i's rows: one run of s.stride bytes */
        if (!parts[m]) continue;
        const bool cols = m == 2 && s.cols;
        *parts[m] = pi_tensor_view(cols ? s.cols : PI_TYPE_Q4_0R, p, 2, (int64_t[]){ s.E, s.F });
        parts[m]->nb[1] = s.stride;
        parts[m]->nb[2] = parts[m]->nb[3] = parts[m]->nb[1] * s.F;
        p += cols ? s.row_c : s.row_r;
    }
    if (s.cols) o.down_t_scales = (char *)dst + s.stride * s.F;
    pack_args a = { w, &o, s };
    pi_threadpool_run(pool, pack_task, &a);
    *out = o;
    return PI_OK;
}

pi_status pi_sparse_pack(const pi_sparse_ffn_weights *w, int32_t gate_mode, void *dst, int64_t dst_bytes,
                         pi_sparse_ffn_weights *out) {
    return pi_sparse_pack_on(NULL, w, gate_mode, dst, dst_bytes, out);
}
