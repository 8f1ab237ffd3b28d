/*
 * powerinfer.h: the public C API of libpowerinfer.
 *
 * This file is the single source of the Python bindings' declarations: the
 * text between PI_CDEF_BEGIN and PI_CDEF_END is handed to cffi verbatim
 * (minus preprocessor lines), and the same text is compiled by the C
 * compiler with every source file of the library, so the two cannot drift.
 * Keep that region free of macros and inline functions.
 *
 * Conventions
 *  - Every function that can fail returns a pi_status (PI_OK == 0, errors < 0)
 *    or NULL; pi_last_error() then gives a message (thread-local). The library
 *    never calls exit() or abort() on user input.
 *  - Tensor shapes follow GGUF/ggml: ne[0] is the contiguous dimension, so a
 *    numpy array of shape (a, b) has ne = {b, a}. nb[] are byte strides.
 *  - Type ids are the ggml type ids used in GGUF files.
 *  - Python owns the memory-mapped model file; the model keeps pointers into it
 *    and never copies weights.
 *  - Threads: a pi_context is not thread-safe. It must not be used by two
 *    threads at once (pi_decode, pi_get_logits, the pi_kv_* and statistics
 *    calls on one context race on its KV cache and scratch buffers); the caller
 *    serialises them (the Python Context holds a lock around each call).
 */
#ifndef POWERINFER_H
#define POWERINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define PI_API __declspec(dllexport)
#else
#define PI_API __attribute__((visibility("default")))
#endif

/* PI_CDEF_BEGIN */

typedef int32_t pi_status;

enum {
    PI_OK                =  0,
    PI_ERR_INVALID_ARG   = -1,  /* a NULL pointer, bad shape or out-of-range value */
    PI_ERR_OUT_OF_MEMORY = -2,  /* an allocation failed */
    PI_ERR_UNSUPPORTED   = -3,  /* a dtype, op or architecture this build cannot run */
    PI_ERR_BAD_MODEL     = -4,  /* missing tensor, wrong shape or type, inconsistent hparams */
    PI_ERR_KV_FULL       = -5,  /* no room left in the KV cache for this batch */
    PI_ERR_ABORTED       = -6   /* the abort callback asked to stop */
};

/* ggml type ids (the subset the core knows; see pi_type_supported). */
enum {
    PI_TYPE_F32  = 0,
    PI_TYPE_F16  = 1,
    PI_TYPE_Q4_0 = 2,
    PI_TYPE_Q4_1 = 3,
    PI_TYPE_Q5_0 = 6,
    PI_TYPE_Q5_1 = 7,
    PI_TYPE_Q8_0 = 8,
    PI_TYPE_Q8_1 = 9,    /* activations of Q4_1/Q5_1 (f32 d, f32 s = d * sum q, 32 x int8) */
    PI_TYPE_Q2_K = 10,
    PI_TYPE_Q3_K = 11,
    PI_TYPE_Q4_K = 12,
    PI_TYPE_Q5_K = 13,
    PI_TYPE_Q6_K = 14,
    PI_TYPE_Q8_K = 15,   /* activations of the K-quants (f32 d, 256 x int8, 16 x int16 block sums) */
    PI_TYPE_IQ2_XXS = 16, /* super-blocks of 256: a 256-point grid of 8 values, a 4-bit scale per 32, 7-bit sign indices */
    PI_TYPE_IQ2_XS  = 17, /* the same with a 512-point grid, a 4-bit scale per 16 */
    PI_TYPE_IQ3_XXS = 18, /* super-blocks of 256: a 256-point grid of 4 values, a 4-bit scale per 32, 7-bit sign indices */
    PI_TYPE_IQ1_S  = 19, /* super-blocks of 256: a 2048-point grid of 8 values in {-1, 0, 1} + delta, a 3-bit scale per 32 */
    PI_TYPE_IQ4_NL = 20, /* Q4_0's layout, the nibbles indexing a non-linear grid of 16 int8 values */
    PI_TYPE_IQ3_S  = 21, /* super-blocks of 256: a 512-point grid of 4 values, a 4-bit scale per 32, a sign bit each */
    PI_TYPE_IQ2_S  = 22, /* super-blocks of 256: a 1024-point grid of 8 values, a 4-bit scale per 16, a sign bit each */
    PI_TYPE_IQ4_XS = 23, /* super-blocks of 256: IQ4_NL's grid, a 6-bit scale per 32 */
    PI_TYPE_I32  = 26,
    PI_TYPE_IQ1_M  = 29, /* IQ1_S's grid, a delta per 8 values, a 3-bit scale per 16, d spread over the scales' top bits */
    PI_TYPE_BF16 = 30,
    PI_TYPE_MXFP4 = 39,  /* OCP MXFP4 (gpt-oss's experts): Q4_0's nibbles as E2M1 values, an E8M0 power-of-two scale */
    PI_TYPE_COUNT = 40
};

enum {  /* model architecture families (the forward pass reads the pi_hparams flags, not the id) */
    PI_ARCH_LLAMA  = 0,   /* llama, mistral, tinyllama: the llama blocks */
    PI_ARCH_BAMBOO = 1,
    PI_ARCH_QWEN2  = 2,   /* llama + NEOX rope; qwen2: q/k/v biases, qwen3: q/k norms, gpt-oss: biases, attention sinks,
                           * local layers and biased experts with the OAI SwiGLU (the hparams' flags) */
    PI_ARCH_GEMMA3 = 3,   /* QK norms, post-norms, GELU FFN, embedding scale, local (sliding-window) layers; gemma2:
                           * no QK norms, soft-capped attention scores and logits (attn_softcap, final_softcap) */
    PI_ARCH_FALCON = 4,   /* sparse only: LayerNorm, fused attn_qkv, NEOX rope, parallel attention + FFN */
    PI_ARCH_OPT    = 5,   /* sparse only: pre-LayerNorm, biases everywhere, learned positions (pos + 2), no rope */
    PI_ARCH_BERT   = 6    /* encoders (bert, nomic-bert; dense files): attention over each sequence of the batch alone,
                           * in both directions; x = LayerNorm(token_embd[tok] + token_types[0] (+ position_embd[pos]))
                           * * token_embd_norm; post-LayerNorm blocks x = LN(x + attn(x)) * attn_output_norm, x = LN(x +
                           * FFN(x)) * layer_output_norm (weights and biases); optional biases on q/k/v/o (qkv_bias,
                           * attn_out_bias) and on the FFN's up and down; no output norm, no output head: a context
                           * outputs embeddings only (the last layer's x), and keeps no cells between decodes */
};

enum {  /* rotary embedding: which dims form a rotating pair */
    PI_ROPE_NORMAL = 0,   /* (2i, 2i+1): llama GGUF files (q/k rows permuted by the converter) */
    PI_ROPE_NEOX   = 2    /* (i, i + n_rot/2): qwen2, qwen3, gemma3 (ggml's GGML_ROPE_TYPE_NEOX) */
};

enum {  /* FFN activation */
    PI_ACT_SILU = 0,
    PI_ACT_RELU = 1,
    PI_ACT_GELU = 2,
    PI_ACT_SWIGLU_OAI = 3,  /* mixture-of-experts FFNs only (gpt-oss): h = g' sigmoid(alpha g') (u' + 1), g' = min(g, limit),
                             * u' = clamp(u, -limit, limit) (hparams.swiglu_alpha, swiglu_limit; pi_op_swiglu_oai) */
    PI_ACT_XIELU = 4        /* dense FFNs without a gate (ffn_gate PI_FFN_SEQ) only (apertus): h = xielu(u) with
                             * layer il's parameters blk.N.ffn_act.weight [4] f32 (pi_op_xielu); on the CPU */
};

enum {  /* how the FFN gate combines with up */
    PI_FFN_PAR = 0,   /* h = act(gate x) * (up x)          SwiGLU, ReGLU */
    PI_FFN_SYM = 1,   /* h = act(gate x) * act(up x)       dReLU (bamboo) */
    PI_FFN_SEQ = 2    /* h = act(up x), no gate            falcon, opt */
};

enum {  /* unary and binary elementwise ops */
    PI_UNARY_SILU = 0,
    PI_UNARY_RELU = 1,
    PI_UNARY_GELU = 2,
    PI_BINARY_ADD = 0,
    PI_BINARY_MUL = 1
};

/* ---- errors and library info ------------------------------------------ */

/* Message of the last failed call on this thread ("" if none). */
PI_API const char *pi_last_error(void);
/* "CPU_ISA = avx512 (of scalar, avx2, avx512) | AVX2 = 1 | AVX512 = 1 | ... ": the kernels in use, the
 * levels this CPU runs, and its features. */
PI_API const char *pi_system_info(void);

/* ---- CPU kernels: one build, the ISA level chosen at run time ----------
 * Levels, lowest first: "scalar" (portable C), "avx2" (AVX2, FMA, F16C), "avx512" (AVX-512 F/BW/VL/DQ/CD
 * and VNNI), "amx" (AMX tiles, with AVX512-BF16). At load the library takes the best level that this build
 * includes and this CPU and OS run, or the one $POWERINFER_ISA names if that is supported and not higher.
 * Every level computes the same bits (docs/design.md, "numeric contract"). */
PI_API const char *pi_cpu_isa(void);                     /* the level in use */
PI_API int32_t     pi_cpu_isa_supported(const char *name); /* 1 if the build has it and this CPU runs it */
/* 1 where bf16 weights are computed in vdpbf16ps's arithmetic (activations rounded to bf16, at every level): by
 * default on CPUs with AVX512_BF16; $POWERINFER_BF16_DOT=0 / 1 chooses at load. 0: f32 activations. */
PI_API int32_t     pi_bf16_dot(void);
/* Switches the level for the whole process; models and contexts made at any level work at any other.
 * Not while other calls into the library run. */
PI_API pi_status   pi_cpu_isa_set(const char *name);
/* Why $POWERINFER_ISA was not applied at load (NULL if it was, or is unset). */
PI_API const char *pi_cpu_isa_env_error(void);

/* ---- dtypes ------------------------------------------------------------ */

/* 1 if the core can compute with this type (matmul, get_rows, dequantize). */
PI_API int32_t     pi_type_supported(int32_t type);
PI_API const char *pi_type_name(int32_t type);        /* "q4_0"; "unknown" if not known */
PI_API int64_t     pi_type_block_size(int32_t type);  /* elements per block; 0 if unknown */
PI_API int64_t     pi_type_block_bytes(int32_t type); /* bytes per block; 0 if unknown */
/* Bytes of a row of n elements; -1 if n is not a multiple of the block size. */
PI_API int64_t     pi_row_bytes(int32_t type, int64_t n);
/* Convert n elements (n a multiple of the block size). */
PI_API pi_status   pi_quantize_row(int32_t type, const float *src, void *dst, int64_t n);
PI_API pi_status   pi_dequantize_row(int32_t type, const void *src, float *dst, int64_t n);

/* ---- thread pool ------------------------------------------------------- */

typedef struct pi_threadpool pi_threadpool;

/* n_threads <= 0 picks the number of physical cores. */
PI_API pi_status pi_threadpool_create(int32_t n_threads, pi_threadpool **out);
PI_API void      pi_threadpool_free(pi_threadpool *pool);
PI_API int32_t   pi_threadpool_size(const pi_threadpool *pool);

/* ---- tensors and ops ----------------------------------------------------
 * A pi_tensor is a view: a type, up to 4 dims and byte strides over memory
 * the caller owns. Rows (dim 0) of quantized tensors must be contiguous and
 * a whole number of blocks. Ops write f32 outputs and run on `pool` (NULL
 * means the calling thread only). Outputs must not alias inputs unless the
 * op says so.
 */
typedef struct pi_tensor {
    int32_t type;
    int32_t n_dims;
    int64_t ne[4];     /* elements per dim, ne[0] contiguous */
    int64_t nb[4];     /* byte strides */
    void   *data;
} pi_tensor;

/* out[:, i] = dequant(table[:, ids[i]]);  table [n_embd, n_rows] any type, out [n_embd, n] f32 */
PI_API pi_status pi_op_get_rows(pi_threadpool *pool, const pi_tensor *table, const int32_t *ids,
                                int64_t n, pi_tensor *out);
/* y = W x:  w [K, N] any type, x [K, T] f32, y [N, T] f32   (y[n,t] = sum_k w[k,n] x[k,t]) */
PI_API pi_status pi_op_mul_mat(pi_threadpool *pool, const pi_tensor *w, const pi_tensor *x, pi_tensor *y);
/* y[i] = W[i] x for n (1..3) weights of one input (a layer's q, k, v; gate, up): pi_op_mul_mat's bits for each,
 * in one pass over all their rows where the weights share the activation format (fewer waits at one token) */
PI_API pi_status pi_op_mul_mats(pi_threadpool *pool, int32_t n, const pi_tensor *const *w, const pi_tensor *x,
                                pi_tensor *const *y);
/* Weight repacking: an interleaved copy of a 2-d weight that mul_mat reads faster on this CPU
 * (Q4_0 with AVX2: 8 rows interleaved). pi_model_create does this for the weights only mul_mat
 * reads, unless pi_model_desc.no_repack. pi_repack_bytes: bytes of the copy, 0 if the tensor has
 * no faster layout. pi_repack writes it to dst and describes it in out (usable by pi_op_mul_mat
 * only: its rows are not addressable one by one). */
PI_API int64_t   pi_repack_bytes(const pi_tensor *w);
PI_API pi_status pi_repack(const pi_tensor *w, void *dst, int64_t dst_bytes, pi_tensor *out);
/* RMSNorm over dim 0: out = x / sqrt(mean(x^2) + eps) * weight;  x, out [D, T]; weight [D] f32 or NULL. out may alias x. */
PI_API pi_status pi_op_rms_norm(pi_threadpool *pool, const pi_tensor *x, const pi_tensor *weight, float eps,
                                pi_tensor *out);
/* LayerNorm over dim 0: out = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias;  x, out [D, T];
 * weight, bias [D] f32 or NULL. out may alias x. */
PI_API pi_status pi_op_layer_norm(pi_threadpool *pool, const pi_tensor *x, const pi_tensor *weight,
                                  const pi_tensor *bias, float eps, pi_tensor *out);
/* Rotary embedding of the first n_rot dims: pair i (0 <= i < n_rot/2) rotates by
 * theta = pos[t] * freq_scale * base^(-2i/n_rot).  mode PI_ROPE_NORMAL: the pair is dims (2i, 2i+1);
 * PI_ROPE_NEOX: dims (i, i + n_rot/2).  x, out [head_dim, n_head, T] f32; pos [T]. out may alias x. */
PI_API pi_status pi_op_rope(pi_threadpool *pool, const pi_tensor *x, const int32_t *pos, int32_t n_rot,
                            int32_t mode, float freq_base, float freq_scale, pi_tensor *out);
/* Row-wise softmax over dim 0: x, out [D, R] f32. out may alias x. */
PI_API pi_status pi_op_softmax(pi_threadpool *pool, const pi_tensor *x, pi_tensor *out);
/* out = f(x) elementwise (PI_UNARY_*); f32. out may alias x. */
PI_API pi_status pi_op_unary(pi_threadpool *pool, int32_t op, const pi_tensor *x, pi_tensor *out);
/* out = a (op) b elementwise (PI_BINARY_*); b broadcasts over any dim where b.ne == 1; f32. out may alias a. */
PI_API pi_status pi_op_binary(pi_threadpool *pool, int32_t op, const pi_tensor *a, const pi_tensor *b,
                              pi_tensor *out);
/* Scaled dot-product attention with grouped KV heads.
 *   q [head_dim, n_head, T] f32;  k, v [head_dim, n_head_kv, n_kv] of types with a conversion to f32 (the KV
 *   cache's: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1), read as their f32 values (q is not quantized);
 *   mask [n_kv, T] f32 added to the scores (use -INFINITY to hide) or NULL;
 *   out [head_dim, n_head, T] f32.  Query head h reads KV head h / (n_head / n_head_kv). */
PI_API pi_status pi_op_attention(pi_threadpool *pool, const pi_tensor *q, const pi_tensor *k,
                                 const pi_tensor *v, const pi_tensor *mask, float scale, pi_tensor *out);

/* pi_op_attention with soft-capped scores (Gemma 2): each score s = q.k * scale becomes softcap * tanh(s / softcap)
 * before the mask is added and the softmax taken; softcap 0: none (pi_op_attention's bits), else finite and > 0. */
PI_API pi_status pi_op_attention_softcap(pi_threadpool *pool, const pi_tensor *q, const pi_tensor *k,
                                         const pi_tensor *v, const pi_tensor *mask, float scale, float softcap,
                                         pi_tensor *out);
/* pi_op_attention_softcap with attention sinks (gpt-oss): sinks [n_head] f32 (one logit per query head, or NULL: none)
 * joins each row's softmax as one more column that has no value: p_c = e^(s_c - m) / (sum_c' e^(s_c' - m) +
 * e^(sink_h - m)), m the largest of the visible scores and the sink (ggml's soft_max with sinks); the sink is not
 * scaled. A row that sees no cell outputs zeros, as without sinks. */
PI_API pi_status pi_op_attention_sinks(pi_threadpool *pool, const pi_tensor *q, const pi_tensor *k,
                                       const pi_tensor *v, const pi_tensor *mask, float scale, float softcap,
                                       const pi_tensor *sinks, pi_tensor *out);
/* gpt-oss's gated activation (ggml's swiglu_oai): up = g' / (1 + e^(-alpha g')) * (u' + 1), g' = min(gate, limit),
 * u' = clamp(up, -limit, limit), elementwise over gate and up [D, T] f32 (the same shape), in place in up; alpha and
 * limit finite, limit >= 0. The same bits at every level (arch/activation.c's exp). */
PI_API pi_status pi_op_swiglu_oai(pi_threadpool *pool, const pi_tensor *gate, pi_tensor *up, float alpha, float limit);
/* Apertus's xIELU (ggml's xielu), elementwise over x [any shape, contiguous] f32 in place, p = {a_n, a_p, beta, eps}
 * (a_n = beta + softplus(alpha_n), a_p = softplus(alpha_p): the file's values as ggml_xielu turns them): x > 0:
 * a_p x^2 + beta x; else (expm1(min(x, eps)) - x) a_n + beta x. Plain C (libm's expm1f): the same bits at every
 * level. */
PI_API pi_status pi_op_xielu(pi_threadpool *pool, pi_tensor *x, const float *p);
/* Soft-capping: out = cap * tanh(x / cap) elementwise (Gemma 2's final logits); cap finite and > 0; f32. out may
 * alias x. The same bits at every level (an exp-based tanh, within a few ulp of tanhf). */
PI_API pi_status pi_op_softcap(pi_threadpool *pool, const pi_tensor *x, float cap, pi_tensor *out);

/* ---- sparse FFN ---------------------------------------------------------
 * PowerInfer's FFN: neuron i is row i of gate/up and row i of down_t (the
 * transposed down matrix). A neuron is computed for token t only when
 * scores[i, t] >= threshold; the others contribute exactly zero.
 */
typedef struct pi_sparse_ffn_weights {
    pi_tensor gate;      /* [n_embd, n_ff]; data NULL when the FFN has no gate (PI_FFN_SEQ) */
    pi_tensor up;        /* [n_embd, n_ff] */
    pi_tensor down_t;    /* [n_embd, n_ff]   row i = output vector of neuron i */
    const float *up_bias;    /* [n_ff] or NULL: added to up_i . x of active neurons before the activation (opt) */
    const float *down_bias;  /* [n_embd] or NULL: added to the output after the sum over neurons (opt) */
    pi_tensor down;      /* optional, [n_ff, n_embd]: the untransposed down matrix. A Q4_0, Q4_K or Q6_K one is what
                          * pi_sparse_pack lays the down step out from (by neuron, its own quants and scales: nothing
                          * re-quantized); the kernels read down_t, not this */
    const void *down_t_scales;   /* set by pi_sparse_pack where down_t is that layout (internal types q4_0c, q4_kc,
                                  * q6_kc): its scales by block of neurons (q4_0c: [n_ff / 32][n_embd] fp16; q4_kc,
                                  * q6_kc: per super-block of 256 neurons d (dmin), the sub-blocks' scales (mins));
                                  * else NULL */
    const float *act_scale;  /* [n_ff] or NULL (= all 1): with the gate given (activation sparsity), neuron i runs for
                              * token t iff |act(g[i, t])| * act_scale[i] >= threshold (finite, >= 0; a gate-sparse
                              * file's blk.N.ffn_act_scale, tools/sparsify.py: the channel's mean |up x|) */
} pi_sparse_ffn_weights;

/* Sparse FFN packing: a copy of Q4_0 gate/up/down_t (n_embd a multiple of 256) in which each neuron's
 * rows lie next to each other (gate_i, up_i, down_t_i: one contiguous read per neuron) in a layout with
 * the block scales ahead of the quants (internal type q4_0r, read by single-row kernels).
 * pi_model_create does this for sparse models unless pi_model_desc.no_repack. pi_sparse_pack_bytes:
 * bytes of the copy, 0 if these weights have no packed layout. pi_sparse_pack writes it to
 * dst and describes it in out (biases carried over), usable by pi_op_sparse_ffn. The results differ
 * from the file layout's in the last bits (another summation order of the dot products). With up NULL
 * (an input-sparse matmul: gate mode seq, no gate) a Q4_0 down_t alone is packed (rows of a multiple of
 * 256 elements); its rows are only added, so the results are the file layout's bits. Where w->down is a
 * Q4_0 matrix [n_ff, n_embd] (n_embd a multiple of 64, n_ff of 32) the down step is packed from it instead,
 * by neuron with the block scales apart (out->down_t of internal type q4_0c, out->down_t_scales): the
 * file's own quants, each block of 32 neurons' h quantized as the dense path quantizes it, so that with
 * every neuron kept the result is the dense product's up to the f32 summation order; down_t may then be
 * absent, and gate/up rows without a packed layout (n_embd not a multiple of 256) stay where they are
 * (out->gate/up = w's). A Q4_K or Q6_K w->down (n_embd a multiple of 64, n_ff of 256) is laid out the same way
 * (internal types q4_kc, q6_kc): each super-block of 256 neurons' h quantized as the dense path quantizes it, so that
 * with every neuron kept the result is again the dense product's up to the f32 summation order; gate/up stay where
 * they are. */
PI_API int64_t   pi_sparse_pack_bytes(const pi_sparse_ffn_weights *w, int32_t gate_mode);
PI_API pi_status pi_sparse_pack(const pi_sparse_ffn_weights *w, int32_t gate_mode, void *dst, int64_t dst_bytes,
                                pi_sparse_ffn_weights *out);

/* scores = fc2 relu(fc1 x):  fc1 [n_embd, r], fc2 [r, n_ff], x [n_embd, T] f32, scores [n_ff, T] f32. */
PI_API pi_status pi_op_predictor(pi_threadpool *pool, const pi_tensor *fc1, const pi_tensor *fc2,
                                 const pi_tensor *x, pi_tensor *scores);
/* out [n_embd, T] = sum over active i of h[i, t] * down_t[i, :] (+ down_bias), with h = act(gate x) * (up x + up_bias) (gate_mode
 * per PI_FFN_*, act per PI_ACT_*), for x [n_embd, T] f32 and scores [n_ff, T] f32. out must not alias x.
 * The gate given (activation sparsity): with w->gate.data NULL and gate_mode PI_FFN_PAR or PI_FFN_SYM, scores
 * hold the gate's values g = gate x (computed by the caller) and neuron i runs for token t iff
 * |act(g[i, t])| >= threshold; then only up and down_t rows are read.
 * Everything given (an input-sparse matmul): with w->up.data NULL too and gate_mode PI_FFN_SEQ, down_t is any
 * transposed matrix [n_out, n_in] (row i = input i's column), scores [n_in, T] are the input h itself and
 * out [n_out, T] = sum over |h[i, t]| >= threshold of h[i, t] * down_t[i, :]; x [.., T] only gives T.
 * n_active, if not NULL, receives the number of (neuron, token) pairs computed. */
PI_API pi_status pi_op_sparse_ffn(pi_threadpool *pool, const pi_sparse_ffn_weights *w, int32_t act,
                                  int32_t gate_mode, const pi_tensor *x, const pi_tensor *scores,
                                  float threshold, pi_tensor *out, int64_t *n_active);

/* A level's selection applied to dense values (how a gate-sparse file's batches run through the dense kernels):
 * dst [n, T] = src where entry (i, t) is kept, else 0. Kept: |act(s[i, t])| * weights[i] >= threshold (act PI_ACT_*,
 * weights NULL: 1), the channels pi_op_sparse_ffn with the gate given computes; with act -1, |s[i, t]| >= threshold,
 * the inputs an input-sparse matmul reads. s, src, dst f32 [n, T], contiguous; dst may be src or s. n_kept (if not
 * NULL) += the pairs kept; counts (NULL or [n]) += per entry i the tokens that kept it. */
PI_API pi_status pi_op_sparse_mask(pi_threadpool *pool, const pi_tensor *s, int32_t act, const float *weights,
                                   float threshold, const pi_tensor *src, pi_tensor *dst, int64_t *n_kept,
                                   int64_t *counts);

/* ---- models -----------------------------------------------------------
 * Python parses the GGUF file and passes hyper-parameters plus a table of
 * tensor views into the mapped file. Tensors are looked up by their GGUF
 * names; shapes and types are checked against the hparams.
 */
typedef struct pi_hparams {
    int32_t arch;            /* PI_ARCH_* */
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;
    int32_t n_ff;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t n_layer;
    int32_t n_rot;           /* rotary dims per head (== head_dim for llama) */
    int32_t ffn_act;         /* PI_ACT_* */
    int32_t ffn_gate;        /* PI_FFN_* */
    float   norm_eps;
    float   rope_freq_base;
    float   rope_freq_scale; /* 1 / linear scaling factor */
    int32_t sparse;          /* 1: PowerInfer layout (ffn_down_t, predictors blk.N.fc1/fc2) */
    /* Architecture details; all-zero is the llama forward pass. */
    int32_t head_dim;        /* q/k/v size per head; 0: n_embd / n_head (gemma3: key_length, 256 for n_embd 640) */
    int32_t rope_mode;       /* PI_ROPE_NORMAL or PI_ROPE_NEOX */
    float   attn_scale;      /* attention scores are q.k * attn_scale; 0: 1/sqrt(head_dim) */
    float   embd_scale;      /* token embeddings are multiplied by this; 0: 1 (gemma3: sqrt(n_embd)) */
    float   attn_softcap;    /* > 0: each attention score s = q.k * attn_scale becomes attn_softcap * tanh(s /
                              * attn_softcap) before the mask and the softmax (gemma2: attn_logit_softcapping, 50); 0: none */
    float   final_softcap;   /* > 0: logits = final_softcap * tanh(logits / final_softcap) (gemma2:
                              * final_logit_softcapping, 30); 0: none. Embeddings (pi_get_embeddings) are not capped */
    int32_t qkv_bias;        /* 1: blk.N.attn_q/k/v.bias [f32] are added after the projections (qwen2) */
    int32_t qk_norm;         /* 1: per-head RMSNorm of q and k with blk.N.attn_q_norm/attn_k_norm [head_dim]; 2: RMSNorm
                              * of the whole q [n_head * head_dim] and k [n_head_kv * head_dim] (olmo2) */
    int32_t post_norms;      /* 1: RMSNorm of each block's output (post_attention_norm, post_ffw_norm) before the residual add */
    int32_t n_swa;           /* > 0: local layers see only the last n_swa positions (pos[t] - pos[cell] < n_swa) */
    int32_t swa_pattern;     /* with n_swa: layer il is local iff swa_pattern == 0 or il % swa_pattern < swa_pattern - 1
                              * (llama.cpp's set_swa_pattern; gemma3: 6, every 6th layer global) */
    float   rope_freq_base_swa;   /* rope base and scale of the local layers (gemma3: 10000, 1) */
    float   rope_freq_scale_swa;
    int32_t gate_sparse;     /* 1: a dense file made activation-sparse (tools/sparsify.py): the FFN can run with the
                              * gate dense and only the up rows and the down step's rows of the channels with
                              * |act(gate x)| >= the layer's threshold (pi_set_sparse_thresholds; <= 0: dense FFN). The
                              * down step: the file's Q4_0 / Q4_K / Q6_K ffn_down laid out by channel at load
                              * (pi_sparse_pack), else blk.N.ffn_down_t (the transposed copy the tool writes) */
    int32_t gate_input_sparse;   /* 1 (with gate_sparse): the gate can read only the FFN input's entries with
                              * |x_j| >= the layer's input threshold (pi_set_gate_input_thresholds): the file's Q4_0 /
                              * Q4_K / Q6_K ffn_gate laid out by input at load, else blk.N.ffn_gate_t */
    int32_t attn_input_sparse;   /* 1 (with gate_sparse): attn_q/k/v can read only the attention input's entries with
                              * |x_j| >= the layer's attention input threshold, attn_output only the attention
                              * output's (pi_set_attn_input_thresholds, TEAL): the four matrices (Q4_0, Q4_K or Q6_K)
                              * laid out by input at load, beside the file's */
    int32_t n_expert;        /* > 0: a mixture-of-experts FFN (Mixtral, Qwen3-MoE): blk.N.ffn_gate_inp [n_embd, n_expert]
                              * routes each token to its n_expert_used experts of blk.N.ffn_gate_exps / ffn_up_exps
                              * [n_embd, n_ff, n_expert] and ffn_down_exps [n_ff, n_embd, n_expert] (n_ff: an expert's
                              * width), weighted by the softmax of the router's logits over the chosen ones (llama.cpp's
                              * build_moe_ffn with norm_w; times expert_weights_scale where that is not 0); CPU only.
                              * ffn_gate_up_exps [n_embd, 2 n_ff, n_expert] (each expert's gate rows, then its up rows)
                              * may stand for ffn_gate_exps and ffn_up_exps; an optional ffn_down_exps.scale [n_expert]
                              * f32 multiplies each expert's output (gemma4). pi_layer_geom.moe: which layers */
    int32_t n_expert_used;
    float   expert_weights_scale;
    float   rope_mscale;     /* cos and sin of the rope are multiplied by this (ggml's rope attn_factor: YaRN's mscale times
                              * a file's rope.scaling.attn_factor; only the n_rot rotated dims scale); 0: 1 */
    int32_t n_ctx_orig;      /* with rope_freqs_long.weight (phi3's long rope factors): a context of more positions per
                              * sequence than this uses those factors instead of rope_freqs.weight (llama.cpp's choice
                              * by n_ctx_seq > n_ctx_orig_yarn) */
    float   residual_scale;  /* each block's output (attention, FFN) is multiplied by this before the residual add
                              * (granite's residual_scale); 0: 1 */
    float   logit_scale;     /* the logits are divided by this (granite's logit_scale); 0: 1 */
    int32_t post_norms_only; /* 1 (with post_norms): no attn_norm / ffn_norm: each block reads the residual stream itself,
                              * its output is normed before the add (olmo2) */
    int32_t n_no_rope_layer_step;  /* > 0: layers il with (il + 1) % step == 0 apply no rope (smollm3: 4, NoPE every
                              * 4th layer; 1: no layer ropes, granite without rope.scaling.finetuned) */
    int32_t attn_sinks;      /* 1: blk.N.attn_sinks.weight [n_head] f32, one logit per query head joining each softmax
                              * row as a column without a value (gpt-oss; pi_op_attention_sinks) */
    int32_t attn_out_bias;   /* 1: blk.N.attn_output.bias [n_embd] f32 is added after wo (gpt-oss; opt always has it) */
    int32_t expert_bias;     /* 1 (with n_expert): biases of the router and the experts are added after their products:
                              * blk.N.ffn_gate_inp.bias [n_expert], ffn_gate_exps.bias and ffn_up_exps.bias [n_ff,
                              * n_expert], ffn_down_exps.bias [n_embd, n_expert], all f32 (gpt-oss) */
    float   swiglu_alpha;    /* with ffn_act PI_ACT_SWIGLU_OAI: alpha and limit (gpt-oss: 1.702 and 7, llama.cpp's */
    float   swiglu_limit;    /* constants); finite, limit >= 0 */
    int32_t expert_raw_weights;  /* 1 (with n_expert): the chosen experts' weights are their softmax probabilities over
                              * all experts, not renormalized over the chosen (qwen2moe: llama.cpp's norm_w false) */
    int32_t n_ff_shexp;      /* > 0 (with n_expert): a shared expert of this width beside the routed ones, run for every
                              * token: blk.N.ffn_gate_shexp / ffn_up_shexp [n_embd, n_ff_shexp], ffn_down_shexp [n_ff_shexp,
                              * n_embd], its output times sigmoid(ffn_gate_inp_shexp . x) where the file has that [n_embd]
                              * gate (qwen2moe; granitemoe's has none) */
    int32_t v_norm;          /* 1: V is RMS-normed per head without a weight (eps norm_eps) before it is cached, and
                              * blk.N.attn_v.weight may be absent: V is then the K projection (before k's norm and
                              * rope) (gemma4) */
    int32_t rope_freqs_global;   /* 1: rope_freqs.weight applies to the global layers only (gemma4's proportional rope:
                              * 1 for the rotated pairs, 1e30 for the others); local layers rope without factors */
    int32_t n_embd_per_layer;    /* > 0: per-layer embeddings of this width n_pl (gemma4 E2B / E4B: llama.cpp's
                              * embedding_length_per_layer_input): per batch P = (rms_norm(per_layer_model_proj [n_embd,
                              * n_pl n_layer] . x / sqrt(n_embd)) per n_pl chunk * per_layer_proj_norm [n_pl] +
                              * per_layer_token_embd [n_pl n_layer, n_vocab][tokens] * sqrt(n_pl)) / sqrt(2), x the
                              * scaled token embeddings; after layer il's FFN x += rms_norm(blk.N.proj [n_pl, n_embd] .
                              * (gelu(blk.N.inp_gate [n_embd, n_pl] . x) * P[il])) * blk.N.post_norm [n_embd] */
    int32_t n_ff_exp;        /* > 0 (with n_expert): the experts' width, where the layers' dense FFNs are n_ff (or their
                              * geometry's) wide (gemma4's expert_feed_forward_length); 0: the experts are n_ff wide */
    int32_t moe_router_norm; /* 1 (with n_expert): the router reads rms_norm(x) (no weight) / sqrt(n_embd) *
                              * blk.N.ffn_gate_inp.scale [n_embd] f32, x the FFN block's input (the residual stream),
                              * not the experts' normed input (gemma4) */
    int32_t moe_dense_ffn;   /* 1 (with n_expert, post_norms): a layer with experts also runs its dense FFN (ffn_gate /
                              * ffn_up / ffn_down, its geometry's n_ff wide) beside them, each with its own norms:
                              * f = rms_norm(FFN(ffn_norm(x))) * post_ffw_norm_1 + rms_norm(experts(rms_norm(x) *
                              * pre_ffw_norm_2)) * post_ffw_norm_2, then post_ffw_norm's residual add (gemma4) */
    /* architectures on llama's blocks with flags (mistral3, hunyuan-dense, arcee, command-r, ...): */
    float   attn_temp_scale; /* != 0: q of the token at position p is multiplied, after rope, by 1 + attn_temp_scale *
                              * ln(floor(p / attn_temp_floor) + 1) (Llama 4's attention temperature tuning as Mistral 3
                              * uses it: llama.cpp's f_attn_temp_scale); 0: none */
    int32_t attn_temp_floor; /* with attn_temp_scale: the positions per step (> 0; llama.cpp's n_attn_temp_floor_scale,
                              * Mistral 3's YaRN original context) */
    int32_t qk_norm_after_rope;  /* 1 (with qk_norm): q and k are normed after their rope, not before (hunyuan-dense) */
    int32_t ffn_act_square;  /* 1: the dense FFN's activation output is squared: ReLU^2 with ffn_act PI_ACT_RELU and
                              * ffn_gate PI_FFN_SEQ, h = relu(W_up x)^2 (arcee; llama.cpp's LLM_FFN_RELU_SQR); dense
                              * files without experts only */
    int32_t layer_norm;      /* 1: the block and output norms are LayerNorm (mean removed, weights, no biases), not
                              * RMSNorm (command-r, cohere2; falcon and opt use LayerNorm with biases by their arch) */
    int32_t parallel_block;  /* 1: attention and FFN read one norm side by side: x += attn(h) + ffn(h), h = norm(x) *
                              * attn_norm, no ffn_norm (command-r, cohere2); dense files without experts or post-norms,
                              * on the CPU */
    /* DeepSeek-V2 / V3 multi-head latent attention (deepseek2; docs/design.md, "MLA"), in its absorbed form: */
    int32_t mla_kv_rank;     /* > 0: MLA with this latent width R (kv_lora_rank): per token blk.N.attn_kv_a_mqa
                              * [n_embd, R + n_rot] gives the latent (RMS-normed by attn_kv_a_norm [R]) and k_pe (roped,
                              * one for all heads); the cache row is [latent, k_pe] (the layers' geometry: head_dim
                              * R + n_rot, one KV head; no V rows: V is read from it), V its first R values; each
                              * head's query is [attn_k_b[h] q_nope, rope(q_pe)], its output's first R values times
                              * attn_v_b[h]; then attn_output [n_head mla_head_v, n_embd]. attn_k_b [nope, R,
                              * n_head], attn_v_b [R, mla_head_v, n_head]. Scores are scaled by attn_scale. CPU only */
    int32_t mla_head_k;      /* q's head size before absorption: nope + n_rot (attn_q [n_embd, n_head mla_head_k]) */
    int32_t mla_head_v;      /* the value head size (attn_v_b's rows per head) */
    int32_t q_lora_rank;     /* > 0 (with mla_kv_rank): q = attn_q_b [r, n_head mla_head_k] rms_norm(attn_q_a [n_embd,
                              * r] x) * attn_q_a_norm [r] instead of attn_q */
    /* DeepSeek-V3's routing (with n_expert; llama.cpp's build_moe_ffn); blk.N.exp_probs_b.bias [n_expert] f32, where a
     * layer has it, is added to the router's probabilities p to choose the experts, not to weight them: */
    int32_t expert_sigmoid;  /* 1: p = sigmoid(logits), not their softmax; the chosen experts weighted by their p,
                              * renormalized (sum clamped >= 6.103515625e-5, as ggml) unless expert_raw_weights */
    int32_t n_expert_groups; /* > 1: the experts in this many groups of n_expert / n_expert_groups (>= 2); a token
                              * chooses among the n_group_used groups with the largest sums of their two best selection
                              * scores */
    int32_t n_group_used;
    /* Gated delta net layers (qwen35, qwen35moe, qwen3next; docs/design.md "Recurrent state"): the layers with
     * pi_layer_geom.recurrent run, in place of the attention, a short causal conv and the gated delta rule over a
     * per-sequence state (no KV cache). H_k = ssm_n_group key heads and H_v = ssm_dt_rank value heads of ssm_d_state
     * values each (ssm_d_inner = H_v ssm_d_state); per token x (the normed input): qkv = attn_qkv [n_embd, 2 H_k S +
     * H_v S] x, z = attn_gate [n_embd, H_v S] x, beta = sigmoid(b), g = softplus(a + ssm_dt.bias [H_v]) * ssm_a [H_v]
     * (b, a from ssm_beta / ssm_alpha [n_embd, H_v], or qwen3next's ssm_ba [n_embd, 2 H_v]: per key head its H_v / H_k
     * b values, then its a values); c = silu(causal conv of qkv over the last ssm_d_conv tokens with ssm_conv1d
     * [ssm_d_conv, 2 H_k S + H_v S]); q, k = l2-normed heads of c (eps norm_eps), v its last H_v S values; per value
     * head h with key head j (ssm_head_interleave 0: h % H_k, 1: h / (H_v / H_k)): S_h = e^g S_h, d = beta (v_h - S_h^T
     * k_j), S_h += k_j d^T, o_h = S_h^T q_j / sqrt(S); out = ssm_out [H_v S, n_embd] (rms_norm(o_h) * ssm_norm [S] *
     * silu(z_h)) */
    int32_t ssm_d_conv;
    int32_t ssm_d_inner;
    int32_t ssm_d_state;
    int32_t ssm_dt_rank;
    int32_t ssm_n_group;
    int32_t ssm_head_interleave;
    int32_t attn_output_gate; /* 1: attn_q [n_embd, 2 n_head head_dim] gives per head its query, then a gate g; the
                              * attention output of the head is multiplied by sigmoid(g) before attn_output (qwen35,
                              * qwen3next's full-attention layers); CPU only */
    int32_t shortconv;       /* 1: the pi_layer_geom.recurrent layers are LFM2's short convs (lfm2; shortconv.c), not
                              * gated delta nets: bcx = shortconv.in_proj [n_embd, 3 n_embd] x split into b, c, x;
                              * out = shortconv.out_proj [n_embd, n_embd] (c * causal conv of b * x over the last
                              * ssm_d_conv tokens with shortconv.conv [ssm_d_conv, n_embd]); the other ssm_* are 0;
                              * the state per sequence: the last ssm_d_conv - 1 rows of b * x, no matrix; CPU only */
} pi_hparams;

/* One layer's geometry. Models whose layers differ in shape (gemma4: local and global layers with their own head
 * size, KV heads, rope dims and FFN width) give one per layer (pi_model_desc.layers); the others leave it NULL, and
 * every layer gets head_dim (pi_hparams.head_dim or n_embd / n_head), n_head_kv, n_rot and n_ff of pi_hparams, is_local
 * by n_swa / swa_pattern and its own KV cache. n_head is every layer's. */
typedef struct pi_layer_geom {
    int32_t head_dim;    /* q/k/v size per head */
    int32_t n_head_kv;   /* divides n_head */
    int32_t n_rot;       /* even, <= head_dim */
    int32_t n_ff;        /* the dense FFN's width */
    int32_t is_local;    /* 1: sliding window (needs n_swa > 0; rope_freq_base_swa / rope_freq_scale_swa) */
    int32_t kv_source;   /* il: the layer has its own K/V and KV cache; an earlier layer (itself with its own, of the
                          * same head_dim, n_head_kv and is_local): this layer has no attn_k / attn_v / attn_k_norm,
                          * writes no KV and attends over that layer's cache (gemma4's shared KV layers) */
    int32_t moe;         /* 1: the layer's FFN is the mixture of experts (needs n_expert > 0); 0: a dense FFN. Made
                          * from pi_hparams: n_expert > 0 (gemma4: the layers whose file has blk.N.ffn_gate_inp) */
    int32_t recurrent;   /* 1: a gated delta net layer (pi_hparams.ssm_*; with shortconv: LFM2's short conv): no
                          * attention and no KV cache, a recurrent state per sequence instead (kv_source must be the
                          * layer itself) */
} pi_layer_geom;

typedef struct pi_tensor_desc {
    const char *name;        /* GGUF name, e.g. "blk.0.attn_q.weight" */
    int32_t     type;
    int32_t     n_dims;
    int64_t     ne[4];
    const void *data;
    uint64_t    nbytes;      /* bytes available at data (checked against the shape) */
} pi_tensor_desc;

typedef struct pi_model_desc {
    pi_hparams            hparams;
    int32_t               n_tensors;
    const pi_tensor_desc *tensors;
    const pi_layer_geom  *layers;      /* [hparams.n_layer] (copied), or NULL: every layer as pi_hparams says */
    int32_t               no_repack;   /* 1: use the file's weights as they are (no interleaved copies); a gate-sparse
                                        * layer without ffn_down_t (ffn_gate_t) still gets the column layout of its
                                        * ffn_down (ffn_gate), the only form its sparse step can read */
} pi_model_desc;

typedef struct pi_model pi_model;

PI_API pi_status pi_model_create(const pi_model_desc *desc, pi_model **out);
PI_API void      pi_model_free(pi_model *model);
PI_API pi_status pi_model_hparams(const pi_model *model, pi_hparams *out);
/* Layer il's geometry (pi_layer_geom: the table given, or the one made from pi_hparams). */
PI_API pi_status pi_model_layer_geom(const pi_model *model, int32_t il, pi_layer_geom *out);
/* Layers whose sparse FFN the loader packed (pi_sparse_pack); 0 for dense models or NULL; with no_repack, the
 * gate-sparse layers without ffn_down_t. */
PI_API int32_t   pi_model_n_packed_ffn(const pi_model *model);

/* ---- contexts, batches, decoding -------------------------------------- */

typedef struct pi_context_params {
    int32_t n_ctx;       /* KV cache cells (tokens over all sequences) */
    int32_t n_batch;     /* most tokens a single pi_decode call may carry */
    int32_t n_seq_max;   /* sequence ids are 0 .. n_seq_max-1 (at most 64) */
    int32_t n_threads;   /* <= 0: physical cores */
    int32_t type_k;      /* the K cache's type: PI_TYPE_F16 (the default), F32, BF16, Q8_0, Q4_0, Q4_1, IQ4_NL, Q5_0, Q5_1
                          * (quantized: the head size a multiple of 32, the layers' attention on the CPU) */
    int32_t type_v;      /* the V cache's type: as type_k */
    float   sparse_threshold;  /* sparse models: a neuron runs when its predictor score >= this (every layer;
                                * pi_set_sparse_thresholds sets one per layer); gate-sparse files: |act(gate)| >= this */
    int32_t sparse_mode;       /* PI_SPARSE_PREDICT, or PI_SPARSE_ALL to compute every neuron */
    int32_t count_neurons;     /* 1: count per neuron how many tokens computed it (pi_neuron_counts) */
    int32_t act_histogram;     /* 1: histogram |act(gate x)| of every dense FFN run on the CPU (pi_act_histogram) */
    int32_t sparse_batch_max;  /* gate-sparse files: pi_decode calls of more than this many tokens (prompts) run the
                                * dense FFN and attention, the file's dense model exactly; 0 (the default): every
                                * call runs the level (see sparse_gather_max) */
    int32_t sparse_gather_max; /* gate-sparse files: calls of at most this many tokens run a level through the sparse
                                * kernels, which read the kept rows only (a batch gives the bits of its tokens one at
                                * a time); larger ones apply the level's selection to the dense kernels' values
                                * (pi_op_sparse_mask: the same inputs and channels kept, every weight read, prompts at
                                * about dense speed, results within f32 rounding of the sparse kernels' where both
                                * read the same matrices). Default 1; 0: no limit (every call through the sparse
                                * kernels) */
    int32_t n_threads_batch;   /* threads for decode calls of more than one token (prompts; llama.cpp's -tb); <= 0:
                                * n_threads. One-token calls use n_threads. The results do not depend on either. */
} pi_context_params;

enum {
    PI_SPARSE_PREDICT = 0,   /* run the predictor, compute the neurons it selects */
    PI_SPARSE_ALL     = 1    /* skip the predictor, compute every neuron (dense result of a sparse file);
                              * gate-sparse files: the dense FFN (ffn_down), exactly the file's dense model */
};

typedef struct pi_context pi_context;

/* Returns 1 to stop a long decode (checked between layers), 0 to go on. */
typedef int32_t (*pi_abort_callback)(void *user_data);

PI_API pi_context_params pi_context_default_params(void);
PI_API pi_status pi_context_create(pi_model *model, const pi_context_params *params, pi_context **out);
PI_API void      pi_context_free(pi_context *ctx);
PI_API void      pi_set_abort_callback(pi_context *ctx, pi_abort_callback cb, void *user_data);
/* One thread count for every decode from now on (n_threads and n_threads_batch; <= 0: physical cores). */
PI_API pi_status pi_set_n_threads(pi_context *ctx, int32_t n_threads);
/* Per-layer sparsity thresholds [n_layer] (copied), replacing params.sparse_threshold layer by layer: the
 * predictor threshold of a PowerInfer file, the |act(gate)| threshold of a gate-sparse file; NULL: every
 * layer back to params.sparse_threshold. NaN is refused. */
PI_API pi_status pi_set_sparse_thresholds(pi_context *ctx, const float *thresholds);
/* Gate-sparse files with blk.N.ffn_gate_t: per-layer thresholds [n_layer] on the FFN input (after its norm):
 * the gate is computed from the entries with |x_j| >= the threshold only (TEAL); <= 0 (the default, and
 * NULL): the dense gate. Applies where the layer runs activation-sparse. NaN is refused. */
PI_API pi_status pi_set_gate_input_thresholds(pi_context *ctx, const float *thresholds);
/* active [n_layer]: FFN input entries the sparse gate read since the last reset; *total: entries per layer
 * (tokens x n_embd) in the same time. */
PI_API pi_status pi_gate_input_stats(pi_context *ctx, int64_t *active, int64_t *total);
/* Files with attn_input_sparse: per-layer thresholds [n_layer] on the attention input (after its norm; q, k and v
 * read the entries with |x_j| >= qkv[il]) and on the attention output (wo reads those with |o_j| >= out[il]);
 * <= 0 (the default, and NULL): the dense matmuls. Applies with sparse_mode PI_SPARSE_PREDICT where the layer's
 * attention is on the CPU. NaN is refused. */
PI_API pi_status pi_set_attn_input_thresholds(pi_context *ctx, const float *qkv, const float *out);
/* active [n_layer]: attention input and output entries q/k/v and wo read since the last reset (a matmul that runs
 * dense, below its threshold or in a call beyond sparse_batch_max, reads all of its entries); *total:
 * entries per layer (tokens x (n_embd + n_head x head_dim)) in the same time. */
PI_API pi_status pi_attn_input_stats(pi_context *ctx, int64_t *active, int64_t *total);

/* One decode step over n_tokens tokens (prompt processing in one call).
 * token[i] is placed at position pos[i] of sequence seq_id[i]; a token sees every
 * cached cell of its sequence with position <= pos[i]. logits[i] != 0 asks for the
 * logits of row i, readable with pi_get_logits(ctx, i) until the next decode. */
typedef struct pi_batch {
    int32_t        n_tokens;
    const int32_t *token;    /* [n_tokens] */
    const int32_t *pos;      /* [n_tokens] */
    const int32_t *seq_id;   /* [n_tokens] */
    const int8_t  *logits;   /* [n_tokens] or NULL: only the last row */
    const float   *embd;     /* [n_tokens][n_embd] or NULL: input vectors in place of token[] (which may then be NULL):
                              * every row enters the first layer as given, not scaled by the file's embd_scale (an
                              * image's projected embeddings, as llama.cpp feeds them); not with per-layer embeddings */
    const int32_t *span;     /* [n_tokens] or NULL: rows with the same span id > 0 and sequence also see each other
                              * whatever their positions (bidirectional within an image, llama.cpp's non-causal
                              * decode of gemma3's image tokens); a sliding window still hides pos[i] - pos >= n_swa */
} pi_batch;

PI_API pi_status    pi_decode(pi_context *ctx, const pi_batch *batch);
/* [n_vocab] logits of batch row i of the last decode; NULL (and an error) if none were asked for. */
PI_API const float *pi_get_logits(pi_context *ctx, int32_t i);

/* What a decode outputs for the rows batch.logits asks for: the logits (the default), the final
 * hidden state (embeddings: norm(x) * output_norm, the output head's input), or both. */
enum {
    PI_OUTPUT_LOGITS = 1,
    PI_OUTPUT_EMBD   = 2
};
/* outputs: PI_OUTPUT_LOGITS, PI_OUTPUT_EMBD (the output head is skipped) or both ORed; for the
 * decodes that follow (the last decode's outputs are dropped). PI_ERR_INVALID_ARG for anything else;
 * PI_ERR_UNSUPPORTED for logits of an encoder (PI_ARCH_BERT: its contexts start with PI_OUTPUT_EMBD). */
PI_API pi_status    pi_set_outputs(pi_context *ctx, int32_t outputs);
/* [n_embd] final hidden state of batch row i of the last decode; NULL (and an error) if none was
 * asked for or the context does not output embeddings. */
PI_API const float *pi_get_embeddings(pi_context *ctx, int32_t i);

/* ---- LoRA adapters (llama.cpp's GGUF adapters: general.type = adapter, adapter.type = lora) ----------------
 * pi_adapter_create: the tensors "<model weight name>.lora_a" / ".lora_b" (views the caller keeps alive while the
 * adapter lives): a [n_in, r] and b [r, n_out] for blk.N.attn_q / attn_k / attn_v / attn_qkv / attn_output / ffn_gate
 * / ffn_up / ffn_down and output.weight; token_embd.weight's pair the other way round (a [r, n_vocab], b [r, n_embd]),
 * as llama.cpp writes them. Each shape is checked against the model's weight (PI_ERR_BAD_MODEL for a weight the model
 * lacks, a half without the other, a wrong shape); FFN pairs of sparse (PWRI) and gate-sparse files are
 * PI_ERR_UNSUPPORTED. alpha: the file's adapter.lora.alpha (0: none). The adapter must not outlive the model.
 * pi_context_set_adapters: the adapters the following decodes apply, each adding scale * alpha / r * b (a x) to its
 * weights' products (llama.cpp's scale; scale 0 keeps the adapter in the list and adds nothing); n = 0: none. The
 * context keeps the pointers: set another list before freeing an adapter. The terms run on the CPU only
 * (PI_ERR_UNSUPPORTED where an adapted layer or the adapted output head is offloaded). */
typedef struct pi_adapter pi_adapter;
PI_API pi_status pi_adapter_create(const pi_model *model, float alpha, int32_t n_tensors,
                                   const pi_tensor_desc *tensors, pi_adapter **out);
PI_API void      pi_adapter_free(pi_adapter *adapter);
PI_API int32_t   pi_adapter_n_pairs(const pi_adapter *adapter);   /* weights adapted */
PI_API pi_status pi_context_set_adapters(pi_context *ctx, int32_t n, pi_adapter *const *adapters,
                                         const float *scales);
/* A control vector (llama.cpp's --control-vector): data [n_layer][n_embd] f32 (copied), row il added to the residual
 * stream after layer il for il_start <= il <= il_end; data NULL: none. n_embd must be the model's; on the CPU only
 * (PI_ERR_UNSUPPORTED where a layer in the range is offloaded). */
PI_API pi_status pi_context_set_control_vector(pi_context *ctx, const float *data, int32_t n_embd, int32_t il_start,
                                               int32_t il_end);

/* KV cache by sequence: positions in [p0, p1) (p1 < 0: to the end). seq < 0 means every sequence. */
PI_API pi_status pi_kv_seq_rm(pi_context *ctx, int32_t seq, int32_t p0, int32_t p1);
PI_API pi_status pi_kv_seq_cp(pi_context *ctx, int32_t src, int32_t dst, int32_t p0, int32_t p1);
PI_API void      pi_kv_clear(pi_context *ctx);
/* Largest position stored for seq, or -1 when it has none. */
PI_API int32_t   pi_kv_seq_pos_max(pi_context *ctx, int32_t seq);
PI_API int32_t   pi_kv_used_cells(pi_context *ctx);
/* A sequence's KV state (the positions in [p0, p1) of seq, p1 < 0: to the end; their K/V rows in every layer, in
 * position order), to save a slot and restore it later into a context of the same model and KV type (llama.cpp's
 * slot save/restore). pi_kv_seq_state_size: the bytes pi_kv_seq_state_get writes now (0 and an error for a bad seq).
 * pi_kv_seq_state_set: cells (n_cells entries, the state's token count; NULL: the lowest free cells) are where the
 * tokens go, each free or holding seq alone (overwritten); seq's other cells at the restored positions leave seq.
 * PI_ERR_INVALID_ARG for a state of another layout (layers, KV width or type), a truncated or malformed one, or a
 * cell held by another sequence; PI_ERR_KV_FULL when cells is NULL and too few are free. */
PI_API size_t    pi_kv_seq_state_size(pi_context *ctx, int32_t seq, int32_t p0, int32_t p1);
PI_API pi_status pi_kv_seq_state_get(pi_context *ctx, int32_t seq, int32_t p0, int32_t p1, void *dst, size_t size,
                                     size_t *written);
PI_API pi_status pi_kv_seq_state_set(pi_context *ctx, int32_t seq, const void *src, size_t size, const int32_t *cells,
                                     int32_t n_cells);
/* The positions a state buffer holds (ascending, as pi_kv_seq_state_get wrote them), without a context: *n (if not
 * NULL) receives their count and the first min(capacity, count) are copied to dst (NULL with capacity 0: the count
 * alone). PI_ERR_INVALID_ARG for a buffer that is not a sequence state or too short for its positions. */
PI_API pi_status pi_kv_seq_state_positions(const void *src, size_t size, int32_t *dst, int32_t capacity, int32_t *n);

/* Models with recurrent layers (pi_layer_geom.recurrent): each sequence's recurrent state (per such layer the last
 * ssm_d_conv - 1 conv inputs and the delta net's [S, S] matrices) has absorbed every position up to the sequence's
 * largest; it cannot drop a tail. pi_kv_seq_rm of positions that state has absorbed is PI_ERR_UNSUPPORTED (nothing
 * removed), except the whole sequence (p0 <= 0 and p1 < 0 or past its last position), which resets it; pi_kv_seq_cp
 * copies the state (a range that covers the source's whole sequence, into a sequence without a state of its own; else
 * PI_ERR_UNSUPPORTED); pi_kv_clear resets
 * every state; the sequence state (pi_kv_seq_state_*) carries it (the whole sequence only). A decode token of a
 * sequence at a position its state has absorbed is PI_ERR_INVALID_ARG. pi_recurrent_pos: the last position the state
 * of seq has absorbed (-1: none, or a model without recurrent layers). */
PI_API int32_t   pi_recurrent_pos(pi_context *ctx, int32_t seq);
/* The short causal conv (ggml's ssm_conv; gated delta net layers): out[t][c] = sum_k w[c][k] x'[t + k][c] over
 * x' = [state; x], state [K - 1][C] the previous inputs, x [T][C], w [C][K] (ssm_conv1d [K, C]); state (if not NULL)
 * becomes the last K - 1 rows of x' afterwards. f32, contiguous; plain C (the same bits at every level). */
PI_API pi_status pi_op_ssm_conv(const float *x, int64_t T, int64_t C, int64_t K, const float *w, float *state,
                                float *out);
/* The gated delta rule (ggml's gated_delta_net) over T tokens of one sequence: q, k [T][H_k][S], v [T][H_v][S],
 * g, beta [T][H_v], state [H_v][S][S] (state[h][j][i] = S_h[i][j], i over k, j over v), in place; out [T][H_v][S].
 * Value head h reads key head h % H_k (interleave 0) or h / (H_v / H_k) (1). Per token: S_h *= e^g, d_j = beta (v_j -
 * sum_i S[i][j] k_i), S[i][j] += k_i d_j, out_j = sum_i S[i][j] q_i / sqrt(S). The heads run on the pool. */
PI_API pi_status pi_op_gated_delta_net(pi_threadpool *pool, const float *q, const float *k, const float *v,
                                       const float *g, const float *beta, int64_t T, int64_t H_k, int64_t H_v,
                                       int64_t S, int32_t interleave, float *state, float *out);

/* Sparse models: neuron evaluations per layer since the last reset. active[l] counts (neuron, token)
 * pairs computed in layer l (array of n_layer), *total the pairs a dense FFN would have computed per layer. */
PI_API pi_status pi_sparse_stats(pi_context *ctx, int64_t *active, int64_t *total);
/* hist [n_layer][PI_ACT_HIST_KINDS][PI_ACT_HIST_BINS]: per layer, how many values fell in each bin since the
 * context was made or pi_sparse_stats_reset (needs params.act_histogram; dense gated FFNs run on the CPU):
 * kind 0 the channels' |act(gate x)|, kind 1 the FFN input's |x_j| (after its norm), kind 2 the attention input's
 * (after its norm), kind 3 the attention output's |o_j| (wo's input; attention on the CPU): the calibration
 * statistics of tools/sparsify.py. Bin b >= 1 holds values in [pi_act_histogram_edge(b),
 * pi_act_histogram_edge(b + 1)), 16 bins per octave from 2^-24; bin 0 holds the values below 2^-24
 * (zeros among them), the last bin everything from its edge up. */
enum { PI_ACT_HIST_BINS = 513, PI_ACT_HIST_KINDS = 4 };
PI_API pi_status pi_act_histogram(pi_context *ctx, int64_t *hist);
/* means [n_layer][n_ff]: per layer and channel the mean |up_i . x| over the tokens of the dense gated FFNs counted by
 * pi_act_histogram (needs params.act_histogram; 0 for a layer with no token yet): tools/sparsify.py's channel
 * weights (pi_sparse_ffn_weights.act_scale). Kind 0 of the histogram counts |act(gate x)| times the layer's act_scale
 * where the file has one. */
PI_API pi_status pi_act_channel_means(pi_context *ctx, float *means);
PI_API float     pi_act_histogram_edge(int32_t bin);
PI_API void      pi_sparse_stats_reset(pi_context *ctx);
/* counts [n_ff]: for sparse layer il, the tokens for which each neuron (by its index in the file) was
 * computed since the context was made or pi_sparse_stats_reset; needs count_neurons: activation
 * statistics as PowerInfer's activation_N.pt hold them (tools/profile_sparse.py), measured by the engine. */
PI_API pi_status pi_neuron_counts(pi_context *ctx, int32_t il, int64_t *counts);

/* ---- GPU devices and the hybrid placement -------------------------------
 * A device is a CUDA/HIP GPU, or the emulated device that POWERINFER_EMULATED_GPU_MIB=N (read once)
 * turns on in every build: N MiB of separately counted host memory whose ops run the CPU kernels.
 * pi_context_offload places a context's layers once, before its first decode: per layer the
 * attention (norms, q/k/v/o, its KV cache, the predictor) and the FFN (dense files: the whole
 * FFN; sparse files: the n_hot hot neurons, whose gate/up/down_t rows are copied to the device,
 * the others computed on the CPU from the mapped file), and the output head. Every device byte
 * (weights, KV cache, compute buffers, scratch) is counted before anything is allocated and must
 * fit in budget_bytes. The forward pass is the same for every placement. A layer that reads another's KV cache
 * (pi_layer_geom.kv_source) has its attention where that layer's is (PI_ERR_UNSUPPORTED otherwise). */
typedef struct pi_device_info {
    int32_t device;
    char    backend[16];      /* "cuda", "hip" or "emulated" */
    char    name[256];
    int64_t total_bytes;
    int64_t free_bytes;
} pi_device_info;

PI_API int32_t     pi_device_count(void);      /* 0 without a device; never fails */
PI_API pi_status   pi_device_get_info(int32_t device, pi_device_info *out);
/* Device bytes held by contexts now / at most since the last reset (all contexts of the process). */
PI_API int64_t     pi_device_allocated_bytes(void);
PI_API int64_t     pi_device_peak_bytes(void);
PI_API void        pi_device_reset_peak(void);
PI_API const char *pi_gpu_backend_name(void);  /* "emulated", "CUDA", "HIP" or "none" */

enum { PI_PLACE_CPU = 0, PI_PLACE_DEVICE = 1 };

typedef struct pi_layer_placement {
    int32_t        attn;     /* PI_PLACE_*: attention, KV cache, predictor, FFN norm */
    int32_t        ffn;      /* dense files: PI_PLACE_* of the FFN; sparse files: unused (n_hot decides) */
    int32_t        n_hot;    /* sparse files: neurons on the device, 0..n_ff (> 0 needs attn on the device) */
    const int32_t *hot;      /* [n_hot] ascending neuron ids when 0 < n_hot < n_ff, else unused */
} pi_layer_placement;

typedef struct pi_offload_params {
    int32_t                   device;
    int64_t                   budget_bytes;   /* > 0: fail (nothing allocated) if the placement needs more */
    int32_t                   n_layer;
    const pi_layer_placement *layers;         /* [n_layer] */
    int32_t                   output;         /* PI_PLACE_* of the output norm and head */
} pi_offload_params;

typedef struct pi_offload_stats {
    int32_t device;          /* -1: nothing offloaded */
    int32_t n_attn_layers;   /* layers whose attention runs on the device */
    int32_t n_ffn_layers;    /* layers whose FFN (dense), or some of whose neurons (sparse), run there */
    int32_t output;
    int64_t n_hot;           /* hot neurons over all layers */
    int64_t model_bytes;     /* dense weights (attention, predictors, norms, output head) */
    int64_t ffn_bytes;       /* FFN weights (hot rows and their bucket, or whole dense FFNs) */
    int64_t kv_bytes;
    int64_t compute_bytes;   /* activation buffers and scratch */
    int64_t total_bytes;
} pi_offload_stats;

/* Device bytes of a context's compute buffers and scratch (allocated by any offload that places
 * something on the device), for the planner; -1 and an error without that device. */
PI_API int64_t   pi_offload_compute_bytes(const pi_model *model, int32_t device, int32_t n_ctx, int32_t n_batch);
/* The same bytes for a device of this build's kind, without one being present (a plan made on another
 * machine, or before a device is chosen): the CUDA/HIP backend's sizes in a GPU build, the emulated
 * device's otherwise (and whenever POWERINFER_EMULATED_GPU_MIB is set). Equals pi_offload_compute_bytes
 * of device 0 wherever that exists. -1 and an error for a NULL model or n_ctx, n_batch < 1. */
PI_API int64_t   pi_offload_plan_compute_bytes(const pi_model *model, int32_t n_ctx, int32_t n_batch);
PI_API pi_status pi_context_offload(pi_context *ctx, const pi_offload_params *params);
PI_API pi_status pi_context_offload_stats(const pi_context *ctx, pi_offload_stats *out);
/* The hot neurons of layer il as the device holds them (its copy of the bucket, read back), into ids
 * (n_ff entries at most; NULL: only count them). Returns their number, or -1 and an error. */
PI_API int32_t   pi_context_hot_neurons(pi_context *ctx, int32_t il, int32_t *ids);

/* ---- importance matrix (imatrix.c; llama-imatrix's collection) ----
 * pi_imatrix_begin: from now on the context's decodes sum, for each weight matrix, x_j^2 of every input row x its
 * matmuls read (batches of 16 rows or more; every routed row for an expert) and count those rows, until
 * pi_imatrix_end (or pi_context_free); begin again starts from zero. PI_IMATRIX_OUTPUT adds output.weight (a file's
 * own, not a tied one). CPU contexts only (PI_ERR_UNSUPPORTED when layers are offloaded); for sparse (PowerInfer)
 * and gate-sparse files the attention matrices only. A non-finite sum fails the decode (PI_ERR_INVALID_ARG).
 * pi_imatrix_entry: entry i's GGUF name, columns (the matrix's ne[0]), matrices (experts; 1 for 2-D), its sums
 * [n_mat][n_cols] and counts [n_mat] (the context's memory, valid until pi_imatrix_end). */
enum { PI_IMATRIX_OUTPUT = 1 };
PI_API pi_status pi_imatrix_begin(pi_context *ctx, int32_t flags);
PI_API void      pi_imatrix_end(pi_context *ctx);
PI_API int32_t   pi_imatrix_n_entries(const pi_context *ctx);
PI_API pi_status pi_imatrix_entry(const pi_context *ctx, int32_t i, const char **name, int64_t *n_cols,
                                  int64_t *n_mat, float **sums, int64_t **counts);
/* nrows rows of n_per_row values quantized as llama.cpp's ggml_quantize_chunk quantizes them with the importance
 * weights quant_weights [n_per_row] (quantize_row_*_impl; NULL: pi_quantize_row's reference quantizers, as llama.cpp
 * without an imatrix; Q8_0 ignores the weights, as llama.cpp). IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S: llama.cpp's searches
 * (quantize_iq4_nl / _iq4_xs / _iq3_xxs / _iq3_s) with or without weights. Other types: pi_quantize_row's without
 * weights, PI_ERR_UNSUPPORTED with them. The file quantizer's one entry (powerinfer.quantize). */
PI_API pi_status pi_quantize_rows_imatrix(int32_t type, const float *src, void *dst, int64_t nrows,
                                          int64_t n_per_row, const float *quant_weights);

/* PI_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* POWERINFER_H */
