/* repack.c: load-time copies of weights in an interleaved layout (see arch/rows8.c).
 * Only for types whose traits name a repacked_type, 2-d, with a multiple of 8 rows. */
#include "internal.h"

#include <string.h>

int64_t pi_repack_bytes(const pi_tensor *w) {
    if (!w || pi_check_tensor(w, "repack") != PI_OK) { pi_clear_error(); return 0; }
    const pi_type_traits *tr = pi_traits(w->type);
    if (!tr->repacked_type || w->n_dims != 2 || w->ne[1] % 8) return 0;
    return pi_row_bytes(tr->repacked_type, w->ne[0]) * w->ne[1];
}

typedef struct { const pi_tensor *w; char *dst; int32_t type; } repack_args;

static void repack_task(void *p, int ith, int nth) {
    const repack_args *a = p;
    const int64_t K = a->w->ne[0], G = a->w->ne[1] / 8, group_bytes = 8 * pi_row_bytes(a->type, K);
    for (int64_t g = G * ith / nth; g < G * (ith + 1) / nth; g++) {
        const void *rows[8];
        for (int k = 0; k < 8; k++) rows[k] = (const char *)a->w->data + (8 * g + k) * a->w->nb[1];
        pi_traits(a->type)->repack8(K, rows, a->dst + g * group_bytes);
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
