/* recurrent.h: the per-sequence recurrent state of layers that carry one instead of a KV cache (recurrent.c).
 *
 * Generic over the layer kind: each recurrent layer keeps, per sequence, a short causal conv state (the last
 * conv_rows inputs of conv_cols channels) and a matrix state of mat_elems floats (the gated delta net's H_v [S, S]
 * matrices; Mamba2's [H, S, P] or LFM2's conv alone would fit the same two parts). Two copies of everything: a decode
 * reads a sequence's current copy and writes the other, and only a decode that succeeds flips the sequence to it, so
 * a failed or aborted decode leaves every state as it was. pos[s]: the last position sequence s's state absorbed. */
#ifndef PI_RECURRENT_H
#define PI_RECURRENT_H

#include "context.h"

typedef struct pi_rs {
    int32_t  n_layer;       /* recurrent layers */
    int32_t *index;         /* [model n_layer] the layer's index among them, or -1 */
    int64_t  conv_rows, conv_cols, mat_elems;   /* per layer and sequence (the same for every recurrent layer) */
    int32_t  n_seq;
    float   *conv;          /* [2][n_layer][n_seq][conv_rows][conv_cols] */
    float   *mat;           /* [2][n_layer][n_seq][mat_elems] */
    uint8_t *cur;           /* [n_seq] which copy is current */
    int32_t *pos;           /* [n_seq] last absorbed position, -1: empty */
    int32_t *pos_new;       /* [n_seq] the decode in flight's last position per sequence, -1: not in it */
} pi_rs;

/* ctx->rs for a model with recurrent layers (NULL and PI_OK without); pi_rs_free releases it. */
pi_status pi_rs_create(pi_context *ctx);
void      pi_rs_free(pi_rs *rs);
/* The current (next = false) or the other copy (the one a decode writes) of layer il's state for seq. */
float    *pi_rs_conv(const pi_rs *rs, int32_t il, int32_t seq, bool next);
float    *pi_rs_mat(const pi_rs *rs, int32_t il, int32_t seq, bool next);
/* Before a decode: every token's position past its sequence's absorbed ones, ascending within a sequence (an error
 * naming the token otherwise); records pos_new. After it succeeded: pi_rs_commit flips the batch's sequences. */
pi_status pi_rs_begin(pi_rs *rs, const pi_batch *b);
void      pi_rs_commit(pi_rs *rs);
/* seq's state back to empty (seq < 0: every sequence) */
void      pi_rs_reset(pi_rs *rs, int32_t seq);
/* The pi_kv_seq_rm / _cp rules (powerinfer.h): PI_OK where the KV cache may go on (after a reset or copy of the
 * state where the range asks for it), PI_ERR_UNSUPPORTED where the state cannot follow. */
pi_status pi_rs_seq_rm(pi_rs *rs, int32_t seq, int32_t p0, int32_t p1);
pi_status pi_rs_seq_cp(pi_rs *rs, int32_t src, int32_t dst, int32_t p0, int32_t p1);
/* A sequence state's recurrent part: bytes (0 without rs), written / read after the KV rows. */
size_t    pi_rs_state_bytes(const pi_rs *rs);
pi_status pi_rs_state_check(const pi_rs *rs, int32_t seq, int32_t p0, int32_t p1);
void      pi_rs_state_write(const pi_rs *rs, int32_t seq, char *dst);
pi_status pi_rs_state_read(pi_rs *rs, int32_t seq, const char *src, int32_t last_pos);

#endif
