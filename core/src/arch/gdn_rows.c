/* gdn_rows.c: the gated delta rule's row kernel (gdn.c): rows j0..j1 of one value head's transposed state over a call's
 * T tokens, each row kept hot while it takes every token: row = e^g row (from src at the first token), d = (v_j -
 * row . k) beta, row += d k, out_j = (row . q) scale. The dot and the axpy are this level's pi_dot_f32 and pi_axpy_f32
 * inlined (their operation order: every level gives the scalar level's bits, as the unfused calls did). */

static void pi_gdn_rows(int64_t S, int64_t T, int64_t j0, int64_t j1, const float *src, float *dst, const float *k,
                        int64_t ldk, const float *q, int64_t ldq, const float *v, int64_t ldv, const float *eg,
                        const float *beta, int64_t ldg, float scale, float *out, int64_t ldo) {
    for (int64_t j = j0; j < j1; j++) {
        const float *from = src + j * S;
        float *row = dst + j * S;
        for (int64_t t = 0; t < T; t++) {
            const float e = eg[t * ldg], b = beta[t * ldg];
            const float *kt = k + t * ldk, *qt = q + t * ldq;
            for (int64_t i = 0; i < S; i++) row[i] = from[i] * e;
            from = row;
            const float d = (v[t * ldv + j] - pi_dot_f32(S, row, kt)) * b;
            pi_axpy_f32(S, d, kt, row);
            out[t * ldo + j] = pi_dot_f32(S, row, qt) * scale;
        }
    }
}
