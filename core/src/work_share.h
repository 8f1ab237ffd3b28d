/* work_share.h: how the pool's threads share the rows of a matmul bound by its weight stream (decode, ops.c).
 *
 * Each thread owns a contiguous stretch of the rows, 1/nth of them, and takes it from the front in pieces of half
 * what is left; a thread whose stretch is empty takes the back half of the largest stretch left and owns that from
 * then on (work stealing). So every thread reads long runs of memory, and the rows of a thread that falls behind (a
 * slower core, a core shared with another process) go to the others. Rows handed out in small pieces alternate
 * between the threads through the memory instead: Gemma 3 270M's decode matrices on a Zen 5 took 1.37x the time
 * that way (bench/README.md, 2026-12-07); claims of 1/nth of the rows left, without owners and stealing, took 1.13x
 * the time of the small pieces with a busy process on one of the two cores (this: 0.89x). Which thread computes a row
 * never changes a result. */
#ifndef PI_WORK_SHARE_H
#define PI_WORK_SHARE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define PI_SHARE_MAX_THREADS 64   /* more threads (or 2^31 rows or more): pi_row_share_init declines */

typedef struct {
    _Alignas(64) atomic_ullong span;   /* the owner's rows left: back << 32 | front (front == back: none) */
} pi_share_slot;

typedef struct {
    int nth;
    int64_t unit;                              /* pieces are multiples of unit rows, but for the one ending at n */
    pi_share_slot slot[PI_SHARE_MAX_THREADS];
} pi_row_share;

/* Splits rows [0, n) into nth stretches (boundaries multiples of unit). false: nth or n too large for it. */
bool pi_row_share_init(pi_row_share *s, int64_t n, int nth, int64_t unit);

/* The next rows of thread ith, [returned, *end); returns -1 when no rows are left anywhere. */
int64_t pi_row_share_next(pi_row_share *s, int ith, int64_t *end);

#endif
