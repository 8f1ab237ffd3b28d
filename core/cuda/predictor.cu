/* predictor.cu: scores = fc2 relu(fc1 x), two launches of the mul_mat kernel family (ReLU fused
 * into the first). Scratch: the hidden [r, T] f32 activations + the q8_0 activation buffer. */
#include "common.cuh"

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

size_t pi_cuda_predictor_scratch(const pi_tensor *fc1, const pi_tensor *fc2, int64_t T) {
    const int64_t E = fc1->ne[0], r = fc1->ne[1];
    const size_t q1 = pi_cuda_mul_mat_scratch(fc1->type, E, T), q2 = pi_cuda_mul_mat_scratch(fc2->type, r, T);
    return align256((size_t)(r * T) * sizeof(float)) + align256(q1 > q2 ? q1 : q2);
}

pi_status pi_cuda_predictor(pi_cuda_stream *s, const pi_tensor *fc1, const pi_tensor *fc2, const pi_tensor *x,
                            pi_tensor *scores, void *scratch) {
    const int64_t T = x->ne[1], r = fc1->ne[1];
    float *hidden = (float *)scratch;
    void *q = (char *)scratch + align256((size_t)(r * T) * sizeof(float));
    int64_t ne[2] = { r, T };
    pi_tensor ht = pi_tensor_view(PI_TYPE_F32, hidden, 2, ne);
    PI_TRY(pi_cuda_mul_mat_ex(s, fc1, x, &ht, NULL, NULL, 0.0f, 1, q));
    return pi_cuda_mul_mat_ex(s, fc2, &ht, scores, NULL, NULL, 0.0f, 0, q);
}
