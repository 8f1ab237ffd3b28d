/* tensor.c: helpers for pi_tensor views. */
#include "internal.h"

int64_t pi_nelements(const pi_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < PI_MAX_DIMS; i++) n *= t->ne[i];
    return n;
}

pi_tensor pi_tensor_view(int32_t type, void *data, int n_dims, const int64_t *ne) {
    pi_tensor t = { .type = type, .n_dims = n_dims, .data = data };
    for (int i = 0; i < PI_MAX_DIMS; i++) t.ne[i] = i < n_dims ? ne[i] : 1;
    t.nb[0] = pi_type_block_bytes(type);
    t.nb[1] = pi_row_bytes(type, t.ne[0]);
    for (int i = 2; i < PI_MAX_DIMS; i++) t.nb[i] = t.nb[i - 1] * t.ne[i - 1];
    return t;
}

bool pi_is_contiguous_rows(const pi_tensor *t) { return t->nb[0] == pi_type_block_bytes(t->type); }

/* Validates a caller-supplied view: known type, sane dims, non-NULL data, rows of whole blocks. */
pi_status pi_check_tensor(const pi_tensor *t, const char *what) {
    if (!t) return pi_fail(PI_ERR_INVALID_ARG, "%s: tensor is NULL", what);
    if (!t->data) return pi_fail(PI_ERR_INVALID_ARG, "%s: tensor data is NULL", what);
    if (t->type != PI_TYPE_I32 && !pi_traits(t->type))
        return pi_fail(PI_ERR_UNSUPPORTED, "%s: unsupported tensor type id %d", what, (int)t->type);
    if (t->n_dims < 1 || t->n_dims > PI_MAX_DIMS)
        return pi_fail(PI_ERR_INVALID_ARG, "%s: n_dims = %d, must be 1..4", what, (int)t->n_dims);
    int64_t n = 1;
    for (int i = 0; i < PI_MAX_DIMS; i++) {
        if (t->ne[i] < 1 || t->ne[i] > ((int64_t)1 << 40))
            return pi_fail(PI_ERR_INVALID_ARG, "%s: ne[%d] = %lld is out of range", what, i, (long long)t->ne[i]);
        if (i >= t->n_dims && t->ne[i] != 1)
            return pi_fail(PI_ERR_INVALID_ARG, "%s: ne[%d] must be 1 for a %d-d tensor", what, i, (int)t->n_dims);
        if (t->ne[i] > ((int64_t)1 << 46) / n)   /* keeps element counts and byte offsets far from overflow */
            return pi_fail(PI_ERR_INVALID_ARG, "%s: too many elements (more than 2^46)", what);
        n *= t->ne[i];
    }
    if (pi_row_bytes(t->type, t->ne[0]) < 0)
        return pi_fail(PI_ERR_INVALID_ARG, "%s: row length %lld is not a multiple of the %s block size",
                       what, (long long)t->ne[0], pi_type_name(t->type));
    if (!pi_is_contiguous_rows(t))   /* every kernel reads dim 0 as one contiguous run of blocks */
        return pi_fail(PI_ERR_INVALID_ARG, "%s: rows must be contiguous (nb[0] = %lld, expected %lld for %s)", what,
                       (long long)t->nb[0], (long long)pi_type_block_bytes(t->type), pi_type_name(t->type));
    return PI_OK;
}
