/* model.h: the model's weights as views into the caller's memory-mapped file. */
#ifndef PI_MODEL_H
#define PI_MODEL_H

#include "internal.h"

typedef struct pi_layer {
    pi_tensor attn_norm;   /* [n_embd] f32 */
    pi_tensor wq;          /* [n_embd, n_embd]      rows: query features (rope pairs adjacent) */
    pi_tensor wk;          /* [n_embd, n_embd_gqa] */
    pi_tensor wv;          /* [n_embd, n_embd_gqa] */
    pi_tensor wo;          /* [n_embd, n_embd] */
    pi_tensor ffn_norm;    /* [n_embd] f32 */
    pi_tensor ffn_gate;    /* [n_embd, n_ff]        row i = neuron i; absent (data NULL) for PI_FFN_SEQ */
    pi_tensor ffn_up;      /* [n_embd, n_ff] */
    pi_tensor ffn_down;    /* [n_ff, n_embd]        row j = output feature j (dense files) */
    /* sparse (PowerInfer) files */
    pi_tensor ffn_down_t;  /* [n_embd, n_ff]        row i = output vector of neuron i */
    pi_tensor fc1;         /* [n_embd, r]           predictor layer 1 (rank r varies per layer) */
    pi_tensor fc2;         /* [r, n_ff]             predictor layer 2: raw scores per neuron */
} pi_layer;

struct pi_model {
    pi_hparams hp;
    pi_tensor  token_embd;   /* [n_embd, n_vocab] */
    pi_tensor  output_norm;  /* [n_embd] f32 */
    pi_tensor  output;       /* [n_embd, n_vocab] (token_embd when tied) */
    pi_layer  *layers;       /* [n_layer] */
    int64_t    max_rank;     /* largest predictor rank (sparse files) */
};

#endif
