/* kv_cache.h: the key/value cache, a pool of cells shared by all sequences.
 * A cell holds one token's K and V rows for every layer, its position, and
 * the set of sequences it belongs to (several after pi_kv_seq_cp, which shares
 * a prompt without copying). A token attends to the cells of its sequence with
 * position <= its own. */
#ifndef PI_KV_CACHE_H
#define PI_KV_CACHE_H

#include "internal.h"
#include "model.h"

typedef struct pi_kv_cell {
    int32_t  pos;    /* -1 when free */
    uint64_t seqs;   /* bit s set: the cell belongs to sequence s */
} pi_kv_cell;

/* One layer's part of the cache. A layer that reads another's cache (pi_layer_geom.kv_source) has that layer's sizes
 * and offsets, and own = false: it is stored and saved once, with its source. */
typedef struct pi_kv_layer {
    int64_t n_embd_kv;                  /* head_dim * n_head_kv */
    int64_t k_row_bytes, v_row_bytes;   /* bytes of one cell's K (V) row */
    int64_t k_off, v_off;               /* where the layer's rows [n_ctx] start in k and v */
    bool    own;
} pi_kv_layer;

typedef struct pi_kv_cache {
    int32_t      n_ctx;      /* cells */
    int32_t      n_layer;
    int32_t      type_k, type_v;        /* the K and V rows' types (pi_kv_type_check) */
    pi_kv_layer *layer;      /* [n_layer] */
    pi_kv_cell  *cells;      /* [n_ctx] */
    char        *k;          /* per layer with its own cache: [n_ctx][n_embd_kv] */
    char        *v;
} pi_kv_cache;

/* Whether rows of head_dim values can be cached as `type` (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1:
 * llama.cpp's cache types); PI_OK or an error naming `which` ("K", "V"). */
pi_status pi_kv_type_check(int32_t type, int64_t head_dim, const char *which);
/* A cache of n_ctx cells for the model's layers (pi_model's geom: each layer's row sizes, shared layers none). */
pi_status pi_kv_init(pi_kv_cache *kv, int32_t n_ctx, const pi_model *model, int32_t type_k, int32_t type_v);
void      pi_kv_release(pi_kv_cache *kv);
/* Claims one free cell per token (written to cells[i]) and tags it with pos/seq. */
pi_status pi_kv_claim(pi_kv_cache *kv, int32_t n, const int32_t *pos, const int32_t *seq, int32_t *cells);
void      pi_kv_unclaim(pi_kv_cache *kv, int32_t n, const int32_t *cells);
/* Cells [0, n) cover every used cell. */
int32_t   pi_kv_span(const pi_kv_cache *kv);
/* Pointers to the K and V rows of a cell in a layer (a shared layer's: its source's). */
static inline char *pi_kv_k_row(const pi_kv_cache *kv, int32_t layer, int32_t cell) {
    return kv->k + kv->layer[layer].k_off + (int64_t)cell * kv->layer[layer].k_row_bytes;
}
static inline char *pi_kv_v_row(const pi_kv_cache *kv, int32_t layer, int32_t cell) {
    return kv->v + kv->layer[layer].v_off + (int64_t)cell * kv->layer[layer].v_row_bytes;
}

#endif
