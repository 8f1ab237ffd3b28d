/* context.h: per-context state: thread pool, KV cache, activation buffers, logits. */
#ifndef PI_CONTEXT_H
#define PI_CONTEXT_H

#include "kv_cache.h"
#include "model.h"

/* Activations of one decode step, allocated once for n_batch tokens (T). */
typedef struct pi_buffers {
    float *x;        /* [T][n_embd]     residual stream */
    float *cur;      /* [T][n_embd]     normed input of a block */
    float *q;        /* [T][n_embd] */
    float *k;        /* [T][n_embd_kv] */
    float *v;        /* [T][n_embd_kv] */
    float *att;      /* [T][n_embd]     attention output before wo */
    float *gate;     /* [T][n_ff] */
    float *up;       /* [T][n_ff] */
    void  *scratch;  /* mul_mat activation conversion, [T][max(n_embd, n_ff, rank)] floats */
    /* sparse models */
    float *scores;   /* [T][n_ff]   predictor output */
    float *pred;     /* [T][rank]   predictor hidden layer */
    void  *sparse;   /* pi_sparse_ffn scratch */
    int32_t *cells;  /* [T] KV cells of the batch's tokens */
    /* falcon */
    float *qkv;      /* [T][n_embd + 2 n_embd_kv]  fused q/k/v projection */
    float *ln;       /* [T][n_embd]  the FFN's normed input (parallel block) */
} pi_buffers;

struct pi_context {
    pi_model         *model;
    pi_context_params params;
    pi_threadpool    *pool;
    pi_kv_cache       kv;
    pi_buffers        buf;
    float            *mask;        /* [T][n_kv], grown on demand */
    float            *mask_swa;    /* [T][n_kv] of the local layers (hparams.n_swa > 0), grown with mask */
    size_t            mask_cap;
    float            *logits;      /* [n_outputs][n_vocab] */
    int32_t           logits_cap;  /* rows allocated */
    int32_t          *output_row;  /* [n_batch] batch row -> logits row, -1 if none */
    int32_t           n_batch_last;
    int64_t          *sparse_active; /* [n_layer] (neuron, token) pairs computed */
    int64_t          *neuron_counts; /* [n_layer][n_ff] tokens per neuron (params.count_neurons), else NULL */
    int64_t           sparse_total;  /* pairs a dense FFN would have computed, per layer */
    pi_abort_callback abort_cb;
    void             *abort_data;
};

#endif
