/* recurrent.c: recurrent layers' per-sequence state (recurrent.h), and the sequence operations' rules for it
 * (llama.cpp's recurrent memory: a state cannot drop positions it has absorbed). */
#include "recurrent.h"

#include <stdlib.h>
#include <string.h>

pi_status pi_rs_create(pi_context *ctx) {
    const pi_model *m = ctx->model;
    const pi_hparams *hp = &m->hp;
    int32_t n = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) n += m->geom[il].recurrent != 0;
    ctx->rs = NULL;
    if (n == 0) return PI_OK;
    pi_rs *rs = calloc(1, sizeof *rs);
    if (!rs) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    /* gated delta nets: 2 H_k S + H_v S conv channels and H_v [S, S]; LFM2's short convs: n_embd and no matrix */
    const int64_t S = hp->ssm_d_state;
    const int64_t C = hp->shortconv ? hp->n_embd : 2 * (int64_t)hp->ssm_n_group * S + (int64_t)hp->ssm_dt_rank * S;
    rs->n_layer = n;
    rs->conv_rows = hp->ssm_d_conv - 1;
    rs->conv_cols = C;
    rs->mat_elems = hp->shortconv ? 0 : (int64_t)hp->ssm_dt_rank * S * S;
    rs->n_seq = ctx->params.n_seq_max;
    const size_t per = (size_t)n * (size_t)rs->n_seq;
    rs->index = malloc((size_t)hp->n_layer * sizeof *rs->index);
    rs->conv = calloc(2 * per * (size_t)PI_MAX(rs->conv_rows * C, 1), sizeof(float));
    rs->mat = calloc(2 * per * (size_t)PI_MAX(rs->mat_elems, 1), sizeof(float));   /* 0: a stub */
    rs->cur = calloc((size_t)rs->n_seq, 1);
    rs->pos = malloc((size_t)rs->n_seq * sizeof(int32_t));
    rs->pos_new = malloc((size_t)rs->n_seq * sizeof(int32_t));
    if (!rs->index || !rs->conv || !rs->mat || !rs->cur || !rs->pos || !rs->pos_new) {
        const double mib = (double)(rs->mat_elems + rs->conv_rows * C) * sizeof(float) / (1 << 20);
        pi_rs_free(rs);
        return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory for the recurrent state (%d layers x %d sequences x %.1f "
                       "MiB, twice)", n, ctx->params.n_seq_max, mib);
    }
    for (int32_t il = 0, r = 0; il < hp->n_layer; il++) rs->index[il] = m->geom[il].recurrent ? r++ : -1;
    for (int32_t s = 0; s < rs->n_seq; s++) rs->pos[s] = rs->pos_new[s] = -1;
    ctx->rs = rs;
    return PI_OK;
}

void pi_rs_free(pi_rs *rs) {
    if (!rs) return;
    free(rs->index);
    free(rs->conv);
    free(rs->mat);
    free(rs->cur);
    free(rs->pos);
    free(rs->pos_new);
    free(rs);
}

static size_t slot(const pi_rs *rs, int32_t il, int32_t seq, bool next) {
    const size_t copy = (size_t)(rs->cur[seq] ^ (next ? 1 : 0));
    return (copy * (size_t)rs->n_layer + (size_t)rs->index[il]) * (size_t)rs->n_seq + (size_t)seq;
}

float *pi_rs_conv(const pi_rs *rs, int32_t il, int32_t seq, bool next) {
    return rs->conv + slot(rs, il, seq, next) * (size_t)(rs->conv_rows * rs->conv_cols);
}

float *pi_rs_mat(const pi_rs *rs, int32_t il, int32_t seq, bool next) {
    return rs->mat + slot(rs, il, seq, next) * (size_t)rs->mat_elems;
}

pi_status pi_rs_begin(pi_rs *rs, const pi_batch *b) {
    for (int32_t s = 0; s < rs->n_seq; s++) rs->pos_new[s] = -1;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        const int32_t s = b->seq_id[i], p = b->pos[i];
        const int32_t last = rs->pos_new[s] >= 0 ? rs->pos_new[s] : rs->pos[s];
        if (p <= last) {
            for (int32_t t = 0; t < rs->n_seq; t++) rs->pos_new[t] = -1;
            return pi_fail(PI_ERR_INVALID_ARG, "pi_decode: token %d of sequence %d at position %d: the sequence's "
                           "recurrent state has absorbed the positions up to %d (a recurrent model cannot decode a "
                           "position again; remove the whole sequence first)", i, s, p, last);
        }
        rs->pos_new[s] = p;
    }
    return PI_OK;
}

void pi_rs_commit(pi_rs *rs) {
    for (int32_t s = 0; s < rs->n_seq; s++)
        if (rs->pos_new[s] >= 0) {
            rs->cur[s] ^= 1;
            rs->pos[s] = rs->pos_new[s];
            rs->pos_new[s] = -1;
        }
}

void pi_rs_reset(pi_rs *rs, int32_t seq) {
    const int32_t s0 = seq < 0 ? 0 : seq, s1 = seq < 0 ? rs->n_seq : seq + 1;
    for (int32_t s = s0; s < s1; s++) {
        if (rs->pos[s] < 0) continue;   /* empty already (its current copy zeros) */
        for (int32_t il = 0, r = 0; r < rs->n_layer; il++) {
            if (rs->index[il] < 0) continue;
            memset(pi_rs_conv(rs, il, s, false), 0, (size_t)(rs->conv_rows * rs->conv_cols) * sizeof(float));
            memset(pi_rs_mat(rs, il, s, false), 0, (size_t)rs->mat_elems * sizeof(float));
            r++;
        }
        rs->pos[s] = -1;
    }
}

/* Whether [p0, p1) covers every position up to `last` (the whole sequence as the state knows it). */
static bool covers(int32_t p0, int32_t p1, int32_t last) { return p0 <= 0 && (p1 < 0 || p1 > last); }

pi_status pi_rs_seq_rm(pi_rs *rs, int32_t seq, int32_t p0, int32_t p1) {
    const int32_t s0 = seq < 0 ? 0 : seq, s1 = seq < 0 ? rs->n_seq : seq + 1;
    for (int32_t s = s0; s < s1; s++) {   /* check all first: nothing changes on an error */
        const int32_t last = rs->pos[s];
        if (last < 0 || covers(p0, p1, last) || (p0 > last) || (p1 >= 0 && p1 <= p0)) continue;
        return pi_fail(PI_ERR_UNSUPPORTED, "cannot remove positions [%d, %d) of sequence %d: its recurrent state has "
                       "absorbed the positions up to %d and cannot drop them (remove the whole sequence and decode "
                       "it again)", p0, p1, s, last);
    }
    for (int32_t s = s0; s < s1; s++)
        if (rs->pos[s] >= 0 && covers(p0, p1, rs->pos[s])) pi_rs_reset(rs, s);
    return PI_OK;
}

pi_status pi_rs_seq_cp(pi_rs *rs, int32_t src, int32_t dst, int32_t p0, int32_t p1) {
    if (src == dst) return PI_OK;
    if (rs->pos[dst] >= 0)   /* its KV cells would stay beside the copied ones, its state would not */
        return pi_fail(PI_ERR_UNSUPPORTED, "cannot copy sequence %d into sequence %d: the destination has a recurrent "
                       "state of its own (positions up to %d); remove it first", src, dst, rs->pos[dst]);
    const int32_t last = rs->pos[src];
    if (last >= 0 && !covers(p0, p1, last))
        return pi_fail(PI_ERR_UNSUPPORTED, "cannot copy positions [%d, %d) of sequence %d: its recurrent state holds "
                       "the positions up to %d as one whole (copy the whole sequence)", p0, p1, src, last);
    if (last < 0) { pi_rs_reset(rs, dst); return PI_OK; }
    for (int32_t il = 0, r = 0; r < rs->n_layer; il++) {
        if (rs->index[il] < 0) continue;
        memcpy(pi_rs_conv(rs, il, dst, false), pi_rs_conv(rs, il, src, false),
               (size_t)(rs->conv_rows * rs->conv_cols) * sizeof(float));
        memcpy(pi_rs_mat(rs, il, dst, false), pi_rs_mat(rs, il, src, false), (size_t)rs->mat_elems * sizeof(float));
        r++;
    }
    rs->pos[dst] = last;
    return PI_OK;
}

/* ---- in a sequence state: int32 last position, int32 n_layer, int64 conv and matrix floats per layer, then per
 * layer its conv rows and its matrix ---- */
typedef struct { int32_t last, n_layer; int64_t conv, mat; } rs_header;

size_t pi_rs_state_bytes(const pi_rs *rs) {
    if (!rs) return 0;
    return sizeof(rs_header) + (size_t)rs->n_layer * (size_t)(rs->conv_rows * rs->conv_cols + rs->mat_elems) *
                                   sizeof(float);
}

pi_status pi_rs_state_check(const pi_rs *rs, int32_t seq, int32_t p0, int32_t p1) {
    if (!rs || rs->pos[seq] < 0 || covers(p0, p1, rs->pos[seq])) return PI_OK;
    return pi_fail(PI_ERR_UNSUPPORTED, "the state of positions [%d, %d) of sequence %d: a recurrent model's sequence "
                   "state is the whole sequence (its recurrent state holds the positions up to %d as one whole)", p0,
                   p1, seq, rs->pos[seq]);
}

void pi_rs_state_write(const pi_rs *rs, int32_t seq, char *dst) {
    const rs_header h = { rs->pos[seq], rs->n_layer, rs->conv_rows * rs->conv_cols, rs->mat_elems };
    memcpy(dst, &h, sizeof h);
    dst += sizeof h;
    for (int32_t il = 0, r = 0; r < rs->n_layer; il++) {
        if (rs->index[il] < 0) continue;
        memcpy(dst, pi_rs_conv(rs, il, seq, false), (size_t)h.conv * sizeof(float));
        dst += h.conv * (int64_t)sizeof(float);
        memcpy(dst, pi_rs_mat(rs, il, seq, false), (size_t)h.mat * sizeof(float));
        dst += h.mat * (int64_t)sizeof(float);
        r++;
    }
}

pi_status pi_rs_state_read(pi_rs *rs, int32_t seq, const char *src, int32_t last_pos) {
    rs_header h;
    memcpy(&h, src, sizeof h);
    if (h.n_layer != rs->n_layer || h.conv != rs->conv_rows * rs->conv_cols || h.mat != rs->mat_elems)
        return pi_fail(PI_ERR_INVALID_ARG, "the state's recurrent part is of another layout (%d layers of %lld + %lld "
                       "values; this context: %d of %lld + %lld)", h.n_layer, (long long)h.conv, (long long)h.mat,
                       rs->n_layer, (long long)(rs->conv_rows * rs->conv_cols), (long long)rs->mat_elems);
    if (h.last != last_pos)
        return pi_fail(PI_ERR_INVALID_ARG, "the state's recurrent part absorbed the positions up to %d, its last "
                       "cached position is %d", h.last, last_pos);
    src += sizeof h;
    for (int32_t il = 0, r = 0; r < rs->n_layer; il++) {
        if (rs->index[il] < 0) continue;
        memcpy(pi_rs_conv(rs, il, seq, false), src, (size_t)h.conv * sizeof(float));
        src += h.conv * (int64_t)sizeof(float);
        memcpy(pi_rs_mat(rs, il, seq, false), src, (size_t)h.mat * sizeof(float));
        src += h.mat * (int64_t)sizeof(float);
        r++;
    }
    rs->pos[seq] = h.last;
    return PI_OK;
}

int32_t pi_recurrent_pos(pi_context *ctx, int32_t seq) {
    if (!ctx || !ctx->rs || seq < 0 || seq >= ctx->rs->n_seq) return -1;
    return ctx->rs->pos[seq];
}
