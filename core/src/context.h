/* context.h: per-context state: backends and their buffers, the placement, KV cache, logits. */
#ifndef PI_CONTEXT_H
#define PI_CONTEXT_H

#include "backend.h"
#include "kv_cache.h"
#include "model.h"

/* Activations of one decode step on one backend, allocated once for n_batch tokens (T). */
typedef struct pi_buffers {
    float *x;        /* [T][n_embd]     residual stream */
    float *cur;      /* [T][n_embd]     normed input of a block */
    float *q;        /* [T][n_embd] */
    float *k;        /* [T][n_embd_kv] */
    float *v;        /* [T][n_embd_kv] */
    float *att;      /* [T][max(n_embd, n_embd_q)]  attention output before wo; FFN output */
    float *gate;     /* [T][n_ff]  dense FFN */
    float *up;       /* [T][n_ff] */
    float *scores;   /* [T][n_ff]   sparse: predictor output */
    float *ffn_hot;  /* [T][n_embd] sparse: the hot neurons' partial sum (hybrid layers) */
    float *qkv;      /* [T][n_embd + 2 n_embd_kv]  falcon: fused q/k/v projection */
    float *ln;       /* [T][n_embd]  falcon: the FFN's normed input (parallel block) */
    float *mask;     /* [T][n_ctx] (the first T * n_kv used) */
    float *mask_swa; /* [T][n_ctx] local layers (hparams.n_swa > 0) */
    int32_t *pos;    /* [T] */
    int32_t *cells;  /* [T] KV cells of the batch's tokens */
    int32_t *ids;    /* [T] row ids (logit rows, opt positions) */
    float *ple;      /* [n_layer][T][n_pl] per-layer inputs P (hparams.n_embd_per_layer), filled per batch */
    float *mla;      /* [T][n_head (mla_head_k + mla_head_v) + max(nope, R) + max(R, v) + q_lora_rank] MLA's parts
                      * (hparams.mla_kv_rank: context.c's mla_attention) */
    float *ple_g;    /* [2][T][n_pl] a layer's per-layer gate and its rows of P (the output rows of the last layer) */
    float *ple_tok;  /* [T][n_layer n_pl] the CPU's: the token table's rows, then P before it is laid out by layer */
    float *ple_x;    /* [T][n_layer n_pl] the CPU's: the projection of the token embeddings */
    float *logits;   /* [T][n_vocab] on a device; NULL on the CPU (written straight into ctx->logits) */
} pi_buffers;

/* A backend and the buffers the forward pass uses on it. */
typedef struct pi_exec {
    pi_backend *be;
    pi_buffers  buf;
    void      **slot[24];    /* the allocated buffers and their sizes (to free them with the same counts) */
    size_t      slot_bytes[24];
    int32_t     n_slots;
    struct pi_imatrix *imatrix;  /* the importance-matrix observer (imatrix.c) while collecting, else NULL */
} pi_exec;

/* Where layer il runs, filled once (pi_context_create: all CPU; pi_context_offload). */
typedef struct pi_layer_exec {
    pi_exec        *attn;      /* attention, KV cache, predictor, FFN norm (sparse: the FFN's main backend) */
    pi_exec        *ffn;       /* dense FFN */
    const pi_layer *attn_w;    /* weights as that backend sees them (model->layers or a device copy) */
    const pi_layer *ffn_w;
    char           *k, *v;     /* this layer's KV rows [n_ctx][row_bytes] on attn */
    /* sparse: hot neurons on attn (n_hot > 0), cold ones on the CPU (n_hot < n_ff) */
    int64_t         n_hot;
    pi_sparse_ffn_weights hot; /* compact [E, n_hot] rows (or the whole matrices when n_hot == n_ff) */
    int32_t        *bucket;    /* [n_hot] on attn; NULL when n_hot == n_ff */
    uint8_t        *hot_mask;  /* [n_ff] host, 1 = hot (skipped by the CPU); NULL when n_hot == 0 */
    const float    *rope_freqs;/* on attn */
} pi_layer_exec;

typedef struct pi_device_state pi_device_state;   /* offload.c */

struct pi_context {
    pi_model         *model;
    pi_context_params params;
    pi_threadpool    *pool;
    pi_kv_cache       kv;
    pi_exec           cpu;
    pi_exec           dev;         /* dev.be NULL: CPU only */
    pi_layer_exec    *lx;          /* [n_layer] */
    pi_exec          *out;         /* output norm + head */
    const pi_tensor  *out_w, *out_norm, *out_norm_b;
    pi_device_state  *ds;          /* device allocations of the offload (offload.c) */
    pi_offload_stats  ostats;
    float            *logits;      /* [n_outputs][n_vocab] */
    int32_t           logits_cap;  /* rows allocated */
    int32_t           outputs;     /* PI_OUTPUT_* of the next decodes (pi_set_outputs) */
    float            *embd;        /* [n_outputs][n_embd] final hidden states (PI_OUTPUT_EMBD) */
    int32_t           embd_cap;    /* rows allocated */
    int32_t          *output_row;  /* [n_batch] batch row -> logits row, -1 if none */
    int32_t           n_batch_last;
    int64_t          *sparse_active; /* [n_layer] (neuron, token) pairs computed */
    int64_t          *neuron_counts; /* [n_layer][n_ff] tokens per neuron (params.count_neurons), else NULL */
    int64_t           sparse_total;  /* pairs a dense FFN would have computed, per layer */
    float            *layer_threshold; /* [n_layer] params.sparse_threshold or pi_set_sparse_thresholds */
    int64_t          *act_hist;      /* [n_layer][PI_ACT_HIST_KINDS][PI_ACT_HIST_BINS] (params.act_histogram) */
    double           *act_usum;      /* [n_layer][n_ff] sum of |up_i . x| over act_utokens[l] tokens (the same) */
    int64_t          *act_utokens;   /* [n_layer] */
    float            *input_threshold; /* [n_layer] pi_set_gate_input_thresholds (0: dense gate) */
    int64_t          *input_active;  /* [n_layer] FFN input entries the sparse gate read */
    int64_t           input_total;   /* tokens x n_embd, per layer */
    float            *attn_threshold; /* [n_layer][2] pi_set_attn_input_thresholds: q/k/v input, wo input (0: dense) */
    int64_t          *attn_active;   /* [n_layer] attention input and output entries the sparse q/k/v and wo read */
    int64_t           attn_total;    /* tokens x (n_embd + n_head x head_dim), per layer */
    pi_abort_callback abort_cb;
    void             *abort_data;
    struct pi_lora_use *lora;        /* [n_lora] the adapters the decodes apply (lora.h) */
    int32_t           n_lora;
    float            *lora_mid;      /* their terms' low-rank inputs [T][r] */
    int64_t           lora_mid_n;    /* floats allocated */
    void             *lora_conv;     /* the calling thread's mul_mat scratch for small terms (lora.c) */
    float            *cvec;          /* [n_layer][n_embd] control vector (pi_context_set_control_vector), or NULL */
    float            *moe;           /* mixture of experts' scratch (moe.c), grown to moe_n floats */
    int64_t           moe_n;
    void             *moe_conv;      /* its mul_mat scratch */
    size_t            moe_conv_bytes;
    int32_t           cvec_start, cvec_end;   /* the layers it is added after */
    size_t            lora_conv_bytes;
    struct pi_rs     *rs;            /* recurrent layers' per-sequence state (recurrent.h), NULL without such layers */
    float            *gdn;           /* gated delta net / gated attention scratch (gdn.c), grown to gdn_n floats */
    int64_t           gdn_n;
};

/* Buffers of one backend: allocated (counted) with be->alloc; sizes for T tokens and n_ctx cells.
 * pi_buffers_bytes gives the counted total without allocating (device: every buffer, as the planner
 * needs an upper bound before the placement is known). */
size_t    pi_buffers_bytes(const pi_model *m, int64_t T, int64_t n_ctx, bool device);
pi_status pi_buffers_alloc(pi_exec *e, const pi_model *m, int64_t T, int64_t n_ctx, bool device);
void      pi_buffers_free(pi_exec *e);
void      pi_offload_release(pi_context *ctx);   /* device memory freed; reads no model (offload.c) */
const pi_tensor *pi_context_rope_freqs(const pi_context *ctx);   /* the rope factors this context uses (context.c) */
void      pi_context_place_cpu(pi_context *ctx);   /* every layer on the CPU (context.c) */   /* back to CPU only, device memory freed (offload.c) */

/* y [N, T] = W [K, N] x [K, T] on e's thread pool, outside the exec's ops (the experts, the gated delta net and short
 * conv layers: CPU-only products), x converted in the context's scratch (moe_conv); the importance matrix observes it
 * where it collects (context.c) */
pi_status pi_scratch_product(pi_context *ctx, pi_exec *e, const pi_tensor *w, const float *x, float *y, int64_t T);

#endif
