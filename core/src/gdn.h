/* gdn.h: gated delta net layers (qwen35, qwen35moe, qwen3next) and their full-attention layers' output gate (gdn.c). */
#ifndef PI_GDN_H
#define PI_GDN_H

#include "context.h"

/* The hparams' ssm_* and attn_output_gate checked (model.c's check_hparams). */
pi_status pi_gdn_check_hparams(const pi_hparams *hp);
/* Layer il's gated delta net weights (pi_layer_geom.recurrent). */
pi_status pi_gdn_load(const pi_model_desc *desc, const pi_hparams *hp, int32_t il, pi_layer *L);
/* B->cur [T][n_embd] = the gated delta net of layer il over the normed input in B->cur (the CPU), each sequence of
 * the batch from its recurrent state (read from the current copy, written to the other: recurrent.h). */
pi_status pi_gdn_layer(pi_context *ctx, pi_exec *e, const pi_layer *L, int32_t il, const pi_batch *b);
/* hparams.attn_output_gate: q [T][n_head hd] = the query halves of attn_q's [T][n_head][2 hd] output (in the context's
 * scratch, which keeps the gate halves for pi_gdn_apply_gate). */
pi_status pi_gdn_gated_q(pi_context *ctx, pi_exec *e, const pi_tensor *wq, const float *x, float *q, int64_t hd,
                         int64_t T);
/* att [T][n_head hd] *= sigmoid(the gate halves pi_gdn_gated_q kept) */
pi_status pi_gdn_apply_gate(pi_context *ctx, float *att, int64_t hd, int64_t T);

#endif
