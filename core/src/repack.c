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

pi_status pi_repack(const pi_tensor *w, void *dst, int64_t dst_bytes, pi_tensor *out) {
    if (!w || !dst || !out) return pi_fail(PI_ERR_INVALID_ARG, "repack: NULL argument");
    pi_status st = pi_check_tensor(w, "repack w");
    if (st != PI_OK) return st;
    const int64_t bytes = pi_repack_bytes(w);
    if (bytes == 0)
        return pi_fail(PI_ERR_UNSUPPORTED, "repack: no interleaved layout for this %s tensor on this CPU",
                       pi_type_name(w->type));
    if (dst_bytes < bytes) return pi_fail(PI_ERR_INVALID_ARG, "repack: dst holds %lld bytes, %lld needed",
                                          (long long)dst_bytes, (long long)bytes);
    const int32_t type = pi_traits(w->type)->repacked_type;
    const int64_t K = w->ne[0], group_bytes = 8 * pi_row_bytes(type, K);
    for (int64_t g = 0; g < w->ne[1] / 8; g++) {
        const void *rows[8];
        for (int k = 0; k < 8; k++) rows[k] = (const char *)w->data + (8 * g + k) * w->nb[1];
        pi_traits(type)->repack8(K, rows, (char *)dst + g * group_bytes);
    }
    *out = pi_tensor_view(type, dst, 2, w->ne);
    return PI_OK;
}
