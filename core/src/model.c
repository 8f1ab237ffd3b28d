/* model.c: builds a pi_model from hparams and a table of tensor views, checking
 * every name, shape, type and size against the hparams. Weights stay in the caller's mapping, except
 * the load-time interleaved copies (repack_weights) that the matmuls read faster. */
#include "model.h"
#include "gdn.h"
#include "shortconv.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_DIM ((int64_t)1 << 24)   /* no real model has a dimension of 16M or more */

/* ggml's name for a type id, for messages about types this build cannot compute with. */
static const char *ggml_type_name(int32_t type) {
    static const char *const names[] = {
        "f32", "f16", "q4_0", "q4_1", NULL, NULL, "q5_0", "q5_1", "q8_0", "q8_1", "q2_K", "q3_K", "q4_K", "q5_K",
        "q6_K", "q8_K", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s", "iq2_s", "iq4_xs", "i8", "i16",
        "i32", "i64", "f64", "iq1_m", "bf16", NULL, NULL, NULL, "tq1_0", "tq2_0", NULL, NULL, NULL, "mxfp4",
    };
    if (type < 0 || type >= (int32_t)(sizeof names / sizeof names[0]) || !names[type]) return "unknown";
    return names[type];
}

const pi_tensor_desc *pi_find_tensor(const pi_model_desc *desc, const char *name) {
    for (int32_t i = 0; i < desc->n_tensors; i++)
        if (desc->tensors[i].name && strcmp(desc->tensors[i].name, name) == 0) return &desc->tensors[i];
    return NULL;
}

pi_status pi_tensor_desc_view(const pi_tensor_desc *d, int n_dims, const int64_t *ne, pi_tensor *out) {
    memset(out, 0, sizeof *out);
    if (!pi_type_supported(d->type))
        return pi_fail(PI_ERR_UNSUPPORTED, "tensor '%s' has type %s (id %d), which this build cannot compute with",
                       d->name, ggml_type_name(d->type), (int)d->type);
    int64_t want[4] = { 1, 1, 1, 1 };
    bool ok = d->n_dims >= 1 && d->n_dims <= 4;
    for (int i = 0; i < n_dims; i++) want[i] = ne ? ne[i] : (i < d->n_dims ? d->ne[i] : 0);
    for (int i = 0; ok && i < 4; i++) ok = (i < d->n_dims ? d->ne[i] : 1) == want[i] && want[i] >= 1;
    if (ok && !ne) ok = d->n_dims == n_dims;
    if (!ok) {
        char got[96] = "", exp[96] = "", buf[24];
        for (int i = 0; i < d->n_dims && i < 4; i++) {
            snprintf(buf, sizeof buf, i ? ", %lld" : "%lld", (long long)d->ne[i]);
            strncat(got, buf, sizeof got - strlen(got) - 1);
        }
        if (!ne)
            return pi_fail(PI_ERR_BAD_MODEL, "tensor '%s' has shape [%s], expected %d-d", d->name, got, n_dims);
        for (int i = 0; i < n_dims; i++) {
            snprintf(buf, sizeof buf, i ? ", %lld" : "%lld", (long long)want[i]);
            strncat(exp, buf, sizeof exp - strlen(exp) - 1);
        }
        return pi_fail(PI_ERR_BAD_MODEL, "tensor '%s' has shape [%s], expected [%s]", d->name, got, exp);
    }
    const int64_t row = pi_row_bytes(d->type, want[0]);
    if (row < 0)
        return pi_fail(PI_ERR_BAD_MODEL, "tensor '%s': row length %lld is not a multiple of the %s block size",
                       d->name, (long long)want[0], pi_type_name(d->type));
    const uint64_t need = (uint64_t)row * (uint64_t)(want[1] * want[2] * want[3]);
    if (!d->data || d->nbytes < need)
        return pi_fail(PI_ERR_BAD_MODEL, "tensor '%s' needs %llu bytes but only %llu are available", d->name,
                       (unsigned long long)need, (unsigned long long)d->nbytes);
    *out = pi_tensor_view(d->type, (void *)d->data, n_dims, want);
    return PI_OK;
}

/* Looks up `name`, checks it has shape ne0 x ne1 (ne1 == 0: 1-d) and a usable type, and makes a view.
 * optional: a missing tensor leaves *out zeroed and is not an error. */
static pi_status load_tensor(const pi_model_desc *desc, const char *name, int64_t ne0, int64_t ne1,
                             bool must_be_f32, bool optional, pi_tensor *out) {
    memset(out, 0, sizeof *out);
    const pi_tensor_desc *d = pi_find_tensor(desc, name);
    if (!d) {
        if (optional) return PI_OK;
        return pi_fail(PI_ERR_BAD_MODEL, "missing tensor '%s'", name);
    }
    if (must_be_f32 && pi_type_supported(d->type) && d->type != PI_TYPE_F32)
        return pi_fail(PI_ERR_BAD_MODEL, "tensor '%s' must be f32, got %s", name, pi_type_name(d->type));
    return pi_tensor_desc_view(d, ne1 ? 2 : 1, (int64_t[]){ ne0, ne1 }, out);
}

/* An expert tensor [ne0, ne1, n_expert] (mixture of experts): a 3-d view, each expert's [ne0, ne1] matrix one after
 * the other. */
static pi_status load_experts(const pi_model_desc *desc, const char *name, int64_t ne0, int64_t ne1, int64_t n_expert,
                              pi_tensor *out) {
    const pi_tensor_desc *d = pi_find_tensor(desc, name);
    if (!d) return pi_fail(PI_ERR_BAD_MODEL, "missing tensor '%s'", name);
    return pi_tensor_desc_view(d, 3, (int64_t[]){ ne0, ne1, n_expert }, out);
}

/* Layer il's router and experts (pi_hparams.n_expert): ffn_gate_exps and ffn_up_exps, or the two views of
 * ffn_gate_up_exps; the optional per-expert scale; the biases, the router's scale and the shared expert as the hparams
 * say. */
static pi_status load_moe(const pi_model_desc *desc, const pi_hparams *hp, int32_t il, pi_layer *L) {
    const int64_t E = hp->n_embd, F = pi_n_ff_exp(hp), NE = hp->n_expert;
    char name[96];
    pi_status st;
#define GET(suffix, ne0, ne1, f32, opt, dst) do { snprintf(name, sizeof name, "blk.%d." suffix, il); \
        if ((st = load_tensor(desc, name, ne0, ne1, f32, opt, dst)) != PI_OK) return st; } while (0)
#define GET_EXPS(suffix, ne0, ne1, dst) do { snprintf(name, sizeof name, "blk.%d." suffix, il); \
        if ((st = load_experts(desc, name, ne0, ne1, NE, dst)) != PI_OK) return st; } while (0)
    GET("ffn_gate_inp.weight", E, NE, false, false, &L->ffn_gate_inp);
    snprintf(name, sizeof name, "blk.%d.ffn_gate_up_exps.weight", il);
    if (pi_find_tensor(desc, name)) {   /* [E, 2F, NE]: each expert's F gate rows, then its F up rows */
        pi_tensor gu;
        GET_EXPS("ffn_gate_up_exps.weight", E, 2 * F, &gu);
        L->ffn_gate_exps = L->ffn_up_exps = gu;   /* [E, F, NE] views, an expert's matrices gu.nb[2] apart */
        L->ffn_gate_exps.ne[1] = L->ffn_up_exps.ne[1] = F;
        L->ffn_up_exps.data = (char *)gu.data + F * gu.nb[1];
    } else {
        GET_EXPS("ffn_gate_exps.weight", E, F, &L->ffn_gate_exps);
        GET_EXPS("ffn_up_exps.weight", E, F, &L->ffn_up_exps);
    }
    GET_EXPS("ffn_down_exps.weight", F, E, &L->ffn_down_exps);
    GET("ffn_down_exps.scale", NE, 0, true, true, &L->ffn_down_exps_s);
    GET("exp_probs_b.bias", NE, 0, true, true, &L->exp_probs_b);
    if (hp->moe_router_norm) GET("ffn_gate_inp.scale", E, 0, true, false, &L->ffn_gate_inp_s);
    if (hp->expert_bias) {
        GET("ffn_gate_inp.bias", NE, 0, true, false, &L->ffn_gate_inp_b);
        GET("ffn_gate_exps.bias", F, NE, true, false, &L->ffn_gate_exps_b);
        GET("ffn_up_exps.bias", F, NE, true, false, &L->ffn_up_exps_b);
        GET("ffn_down_exps.bias", E, NE, true, false, &L->ffn_down_exps_b);
    }
    if (hp->n_ff_shexp > 0) {
        GET("ffn_gate_shexp.weight", E, hp->n_ff_shexp, false, false, &L->ffn_gate_shexp);
        GET("ffn_up_shexp.weight", E, hp->n_ff_shexp, false, false, &L->ffn_up_shexp);
        GET("ffn_down_shexp.weight", hp->n_ff_shexp, E, false, false, &L->ffn_down_shexp);
        GET("ffn_gate_inp_shexp.weight", E, 0, true, true, &L->ffn_gate_inp_shexp);
    }
#undef GET
#undef GET_EXPS
    return PI_OK;
}

/* Layer il's MLA attention weights (pi_hparams.mla_kv_rank): q (attn_q, or attn_q_a, its norm and attn_q_b),
 * attn_kv_a_mqa and its latent's norm, the per-head attn_k_b / attn_v_b stacks; the cache's head (g->head_dim
 * R + n_rot, one KV head). */
static pi_status load_mla(const pi_model_desc *desc, const pi_hparams *hp, const pi_layer_geom *g, int32_t il,
                          pi_layer *L) {
    const int64_t E = hp->n_embd, H = hp->n_head, R = hp->mla_kv_rank, nr = hp->n_rot, hk = hp->mla_head_k;
    if (g->head_dim != R + nr || g->n_head_kv != 1 || g->n_rot != nr || g->kv_source != il || g->is_local)
        return pi_fail(PI_ERR_BAD_MODEL, "layer %d: MLA needs head_dim = mla_kv_rank + n_rot = %lld, one KV head, "
                       "n_rot %d, its own global KV cache (got head_dim %d, n_head_kv %d, n_rot %d)", il,
                       (long long)(R + nr), hp->n_rot, g->head_dim, g->n_head_kv, g->n_rot);
    char name[96];
    pi_status st;
#define GET(suffix, ne0, ne1, f32, dst) do { snprintf(name, sizeof name, "blk.%d." suffix, il); \
        if ((st = load_tensor(desc, name, ne0, ne1, f32, false, dst)) != PI_OK) return st; } while (0)
#define GET3(suffix, ne0, ne1, dst) do { snprintf(name, sizeof name, "blk.%d." suffix, il); \
        if ((st = load_experts(desc, name, ne0, ne1, H, dst)) != PI_OK) return st; } while (0)
    if (hp->q_lora_rank > 0) {
        GET("attn_q_a.weight", E, hp->q_lora_rank, false, &L->wq_a);
        GET("attn_q_a_norm.weight", hp->q_lora_rank, 0, true, &L->q_a_norm);
        GET("attn_q_b.weight", hp->q_lora_rank, H * hk, false, &L->wq_b);
    } else {
        GET("attn_q.weight", E, H * hk, false, &L->wq);
    }
    GET("attn_kv_a_mqa.weight", E, R + nr, false, &L->wkv_a);
    GET("attn_kv_a_norm.weight", R, 0, true, &L->kv_a_norm);
    GET3("attn_k_b.weight", hk - nr, R, &L->wk_b);
    GET3("attn_v_b.weight", R, hp->mla_head_v, &L->wv_b);
#undef GET
#undef GET3
    return PI_OK;
}

static pi_status check_hparams(const pi_hparams *hp) {
#define CHECK_DIM(field)                                                                      \
    if (hp->field <= 0 || hp->field >= MAX_DIM)                                               \
        return pi_fail(PI_ERR_BAD_MODEL, "hparam " #field " = %d is out of range", hp->field)
    CHECK_DIM(n_vocab); CHECK_DIM(n_embd); CHECK_DIM(n_ff); CHECK_DIM(n_head); CHECK_DIM(n_head_kv);
    CHECK_DIM(n_layer); CHECK_DIM(n_ctx_train);
#undef CHECK_DIM
    if (hp->arch < PI_ARCH_LLAMA || hp->arch > PI_ARCH_BERT)
        return pi_fail(PI_ERR_UNSUPPORTED, "unknown architecture id %d", hp->arch);
    if (hp->sparse && (hp->arch == PI_ARCH_QWEN2 || hp->arch == PI_ARCH_GEMMA3))
        return pi_fail(PI_ERR_UNSUPPORTED,
                       "sparse (PowerInfer) inference supports the llama, bamboo, falcon and opt architectures only");
    if (hp->gate_sparse && (hp->sparse || hp->ffn_gate == PI_FFN_SEQ))
        return pi_fail(PI_ERR_BAD_MODEL, "gate_sparse needs a dense file with a gated FFN (PI_FFN_PAR or PI_FFN_SYM)");
    if (hp->gate_input_sparse && !hp->gate_sparse) return pi_fail(PI_ERR_BAD_MODEL, "gate_input_sparse needs gate_sparse");
    if (hp->attn_input_sparse && !hp->gate_sparse) return pi_fail(PI_ERR_BAD_MODEL, "attn_input_sparse needs gate_sparse");
    if (!hp->sparse && (hp->arch == PI_ARCH_FALCON || hp->arch == PI_ARCH_OPT))
        return pi_fail(PI_ERR_UNSUPPORTED, "dense falcon/opt not supported; use the PowerInfer file");
    if ((hp->arch == PI_ARCH_FALCON || hp->arch == PI_ARCH_OPT) && hp->ffn_gate != PI_FFN_SEQ)
        return pi_fail(PI_ERR_BAD_MODEL, "falcon and opt have no FFN gate (ffn_gate must be PI_FFN_SEQ)");
    if (hp->arch == PI_ARCH_FALCON && (hp->qkv_bias || hp->qk_norm || hp->post_norms || hp->n_swa))
        return pi_fail(PI_ERR_BAD_MODEL, "falcon: qkv_bias, qk_norm, post_norms and n_swa must be 0");
    if (hp->n_layer > 4096) return pi_fail(PI_ERR_BAD_MODEL, "n_layer = %d is absurd", hp->n_layer);
    if (hp->n_expert < 0 || hp->n_expert > 1024 ||
        (hp->n_expert > 0 && (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert)))
        return pi_fail(PI_ERR_BAD_MODEL, "n_expert = %d, n_expert_used = %d: out of range", hp->n_expert,
                       hp->n_expert_used);
    if (hp->n_expert > 0 && (hp->sparse || hp->gate_sparse || hp->ffn_gate != PI_FFN_PAR))
        return pi_fail(PI_ERR_UNSUPPORTED, "mixture of experts: a dense file with a gated FFN only");
    if (!isfinite(hp->expert_weights_scale))
        return pi_fail(PI_ERR_BAD_MODEL, "expert_weights_scale is not finite");
    if (!(hp->rope_mscale >= 0.0f) || !isfinite(hp->rope_mscale))
        return pi_fail(PI_ERR_BAD_MODEL, "rope_mscale = %g must be finite and >= 0", (double)hp->rope_mscale);
    if (hp->n_ctx_orig < 0) return pi_fail(PI_ERR_BAD_MODEL, "n_ctx_orig = %d must be >= 0", hp->n_ctx_orig);
    if (!isfinite(hp->residual_scale) || !isfinite(hp->logit_scale) || hp->logit_scale < 0.0f)
        return pi_fail(PI_ERR_BAD_MODEL, "residual_scale = %g, logit_scale = %g: must be finite (logit_scale >= 0)",
                       (double)hp->residual_scale, (double)hp->logit_scale);
    if (!isfinite(hp->attn_temp_scale) || (hp->attn_temp_scale != 0.0f && hp->attn_temp_floor <= 0))
        return pi_fail(PI_ERR_BAD_MODEL, "attn_temp_scale = %g must be finite, with attn_temp_floor = %d > 0",
                       (double)hp->attn_temp_scale, hp->attn_temp_floor);
    if (hp->qk_norm_after_rope < 0 || hp->qk_norm_after_rope > 1 || (hp->qk_norm_after_rope && !hp->qk_norm))
        return pi_fail(PI_ERR_BAD_MODEL, "qk_norm_after_rope = %d must be 0 or 1 (1 with qk_norm)",
                       hp->qk_norm_after_rope);
    if (hp->ffn_act_square < 0 || hp->ffn_act_square > 1 ||
        (hp->ffn_act_square && (hp->sparse || hp->gate_sparse || hp->n_expert || hp->ffn_gate != PI_FFN_SEQ)))
        return pi_fail(PI_ERR_BAD_MODEL, "ffn_act_square = %d must be 0 or 1 (1: a dense FFN without a gate, no experts)",
                       hp->ffn_act_square);
    if (hp->layer_norm < 0 || hp->layer_norm > 1 || hp->parallel_block < 0 || hp->parallel_block > 1 ||
        (hp->parallel_block && (hp->sparse || hp->gate_sparse || hp->n_expert || hp->post_norms ||
                                hp->arch == PI_ARCH_FALCON || hp->arch == PI_ARCH_OPT)))
        return pi_fail(PI_ERR_BAD_MODEL, "layer_norm = %d and parallel_block = %d must be 0 or 1 (parallel_block: a "
                       "dense llama-family file without experts or post-norms)", hp->layer_norm, hp->parallel_block);
    if (hp->n_no_rope_layer_step < 0)
        return pi_fail(PI_ERR_BAD_MODEL, "n_no_rope_layer_step = %d must be >= 0", hp->n_no_rope_layer_step);
    if (hp->n_head % hp->n_head_kv)
        return pi_fail(PI_ERR_BAD_MODEL, "n_head = %d is not a multiple of n_head_kv = %d", hp->n_head, hp->n_head_kv);
    if (hp->head_dim < 0 || hp->head_dim >= MAX_DIM || (int64_t)hp->head_dim * hp->n_head >= MAX_DIM)
        return pi_fail(PI_ERR_BAD_MODEL, "head_dim = %d is out of range", hp->head_dim);
    if (hp->head_dim == 0 && hp->n_embd % hp->n_head)
        return pi_fail(PI_ERR_BAD_MODEL, "n_embd = %d is not a multiple of n_head = %d", hp->n_embd, hp->n_head);
    const int32_t head_dim = (int32_t)pi_head_dim(hp);
    if (hp->n_rot <= 0 || hp->n_rot > head_dim || hp->n_rot % 2)
        return pi_fail(PI_ERR_BAD_MODEL, "rope dimension %d must be even and at most head_dim %d", hp->n_rot, head_dim);
    if (hp->ffn_act == PI_ACT_XIELU && (hp->sparse || hp->gate_sparse || hp->n_expert || hp->ffn_gate != PI_FFN_SEQ))
        return pi_fail(PI_ERR_UNSUPPORTED, "the xIELU activation runs in dense FFNs without a gate (PI_FFN_SEQ) only");
    if (hp->ffn_act < PI_ACT_SILU || hp->ffn_act > PI_ACT_XIELU)
        return pi_fail(PI_ERR_BAD_MODEL, "unknown FFN activation id %d", hp->ffn_act);
    if (hp->ffn_act == PI_ACT_SWIGLU_OAI && hp->n_expert == 0)
        return pi_fail(PI_ERR_UNSUPPORTED, "the OAI SwiGLU activation runs in mixture-of-experts FFNs only");
    if (hp->ffn_act == PI_ACT_SWIGLU_OAI && (!isfinite(hp->swiglu_alpha) || !(hp->swiglu_limit >= 0.0f) ||
                                             !isfinite(hp->swiglu_limit)))
        return pi_fail(PI_ERR_BAD_MODEL, "swiglu_alpha = %g must be finite and swiglu_limit = %g finite and >= 0",
                       (double)hp->swiglu_alpha, (double)hp->swiglu_limit);
    if (hp->expert_bias && hp->n_expert == 0)
        return pi_fail(PI_ERR_BAD_MODEL, "expert_bias needs a mixture of experts (n_expert > 0)");
    if (hp->ffn_gate < PI_FFN_PAR || hp->ffn_gate > PI_FFN_SEQ)
        return pi_fail(PI_ERR_BAD_MODEL, "unknown FFN gate mode %d", hp->ffn_gate);
    if (!(hp->norm_eps >= 0.0f && hp->norm_eps < 1.0f))
        return pi_fail(PI_ERR_BAD_MODEL, "norm epsilon %g is out of range", (double)hp->norm_eps);
    if (!(hp->rope_freq_base > 0.0f) || !(hp->rope_freq_scale > 0.0f))
        return pi_fail(PI_ERR_BAD_MODEL, "rope freq base %g and scale %g must be > 0", (double)hp->rope_freq_base,
                       (double)hp->rope_freq_scale);
    if (hp->rope_mode != PI_ROPE_NORMAL && hp->rope_mode != PI_ROPE_NEOX)
        return pi_fail(PI_ERR_BAD_MODEL, "unknown rope mode %d", hp->rope_mode);
    if (!(hp->attn_scale >= 0.0f && hp->attn_scale < 1e6f) || !(hp->embd_scale >= 0.0f && hp->embd_scale < 1e6f))
        return pi_fail(PI_ERR_BAD_MODEL, "attention scale %g and embedding scale %g must be finite and >= 0",
                       (double)hp->attn_scale, (double)hp->embd_scale);
    if (!(hp->attn_softcap >= 0.0f && hp->attn_softcap < INFINITY) ||
        !(hp->final_softcap >= 0.0f && hp->final_softcap < INFINITY))
        return pi_fail(PI_ERR_BAD_MODEL, "attention softcap %g and final softcap %g must be finite and >= 0 (0: none)",
                       (double)hp->attn_softcap, (double)hp->final_softcap);
    if (hp->n_swa < 0 || hp->swa_pattern < 0)
        return pi_fail(PI_ERR_BAD_MODEL, "sliding window %d and its layer pattern %d must be >= 0", hp->n_swa,
                       hp->swa_pattern);
    if (!(hp->rope_freq_base_swa >= 0.0f) || !(hp->rope_freq_scale_swa >= 0.0f))
        return pi_fail(PI_ERR_BAD_MODEL, "rope freq base %g and scale %g of the local layers must be >= 0",
                       (double)hp->rope_freq_base_swa, (double)hp->rope_freq_scale_swa);
    if (hp->qkv_bias < 0 || hp->qkv_bias > 1 || hp->qk_norm < 0 || hp->qk_norm > 2 || hp->post_norms < 0 ||
        hp->post_norms > 1 || hp->post_norms_only < 0 || hp->post_norms_only > 1 || hp->attn_sinks < 0 ||
        hp->attn_sinks > 1 || hp->attn_out_bias < 0 || hp->attn_out_bias > 1 || hp->expert_bias < 0 ||
        hp->expert_bias > 1)
        return pi_fail(PI_ERR_BAD_MODEL, "qkv_bias, post_norms, post_norms_only, attn_sinks, attn_out_bias and "
                       "expert_bias must be 0 or 1, qk_norm 0..2");
    if (hp->n_ff_exp < 0 || hp->n_ff_exp >= MAX_DIM || hp->moe_router_norm < 0 || hp->moe_router_norm > 1 ||
        hp->moe_dense_ffn < 0 || hp->moe_dense_ffn > 1 ||
        ((hp->n_ff_exp > 0 || hp->moe_router_norm || hp->moe_dense_ffn) && hp->n_expert == 0))
        return pi_fail(PI_ERR_BAD_MODEL, "n_ff_exp = %d, moe_router_norm = %d, moe_dense_ffn = %d: out of range or "
                       "without experts", hp->n_ff_exp, hp->moe_router_norm, hp->moe_dense_ffn);
    if (hp->moe_dense_ffn && !hp->post_norms)
        return pi_fail(PI_ERR_BAD_MODEL, "moe_dense_ffn needs post_norms (the branches' norms and post_ffw_norm)");
    if (hp->n_ff_shexp < 0 || hp->n_ff_shexp >= MAX_DIM || hp->expert_raw_weights < 0 || hp->expert_raw_weights > 1 ||
        ((hp->n_ff_shexp > 0 || hp->expert_raw_weights) && hp->n_expert == 0))
        return pi_fail(PI_ERR_BAD_MODEL, "n_ff_shexp = %d, expert_raw_weights = %d: out of range or without experts",
                       hp->n_ff_shexp, hp->expert_raw_weights);
    if (hp->expert_sigmoid < 0 || hp->expert_sigmoid > 1 || hp->n_expert_groups < 0 ||
        ((hp->expert_sigmoid || hp->n_expert_groups > 1) && hp->n_expert == 0))
        return pi_fail(PI_ERR_BAD_MODEL, "expert_sigmoid = %d, n_expert_groups = %d: out of range or without experts",
                       hp->expert_sigmoid, hp->n_expert_groups);
    if (hp->n_expert_groups > 1 &&
        (hp->n_expert % hp->n_expert_groups || hp->n_expert / hp->n_expert_groups < 2 || hp->n_group_used < 1 ||
         hp->n_group_used > hp->n_expert_groups ||
         (int64_t)hp->n_group_used * (hp->n_expert / hp->n_expert_groups) < hp->n_expert_used))
        return pi_fail(PI_ERR_BAD_MODEL, "n_expert_groups = %d, n_group_used = %d: the groups must split n_expert = %d "
                       "into groups of 2 or more, and the groups used hold n_expert_used = %d", hp->n_expert_groups,
                       hp->n_group_used, hp->n_expert, hp->n_expert_used);
    if (hp->v_norm < 0 || hp->v_norm > 1 || hp->rope_freqs_global < 0 || hp->rope_freqs_global > 1)
        return pi_fail(PI_ERR_BAD_MODEL, "v_norm = %d, rope_freqs_global = %d: must be 0 or 1", hp->v_norm,
                       hp->rope_freqs_global);
    if (hp->post_norms_only && (!hp->post_norms || hp->sparse || pi_uses_layer_norm(hp)))
        return pi_fail(PI_ERR_BAD_MODEL, "post_norms_only needs post_norms (and a dense RMSNorm model)");
    if (hp->n_embd_per_layer < 0 || (int64_t)hp->n_embd_per_layer * hp->n_layer >= MAX_DIM)
        return pi_fail(PI_ERR_BAD_MODEL, "n_embd_per_layer = %d is out of range (times n_layer %d)",
                       hp->n_embd_per_layer, hp->n_layer);
    if (hp->n_embd_per_layer > 0 && (hp->sparse || hp->gate_sparse || hp->arch == PI_ARCH_FALCON))
        return pi_fail(PI_ERR_UNSUPPORTED, "per-layer embeddings (n_embd_per_layer) run with a dense FFN only (not "
                       "sparse, gate-sparse or falcon files)");
    if (hp->mla_kv_rank < 0 || hp->mla_kv_rank >= MAX_DIM || hp->q_lora_rank < 0 || hp->q_lora_rank >= MAX_DIM ||
        (hp->mla_kv_rank > 0 && (hp->mla_head_k <= hp->n_rot || hp->mla_head_k >= MAX_DIM || hp->mla_head_v <= 0 ||
                                 hp->mla_head_v >= MAX_DIM)) ||
        (hp->q_lora_rank > 0 && hp->mla_kv_rank == 0))
        return pi_fail(PI_ERR_BAD_MODEL, "mla_kv_rank = %d, mla_head_k = %d (> n_rot %d), mla_head_v = %d, "
                       "q_lora_rank = %d: out of range or q_lora_rank without MLA", hp->mla_kv_rank, hp->mla_head_k,
                       hp->n_rot, hp->mla_head_v, hp->q_lora_rank);
    if (pi_is_encoder(hp) && (hp->sparse || hp->gate_sparse || hp->n_expert || hp->mla_kv_rank || hp->n_swa ||
                              hp->qk_norm || hp->post_norms || hp->attn_sinks || hp->n_embd_per_layer ||
                              hp->parallel_block || hp->ffn_gate == PI_FFN_SYM || hp->ffn_act == PI_ACT_XIELU ||
                              hp->ffn_act == PI_ACT_SWIGLU_OAI))
        return pi_fail(PI_ERR_UNSUPPORTED, "encoders (bert family) run dense files with a GELU FFN or a gated one, "
                       "without experts, MLA, sliding windows, q/k norms, sinks or other blocks' flags");
    if (hp->mla_kv_rank > 0 && (hp->sparse || hp->gate_sparse || hp->qkv_bias || hp->qk_norm || hp->v_norm ||
                                hp->attn_sinks || hp->attn_out_bias || hp->n_swa || pi_uses_layer_norm(hp)))
        return pi_fail(PI_ERR_UNSUPPORTED, "MLA attention (mla_kv_rank) with sparse files, q/k/v biases or norms, "
                       "sinks, an output bias or a sliding window is not supported");
    const pi_status st = pi_shortconv_check_hparams(hp);
    return st != PI_OK || hp->shortconv ? st : pi_gdn_check_hparams(hp);
}

/* The model's per-layer geometry: desc->layers checked, or every layer made from hp. */
static pi_status make_geom(const pi_model_desc *desc, pi_model *m) {
    const pi_hparams *hp = &m->hp;
    m->geom = calloc((size_t)hp->n_layer, sizeof *m->geom);
    if (!m->geom) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    for (int32_t il = 0; il < hp->n_layer; il++)
        m->geom[il] = desc->layers ? desc->layers[il]
                                   : (pi_layer_geom){ .head_dim = (int32_t)pi_head_dim(hp), .n_head_kv = hp->n_head_kv,
                                                      .n_rot = hp->n_rot, .n_ff = hp->n_ff,
                                                      .is_local = pi_layer_is_swa(hp, il), .kv_source = il,
                                                      .moe = hp->n_expert > 0 };
    m->uniform = true;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const pi_layer_geom *g = &m->geom[il];
        if (g->head_dim <= 0 || g->head_dim >= MAX_DIM || (int64_t)g->head_dim * hp->n_head >= MAX_DIM ||
            g->n_head_kv <= 0 || hp->n_head % g->n_head_kv || g->n_ff <= 0 || g->n_ff >= MAX_DIM)
            return pi_fail(PI_ERR_BAD_MODEL, "layer %d: head_dim %d, n_head_kv %d (a divisor of n_head %d) and n_ff %d "
                           "must be in range", il, g->head_dim, g->n_head_kv, hp->n_head, g->n_ff);
        if (g->n_rot <= 0 || g->n_rot > g->head_dim || g->n_rot % 2)
            return pi_fail(PI_ERR_BAD_MODEL, "layer %d: rope dimension %d must be even and at most its head_dim %d", il,
                           g->n_rot, g->head_dim);
        if (g->is_local < 0 || g->is_local > 1 || (g->is_local && hp->n_swa <= 0))
            return pi_fail(PI_ERR_BAD_MODEL, "layer %d: is_local = %d (1 needs a sliding window, n_swa > 0)", il,
                           g->is_local);
        if (g->moe < 0 || g->moe > 1 || (g->moe && hp->n_expert == 0))
            return pi_fail(PI_ERR_BAD_MODEL, "layer %d: moe = %d (1 needs experts, n_expert > 0)", il, g->moe);
        const bool has_state = hp->ssm_d_state > 0 || hp->shortconv;   /* a delta net's, or a short conv's */
        if (g->recurrent < 0 || g->recurrent > 1 || (g->recurrent && (!has_state || g->kv_source != il)))
            return pi_fail(PI_ERR_BAD_MODEL, "layer %d: recurrent = %d (1 needs the ssm_* hparams and no shared KV)", il,
                           g->recurrent);
        const pi_layer_geom *src = g->kv_source >= 0 && g->kv_source < il ? &m->geom[g->kv_source] : NULL;
        if (g->kv_source != il && (!src || src->kv_source != g->kv_source || src->head_dim != g->head_dim ||
                                   src->n_head_kv != g->n_head_kv || src->is_local != g->is_local))
            return pi_fail(PI_ERR_BAD_MODEL, "layer %d: kv_source %d must be the layer itself or an earlier layer with "
                           "its own KV cache, of the same head_dim, n_head_kv and local/global kind", il, g->kv_source);
        m->max_q = PI_MAX(m->max_q, (int64_t)g->head_dim * hp->n_head);
        m->max_kv = PI_MAX(m->max_kv, (int64_t)g->head_dim * g->n_head_kv);
        m->max_ff = PI_MAX(m->max_ff, g->n_ff);
        m->uniform &= g->head_dim == pi_head_dim(hp) && g->n_head_kv == hp->n_head_kv && g->n_rot == hp->n_rot &&
                      g->n_ff == hp->n_ff && g->kv_source == il && !g->recurrent;
    }
    if (!m->uniform && (hp->sparse || hp->gate_sparse || hp->arch == PI_ARCH_FALCON))
        return pi_fail(PI_ERR_UNSUPPORTED, "layers of different shapes or with shared KV caches: dense models only "
                       "(not sparse, gate-sparse or falcon files)");
    return PI_OK;
}

#define TRY(expr) do { st = (expr); if (st != PI_OK) goto fail; } while (0)

/* Memory for load-time weight copies. Large ones are aligned to and advised as 2 MiB pages: the
 * kernels stream gigabytes per token, and with 4 KiB pages every 4 KiB costs a TLB miss. */
static void *alloc_weights(int64_t bytes) {
    const size_t huge = (size_t)2 << 20;
    if (bytes < (int64_t)huge) return pi_alloc_lines((size_t)bytes);
    const size_t size = ((size_t)bytes + huge - 1) / huge * huge;
    void *p = aligned_alloc(huge, size);
#ifdef MADV_HUGEPAGE
    if (p) madvise(p, size, MADV_HUGEPAGE);   /* advice only: ignored where THP is off */
#endif
    return p;
}

/* A load-time weight copy of `bytes` the model owns (freed with it); NULL after pi_fail. */
static void *own_copy(pi_model *m, int64_t bytes, const char *what) {
    void **list = realloc(m->repacked, (size_t)(m->n_repacked + 1) * sizeof *list);
    if (!list) { pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory"); return NULL; }
    m->repacked = list;
    void *buf = alloc_weights(bytes);
    if (!buf) {
        pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory %s (%lld bytes); load with no_repack to use the file's layout",
                what, (long long)bytes);
        return NULL;
    }
    return m->repacked[m->n_repacked++] = buf;
}

/* Replaces *t by an interleaved copy when its type has one (the file's mapping stays untouched). */
static pi_status repack_one(pi_model *m, pi_threadpool *pool, pi_tensor *t) {
    const int64_t bytes = t->data ? pi_repack_bytes(t) : 0;
    if (bytes == 0) return PI_OK;
    void *buf = own_copy(m, bytes, "repacking weights");
    return buf ? pi_repack_on(pool, t, buf, bytes, t) : PI_ERR_OUT_OF_MEMORY;
}

/* A gate-sparse layer's down step (and, with gate_input_sparse, its input-sparse gate): the transposed copies the tool
 * writes where the file's matrix has no column layout (pi_sparse_pack's Q4_0C / Q4_KC / Q6_KC, made at load instead). */
static pi_status load_act_sparse(const pi_model_desc *desc, const pi_hparams *hp, int32_t il, pi_layer *L) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.ffn_down_t.weight", il);
    pi_status st = load_tensor(desc, name, hp->n_embd, hp->n_ff, false, true, &L->ffn_down_t);
    if (st != PI_OK) return st;
    L->act_ffn = (pi_sparse_ffn_weights){ .up = L->ffn_up, .down_t = L->ffn_down_t, .down = L->ffn_down };
    pi_tensor scale;   /* the channels' weights in the selection (optional) */
    snprintf(name, sizeof name, "blk.%d.ffn_act_scale", il);
    if ((st = load_tensor(desc, name, hp->n_ff, 0, true, true, &scale)) != PI_OK) return st;
    for (int64_t i = 0; scale.data && i < hp->n_ff; i++) {
        float v;
        memcpy(&v, (const char *)scale.data + i * sizeof v, sizeof v);
        if (!(v >= 0.0f && v <= FLT_MAX))
            return pi_fail(PI_ERR_BAD_MODEL, "tensor '%s': element %lld is %g; the channel weights must be finite and "
                           ">= 0", name, (long long)i, (double)v);
    }
    L->act_ffn.act_scale = scale.data;
    snprintf(name, sizeof name, "blk.%d.ffn_down_t.weight", il);
    if (!L->ffn_down_t.data && !pi_sparse_pack_bytes(&L->act_ffn, PI_FFN_SEQ))
        return pi_fail(PI_ERR_BAD_MODEL, "gate-sparse layer %d: no '%s', and its ffn_down (%s) has no column layout "
                       "(Q4_0, Q4_K or Q6_K with n_embd a multiple of 64); sparsify the file again", il, name,
                       pi_type_name(L->ffn_down.type));
    static const char *const attn_names[4] = { "attn_q", "attn_k", "attn_v", "attn_output" };
    const pi_tensor *attn[4] = { &L->wq, &L->wk, &L->wv, &L->wo };
    for (int k = 0; hp->attn_input_sparse && k < 4; k++) {   /* laid out by input at load (pack_act_ffn) */
        L->act_attn[k] = (pi_sparse_ffn_weights){ .down = *attn[k] };
        if (!pi_sparse_pack_bytes(&L->act_attn[k], PI_FFN_SEQ))
            return pi_fail(PI_ERR_BAD_MODEL, "gate-sparse layer %d: attention input thresholds, but its %s (%s) has no "
                           "column layout (Q4_0, Q4_K or Q6_K with a multiple of 64 rows); sparsify the file without "
                           "--attn-input-scale", il, attn_names[k], pi_type_name(attn[k]->type));
    }
    if (!hp->gate_input_sparse) return PI_OK;
    snprintf(name, sizeof name, "blk.%d.ffn_gate_t.weight", il);
    if ((st = load_tensor(desc, name, hp->n_ff, hp->n_embd, false, true, &L->ffn_gate_t)) != PI_OK) return st;
    L->act_gate = (pi_sparse_ffn_weights){ .down_t = L->ffn_gate_t, .down = L->ffn_gate };
    if (!L->ffn_gate_t.data && !pi_sparse_pack_bytes(&L->act_gate, PI_FFN_SEQ))
        return pi_fail(PI_ERR_BAD_MODEL, "gate-sparse layer %d: gate input thresholds, but no '%s', and its ffn_gate "
                       "(%s) has no column layout (Q4_0, Q4_K or Q6_K with n_ff a multiple of 64)", il, name,
                       pi_type_name(L->ffn_gate.type));
    return PI_OK;
}

/* Replaces a sparse layer's gate/up/down_t by their per-neuron packing when they have one. */
static pi_status pack_sparse_ffn(pi_model *m, pi_threadpool *pool, pi_layer *L) {
    pi_sparse_ffn_weights w = { .gate = L->ffn_gate, .up = L->ffn_up, .down_t = L->ffn_down_t };
    const int64_t bytes = pi_sparse_pack_bytes(&w, m->hp.ffn_gate);
    if (bytes == 0) return PI_OK;
    void *buf = own_copy(m, bytes, "packing the sparse FFN");
    if (!buf) return PI_ERR_OUT_OF_MEMORY;
    pi_status st = pi_sparse_pack_on(pool, &w, m->hp.ffn_gate, buf, bytes, &w);
    if (st != PI_OK) return st;
    if (m->hp.ffn_gate != PI_FFN_SEQ) L->ffn_gate = w.gate;
    L->ffn_up = w.up;
    L->ffn_down_t = w.down_t;
    m->n_packed_ffn++;
    return PI_OK;
}

/* A gate-sparse layer's up rows and down step, packed per channel where they have a packed layout (the gate-less
 * packing: up_i then the down step's row i, from the file's Q4_0 / Q4_K / Q6_K ffn_down where it is one), and the
 * input-sparse gate's rows alone (from ffn_gate, or ffn_gate_t). only_missing (no_repack): only the parts the file has
 * no transposed copy of, which the sparse step cannot read otherwise. */
static pi_status pack_act_ffn(pi_model *m, pi_threadpool *pool, pi_layer *L, bool only_missing) {
    const int64_t bytes = only_missing && L->act_ffn.down_t.data ? 0 : pi_sparse_pack_bytes(&L->act_ffn, PI_FFN_SEQ);
    if (bytes > 0) {
        void *buf = own_copy(m, bytes, "packing the activation-sparse FFN");
        if (!buf) return PI_ERR_OUT_OF_MEMORY;
        pi_status st = pi_sparse_pack_on(pool, &L->act_ffn, PI_FFN_SEQ, buf, bytes, &L->act_ffn);
        if (st != PI_OK) return st;
        m->n_packed_ffn++;
    }
    const bool gate = m->hp.gate_input_sparse && !(only_missing && L->act_gate.down_t.data);
    const int64_t gbytes = gate ? pi_sparse_pack_bytes(&L->act_gate, PI_FFN_SEQ) : 0;
    if (gbytes > 0) {
        void *gbuf = own_copy(m, gbytes, "packing the input-sparse gate");
        if (!gbuf) return PI_ERR_OUT_OF_MEMORY;
        pi_status st = pi_sparse_pack_on(pool, &L->act_gate, PI_FFN_SEQ, gbuf, gbytes, &L->act_gate);
        if (st != PI_OK) return st;
    }
    for (int k = 0; m->hp.attn_input_sparse && k < 4; k++) {   /* q, k, v, wo by input: their only sparse form */
        const int64_t abytes = pi_sparse_pack_bytes(&L->act_attn[k], PI_FFN_SEQ);
        void *abuf = own_copy(m, abytes, "laying out the attention by input");
        if (!abuf) return PI_ERR_OUT_OF_MEMORY;
        pi_status st = pi_sparse_pack_on(pool, &L->act_attn[k], PI_FFN_SEQ, abuf, abytes, &L->act_attn[k]);
        if (st != PI_OK) return st;
    }
    return PI_OK;
}

/* The output head's copy for mul_mat. A tied table is repacked where get_rows reads the interleaved layout too (a
 * group_row_to_f32: Q8_0X16, Gemma's 262144-row head), so the head is read fast without a second copy. */
static pi_status repack_output(pi_model *m, pi_threadpool *pool) {
    if (m->output.data != m->token_embd.data) return repack_one(m, pool, &m->output);
    if (!m->output.data || !pi_traits(m->output.type)->repacked_type ||
        !pi_traits(pi_traits(m->output.type)->repacked_type)->group_row_to_f32)
        return PI_OK;
    pi_status st = repack_one(m, pool, &m->output);
    m->token_embd = m->output;
    return st;
}

/* Replaces a stack of experts' matrices [ne0, ne1, n_expert] by an interleaved copy: its rows as one matrix [ne0, ne1
 * n_expert], each expert's ne1 rows whole groups of the layout, so moe.c's view of expert e (e * nb[2] on) reads its
 * own rows. Left as it is: a stack whose experts are not nb[1] * ne1 apart (gemma4's fused gate|up views: repacked
 * as their whole stack by repack_layer) or whose ne1 is not a multiple of the layout's group. */
static pi_status repack_experts(pi_model *m, pi_threadpool *pool, pi_tensor *t) {
    const pi_type_traits *tr = t->data ? pi_traits(t->type) : NULL;
    if (!tr || !tr->repacked_type || t->n_dims != 3 || t->nb[2] != t->nb[1] * t->ne[1] ||
        t->ne[1] % pi_group_rows(tr->repacked_type))
        return PI_OK;
    pi_tensor flat = pi_tensor_view(t->type, t->data, 2, (int64_t[]){ t->ne[0], t->ne[1] * t->ne[2] });
    const int64_t bytes = pi_repack_bytes(&flat);
    if (bytes == 0) return PI_OK;
    void *buf = own_copy(m, bytes, "repacking experts");
    if (!buf) return PI_ERR_OUT_OF_MEMORY;
    pi_status st = pi_repack_on(pool, &flat, buf, bytes, &flat);
    if (st == PI_OK) *t = pi_tensor_view(flat.type, buf, 3, t->ne);   /* [ne0, ne1, n_expert] */
    return st;
}

/* A layer's weights only mul_mat reads (not the sparse FFN's gathered rows), and a PowerInfer layer's packing. */
static pi_status repack_layer(pi_model *m, pi_threadpool *pool, pi_layer *L) {
    pi_tensor *w[] = { &L->wq, &L->wk, &L->wv, &L->wqkv, &L->wo, &L->fc1, &L->fc2, &L->ssm_qkv, &L->ssm_z,
                       &L->ssm_out,
                       m->hp.sparse ? NULL : &L->ffn_gate, m->hp.sparse ? NULL : &L->ffn_up,
                       m->hp.sparse ? NULL : &L->ffn_down, &L->ple_gate, &L->ple_proj, &L->ffn_gate_shexp,
                       &L->ffn_up_shexp, &L->ffn_down_shexp, &L->wq_a, &L->wq_b, &L->wkv_a };
    pi_tensor *experts[] = { &L->ffn_gate_exps, &L->ffn_up_exps, &L->ffn_down_exps };
    pi_status st = PI_OK;
    for (size_t i = 0; i < sizeof w / sizeof w[0] && st == PI_OK; i++)
        if (w[i]) st = repack_one(m, pool, w[i]);
    pi_tensor *g = &L->ffn_gate_exps, *u = &L->ffn_up_exps;
    const int64_t F = g->ne[1];
    if (st == PI_OK && g->data && g->n_dims == 3 && u->data == (char *)g->data + F * g->nb[1] &&
        g->nb[2] == 2 * F * g->nb[1] && pi_traits(g->type)->repacked_type &&
        F % pi_group_rows(pi_traits(g->type)->repacked_type) == 0) {
        /* gemma4's fused ffn_gate_up_exps [E, 2F, NE] (load_moe's two views): the stack repacked whole, each half of
         * an expert whole groups, then the views again */
        pi_tensor gu = *g;
        gu.ne[1] = 2 * F;
        st = repack_experts(m, pool, &gu);
        if (st == PI_OK && gu.data != g->data) {
            *g = *u = gu;
            g->ne[1] = u->ne[1] = F;
            u->data = (char *)gu.data + F * gu.nb[1];
        }
        experts[0] = experts[1] = NULL;
    }
    for (size_t i = 0; i < sizeof experts / sizeof experts[0] && st == PI_OK; i++)
        if (experts[i]) st = repack_experts(m, pool, experts[i]);
    return st == PI_OK && m->hp.sparse ? pack_sparse_ffn(m, pool, L) : st;
}

/* The load-time copies: the weights only mul_mat reads (not token_embd: get_rows) and the sparse FFNs' packings.
 * no_repack: only the packings of the gate-sparse parts the file has no transposed copy of. */
static pi_status repack_weights(pi_model *m, bool no_repack) {
    pi_threadpool *pool = NULL;   /* the copies are made by all cores; without a pool, by this thread */
    if (pi_threadpool_create(0, &pool) != PI_OK) { pool = NULL; pi_clear_error(); }
    pi_status st = no_repack ? PI_OK : repack_output(m, pool);
    if (st == PI_OK && !no_repack) st = repack_one(m, pool, &m->ple_model_proj);
    for (int32_t il = 0; il < m->hp.n_layer && st == PI_OK; il++) {
        if (!no_repack) st = repack_layer(m, pool, &m->layers[il]);
        if (st == PI_OK && m->hp.gate_sparse) st = pack_act_ffn(m, pool, &m->layers[il], no_repack);
    }
    pi_threadpool_free(pool);
    return st;
}

/* An encoder's tensors (PI_ARCH_BERT, llama.cpp's bert graph): the embeddings' table, type table, positions (where
 * the file has them: bert; nomic-bert ropes instead) and LayerNorm; per layer q/k/v (+ biases: qkv_bias), the output
 * (+ bias: attn_out_bias), attn_output_norm, the FFN (a gate with PI_FFN_PAR; up and down biases where present) and
 * layer_output_norm, each norm with weight and bias. No output norm or head. */
static pi_status load_encoder(const pi_model_desc *desc, pi_model *m) {
    const pi_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff, Ekv = pi_head_dim(hp) * hp->n_head_kv;
    const int64_t Eq = pi_head_dim(hp) * hp->n_head;
    pi_status st;
#define GET(nm, ne0, ne1, f32, opt, dst) do { if ((st = load_tensor(desc, nm, ne0, ne1, f32, opt, dst)) != PI_OK) \
        return st; } while (0)
    GET("token_embd_norm.weight", E, 0, true, false, &m->tok_norm);
    GET("token_embd_norm.bias", E, 0, true, false, &m->tok_norm_b);
    const pi_tensor_desc *tt = pi_find_tensor(desc, "token_types.weight");
    if (tt) GET("token_types.weight", E, tt->n_dims == 2 ? tt->ne[1] : 1, false, false, &m->type_embd);
    const pi_tensor_desc *pe = pi_find_tensor(desc, "position_embd.weight");
    if (pe) {   /* bert: one row per position the model was trained on */
        if (pe->n_dims != 2 || pe->ne[1] < 1 || pe->ne[1] > MAX_DIM)
            return pi_fail(PI_ERR_BAD_MODEL, "'position_embd.weight' must be 2-d [n_embd, n_pos]");
        GET("position_embd.weight", E, pe->ne[1], false, false, &m->pos_embd);
    }
    char name[96];
#define LAYER(suffix, ne0, ne1, f32, opt, dst) do { snprintf(name, sizeof name, "blk.%d." suffix, il); \
        GET(name, ne0, ne1, f32, opt, dst); } while (0)
    for (int32_t il = 0; il < hp->n_layer; il++) {
        pi_layer *L = &m->layers[il];
        LAYER("attn_q.weight", E, Eq, false, false, &L->wq);
        LAYER("attn_k.weight", E, Ekv, false, false, &L->wk);
        LAYER("attn_v.weight", E, Ekv, false, false, &L->wv);
        if (hp->qkv_bias) {
            LAYER("attn_q.bias", Eq, 0, true, false, &L->bq);
            LAYER("attn_k.bias", Ekv, 0, true, false, &L->bk);
            LAYER("attn_v.bias", Ekv, 0, true, false, &L->bv);
        }
        LAYER("attn_output.weight", Eq, E, false, false, &L->wo);
        if (hp->attn_out_bias) LAYER("attn_output.bias", E, 0, true, false, &L->bo);
        LAYER("attn_output_norm.weight", E, 0, true, false, &L->attn_out_norm);
        LAYER("attn_output_norm.bias", E, 0, true, false, &L->attn_out_norm_b);
        LAYER("ffn_gate.weight", E, F, false, hp->ffn_gate == PI_FFN_SEQ, &L->ffn_gate);
        LAYER("ffn_up.weight", E, F, false, false, &L->ffn_up);
        LAYER("ffn_up.bias", F, 0, true, true, &L->ffn_up_b);
        LAYER("ffn_down.weight", F, E, false, false, &L->ffn_down);
        LAYER("ffn_down.bias", E, 0, true, true, &L->ffn_down_b);
        LAYER("layer_output_norm.weight", E, 0, true, false, &L->layer_out_norm);
        LAYER("layer_output_norm.bias", E, 0, true, false, &L->layer_out_norm_b);
    }
#undef LAYER
#undef GET
    return PI_OK;
}

pi_status pi_model_create(const pi_model_desc *desc, pi_model **out) {
    if (!out) return pi_fail(PI_ERR_INVALID_ARG, "pi_model_create: out is NULL");
    *out = NULL;
    if (!desc) return pi_fail(PI_ERR_INVALID_ARG, "pi_model_create: desc is NULL");
    if (desc->n_tensors < 0 || (desc->n_tensors > 0 && !desc->tensors))
        return pi_fail(PI_ERR_INVALID_ARG, "pi_model_create: bad tensor table");
    const pi_hparams *hp = &desc->hparams;
    pi_status st = check_hparams(hp);
    if (st != PI_OK) return st;

    pi_model *m = calloc(1, sizeof *m);
    if (!m) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
    m->hp = *hp;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) { st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory"); goto fail; }
    TRY(make_geom(desc, m));

    const int64_t E = hp->n_embd, V = hp->n_vocab;
    TRY(load_tensor(desc, "token_embd.weight", E, V, false, false, &m->token_embd));
    const bool falcon = hp->arch == PI_ARCH_FALCON, opt = hp->arch == PI_ARCH_OPT, ln = falcon || opt;   /* + biases */
    if (pi_is_encoder(hp)) {
        TRY(load_encoder(desc, m));
        goto loaded;
    }
    TRY(load_tensor(desc, "output_norm.weight", E, 0, true, false, &m->output_norm));
    if (ln) TRY(load_tensor(desc, "output_norm.bias", E, 0, true, false, &m->output_norm_b));
    if (opt) {
        const pi_tensor_desc *pe = pi_find_tensor(desc, "position_embd.weight");
        if (!pe) { st = pi_fail(PI_ERR_BAD_MODEL, "opt: missing tensor 'position_embd.weight'"); goto fail; }
        const int64_t n_pos = pe->n_dims == 2 ? pe->ne[1] : 0;
        if (n_pos <= PI_OPT_POS_OFFSET || n_pos > MAX_DIM) {
            st = pi_fail(PI_ERR_BAD_MODEL, "opt: 'position_embd.weight' must be 2-d [n_embd, n_pos > 2]");
            goto fail;
        }
        TRY(load_tensor(desc, "position_embd.weight", E, n_pos, false, false, &m->pos_embd));
    }
    TRY(load_tensor(desc, "output.weight", E, V, false, true, &m->output));
    if (!m->output.data) m->output = m->token_embd;   /* tied embeddings */
    TRY(load_tensor(desc, "rope_freqs.weight", hp->n_rot / 2, 0, true, true, &m->rope_freqs));
    TRY(load_tensor(desc, "rope_freqs_long.weight", hp->n_rot / 2, 0, true, true, &m->rope_freqs_long));
    if (m->rope_freqs_long.data && !m->rope_freqs.data) {
        st = pi_fail(PI_ERR_BAD_MODEL, "rope_freqs_long.weight without rope_freqs.weight (the short factors)");
        goto fail;
    }

    const int64_t n_pl = hp->n_embd_per_layer;
    if (n_pl > 0) {   /* gemma4's per-layer embeddings: the table stays in the file (rows read by get_rows) */
        TRY(load_tensor(desc, "per_layer_token_embd.weight", n_pl * hp->n_layer, V, false, false, &m->ple_tok_embd));
        TRY(load_tensor(desc, "per_layer_model_proj.weight", E, n_pl * hp->n_layer, false, false, &m->ple_model_proj));
        TRY(load_tensor(desc, "per_layer_proj_norm.weight", n_pl, 0, true, false, &m->ple_proj_norm));
    }

    char name[96];
    for (int32_t il = 0; il < hp->n_layer; il++) {
        pi_layer *L = &m->layers[il];
        const pi_layer_geom *g = &m->geom[il];
        const int64_t F = g->n_ff, hd = g->head_dim, E_q = hd * hp->n_head, E_kv = hd * g->n_head_kv;
        const bool own_kv = g->kv_source == il;
        if (m->rope_freqs.data && (!g->is_local || !hp->rope_freqs_global) && g->n_rot != hp->n_rot) {
            st = pi_fail(PI_ERR_BAD_MODEL, "layer %d ropes %d dims with rope_freqs.weight of %d factors", il, g->n_rot,
                         hp->n_rot / 2);
            goto fail;
        }
#define LAYER(suffix, ne0, ne1, f32, opt, dst) do { \
        snprintf(name, sizeof name, "blk.%d." suffix, il); TRY(load_tensor(desc, name, ne0, ne1, f32, opt, dst)); } while (0)
        if (!hp->post_norms_only) LAYER("attn_norm.weight", E, 0, true, false, &L->attn_norm);
        if (ln) LAYER("attn_norm.bias", E, 0, true, false, &L->attn_norm_b);
        if (g->recurrent) {
            TRY(hp->shortconv ? pi_shortconv_load(desc, hp, il, L) : pi_gdn_load(desc, hp, il, L));
        } else if (hp->mla_kv_rank > 0) {
            TRY(load_mla(desc, hp, g, il, L));
        } else if (falcon) {
            LAYER("attn_norm_2.weight", E, 0, true, true, &L->attn_norm_2);
            if (L->attn_norm_2.data) LAYER("attn_norm_2.bias", E, 0, true, false, &L->attn_norm_2_b);
            LAYER("attn_qkv.weight", E, E_q + 2 * E_kv, false, false, &L->wqkv);
        } else {
            LAYER("attn_q.weight",      E, hp->attn_output_gate ? 2 * E_q : E_q,  false, false, &L->wq);
            if (own_kv) {
                LAYER("attn_k.weight",  E, E_kv, false, false, &L->wk);
                LAYER("attn_v.weight",  E, E_kv, false, hp->v_norm, &L->wv);   /* v_norm: V = K where absent */
            }
        }
        if (!g->recurrent)
            LAYER("attn_output.weight", hp->mla_kv_rank > 0 ? hp->n_head * hp->mla_head_v : E_q, E, false, false,
                  &L->wo);
        if (opt || hp->attn_out_bias) LAYER("attn_output.bias", E, 0, true, false, &L->bo);
        if (hp->attn_sinks) LAYER("attn_sinks.weight", hp->n_head, 0, true, false, &L->attn_sinks);
        if (hp->ssm_d_state > 0)   /* qwen35 / qwen3next: the FFN's norm is named post_attention_norm */
            LAYER("post_attention_norm.weight", E, 0, true, false, &L->ffn_norm);
        else if (!falcon && !hp->post_norms_only && !hp->parallel_block)   /* falcon, parallel_block: one norm */
            LAYER("ffn_norm.weight", E, 0, true, false, &L->ffn_norm);
        if (opt) LAYER("ffn_norm.bias", E, 0, true, false, &L->ffn_norm_b);
        if (hp->qkv_bias) {
            LAYER("attn_q.bias", E_q, 0, true, false, &L->bq);
            if (own_kv) LAYER("attn_k.bias", E_kv, 0, true, false, &L->bk);
            if (own_kv) LAYER("attn_v.bias", E_kv, 0, true, false, &L->bv);
        }
        if (hp->qk_norm && !g->recurrent) {   /* per head, or over the whole projection (olmo2) */
            LAYER("attn_q_norm.weight", hp->qk_norm == 2 ? E_q : hd, 0, true, false, &L->q_norm);
            if (own_kv) LAYER("attn_k_norm.weight", hp->qk_norm == 2 ? E_kv : hd, 0, true, false, &L->k_norm);
        }
        LAYER("layer_output_scale.weight", 1, 0, true, true, &L->out_scale);
        if (n_pl > 0) {
            LAYER("inp_gate.weight", E, n_pl, false, false, &L->ple_gate);
            LAYER("proj.weight", n_pl, E, false, false, &L->ple_proj);
            LAYER("post_norm.weight", E, 0, true, false, &L->ple_norm);
        }
        if (hp->post_norms) {
            LAYER("post_attention_norm.weight", E, 0, true, false, &L->post_attn_norm);
            LAYER("post_ffw_norm.weight", E, 0, true, false, &L->post_ffn_norm);
        }
        if (g->moe) {   /* mixture of experts: the router and the experts (moe_dense_ffn: the dense FFN too) */
            TRY(load_moe(desc, hp, il, L));
            if (!hp->moe_dense_ffn) continue;
            LAYER("post_ffw_norm_1.weight", E, 0, true, false, &L->ffn_post_norm_1);
            LAYER("pre_ffw_norm_2.weight", E, 0, true, false, &L->ffn_pre_norm_2);
            LAYER("post_ffw_norm_2.weight", E, 0, true, false, &L->ffn_post_norm_2);
        }
        LAYER("ffn_gate.weight",    E, F,    false, hp->ffn_gate == PI_FFN_SEQ, &L->ffn_gate);
        LAYER("ffn_up.weight",      E, F,    false, false, &L->ffn_up);
        if (hp->ffn_act == PI_ACT_XIELU) LAYER("ffn_act.weight", 4, 0, true, false, &L->act_params);
        if (opt) LAYER("ffn_up.bias", F, 0, true, false, &L->ffn_up_b);
        if (!hp->sparse) {
            LAYER("ffn_down.weight", F, E, false, false, &L->ffn_down);
            if (hp->gate_sparse) TRY(load_act_sparse(desc, hp, il, L));
            continue;
        }
        LAYER("ffn_down_t.weight", E, F, false, false, &L->ffn_down_t);
        if (opt) LAYER("ffn_down_t.bias", E, 0, true, false, &L->ffn_down_t_b);
        snprintf(name, sizeof name, "blk.%d.fc1.weight", il);
        const pi_tensor_desc *fc1 = pi_find_tensor(desc, name);
        if (!fc1) { st = pi_fail(PI_ERR_BAD_MODEL, "sparse model without predictor: missing tensor '%s'", name); goto fail; }
        const int64_t rank = fc1->n_dims == 2 ? fc1->ne[1] : 0;
        if (rank < 1 || rank > MAX_DIM) {
            st = pi_fail(PI_ERR_BAD_MODEL, "predictor '%s' must be 2-d [n_embd, rank]", name);
            goto fail;
        }
        m->max_rank = PI_MAX(m->max_rank, rank);
        LAYER("fc1.weight", E, rank, false, false, &L->fc1);
        LAYER("fc2.weight", rank, F, false, false, &L->fc2);
#undef LAYER
    }
loaded:
    m->output_file = m->output;
    if (!(m->file_layers = malloc((size_t)hp->n_layer * sizeof *m->file_layers))) {
        st = pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    memcpy(m->file_layers, m->layers, (size_t)hp->n_layer * sizeof *m->file_layers);
    if (!desc->no_repack || hp->gate_sparse) TRY(repack_weights(m, desc->no_repack));
    *out = m;
    return PI_OK;
fail:
    pi_model_free(m);
    return st;
}

void pi_model_free(pi_model *model) {
    if (!model) return;
    for (int32_t i = 0; i < model->n_repacked; i++) free(model->repacked[i]);
    free(model->repacked);
    free(model->layers);
    free(model->geom);
    free(model->file_layers);
    free(model);
}

int32_t pi_model_n_packed_ffn(const pi_model *model) { return model ? model->n_packed_ffn : 0; }

pi_status pi_model_hparams(const pi_model *model, pi_hparams *out) {
    if (!model || !out) return pi_fail(PI_ERR_INVALID_ARG, "pi_model_hparams: NULL argument");
    *out = model->hp;
    return PI_OK;
}

pi_status pi_model_layer_geom(const pi_model *model, int32_t il, pi_layer_geom *out) {
    if (!model || !out) return pi_fail(PI_ERR_INVALID_ARG, "pi_model_layer_geom: NULL argument");
    if (il < 0 || il >= model->hp.n_layer)
        return pi_fail(PI_ERR_INVALID_ARG, "pi_model_layer_geom: layer %d is out of range [0, %d)", il,
                       model->hp.n_layer);
    *out = model->geom[il];
    return PI_OK;
}
