/* quant_iq3.c: the IQ3_XXS and IQ3_S quantizers of llama.cpp (quantize_iq3_xxs, quantize_iq3_s: ggml-quants.c's
 * quantize_row_iq3_xxs_impl / quantize_row_iq3_s_impl), with or without importance weights.
 *
 * Both search, per sub-block of 32, a scale over a 4-value lattice: groups of 4 magnitudes are rounded to levels
 * 0..7 and the point must be one of the grid's 256 (IQ3_XXS) or 512 (IQ3_S) points; a point off the grid is replaced
 * by the best of its neighbours (the grid points at the 2 (IQ3_XXS) or 3 (IQ3_S) smallest distinct squared
 * distances, in order of distance then grid index, as llama.cpp's iq3xs_init_impl lists them). The tables are built
 * once per grid (pthread_once), from the dequantization grids of iq_grids.h: a point's levels are its bytes' ranks.
 *
 * Like llama.cpp's, IQ3_S's quants and signs of a sub-block whose values are all zero are not written and the next
 * sub-block's are written in their place (its qs / signs pointers advance only past written sub-blocks), so the
 * files are the same bytes. */
#include "quant_iq.h"

#include "iq_grids.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define KMAP_SIZE 4096      /* 4 levels of 3 bits */
#define EPS_IQ3_XXS 1e-8f

typedef struct {
    uint32_t  grid[512];    /* bytes 2 l + 1 of each point's 4 levels l */
    int       map[KMAP_SIZE];   /* levels (3 bits each) -> grid index, or -(offset + 1) into neighbours */
    uint16_t *neighbours;   /* per off-grid point: the count, then the grid indices */
    int       size;
} iq3_table;

static iq3_table tables[2];
static pthread_once_t once[2] = { PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT };
static int table_ok[2];

static int cmp_pair(const void *a, const void *b) {
    const int *l = a, *r = b;
    return l[0] < r[0] ? -1 : l[0] > r[0] ? 1 : l[1] < r[1] ? -1 : l[1] > r[1] ? 1 : 0;
}

static void build(int which) {
    iq3_table *t = &tables[which];
    const int size = which == 0 ? 256 : 512, nwant = which == 0 ? 2 : 3;
    static const uint8_t xxs_bytes[8] = { 4, 12, 20, 28, 36, 44, 52, 62 };
    t->size = size;
    for (int i = 0; i < KMAP_SIZE; i++) t->map[i] = -1;
    for (int j = 0; j < size; j++) {
        const uint32_t g = which == 0 ? PI_IQ3_XXS_GRID[j] : PI_IQ3_S_GRID[j];
        uint32_t p = 0;
        int index = 0;
        for (int k = 0; k < 4; k++) {
            const uint8_t b = (uint8_t)(g >> 8 * k);
            int l = 0;
            if (which == 0) while (l < 7 && xxs_bytes[l] != b) l++;
            else l = (b - 1) / 2;
            p |= (uint32_t)(2 * l + 1) << 8 * k;
            index |= l << 3 * k;
        }
        t->grid[j] = p;
        t->map[index] = j;
    }
    int *d2 = malloc(2 * (size_t)size * sizeof(int));
    bool *off = malloc(KMAP_SIZE * sizeof(bool));
    if (!d2 || !off) goto done;
    for (int i = 0; i < KMAP_SIZE; i++) off[i] = t->map[i] < 0;
    /* twice, as llama.cpp: count the neighbours of each off-grid point, then list them at their offsets */
    for (int pass = 0; pass < 2; pass++) {
        int at = 0;
        for (int i = 0; i < KMAP_SIZE; i++) {
            if (!off[i]) continue;
            int8_t pos[4];
            for (int k = 0; k < 4; k++) pos[k] = (int8_t)(2 * ((i >> 3 * k) & 7) + 1);
            for (int j = 0; j < size; j++) {
                const int8_t *pg = (const int8_t *)&t->grid[j];
                int s = 0;
                for (int k = 0; k < 4; k++) s += (pg[k] - pos[k]) * (pg[k] - pos[k]);
                d2[2 * j] = s;
                d2[2 * j + 1] = j;
            }
            qsort(d2, (size_t)size, 2 * sizeof(int), cmp_pair);
            const int start = at++;
            if (pass == 1) t->map[i] = -(start + 1);
            int n = 0, have = 1, cur = d2[0];
            for (int j = 0; j < size; j++) {
                if (d2[2 * j] > cur) {
                    if (have == nwant) break;
                    cur = d2[2 * j];
                    have++;
                }
                if (pass == 1) t->neighbours[at] = (uint16_t)d2[2 * j + 1];
                at++;
                n++;
            }
            if (pass == 1) t->neighbours[start] = (uint16_t)n;
        }
        if (pass == 0 && !(t->neighbours = malloc((size_t)at * sizeof(uint16_t)))) goto done;
    }
    table_ok[which] = 1;
done:
    free(d2);
    free(off);
}

static void build_xxs(void) { build(0); }
static void build_s(void) { build(1); }

static const iq3_table *table(int which) {
    pthread_once(&once[which], which == 0 ? build_xxs : build_s);
    return table_ok[which] ? &tables[which] : NULL;
}

bool pi_iq3_tables_ready(int32_t type) { return table(type == PI_TYPE_IQ3_XXS ? 0 : 1) != NULL; }

/* the neighbour of the off-grid point with the least weighted squared error at `scale`; L gets its levels */
static int best_neighbour(const iq3_table *t, const uint16_t *nb, const float *xval, const float *w, float scale,
                          int8_t *L) {
    float best = FLT_MAX;
    int index = -1;
    for (int j = 1; j <= nb[0]; j++) {
        const int8_t *pg = (const int8_t *)&t->grid[nb[j]];
        float d2 = 0;
        for (int i = 0; i < 4; i++) {
            const float diff = scale * (float)pg[i] - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best) { best = d2; index = nb[j]; }
    }
    const int8_t *pg = (const int8_t *)&t->grid[index];
    for (int i = 0; i < 4; i++) L[i] = (int8_t)((pg[i] - 1) / 2);
    return index;
}

static int levels_index(const int8_t *L) {
    int u = 0;
    for (int i = 0; i < 4; i++) u |= L[i] << 3 * i;
    return u;
}

/* Rounds the 4 levels of group k at 1/id (clamped to 0..7) into Lk; on the grid: true, else the best neighbour at
 * scale is taken (false). */
static bool round_group(const iq3_table *t, const float *xval, const float *waux, float id, float scale, int8_t *Lk) {
    for (int i = 0; i < 4; i++) Lk[i] = (int8_t)PI_MAX(0, PI_MIN(7, pi_nearest_int(0.5f * (id * xval[i] - 1))));
    const int u = levels_index(Lk);
    if (t->map[u] >= 0) return true;
    best_neighbour(t, t->neighbours - t->map[u] - 1, xval, waux, scale, Lk);
    return false;
}

static float sum_sq256(const float *x) {
    float s = 0;
    for (int i = 0; i < PI_QK_K; i++) s += x[i] * x[i];
    return s;
}

/* Sub-block of 32: the weights, the magnitudes xval and the sign bytes (IQ3_XXS: an even count of minus signs per
 * 8, the least important element flipped to make it so). Returns max xval. */
static float prepare32(const float *xb, const float *qw, float sigma2, bool even_signs, float *w, float *waux,
                       float *xval, uint8_t *signs) {
    for (int i = 0; i < 32; i++) w[i] = qw ? qw[i] * sqrtf(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
    for (int i = 0; i < 32; i++) waux[i] = sqrtf(w[i]);
    for (int k = 0; k < 4; k++) {
        int nflip = 0;
        uint8_t s = 0;
        for (int i = 0; i < 8; i++) {
            if (xb[8 * k + i] >= 0) xval[8 * k + i] = xb[8 * k + i];
            else { xval[8 * k + i] = -xb[8 * k + i]; nflip++; s |= (uint8_t)(1 << i); }
        }
        if (even_signs && nflip % 2) {
            int imin = 0;
            float min = w[8 * k] * xb[8 * k] * xb[8 * k];
            for (int i = 1; i < 8; i++) {
                const float ax = w[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                if (ax < min) { min = ax; imin = i; }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            s ^= (uint8_t)(1 << imin);
        }
        signs[k] = even_signs ? (uint8_t)(s & 127) : s;
    }
    float max = xval[0];
    for (int i = 1; i < 32; i++) max = PI_MAX(max, xval[i]);
    return max;
}

/* the scale search of a sub-block: grids (2*8 - 1 + 0.2 is) / max for is in [-nis, nis], then the off-grid groups
 * rounded again at the best scale (only those still off the grid: IQ3_XXS; all of them: IQ3_S). L: its levels. */
static float search32(const iq3_table *t, const float *w, const float *waux, const float *xval, float max, int nis,
                      bool redo_all, int8_t *L) {
    int8_t Laux[32];
    bool on[8], on_aux[8];
    float best = 0, scale = max / 15;
    for (int k = 0; k < 8; k++) on[k] = !redo_all;
    for (int is = -nis; is <= nis; is++) {
        const float id = (15 + (float)is * 0.2f) / max, this_scale = 1 / id;
        for (int k = 0; k < 8; k++) on_aux[k] = round_group(t, xval + 4 * k, waux + 4 * k, id, this_scale, Laux + 4 * k);
        float sumqx = 0, sumq2 = 0;
        for (int i = 0; i < 32; i++) {
            const float q = (float)(2 * Laux[i] + 1);
            sumqx += w[i] * xval[i] * q;
            sumq2 += w[i] * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            memcpy(L, Laux, 32);
            memcpy(on, on_aux, sizeof on);
        }
    }
    int off = 0;
    for (int k = 0; k < 8; k++) off += !on[k];
    if (off > 0 && scale > 0) {
        const float id = 1 / scale;
        for (int k = 0; k < 8; k++) {
            if (!redo_all && on[k]) continue;
            int8_t Lk[4];
            for (int i = 0; i < 4; i++) Lk[i] = (int8_t)PI_MAX(0, PI_MIN(7, pi_nearest_int(0.5f * (id * xval[4 * k + i] - 1))));
            int index = t->map[levels_index(Lk)];
            if (index < 0)
                index = best_neighbour(t, t->neighbours - index - 1, xval + 4 * k, waux + 4 * k, scale, L + 4 * k);
            const int8_t *pg = (const int8_t *)&t->grid[index];
            for (int i = 0; i < 4; i++) L[4 * k + i] = (int8_t)((pg[i] - 1) / 2);
        }
        float sumqx = 0, sumq2 = 0;
        for (int i = 0; i < 32; i++) {
            const float q = (float)(2 * L[i] + 1);
            sumqx += w[i] * xval[i] * q;
            sumq2 += w[i] * q * q;
        }
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    return scale;
}

void pi_iq3_xxs_row(const float *x, void *dst, int64_t n, const float *qw) {
    const iq3_table *t = table(0);
    pi_block_iq3_xxs *y = dst;
    float scales[8], w[32], waux[32], xval[32];
    int8_t L[32];
    uint8_t signs[4];
    for (int64_t b = 0; b < n / PI_QK_K; b++) {
        const float *xbl = x + PI_QK_K * b;
        uint8_t q3[3 * PI_QK_K / 8];
        memset(q3, 0, sizeof q3);
        y[b].d = pi_f32_to_fp16(0.0f);
        const float sigma2 = 2 * sum_sq256(xbl) / PI_QK_K;
        float max_scale = 0;
        uint32_t sas[8] = { 0 };   /* scales and signs */
        for (int ib = 0; ib < 8; ib++) {
            const float max = prepare32(xbl + 32 * ib, qw ? qw + PI_QK_K * b + 32 * ib : NULL, sigma2, true, w, waux,
                                        xval, signs);
            memset(L, 0, sizeof L);
            if (max < EPS_IQ3_XXS) {
                scales[ib] = 0;
                continue;
            }
            float scale = search32(t, w, waux, xval, max, 15, false, L);
            if (scale < 0) {
                scale = -scale;
                for (int k = 0; k < 4; k++) signs[k] = (uint8_t)(~signs[k] & 127);
            }
            for (int k = 0; k < 8; k++) q3[8 * ib + k] = (uint8_t)t->map[levels_index(L + 4 * k)];
            sas[ib] = (uint32_t)signs[0] | (uint32_t)signs[1] << 7 | (uint32_t)signs[2] << 14 | (uint32_t)signs[3] << 21;
            scales[ib] = scale;
            max_scale = PI_MAX(max_scale, scale);
        }
        if (max_scale == 0.0f) {
            memset(y[b].qs, 0, sizeof y[b].qs);
            continue;
        }
        const float d = max_scale / 31;
        y[b].d = pi_f32_to_fp16(d * 1.0125f);
        const float id = 1 / d;
        for (int ib = 0; ib < 8; ib++) {
            const int l = PI_MAX(0, PI_MIN(15, pi_nearest_int(0.5f * (id * scales[ib] - 1))));
            sas[ib] |= (uint32_t)l << 28;
        }
        memcpy(q3 + PI_QK_K / 4, sas, sizeof sas);
        memcpy(y[b].qs, q3, sizeof y[b].qs);
    }
}

void pi_iq3_s_row(const float *x, void *dst, int64_t n, const float *qw) {
    const iq3_table *t = table(1);
    pi_block_iq3_s *y = dst;
    float scales[8], w[32], waux[32], xval[32];
    int8_t L[32];
    uint8_t signs[4];
    for (int64_t b = 0; b < n / PI_QK_K; b++) {
        memset(&y[b], 0, sizeof y[b]);
        uint8_t *qs = y[b].qs, *sg = y[b].signs;   /* advance past written sub-blocks only (llama.cpp's) */
        const float *xbl = x + PI_QK_K * b;
        const float sigma2 = 2 * sum_sq256(xbl) / PI_QK_K;
        float max_scale = 0;
        for (int ib = 0; ib < 8; ib++) {
            const float max = prepare32(xbl + 32 * ib, qw ? qw + PI_QK_K * b + 32 * ib : NULL, sigma2, false, w, waux,
                                        xval, signs);
            memset(L, 0, sizeof L);
            if (max == 0.0f) {
                scales[ib] = 0;
                continue;
            }
            float scale = search32(t, w, waux, xval, max, 9, true, L);
            if (scale < 0) {
                scale = -scale;
                for (int k = 0; k < 4; k++) signs[k] = (uint8_t)~signs[k];
            }
            for (int k = 0; k < 8; k++) {
                const int index = t->map[levels_index(L + 4 * k)];
                qs[k] = (uint8_t)(index & 255);
                y[b].qh[(ib * 8 + k) / 8] |= (uint8_t)((index >> 8) << ((ib * 8 + k) % 8));
            }
            qs += 8;
            memcpy(sg, signs, 4);
            sg += 4;
            scales[ib] = scale;
            max_scale = PI_MAX(max_scale, scale);
        }
        if (max_scale == 0.0f) continue;
        const float d = max_scale / 31;
        y[b].d = pi_f32_to_fp16(d * 1.033f);
        const float id = 1 / d;
        for (int ib = 0; ib < 8; ib += 2) {
            const int l1 = PI_MAX(0, PI_MIN(15, pi_nearest_int(0.5f * (id * scales[ib] - 1))));
            const int l2 = PI_MAX(0, PI_MIN(15, pi_nearest_int(0.5f * (id * scales[ib + 1] - 1))));
            y[b].scales[ib / 2] = (uint8_t)(l1 | l2 << 4);
        }
    }
}
