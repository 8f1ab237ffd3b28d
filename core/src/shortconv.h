/* shortconv.h: LFM2's short conv layers (lfm2; shortconv.c), in place of the attention in the layers with
 * pi_layer_geom.recurrent when pi_hparams.shortconv is 1. */
#ifndef PI_SHORTCONV_H
#define PI_SHORTCONV_H

#include "context.h"

/* hparams.shortconv checked (model.c's check_hparams): 0 or 1; 1 needs ssm_d_conv 2..64 and the gated delta net's
 * other ssm_* zero, a dense (not sparse) model. */
pi_status pi_shortconv_check_hparams(const pi_hparams *hp);
/* Layer il's short conv weights into L->ssm_qkv (in_proj), ssm_conv1d (conv), ssm_out (out_proj). */
pi_status pi_shortconv_load(const pi_model_desc *desc, const pi_hparams *hp, int32_t il, pi_layer *L);
/* B->cur [T][n_embd] = the short conv of layer il over the normed input in B->cur (the CPU), each sequence of the
 * batch from its recurrent state's conv part (read from the current copy, written to the other: recurrent.h). */
pi_status pi_shortconv_layer(pi_context *ctx, pi_exec *e, const pi_layer *L, int32_t il, const pi_batch *b);

#endif
