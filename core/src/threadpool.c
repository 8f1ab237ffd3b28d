/* threadpool.c: a fixed set of worker threads that run one task at a time.
 * Workers spin briefly on a generation counter (ops follow each other within
 * microseconds during a decode) and then sleep on a condition variable, so an
 * idle pool costs no CPU. The caller takes part as thread 0. */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* The spin-wait hint: tells the core (and its SMT sibling) that this thread is only polling. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__) || (defined(__arm__) && defined(__ARM_ARCH) && __ARM_ARCH >= 7)
#define CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define CPU_RELAX() __asm__ __volatile__("" ::: "memory")   /* no hint known here: a compiler barrier only */
#endif

#define SPIN_ROUNDS 2000   /* ~0.1 ms of spinning before yielding: short enough on a busy machine */

struct pi_threadpool {
    int32_t           n_threads;
    pthread_t        *threads;        /* [n_threads - 1] workers */
    pthread_mutex_t   mutex;
    pthread_cond_t    wake;
    atomic_int        generation;     /* bumped once per task */
    atomic_int        pending;        /* workers still running the current task */
    atomic_bool       stop;
    pi_task_fn        fn;
    void             *arg;
    atomic_int        n_active;       /* threads the next runs use (pi_threadpool_set_active), <= n_threads */
    int               run_nth;        /* the current run's thread count */
};

typedef struct { pi_threadpool *pool; int ith; } worker_arg;

static void *worker_main(void *p) {
    worker_arg wa = *(worker_arg *)p;
    free(p);
    pi_threadpool *pool = wa.pool;
    int seen = 0;   /* the generation at pool creation; a task may be posted before we start */
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&pool->generation, memory_order_acquire) == seen &&
               !atomic_load(&pool->stop)) {
            if (++spins < SPIN_ROUNDS) { CPU_RELAX(); continue; }
            pthread_mutex_lock(&pool->mutex);
            while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->wake, &pool->mutex);
            pthread_mutex_unlock(&pool->mutex);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = atomic_load(&pool->generation);
        const int nth = pool->run_nth;
        if (wa.ith >= nth) continue;   /* not one of this run's threads */
        pool->fn(pool->arg, wa.ith, nth);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
}

int32_t pi_physical_cores(void) {
    /* Count distinct (physical id, core id) pairs; fall back to online CPUs. */
    FILE *f = fopen("/proc/cpuinfo", "r");
    int32_t n = 0;
    if (f) {
        char line[256];
        int phys = 0, seen_pairs[1024][2], n_pairs = 0;
        while (fgets(line, sizeof line, f)) {
            int v;
            if (sscanf(line, "physical id : %d", &v) == 1) phys = v;
            else if (sscanf(line, "core id : %d", &v) == 1) {
                int dup = 0;
                for (int i = 0; i < n_pairs; i++) dup |= seen_pairs[i][0] == phys && seen_pairs[i][1] == v;
                if (!dup && n_pairs < 1024) { seen_pairs[n_pairs][0] = phys; seen_pairs[n_pairs][1] = v; n_pairs++; }
            }
        }
        fclose(f);
        n = n_pairs;
    }
    if (n <= 0) n = (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

pi_status pi_threadpool_create(int32_t n_threads, pi_threadpool **out) {
    if (!out) return pi_fail(PI_ERR_INVALID_ARG, "pi_threadpool_create: out is NULL");
    *out = NULL;
    if (n_threads <= 0) n_threads = pi_physical_cores();
    if (n_threads > 512) return pi_fail(PI_ERR_INVALID_ARG, "n_threads = %d is too many (max 512)", n_threads);
    pi_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool) return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory creating a thread pool");
    pool->n_threads = n_threads;
    atomic_init(&pool->n_active, n_threads);
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pool->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!pool->threads) { free(pool); return pi_fail(PI_ERR_OUT_OF_MEMORY, "out of memory creating a thread pool"); }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa || pthread_create(&pool->threads[i - 1], NULL, worker_main, wa ? (wa->pool = pool, wa->ith = i, wa) : NULL) != 0) {
            free(wa);
            pool->n_threads = i;   /* join what was started */
            pi_threadpool_free(pool);
            return pi_fail(PI_ERR_OUT_OF_MEMORY, "could not start worker thread %d", i);
        }
    }
    *out = pool;
    return PI_OK;
}

void pi_threadpool_free(pi_threadpool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->stop, true);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i - 1], NULL);
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->wake);
    free(pool->threads);
    free(pool);
}

int32_t pi_threadpool_size(const pi_threadpool *pool) { return pool ? atomic_load(&pool->n_active) : 1; }

int32_t pi_threadpool_capacity(const pi_threadpool *pool) { return pool ? pool->n_threads : 1; }

void pi_threadpool_set_active(pi_threadpool *pool, int32_t n) {
    if (pool) atomic_store(&pool->n_active, PI_MAX(1, PI_MIN(n, pool->n_threads)));
}

void pi_threadpool_run(pi_threadpool *pool, pi_task_fn fn, void *arg) {
    const int nth = pool ? atomic_load(&pool->n_active) : 1;
    if (nth == 1) { fn(arg, 0, 1); return; }
    pool->fn = fn;
    pool->arg = arg;
    pool->run_nth = nth;
    atomic_store(&pool->pending, nth - 1);
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    fn(arg, 0, nth);
    /* wait for the workers; yield the core now and then in case one of them was preempted */
    for (int spins = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; spins++) {
        if (spins < SPIN_ROUNDS) CPU_RELAX();
        else sched_yield();
    }
}
