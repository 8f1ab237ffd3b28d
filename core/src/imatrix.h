/* imatrix.h: the importance-matrix observer (imatrix.c): while a context collects (pi_imatrix_begin), the forward
 * pass hands it the input of every weight matmul it makes; it sums x^2 per input column, as llama-imatrix does. */
#ifndef PI_IMATRIX_H
#define PI_IMATRIX_H

#include "internal.h"

typedef struct pi_imatrix pi_imatrix;

/* x [T][w->ne[0]]: the input of y = W x. Weights the observer does not know (views, LoRA terms) are ignored, as are
 * batches of fewer than 16 rows (llama-imatrix's rule for plain matmuls). */
pi_status pi_imatrix_observe(pi_imatrix *im, const pi_tensor *w, const float *x, int64_t T);
/* expert ex of the 3-D tensor w (its [ne0, ne1] slice) got the m rows x (every batch size, as MUL_MAT_ID) */
pi_status pi_imatrix_observe_expert(pi_imatrix *im, const pi_tensor *w, int64_t ex, const float *x, int64_t m);

#endif
