/* quant_iq.h: the IQ quantizers of the file quantizer (quant_iq3.c), rows of n values (n a multiple of 256) with
 * importance weights qw [n] or NULL, llama.cpp's bytes. pi_iq3_tables_ready: the grid tables of IQ3_XXS / IQ3_S
 * could be built (false only when memory ran out; the row functions then must not be called). */
#ifndef PI_QUANT_IQ_H
#define PI_QUANT_IQ_H

#include "quants_k.h"

#include <stdbool.h>

bool pi_iq3_tables_ready(int32_t type);
void pi_iq3_xxs_row(const float *x, void *dst, int64_t n, const float *qw);
void pi_iq3_s_row(const float *x, void *dst, int64_t n, const float *qw);

#endif
