/* host_ops.cu: the public pi_cuda_op_* test entry points (powerinfer_cuda.h). Each checks its host
 * arguments like its CPU twin, copies them to the device (rows packed contiguously), runs the device
 * op, copies the result back and synchronizes. Device memory is freed on every path. */
#include "common.cuh"

#include <stdlib.h>

namespace {

/* A device buffer freed at scope exit. */
struct DevBuf {
    void *p = nullptr;
    DevBuf() = default;
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;
    ~DevBuf() { pi_cuda_free(p); }
    pi_status alloc(size_t bytes) { return pi_cuda_malloc(&p, bytes ? bytes : 1); }
};

bool contiguous(const pi_tensor *t) {
    return t->nb[1] == pi_row_bytes(t->type, t->ne[0]) && t->nb[2] == t->nb[1] * t->ne[1] &&
           t->nb[3] == t->nb[2] * t->ne[2];
}

size_t packed_bytes(const pi_tensor *t) { return (size_t)(pi_row_bytes(t->type, t->ne[0]) * pi_rows(t)); }

const char *host_row(const pi_tensor *t, int64_t r) {
    const int64_t i1 = r % t->ne[1], i2 = (r / t->ne[1]) % t->ne[2], i3 = r / (t->ne[1] * t->ne[2]);
    return (const char *)t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

/* Copies a host view to a new packed device buffer; *dev becomes the device view. */
pi_status upload(const pi_tensor *h, DevBuf &buf, pi_tensor *dev) {
    const size_t bytes = packed_bytes(h);
    PI_TRY(buf.alloc(bytes));
    *dev = pi_tensor_view(h->type, buf.p, h->n_dims, h->ne);
    if (contiguous(h)) return pi_cuda_upload(NULL, buf.p, h->data, bytes);
    const size_t rb = (size_t)pi_row_bytes(h->type, h->ne[0]);
    char *stage = (char *)malloc(bytes);
    if (!stage) return pi_fail(PI_ERR_OUT_OF_MEMORY, "GPU op: out of host memory");
    for (int64_t r = 0; r < pi_rows(h); r++) memcpy(stage + r * rb, host_row(h, r), rb);
    pi_status st = pi_cuda_upload(NULL, buf.p, stage, bytes);
    if (st == PI_OK) st = pi_cuda_stream_sync(NULL);
    free(stage);
    return st;
}

pi_status alloc_like(const pi_tensor *h, DevBuf &buf, pi_tensor *dev) {
    PI_TRY(buf.alloc(packed_bytes(h)));
    *dev = pi_tensor_view(h->type, buf.p, h->n_dims, h->ne);
    return PI_OK;
}

/* Copies a packed device tensor back into the (possibly strided) host view and synchronizes. */
pi_status download(const pi_tensor *dev, pi_tensor *h) {
    const size_t bytes = packed_bytes(h);
    if (contiguous(h)) {
        PI_TRY(pi_cuda_download(NULL, h->data, dev->data, bytes));
        return pi_cuda_stream_sync(NULL);
    }
    const size_t rb = (size_t)pi_row_bytes(h->type, h->ne[0]);
    char *stage = (char *)malloc(bytes);
    if (!stage) return pi_fail(PI_ERR_OUT_OF_MEMORY, "GPU op: out of host memory");
    pi_status st = pi_cuda_download(NULL, stage, dev->data, bytes);
    if (st == PI_OK) st = pi_cuda_stream_sync(NULL);
    if (st == PI_OK)
        for (int64_t r = 0; r < pi_rows(h); r++) memcpy((char *)host_row(h, r), stage + r * rb, rb);
    free(stage);
    return st;
}

pi_status upload_i32(const int32_t *src, int64_t n, DevBuf &buf) {
    PI_TRY(buf.alloc((size_t)n * sizeof(int32_t)));
    return pi_cuda_upload(NULL, buf.p, src, (size_t)n * sizeof(int32_t));
}

/* ---- argument checks (the CPU ops' rules) ---- */

pi_status need_device(const char *what) {
    if (pi_cuda_available() == 0) return pi_fail(PI_ERR_UNSUPPORTED, "%s: no GPU device", what);
    return PI_OK;
}

pi_status check_f32(const pi_tensor *t, const char *what) {
    PI_TRY(pi_check_tensor(t, what));
    if (t->type != PI_TYPE_F32) return pi_fail(PI_ERR_INVALID_ARG, "%s: must be f32, got %s", what, pi_type_name(t->type));
    return PI_OK;
}

pi_status check_2d_f32(const pi_tensor *t, int64_t ne0, int64_t ne1, const char *what) {
    PI_TRY(check_f32(t, what));
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] * t->ne[3] != 1)
        return pi_fail(PI_ERR_INVALID_ARG, "%s: shape must be [%lld, %lld]", what, (long long)ne0, (long long)ne1);
    return PI_OK;
}

pi_status check_same_shape(const pi_tensor *a, const pi_tensor *b, const char *what) {
    for (int i = 0; i < 4; i++)
        if (a->ne[i] != b->ne[i])
            return pi_fail(PI_ERR_INVALID_ARG, "%s: shape mismatch in dim %d (%lld vs %lld)", what, i,
                           (long long)a->ne[i], (long long)b->ne[i]);
    return PI_OK;
}

pi_status check_weight(const pi_tensor *t, int64_t ne0, int64_t ne1, const char *what) {
    PI_TRY(pi_check_tensor(t, what));
    if (!pi_cuda_type_supported(t->type))
        return pi_fail(PI_ERR_UNSUPPORTED, "%s: the GPU backend has no kernels for type %s yet", what,
                       pi_type_name(t->type));
    if (t->ne[0] != ne0 || (ne1 >= 0 && t->ne[1] != ne1) || t->ne[2] * t->ne[3] != 1)
        return pi_fail(PI_ERR_INVALID_ARG, "%s: shape [%lld, %lld], expected [%lld, %lld]", what, (long long)t->ne[0],
                       (long long)t->ne[1], (long long)ne0, (long long)ne1);
    return PI_OK;
}

pi_status check_bucket(const int32_t *bucket, int64_t k, int64_t n, const char *what) {
    if (!bucket) {
        if (k != n) return pi_fail(PI_ERR_INVALID_ARG, "%s: without a bucket the hot rows must be all %lld rows",
                                   what, (long long)n);
        return PI_OK;
    }
    for (int64_t j = 0; j < k; j++) {
        if (bucket[j] < 0 || bucket[j] >= n)
            return pi_fail(PI_ERR_INVALID_ARG, "%s: bucket[%lld] = %d is out of range [0, %lld)", what, (long long)j,
                           bucket[j], (long long)n);
        if (j && bucket[j] <= bucket[j - 1])
            return pi_fail(PI_ERR_INVALID_ARG, "%s: bucket must be strictly ascending (bucket[%lld] = %d after %d)",
                           what, (long long)j, bucket[j], bucket[j - 1]);
    }
    return PI_OK;
}

pi_status check_ffn_args(const pi_sparse_ffn_weights *w, int32_t act, int32_t gate_mode, const pi_tensor *x,
                         const pi_tensor *scores, float threshold, const pi_tensor *out, int64_t k, int64_t n_ff,
                         const char *what) {
    if (!w) return pi_fail(PI_ERR_INVALID_ARG, "%s: weights are NULL", what);
    if (w->up_bias || w->down_bias)
        return pi_fail(PI_ERR_UNSUPPORTED, "%s: FFN biases (opt) are not supported on the GPU yet", what);
    PI_TRY(pi_check_tensor(x, what));
    const int64_t E = x->ne[0], T = x->ne[1];
    if (gate_mode < PI_FFN_PAR || gate_mode > PI_FFN_SEQ)
        return pi_fail(PI_ERR_INVALID_ARG, "%s: unknown gate mode %d", what, gate_mode);
    if (gate_mode != PI_FFN_SEQ) PI_TRY(check_weight(&w->gate, E, k, "sparse_ffn gate"));
    PI_TRY(check_weight(&w->up, E, k, "sparse_ffn up"));
    PI_TRY(check_weight(&w->down_t, E, k, "sparse_ffn down_t"));
    PI_TRY(check_2d_f32(x, E, T, "sparse_ffn x"));
    PI_TRY(check_2d_f32(scores, n_ff, T, "sparse_ffn scores"));
    PI_TRY(check_2d_f32(out, E, T, "sparse_ffn out"));
    if (out->data == x->data) return pi_fail(PI_ERR_INVALID_ARG, "%s: out must not alias x", what);
    if (act < PI_ACT_SILU || act > PI_ACT_GELU) return pi_fail(PI_ERR_INVALID_ARG, "%s: unknown activation %d", what, act);
    if (isnan(threshold)) return pi_fail(PI_ERR_INVALID_ARG, "%s: threshold is NaN", what);
    return PI_OK;
}

pi_status run_sparse_ffn(const pi_sparse_ffn_weights *w, const int32_t *bucket, int32_t act, int32_t gate_mode,
                         const pi_tensor *x, const pi_tensor *scores, float threshold, pi_tensor *out,
                         int64_t *n_active) {
    const int64_t E = x->ne[0], T = x->ne[1], k = w->up.ne[1];
    DevBuf bg, bu, bd, bx, bs, bo, bb, bsc, bcnt;
    pi_sparse_ffn_weights dw;
    memset(&dw, 0, sizeof dw);
    if (gate_mode != PI_FFN_SEQ) PI_TRY(upload(&w->gate, bg, &dw.gate));
    PI_TRY(upload(&w->up, bu, &dw.up));
    PI_TRY(upload(&w->down_t, bd, &dw.down_t));
    pi_tensor dx, ds, dout;
    PI_TRY(upload(x, bx, &dx));
    PI_TRY(upload(scores, bs, &ds));
    PI_TRY(alloc_like(out, bo, &dout));
    if (bucket) PI_TRY(upload_i32(bucket, k, bb));
    PI_TRY(bsc.alloc(pi_cuda_sparse_ffn_scratch(&dw, E, k, T)));
    PI_TRY(bcnt.alloc(sizeof(uint64_t)));
    PI_TRY(pi_cuda_memset(NULL, bcnt.p, 0, sizeof(uint64_t)));
    PI_TRY(pi_cuda_sparse_ffn(NULL, &dw, (const int32_t *)bb.p, act, gate_mode, &dx, &ds, threshold, &dout,
                              (uint64_t *)bcnt.p, bsc.p));
    uint64_t cnt = 0;
    PI_TRY(pi_cuda_download(NULL, &cnt, bcnt.p, sizeof cnt));
    PI_TRY(download(&dout, out));
    if (n_active) *n_active = (int64_t)cnt;
    return PI_OK;
}

}  // namespace

/* ---- entry points ---- */

pi_status pi_cuda_op_get_rows(const pi_tensor *table, const int32_t *ids, int64_t n, pi_tensor *out) {
    PI_TRY(need_device("cuda get_rows"));
    PI_TRY(pi_check_tensor(table, "get_rows table"));
    PI_TRY(check_f32(out, "get_rows out"));
    if (!ids) return pi_fail(PI_ERR_INVALID_ARG, "get_rows: ids is NULL");
    if (!pi_cuda_type_supported(table->type))
        return pi_fail(PI_ERR_UNSUPPORTED, "get_rows: no GPU kernels for type %s", pi_type_name(table->type));
    if (table->ne[2] * table->ne[3] != 1 || out->ne[2] * out->ne[3] != 1)
        return pi_fail(PI_ERR_INVALID_ARG, "get_rows: table and out must be 2-d");
    if (out->ne[0] != table->ne[0] || out->ne[1] != n || n < 1)
        return pi_fail(PI_ERR_INVALID_ARG, "get_rows: out must be [%lld, %lld]", (long long)table->ne[0], (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= table->ne[1])
            return pi_fail(PI_ERR_INVALID_ARG, "get_rows: id %d at %lld is out of range [0, %lld)", ids[i],
                           (long long)i, (long long)table->ne[1]);
    DevBuf bt, bi, bo;
    pi_tensor dt, dout;
    PI_TRY(upload(table, bt, &dt));
    PI_TRY(upload_i32(ids, n, bi));
    PI_TRY(alloc_like(out, bo, &dout));
    PI_TRY(pi_cuda_get_rows(NULL, &dt, (const int32_t *)bi.p, n, &dout));
    return download(&dout, out);
}

pi_status pi_cuda_op_set_rows(pi_tensor *dst, const pi_tensor *src, const int32_t *rows) {
    PI_TRY(need_device("cuda set_rows"));
    PI_TRY(pi_check_tensor(dst, "set_rows dst"));
    PI_TRY(check_f32(src, "set_rows src"));
    if (!rows) return pi_fail(PI_ERR_INVALID_ARG, "set_rows: rows is NULL");
    if (dst->type != PI_TYPE_F32 && dst->type != PI_TYPE_F16 && dst->type != PI_TYPE_BF16)
        return pi_fail(PI_ERR_UNSUPPORTED, "set_rows: destination type %s (f32, f16, bf16)", pi_type_name(dst->type));
    if (dst->ne[2] * dst->ne[3] != 1 || src->ne[2] * src->ne[3] != 1 || dst->ne[0] != src->ne[0])
        return pi_fail(PI_ERR_INVALID_ARG, "set_rows: dst [%lld, n] and src [%lld, T] must be 2-d with equal rows",
                       (long long)dst->ne[0], (long long)src->ne[0]);
    for (int64_t t = 0; t < src->ne[1]; t++)
        if (rows[t] < 0 || rows[t] >= dst->ne[1])
            return pi_fail(PI_ERR_INVALID_ARG, "set_rows: row %d at %lld is out of range [0, %lld)", rows[t],
                           (long long)t, (long long)dst->ne[1]);
    DevBuf bd, bs, br;
    pi_tensor dd, ds;
    PI_TRY(upload(dst, bd, &dd));
    PI_TRY(upload(src, bs, &ds));
    PI_TRY(upload_i32(rows, src->ne[1], br));
    PI_TRY(pi_cuda_set_rows(NULL, &dd, &ds, (const int32_t *)br.p));
    return download(&dd, dst);
}

pi_status pi_cuda_op_mul_mat(const pi_tensor *w, const pi_tensor *x, pi_tensor *y) {
    PI_TRY(need_device("cuda mul_mat"));
    PI_TRY(pi_check_tensor(w, "mul_mat w"));
    PI_TRY(check_f32(x, "mul_mat x"));
    PI_TRY(check_f32(y, "mul_mat y"));
    PI_TRY(check_weight(w, w->ne[0], w->ne[1], "mul_mat w"));
    if (x->ne[2] * x->ne[3] != 1 || y->ne[2] * y->ne[3] != 1)
        return pi_fail(PI_ERR_INVALID_ARG, "mul_mat: only 2-d operands are supported");
    if (x->ne[0] != w->ne[0] || y->ne[0] != w->ne[1] || y->ne[1] != x->ne[1])
        return pi_fail(PI_ERR_INVALID_ARG, "mul_mat: shapes w [%lld, %lld], x [%lld, %lld], y [%lld, %lld] do not fit",
                       (long long)w->ne[0], (long long)w->ne[1], (long long)x->ne[0], (long long)x->ne[1],
                       (long long)y->ne[0], (long long)y->ne[1]);
    DevBuf bw, bx, by, bs;
    pi_tensor dw, dx, dy;
    PI_TRY(upload(w, bw, &dw));
    PI_TRY(upload(x, bx, &dx));
    PI_TRY(alloc_like(y, by, &dy));
    PI_TRY(bs.alloc(pi_cuda_mul_mat_scratch(w->type, w->ne[0], x->ne[1])));
    PI_TRY(pi_cuda_mul_mat(NULL, &dw, &dx, &dy, bs.p));
    return download(&dy, y);
}

pi_status pi_cuda_op_rms_norm(const pi_tensor *x, const pi_tensor *weight, float eps, pi_tensor *out) {
    PI_TRY(need_device("cuda rms_norm"));
    PI_TRY(check_f32(x, "rms_norm x"));
    PI_TRY(check_f32(out, "rms_norm out"));
    PI_TRY(check_same_shape(x, out, "rms_norm"));
    if (weight) {
        PI_TRY(check_f32(weight, "rms_norm weight"));
        if (weight->ne[0] != x->ne[0] || pi_nelements(weight) != weight->ne[0])
            return pi_fail(PI_ERR_INVALID_ARG, "rms_norm: weight must be [%lld]", (long long)x->ne[0]);
    }
    if (!(eps >= 0.0f)) return pi_fail(PI_ERR_INVALID_ARG, "rms_norm: eps must be >= 0");
    DevBuf bx, bw, bo;
    pi_tensor dx, dw, dout;
    PI_TRY(upload(x, bx, &dx));
    if (weight) PI_TRY(upload(weight, bw, &dw));
    PI_TRY(alloc_like(out, bo, &dout));
    PI_TRY(pi_cuda_rms_norm(NULL, &dx, weight ? &dw : NULL, eps, &dout));
    return download(&dout, out);
}

pi_status pi_cuda_op_rope(const pi_tensor *x, const int32_t *pos, int32_t n_rot, int32_t mode, float freq_base,
                          float freq_scale, pi_tensor *out) {
    PI_TRY(need_device("cuda rope"));
    PI_TRY(check_f32(x, "rope x"));
    PI_TRY(check_f32(out, "rope out"));
    PI_TRY(check_same_shape(x, out, "rope"));
    if (!pos) return pi_fail(PI_ERR_INVALID_ARG, "rope: pos is NULL");
    if (x->ne[3] != 1) return pi_fail(PI_ERR_INVALID_ARG, "rope: x must be [head_dim, n_head, T] (3-d at most)");
    if (n_rot <= 0 || n_rot % 2 || n_rot > x->ne[0])
        return pi_fail(PI_ERR_INVALID_ARG, "rope: n_rot = %d must be even and in (0, %lld]", n_rot, (long long)x->ne[0]);
    if (!(freq_base > 0.0f) || !(freq_scale > 0.0f))
        return pi_fail(PI_ERR_INVALID_ARG, "rope: freq_base and freq_scale must be > 0");
    if (mode != PI_ROPE_NORMAL && mode != PI_ROPE_NEOX)
        return pi_fail(PI_ERR_INVALID_ARG, "rope: mode %d is not PI_ROPE_NORMAL (0) or PI_ROPE_NEOX (2)", mode);
    DevBuf bx, bp, bo;
    pi_tensor dx, dout;
    PI_TRY(upload(x, bx, &dx));
    PI_TRY(upload_i32(pos, x->ne[2], bp));
    PI_TRY(alloc_like(out, bo, &dout));
    PI_TRY(pi_cuda_rope(NULL, &dx, (const int32_t *)bp.p, n_rot, mode, freq_base, freq_scale, 1.0f, &dout));
    return download(&dout, out);
}

pi_status pi_cuda_op_softmax(const pi_tensor *x, pi_tensor *out) {
    PI_TRY(need_device("cuda softmax"));
    PI_TRY(check_f32(x, "softmax x"));
    PI_TRY(check_f32(out, "softmax out"));
    PI_TRY(check_same_shape(x, out, "softmax"));
    DevBuf bx, bo;
    pi_tensor dx, dout;
    PI_TRY(upload(x, bx, &dx));
    PI_TRY(alloc_like(out, bo, &dout));
    PI_TRY(pi_cuda_softmax(NULL, &dx, &dout));
    return download(&dout, out);
}

pi_status pi_cuda_op_unary(int32_t op, const pi_tensor *x, pi_tensor *out) {
    PI_TRY(need_device("cuda unary"));
    PI_TRY(check_f32(x, "unary x"));
    PI_TRY(check_f32(out, "unary out"));
    PI_TRY(check_same_shape(x, out, "unary"));
    if (op != PI_UNARY_SILU && op != PI_UNARY_RELU && op != PI_UNARY_GELU)
        return pi_fail(PI_ERR_INVALID_ARG, "unary: unknown op %d", op);
    DevBuf bx, bo;
    pi_tensor dx, dout;
    PI_TRY(upload(x, bx, &dx));
    PI_TRY(alloc_like(out, bo, &dout));
    PI_TRY(pi_cuda_unary(NULL, op, &dx, &dout));
    return download(&dout, out);
}

pi_status pi_cuda_op_binary(int32_t op, const pi_tensor *a, const pi_tensor *b, pi_tensor *out) {
    PI_TRY(need_device("cuda binary"));
    PI_TRY(check_f32(a, "binary a"));
    PI_TRY(check_f32(b, "binary b"));
    PI_TRY(check_f32(out, "binary out"));
    PI_TRY(check_same_shape(a, out, "binary"));
    if (op != PI_BINARY_ADD && op != PI_BINARY_MUL) return pi_fail(PI_ERR_INVALID_ARG, "binary: unknown op %d", op);
    for (int i = 0; i < 4; i++)
        if (b->ne[i] != 1 && b->ne[i] != a->ne[i])
            return pi_fail(PI_ERR_INVALID_ARG, "binary: b dim %d (%lld) neither 1 nor %lld", i, (long long)b->ne[i],
                           (long long)a->ne[i]);
    DevBuf ba, bb, bo;
    pi_tensor da, db, dout;
    PI_TRY(upload(a, ba, &da));
    PI_TRY(upload(b, bb, &db));
    PI_TRY(alloc_like(out, bo, &dout));
    PI_TRY(pi_cuda_binary(NULL, op, &da, &db, &dout));
    return download(&dout, out);
}

pi_status pi_cuda_op_attention(const pi_tensor *q, const pi_tensor *k, const pi_tensor *v, const pi_tensor *mask,
                               float scale, pi_tensor *out) {
    return pi_cuda_op_attention_softcap(q, k, v, mask, scale, 0.0f, out);
}

pi_status pi_cuda_op_attention_softcap(const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                                       const pi_tensor *mask, float scale, float softcap, pi_tensor *out) {
    return pi_cuda_op_attention_sinks(q, k, v, mask, scale, softcap, NULL, out);
}

pi_status pi_cuda_op_attention_sinks(const pi_tensor *q, const pi_tensor *k, const pi_tensor *v,
                                     const pi_tensor *mask, float scale, float softcap, const pi_tensor *sinks,
                                     pi_tensor *out) {
    PI_TRY(need_device("cuda attention"));
    PI_TRY(check_f32(q, "attention q"));
    PI_TRY(pi_check_tensor(k, "attention k"));
    PI_TRY(pi_check_tensor(v, "attention v"));
    PI_TRY(check_f32(out, "attention out"));
    PI_TRY(check_same_shape(q, out, "attention q/out"));
    PI_TRY(check_same_shape(k, v, "attention k/v"));
    if ((k->type != PI_TYPE_F32 && k->type != PI_TYPE_F16) || (v->type != PI_TYPE_F32 && v->type != PI_TYPE_F16))
        return pi_fail(PI_ERR_UNSUPPORTED, "attention: k and v must be f32 or f16");
    if (k->ne[0] != q->ne[0] || q->ne[3] != 1 || k->ne[3] != 1)
        return pi_fail(PI_ERR_INVALID_ARG, "attention: head_dim of q (%lld) and k (%lld) differ", (long long)q->ne[0],
                       (long long)k->ne[0]);
    if (q->ne[1] % k->ne[1] != 0)
        return pi_fail(PI_ERR_INVALID_ARG, "attention: %lld query heads is not a multiple of %lld kv heads",
                       (long long)q->ne[1], (long long)k->ne[1]);
    if (mask) {
        PI_TRY(check_f32(mask, "attention mask"));
        if (mask->ne[0] != k->ne[2] || mask->ne[1] != q->ne[2])
            return pi_fail(PI_ERR_INVALID_ARG, "attention: mask must be [%lld, %lld]", (long long)k->ne[2],
                           (long long)q->ne[2]);
    }
    if (!isfinite(scale)) return pi_fail(PI_ERR_INVALID_ARG, "attention: scale must be finite");
    if (!(softcap >= 0.0f && softcap < INFINITY))
        return pi_fail(PI_ERR_INVALID_ARG, "attention: softcap %g must be finite and >= 0 (0: none)", (double)softcap);
    if (sinks) {
        PI_TRY(check_f32(sinks, "attention sinks"));
        if (sinks->ne[0] != q->ne[1] || sinks->ne[1] * sinks->ne[2] * sinks->ne[3] != 1)
            return pi_fail(PI_ERR_INVALID_ARG, "attention: sinks must be [%lld] (one per query head)",
                           (long long)q->ne[1]);
    }
    DevBuf bq, bk, bv, bm, bo, bs, bsk;
    pi_tensor dq, dk, dv, dm, dout, dsk;
    PI_TRY(upload(q, bq, &dq));
    PI_TRY(upload(k, bk, &dk));
    PI_TRY(upload(v, bv, &dv));
    if (mask) PI_TRY(upload(mask, bm, &dm));
    if (sinks) PI_TRY(upload(sinks, bsk, &dsk));
    PI_TRY(alloc_like(out, bo, &dout));
    PI_TRY(bs.alloc(pi_cuda_attention_scratch(q->ne[1], q->ne[2], k->ne[2])));
    PI_TRY(pi_cuda_attention(NULL, &dq, &dk, &dv, mask ? &dm : NULL, scale, softcap,
                             sinks ? (const float *)dsk.data : NULL, &dout, bs.p));
    return download(&dout, out);
}

pi_status pi_cuda_op_predictor(const pi_tensor *fc1, const pi_tensor *fc2, const pi_tensor *x, pi_tensor *scores) {
    PI_TRY(need_device("cuda predictor"));
    PI_TRY(pi_check_tensor(x, "predictor x"));
    PI_TRY(pi_check_tensor(fc1, "predictor fc1"));
    PI_TRY(pi_check_tensor(fc2, "predictor fc2"));
    const int64_t E = x->ne[0], T = x->ne[1], r = fc1->ne[1];
    PI_TRY(check_2d_f32(x, E, T, "predictor x"));
    PI_TRY(check_weight(fc1, E, r, "predictor fc1"));
    PI_TRY(check_weight(fc2, r, fc2->ne[1], "predictor fc2"));
    PI_TRY(check_2d_f32(scores, fc2->ne[1], T, "predictor scores"));
    DevBuf b1, b2, bx, bs, bsc;
    pi_tensor d1, d2, dx, ds;
    PI_TRY(upload(fc1, b1, &d1));
    PI_TRY(upload(fc2, b2, &d2));
    PI_TRY(upload(x, bx, &dx));
    PI_TRY(alloc_like(scores, bs, &ds));
    PI_TRY(bsc.alloc(pi_cuda_predictor_scratch(&d1, &d2, T)));
    PI_TRY(pi_cuda_predictor(NULL, &d1, &d2, &dx, &ds, bsc.p));
    return download(&ds, scores);
}

pi_status pi_cuda_op_sparse_ffn(const pi_sparse_ffn_weights *w, int32_t act, int32_t gate_mode, const pi_tensor *x,
                                const pi_tensor *scores, float threshold, pi_tensor *out, int64_t *n_active) {
    PI_TRY(need_device("cuda sparse_ffn"));
    if (!w) return pi_fail(PI_ERR_INVALID_ARG, "sparse_ffn: weights are NULL");
    PI_TRY(pi_check_tensor(&w->up, "sparse_ffn up"));
    const int64_t F = w->up.ne[1];
    PI_TRY(check_ffn_args(w, act, gate_mode, x, scores, threshold, out, F, F, "sparse_ffn"));
    return run_sparse_ffn(w, NULL, act, gate_mode, x, scores, threshold, out, n_active);
}

pi_status pi_cuda_op_sparse_ffn_hot(const pi_sparse_ffn_weights *w_hot, const int32_t *bucket, int64_t n_ff,
                                    int32_t act, int32_t gate_mode, const pi_tensor *x, const pi_tensor *scores,
                                    float threshold, pi_tensor *out, int64_t *n_active) {
    PI_TRY(need_device("cuda sparse_ffn_hot"));
    if (!w_hot) return pi_fail(PI_ERR_INVALID_ARG, "sparse_ffn_hot: weights are NULL");
    PI_TRY(pi_check_tensor(&w_hot->up, "sparse_ffn_hot up"));
    const int64_t k = w_hot->up.ne[1];
    if (n_ff < k) return pi_fail(PI_ERR_INVALID_ARG, "sparse_ffn_hot: %lld hot rows but n_ff = %lld", (long long)k,
                                 (long long)n_ff);
    PI_TRY(check_ffn_args(w_hot, act, gate_mode, x, scores, threshold, out, k, n_ff, "sparse_ffn_hot"));
    PI_TRY(check_bucket(bucket, k, n_ff, "sparse_ffn_hot"));
    return run_sparse_ffn(w_hot, bucket, act, gate_mode, x, scores, threshold, out, n_active);
}

pi_status pi_cuda_op_mul_mat_sparse(const pi_tensor *w_hot, const int32_t *bucket, const pi_tensor *x,
                                    const pi_tensor *scores, float threshold, pi_tensor *y) {
    PI_TRY(need_device("cuda mul_mat_sparse"));
    PI_TRY(pi_check_tensor(w_hot, "mul_mat_sparse w"));
    PI_TRY(pi_check_tensor(x, "mul_mat_sparse x"));
    PI_TRY(pi_check_tensor(y, "mul_mat_sparse y"));
    const int64_t K = w_hot->ne[0], k = w_hot->ne[1], T = x->ne[1], N = y->ne[0];
    PI_TRY(check_weight(w_hot, K, k, "mul_mat_sparse w"));
    PI_TRY(check_2d_f32(x, K, T, "mul_mat_sparse x"));
    PI_TRY(check_2d_f32(y, N, T, "mul_mat_sparse y"));
    if (scores) PI_TRY(check_2d_f32(scores, N, T, "mul_mat_sparse scores"));
    PI_TRY(check_bucket(bucket, k, N, "mul_mat_sparse"));
    if (isnan(threshold)) return pi_fail(PI_ERR_INVALID_ARG, "mul_mat_sparse: threshold is NaN");
    DevBuf bw, bx, by, bs, bb, bsc;
    pi_tensor dw, dx, dy, ds;
    PI_TRY(upload(w_hot, bw, &dw));
    PI_TRY(upload(x, bx, &dx));
    PI_TRY(upload(y, by, &dy));   /* rows outside the bucket keep their values */
    if (scores) PI_TRY(upload(scores, bs, &ds));
    if (bucket) PI_TRY(upload_i32(bucket, k, bb));
    PI_TRY(bsc.alloc(pi_cuda_mul_mat_scratch(w_hot->type, K, T)));
    PI_TRY(pi_cuda_mul_mat_ex(NULL, &dw, &dx, &dy, (const int32_t *)bb.p, scores ? &ds : NULL, threshold, 0, bsc.p));
    return download(&dy, y);
}

pi_status pi_cuda_op_axpy_sparse(const pi_tensor *down_hot, const int32_t *bucket, const pi_tensor *h,
                                 const pi_tensor *scores, float threshold, pi_tensor *out) {
    PI_TRY(need_device("cuda axpy_sparse"));
    PI_TRY(pi_check_tensor(down_hot, "axpy_sparse down"));
    PI_TRY(pi_check_tensor(h, "axpy_sparse h"));
    const int64_t E = down_hot->ne[0], k = down_hot->ne[1], N = h->ne[0], T = h->ne[1];
    PI_TRY(check_weight(down_hot, E, k, "axpy_sparse down"));
    PI_TRY(check_2d_f32(h, N, T, "axpy_sparse h"));
    if (scores) PI_TRY(check_2d_f32(scores, N, T, "axpy_sparse scores"));
    PI_TRY(check_2d_f32(out, E, T, "axpy_sparse out"));
    PI_TRY(check_bucket(bucket, k, N, "axpy_sparse"));
    if (isnan(threshold)) return pi_fail(PI_ERR_INVALID_ARG, "axpy_sparse: threshold is NaN");
    DevBuf bd, bh, bs, bo, bb, bsc;
    pi_tensor dd, dh, ds, dout;
    PI_TRY(upload(down_hot, bd, &dd));
    PI_TRY(upload(h, bh, &dh));
    if (scores) PI_TRY(upload(scores, bs, &ds));
    PI_TRY(alloc_like(out, bo, &dout));
    if (bucket) PI_TRY(upload_i32(bucket, k, bb));
    PI_TRY(bsc.alloc(pi_cuda_axpy_sparse_scratch(E, k, T)));
    PI_TRY(pi_cuda_axpy_sparse(NULL, &dd, (const int32_t *)bb.p, &dh, scores ? &ds : NULL, threshold, &dout, bsc.p));
    return download(&dout, out);
}
