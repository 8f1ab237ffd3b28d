/* model.h: the model's weights as views into the caller's memory-mapped file. */
#ifndef PI_MODEL_H
#define PI_MODEL_H

#include "internal.h"

typedef struct pi_layer {
    pi_tensor attn_norm;   /* [n_embd] f32 */
    pi_tensor attn_norm_b; /* [n_embd] f32, LayerNorm bias (falcon, opt) */
    pi_tensor attn_norm_2, attn_norm_2_b;  /* falcon-40B: the attention's own LayerNorm; data NULL if absent */
    pi_tensor wqkv;        /* falcon: [n_embd, (n_head + 2 n_head_kv) head_dim], rows: all Q, all K, all V heads */
    pi_tensor bo;          /* [n_embd] f32 attn_output.bias (opt; hparams.attn_out_bias) */
    pi_tensor attn_sinks;  /* [n_head] f32 (hparams.attn_sinks): each head's sink logit */
    pi_tensor ffn_norm_b;  /* [n_embd] f32 (opt) */
    pi_tensor ffn_up_b;    /* [n_ff] f32 (opt) */
    pi_tensor ffn_down_t_b;/* [n_embd] f32 (opt) */
    pi_tensor wq;          /* [n_embd, n_head * head_dim]     rows: query features */
    pi_tensor wk;          /* [n_embd, n_head_kv * head_dim] */
    pi_tensor wv;          /* [n_embd, n_head_kv * head_dim] */
    pi_tensor bq, bk, bv;  /* [n_head(_kv) * head_dim] f32, hparams.qkv_bias only */
    pi_tensor q_norm;      /* [head_dim] f32, hparams.qk_norm only */
    pi_tensor k_norm;
    pi_tensor wo;          /* [n_head * head_dim, n_embd] */
    pi_tensor post_attn_norm;  /* [n_embd] f32, hparams.post_norms only */
    pi_tensor ffn_norm;    /* [n_embd] f32 */
    pi_tensor post_ffn_norm;   /* [n_embd] f32, hparams.post_norms only */
    pi_tensor ffn_gate;    /* [n_embd, n_ff]        row i = neuron i; absent (data NULL) for PI_FFN_SEQ */
    pi_tensor ffn_up;      /* [n_embd, n_ff] */
    pi_tensor ffn_down;    /* [n_ff, n_embd]        row j = output feature j (dense files) */
    /* sparse (PowerInfer) files */
    pi_tensor ffn_down_t;  /* [n_embd, n_ff]        row i = output vector of neuron i */
    pi_tensor fc1;         /* [n_embd, r]           predictor layer 1 (rank r varies per layer) */
    pi_tensor fc2;         /* [r, n_ff]             predictor layer 2: raw scores per neuron */
    /* gate-sparse files (hparams.gate_sparse): the rows the activation-sparse FFN gathers per channel: up and the
     * down step (the file's ffn_up and ffn_down_t; packed by pi_sparse_pack: up with a Q4_0 ffn_down laid out by
     * channel, or with ffn_down_t); gate.data NULL (the gate's values come from the dense gate matmul) */
    pi_sparse_ffn_weights act_ffn;
    pi_tensor ffn_gate_t;  /* [n_ff, n_embd] gate-sparse files, optional: row j = input j's gate column (the gate as an
                            * input-sparse matmul over the FFN input's entries with |x_j| >= the input threshold) */
    pi_sparse_ffn_weights act_gate;   /* that input-sparse gate: down_t = ffn_gate_t (data NULL: none), down = ffn_gate;
                                       * packed as act_ffn's down step */
    pi_tensor ffn_gate_inp;    /* [n_embd, n_expert] mixture of experts: the router */
    pi_tensor ffn_gate_exps;   /* [n_embd, n_ff, n_expert] */
    pi_tensor ffn_up_exps;     /* [n_embd, n_ff, n_expert] */
    pi_tensor ffn_down_exps;   /* [n_ff, n_embd, n_expert] */
    pi_tensor ffn_gate_inp_b;  /* [n_expert] f32, hparams.expert_bias: the router's bias */
    pi_tensor exp_probs_b;     /* [n_expert] f32, optional: added to the router's probabilities to choose (DeepSeek-V3)
                                */
    pi_tensor ffn_gate_exps_b; /* [n_ff, n_expert] f32, hparams.expert_bias: row e = expert e's bias */
    pi_tensor ffn_up_exps_b;   /* [n_ff, n_expert] f32 */
    pi_tensor ffn_down_exps_b; /* [n_embd, n_expert] f32 */
    pi_tensor ffn_gate_shexp, ffn_up_shexp;   /* [n_embd, n_ff_shexp] hparams.n_ff_shexp: the shared expert */
    pi_tensor ffn_down_shexp;  /* [n_ff_shexp, n_embd] */
    pi_tensor ffn_gate_inp_shexp;   /* [n_embd] f32, optional: its output's sigmoid gate */
    pi_tensor ffn_gate_inp_s;  /* [n_embd] f32, hparams.moe_router_norm: the router input's scale */
    pi_tensor ffn_down_exps_s; /* [n_expert] f32, optional: each expert's output scale */
    pi_tensor ffn_post_norm_1, ffn_pre_norm_2, ffn_post_norm_2;   /* [n_embd] f32, hparams.moe_dense_ffn: the norms
                                * after the dense FFN, before and after the experts */
    pi_tensor out_scale;   /* [1] f32 blk.N.layer_output_scale, optional (gemma4): x *= it after the layer */
    pi_tensor ple_gate;    /* [n_embd, n_pl] blk.N.inp_gate (hparams.n_embd_per_layer): the per-layer embedding's gate */
    pi_tensor ple_proj;    /* [n_pl, n_embd] blk.N.proj */
    pi_tensor ple_norm;    /* [n_embd] f32 blk.N.post_norm */
    pi_tensor act_params;  /* [4] f32 blk.N.ffn_act (ffn_act PI_ACT_XIELU: apertus's a_n, a_p, beta, eps) */
    pi_tensor wq_a, q_a_norm, wq_b;   /* hparams.q_lora_rank: [n_embd, r], [r] f32, [r, n_head mla_head_k] */
    pi_tensor wkv_a, kv_a_norm;  /* hparams.mla_kv_rank R: [n_embd, R + n_rot], [R] f32 */
    pi_tensor wk_b;        /* [nope, R, n_head]: head h's q_nope -> latent space */
    pi_tensor wv_b;        /* [R, mla_head_v, n_head]: head h's latent output -> its value */
    pi_sparse_ffn_weights act_attn[4];   /* hparams.attn_input_sparse: wq, wk, wv, wo as input-sparse matmuls (down =
                                          * the file's matrix, down_t its layout by input, made at load) */
    /* gated delta net layers (pi_layer_geom.recurrent; gdn.c): C = 2 H_k S + H_v S conv channels */
    pi_tensor ssm_qkv;     /* [n_embd, C] blk.N.attn_qkv */
    pi_tensor ssm_z;       /* [n_embd, H_v S] blk.N.attn_gate */
    pi_tensor ssm_beta, ssm_alpha;   /* [n_embd, H_v] (qwen35), or */
    pi_tensor ssm_ba;      /* [n_embd, 2 H_v] (qwen3next): per key head its b values, then its a values */
    pi_tensor ssm_conv1d;  /* [d_conv, C] f32 */
    pi_tensor ssm_dt;      /* [H_v] f32 blk.N.ssm_dt.bias */
    pi_tensor ssm_a;       /* [H_v] f32 blk.N.ssm_a (-exp(A_log)) */
    pi_tensor ssm_norm;    /* [S] f32 */
    pi_tensor ssm_out;     /* [H_v S, n_embd] */
    /* LFM2's short conv layers (hparams.shortconv; shortconv.c) hold theirs in ssm_qkv (blk.N.shortconv.in_proj
     * [n_embd, 3 n_embd]), ssm_conv1d (blk.N.shortconv.conv [d_conv, n_embd] f32) and ssm_out (shortconv.out_proj) */
    /* encoders (PI_ARCH_BERT): the post-norms of the blocks (LayerNorm weight and bias, [n_embd] f32) and the FFN's
     * down bias (its up bias is ffn_up_b); data NULL where absent */
    pi_tensor attn_out_norm, attn_out_norm_b;     /* blk.N.attn_output_norm: after the attention's residual add */
    pi_tensor layer_out_norm, layer_out_norm_b;   /* blk.N.layer_output_norm: after the FFN's residual add */
    pi_tensor ffn_down_b;  /* [n_embd] f32 blk.N.ffn_down.bias */
} pi_layer;

struct pi_model {
    pi_hparams hp;
    pi_tensor  token_embd;   /* [n_embd, n_vocab] */
    pi_tensor  output_norm;  /* [n_embd] f32 */
    pi_tensor  output_norm_b;/* [n_embd] f32 (falcon, opt) */
    pi_tensor  pos_embd;     /* opt: [n_embd, n_pos] learned positions, row pos + 2 */
    pi_tensor  output;       /* [n_embd, n_vocab] (token_embd when tied) */
    pi_tensor  rope_freqs;   /* [n_rot/2] f32 frequency factors (Llama 3.1+ "llama3" rope); data NULL if absent */
    pi_tensor  rope_freqs_long;  /* [n_rot/2] f32 phi3's long factors (pi_context_rope_freqs); data NULL if absent */
    pi_tensor  ple_tok_embd; /* [n_pl n_layer, n_vocab] per_layer_token_embd (hparams.n_embd_per_layer; rows read by
                              * get_rows as they are in the file) */
    pi_tensor  ple_model_proj;   /* [n_embd, n_pl n_layer] per_layer_model_proj */
    pi_tensor  ple_proj_norm;    /* [n_pl] f32 per_layer_proj_norm */
    pi_layer  *layers;       /* [n_layer] */
    pi_layer_geom *geom;     /* [n_layer] each layer's shape (pi_model_desc.layers, or made from hp) */
    int64_t    max_q, max_kv, max_ff;   /* the largest n_head * head_dim, n_head_kv * head_dim and n_ff of any layer */
    bool       uniform;      /* every layer of hp's shape and with its own KV cache (what a device backend runs) */
    pi_layer  *file_layers;  /* [n_layer] the same views in the file's layout (before pi_repack / pi_sparse_pack):
                              * what a device backend uploads */
    pi_tensor  output_file;  /* the output head in the file's layout */
    int64_t    max_rank;     /* largest predictor rank (sparse files) */
    void     **repacked;     /* [n_repacked] interleaved copies this model owns (pi_repack) */
    int32_t    n_repacked;
    int32_t    n_packed_ffn; /* layers whose sparse FFN is packed (pi_sparse_pack) */
    /* encoders (PI_ARCH_BERT): the embeddings' LayerNorm and the token type table (row 0 is added to every token, as
     * llama.cpp: "sentence A"); pos_embd (bert) holds n_ctx_train rows read at pos, without opt's offset */
    pi_tensor  tok_norm, tok_norm_b;   /* [n_embd] f32 token_embd_norm weight and bias */
    pi_tensor  type_embd;              /* [n_embd, n_token_types] token_types.weight; data NULL if absent */
};

/* the descriptor named name among desc's tensors (NULL if none) */
const pi_tensor_desc *pi_find_tensor(const pi_model_desc *desc, const char *name);

/* A view of the tensor d describes, checked: a type this build computes with, n_dims dims of shape ne (NULL: any of
 * n_dims dims, each >= 1; dims past n_dims must be 1), rows of whole blocks and the bytes the shape needs
 * (PI_ERR_UNSUPPORTED / PI_ERR_BAD_MODEL naming the tensor). */
pi_status pi_tensor_desc_view(const pi_tensor_desc *d, int n_dims, const int64_t *ne, pi_tensor *out);

/* LayerNorm instead of RMSNorm (falcon, opt, the encoders). */
static inline bool pi_uses_layer_norm(const pi_hparams *hp) {
    return hp->arch == PI_ARCH_FALCON || hp->arch == PI_ARCH_OPT || hp->arch == PI_ARCH_BERT || hp->layer_norm;
}

/* opt: position embeddings are looked up at pos + 2 (fairseq's padding offset). */
#define PI_OPT_POS_OFFSET 2

/* The row of position_embd that position pos reads (opt: pos + 2; bert: pos). */
static inline int64_t pi_pos_embd_row(const pi_hparams *hp, int64_t pos) {
    return pos + (hp->arch == PI_ARCH_OPT ? PI_OPT_POS_OFFSET : 0);
}

/* An encoder (bert family): bidirectional attention per sequence, post-norm blocks, embeddings only. */
static inline bool pi_is_encoder(const pi_hparams *hp) {
    return hp->arch == PI_ARCH_BERT;
}

/* An expert's width (mixture of experts). */
static inline int64_t pi_n_ff_exp(const pi_hparams *hp) {
    return hp->n_ff_exp > 0 ? hp->n_ff_exp : hp->n_ff;
}

/* q/k/v size of one head. */
static inline int64_t pi_head_dim(const pi_hparams *hp) {
    return hp->head_dim > 0 ? hp->head_dim : hp->n_embd / hp->n_head;
}

/* Whether layer il is a local (sliding-window) layer by hp alone: llama.cpp's set_swa_pattern(swa_pattern) (the default
 * of pi_layer_geom.is_local; the forward pass reads the model's geom). */
static inline bool pi_layer_is_swa(const pi_hparams *hp, int32_t il) {
    return hp->n_swa > 0 && (hp->swa_pattern <= 0 || il % hp->swa_pattern < hp->swa_pattern - 1);
}

#endif
