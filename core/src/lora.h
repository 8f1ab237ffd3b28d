/* lora.h: LoRA adapters (llama.cpp's GGUF adapters) applied at run time.
 *
 * An adapted weight W [n_in, n_out] gives y = W x + sum over the context's adapters of s * B (A x), with A = lora_a
 * [n_in, r], B = lora_b [r, n_out] (both in mul_mat's weight convention) and s = the adapter's scale set on the
 * context times alpha / r (times 1 when the file's alpha is 0), llama.cpp's build_lora_mm. token_embd's pair is
 * stored the other way round (A [r, n_vocab] is a table: the token's row, then B [r, n_embd]), as llama.cpp's.
 * The terms run where the weight's layer runs, on the CPU only (a layer on a device with an adapted weight is an
 * error at pi_context_set_adapters and at decode). */
#ifndef PI_LORA_H
#define PI_LORA_H

#include "context.h"

enum {   /* the weights of a layer an adapter can adapt */
    PI_LORA_Q, PI_LORA_K, PI_LORA_V, PI_LORA_QKV, PI_LORA_O, PI_LORA_GATE, PI_LORA_UP, PI_LORA_DOWN,
    PI_LORA_PLE_GATE, PI_LORA_PLE_PROJ,   /* gemma4's per-layer embedding: blk.N.inp_gate, blk.N.proj (with the FFN) */
    PI_LORA_LAYER_N
};

typedef struct pi_lora_pair {
    pi_tensor a, b;       /* a [n_in, r] (token_embd: [r, n_vocab]), b [r, n_out]; a.data NULL: not adapted */
    pi_tensor bt;         /* b transposed, [n_out, r]: r rows of n_out (f16 or f32, the adapter's own copy), added
                           * by the axpy kernels: no horizontal sum per output over a short r */
    float     rank_scale; /* alpha / r, or 1 where the adapter's alpha is 0 */
} pi_lora_pair;

struct pi_adapter {
    const pi_model *model;
    float           alpha;
    int32_t         n_layer;         /* the model's (freeing reads no model: it may be gone first) */
    pi_lora_pair   *layers;          /* [n_layer][PI_LORA_LAYER_N] */
    pi_lora_pair    output, tok_embd;
    int32_t         n_pairs;
};

typedef struct pi_lora_use {
    const pi_adapter *adapter;
    float             scale;
} pi_lora_use;

/* y [n_out, T] += the context's adapters' terms for weight w of layer il over its input x [n_in, T], on e. */
pi_status pi_lora_add(pi_context *ctx, pi_exec *e, int32_t il, int32_t w, float *x, float *y, int64_t T);
/* logits [n_vocab, T] += the output head's terms over the normed rows x [n_embd, T] (in chunks of tokens). */
pi_status pi_lora_add_output(pi_context *ctx, pi_exec *e, float *x, float *logits, int64_t T);
/* x [n_embd, T] += the token embedding's terms for the batch's tokens (before any embedding scale). */
pi_status pi_lora_add_embd(pi_context *ctx, pi_exec *e, const int32_t *tokens, float *x, int64_t T);
/* The context's adapter list and scratch, freed (pi_context_free). */
void      pi_lora_release(pi_context *ctx);

#endif
