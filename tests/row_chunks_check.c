/* Checks csrc/row_chunks.h, how the linear kernels share a step's row blocks (or a slice's
 * panels) among threads: every unit claimed exactly once, whatever order the threads claim in;
 * a thread that keeps pace takes only its own share, a slice at a time; a thread that stalls
 * has the rest of its share taken by the others, in pieces within `least` and `most`; real
 * threads claiming at once, one unit at a time, thousands of rounds (where claims and steals
 * race on the same share); and a slowed thread whose share the other takes. It prints "ok" or
 * what failed and exits nonzero; tests/test_row_chunks.py builds and runs it. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "row_chunks.h"

#define MAX_UNITS 5000
static int failures;
#define CHECK(cond, ...) \
    do { \
        if (!(cond)) { \
            failures++; \
            printf(__VA_ARGS__); \
            printf("\n"); \
        } \
    } while (0)

/* Claims by `threads` simulated threads in the order `next_thread` picks (-1: all done) until
 * every share is done; each block's claims counted in seen; steals (pieces taken from another
 * share) checked against least and most. */
static void simulate(int64_t units, int threads, int64_t slice, int64_t least, int64_t most,
                     int (*next_thread)(int step, int threads), const char *what) {
    Share shares[16];
    int seen[MAX_UNITS] = {0};
    share_units(shares, units, threads);
    for (int step = 0;; step++) {
        if (step > 4 * units + 64 * threads) { /* each claim takes a unit: this is a hang */
            CHECK(0, "%s: %lld units still not done after %d claims", what, (long long)units,
                  step);
            return;
        }
        const int t = next_thread(step, threads);
        int64_t first, own = take_units(shares + t, 0, slice, least, most, &first), n = own;
        for (int i = 1; n == 0 && i < threads; i++) {
            const uint64_t before = shares[(t + i) % threads].word;
            n = take_units(shares + (t + i) % threads, 1, slice, least, most, &first);
            const int64_t left = (int64_t)(before & 0xffffffffu) - (int64_t)(before >> 32);
            CHECK(n == 0 || n <= most, "%s: a steal of %lld > most %lld", what, (long long)n,
                  (long long)most);
            const int64_t floor = least < most ? least : most; /* most wins */
            CHECK(n == 0 || n >= floor || n == left, "%s: a steal of %lld < %lld", what,
                  (long long)n, (long long)floor);
        }
        if (n == 0) {
            int done = 1;
            for (int i = 0; i < threads; i++)
                done &= (shares[i].word >> 32) >= (shares[i].word & 0xffffffffu);
            if (done) break;
            continue;
        }
        CHECK(own == 0 || own <= slice, "%s: a slice of %lld > %lld", what, (long long)own,
              (long long)slice);
        if (first < 0 || first + n > units) {
            CHECK(0, "%s: a claim of %lld at %lld, outside %lld units", what, (long long)n,
                  (long long)first, (long long)units);
            return;
        }
        for (int64_t u = first; u < first + n; u++) seen[u]++;
    }
    for (int64_t u = 0; u < units; u++)
        CHECK(seen[u] == 1, "%s: block %lld claimed %d times", what, (long long)u, seen[u]);
}

static int round_robin(int step, int threads) { return step % threads; }
static int first_only(int step, int threads) { (void)step, (void)threads; return 0; }
static unsigned rng = 12345;
static int at_random(int step, int threads) {
    (void)step;
    rng = rng * 1103515245u + 12345u;
    return (int)((rng >> 16) % (unsigned)threads);
}

/* Thread 0 alone: its own share in slices, then the other's in halves. */
static void stalled_thread(void) {
    Share shares[2];
    int64_t first, sizes[64], k = 0, n;
    share_units(shares, 100, 2); /* [0, 50) and [50, 100) */
    while ((n = claim_units(shares, 2, 0, 20, 5, 20, &first)) > 0 && k < 64) sizes[k++] = n;
    /* own: 20, 20, 10; then from thread 1's 50: 20 (half is 25, most 20), 15, 8, 5, 2 */
    const int64_t want[] = {20, 20, 10, 20, 15, 8, 5, 2};
    CHECK(k == 8, "stalled: %lld claims, want 8", (long long)k);
    for (int64_t i = 0; i < k && i < 8; i++)
        CHECK(sizes[i] == want[i], "stalled: claim %lld took %lld, want %lld", (long long)i,
              (long long)sizes[i], (long long)want[i]);
}

/* Real threads claiming at once, a unit at a time with steals of up to `most`, for many
 * rounds and sizes: every unit once, with claims and steals racing on the same shares. */
static void contended(int threads) {
    enum { MOST_UNITS = 3000 };
    static int seen[MOST_UNITS];
    Share shares[8];
    for (int round = 0; round < 2000; round++) {
        const int64_t units = 1 + (round * 7919) % MOST_UNITS, most = 1 + round % 9;
        for (int64_t u = 0; u < units; u++) seen[u] = 0;
        share_units(shares, units, threads);
        int bad = 0;
#pragma omp parallel num_threads(threads) reduction(+ : bad)
        {
            const int t = omp_get_thread_num();
            int64_t first, n;
            while ((n = claim_units(shares, threads, t, 1 + round % 3, 2, most, &first)) > 0) {
                if (first < 0 || first + n > units) {
                    bad++;
                    break;
                }
                for (int64_t u = first; u < first + n; u++)
                    __atomic_fetch_add(seen + u, 1, __ATOMIC_RELAXED);
            }
        }
        CHECK(bad == 0, "contended: %d claims outside %lld units", bad, (long long)units);
        for (int64_t u = 0; u < units; u++)
            if (seen[u] != 1) {
                CHECK(0, "contended (%d threads): unit %lld of %lld claimed %d times", threads,
                      (long long)u, (long long)units, seen[u]);
                return;
            }
    }
}

/* Real threads claiming at once, thread 1 slowed: every block once, and thread 0 took more. */
static void concurrent(void) {
    enum { UNITS = 4000 };
    static int seen[UNITS];
    int64_t taken[2] = {0, 0};
    Share shares[2];
    share_units(shares, UNITS, 2);
#pragma omp parallel num_threads(2)
    {
        const int t = omp_get_thread_num();
        int64_t first, n;
        while ((n = claim_units(shares, 2, t, 1, 1, UNITS, &first)) > 0) { /* as panels are */
            for (int64_t u = first; u < first + n; u++)
                __atomic_fetch_add(seen + u, 1, __ATOMIC_RELAXED);
            taken[t] += n;
            if (t == 1) {
                const struct timespec pause = {0, 200000}; /* 0.2 ms a claim */
                nanosleep(&pause, 0);
            }
        }
    }
    for (int u = 0; u < UNITS; u++)
        CHECK(seen[u] == 1, "concurrent: block %d claimed %d times", u, seen[u]);
    if (omp_get_max_threads() >= 2)
        CHECK(taken[0] > taken[1], "concurrent: the slowed thread took %lld of %d",
              (long long)taken[1], UNITS);
}

int main(void) {
    for (int threads = 1; threads <= 4; threads++)
        for (int64_t units = 1; units <= 300; units += 37) {
            simulate(units, threads, 16, 3, 16, round_robin, "round robin");
            simulate(units, threads, 16, 3, 16, first_only, "one thread");
            simulate(units, threads, 16, 3, 16, at_random, "random order");
            simulate(units, threads, 1, 1, 1, at_random, "one block a claim");
            simulate(units, threads, 1, 1, units, at_random, "panels"); /* as panels are shared */
            simulate(units, threads, 9, 13, 9, at_random, "least above most"); /* float32, AVX2 */
        }
    /* threads keeping pace take only their own shares, slice for slice, as an equal split */
    Share shares[2];
    int64_t first, n;
    share_units(shares, 293, 2);
    int64_t claims[2] = {0, 0};
    for (int t = 0; (n = claim_units(shares, 2, t, 32, 5, 32, &first)) > 0; t ^= 1) {
        claims[t]++;
        CHECK(first < 146 ? t == 0 : t == 1, "paced: thread %d took block %lld", t,
              (long long)first);
    }
    CHECK(claims[0] == 5 && claims[1] == 5, "paced: %lld and %lld slices, want 5 each",
          (long long)claims[0], (long long)claims[1]);
    stalled_thread();
    contended(2);
    contended(4);
    concurrent();
    printf(failures ? "%d failed\n" : "ok\n", failures);
    return failures != 0;
}
