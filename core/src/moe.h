/* moe.h: the mixture-of-experts FFN (moe.c). */
#ifndef PI_MOE_H
#define PI_MOE_H

#include "context.h"

/* out [T][n_embd] = layer L's mixture of experts over the normed input in [T][n_embd] (out may be in); x [T][n_embd]:
 * the block's input, the router's with hparams.moe_router_norm (else unread). */
pi_status pi_moe_ffn(pi_context *ctx, pi_exec *e, const pi_layer *L, const float *x, float *in, float *out, int64_t T);
void      pi_moe_release(pi_context *ctx);

#endif
