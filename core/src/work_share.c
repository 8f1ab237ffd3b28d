/* work_share.c: the threads' shares of a matmul's rows at decode (work_share.h). */
#include "work_share.h"

static inline uint64_t pack(int64_t front, int64_t back) { return (uint64_t)back << 32 | (uint64_t)front; }
static inline int64_t front_of(uint64_t v) { return (int64_t)(v & 0xffffffffu); }
static inline int64_t back_of(uint64_t v) { return (int64_t)(v >> 32); }

/* Where to cut rows [f, b) in two: half of them (a multiple of unit from f), or b where there is no room for two. */
static inline int64_t half_point(int64_t f, int64_t b, int64_t unit) {
    const int64_t half = (b - f) / 2 / unit * unit;
    return half >= unit && f + half < b ? f + half : b;
}

bool pi_row_share_init(pi_row_share *s, int64_t n, int nth, int64_t unit) {
    if (nth < 1 || nth > PI_SHARE_MAX_THREADS || n < 0 || n >= (int64_t)1 << 31 || unit < 1) return false;
    s->nth = nth;
    s->unit = unit;
    for (int i = 0; i < nth; i++) {
        const int64_t f = n * i / nth / unit * unit, b = i + 1 == nth ? n : n * (i + 1) / nth / unit * unit;
        atomic_init(&s->slot[i].span, pack(f, b < f ? f : b));
    }
    return true;
}

/* The front half of thread ith's own stretch (all of it when it is short), or false when it is empty. */
static bool take_front(pi_row_share *s, int ith, int64_t *r0, int64_t *r1) {
    atomic_ullong *span = &s->slot[ith].span;
    uint64_t v = atomic_load(span);
    for (;;) {
        const int64_t f = front_of(v), b = back_of(v);
        if (f >= b) return false;
        const int64_t m = half_point(f, b, s->unit);
        if (atomic_compare_exchange_weak(span, &v, pack(m, b))) {
            *r0 = f;
            *r1 = m;
            return true;
        }
    }
}

/* Moves the back half of the largest stretch left (all of it when it is short) to thread ith; false: none left. */
static bool steal(pi_row_share *s, int ith) {
    for (;;) {
        int victim = -1;
        int64_t most = 0;
        for (int i = 0; i < s->nth; i++) {
            const uint64_t v = atomic_load(&s->slot[i].span);
            if (back_of(v) - front_of(v) > most) { most = back_of(v) - front_of(v); victim = i; }
        }
        if (victim < 0) return false;
        atomic_ullong *span = &s->slot[victim].span;
        uint64_t v = atomic_load(span);
        const int64_t f = front_of(v), b = back_of(v);
        if (f >= b) continue;   /* taken meanwhile: look again */
        int64_t m = half_point(f, b, s->unit);
        if (m == b) m = f;      /* too short to halve: all of it */
        if (atomic_compare_exchange_strong(span, &v, pack(f, m))) {
            atomic_store(&s->slot[ith].span, pack(m, b));   /* an empty stretch: nobody else writes it */
            return true;
        }
    }
}

int64_t pi_row_share_next(pi_row_share *s, int ith, int64_t *end) {
    int64_t r0, r1;
    while (!take_front(s, ith, &r0, &r1))
        if (!steal(s, ith)) return -1;
    *end = r1;
    return r0;
}
