/* A linear's work (a step's row blocks, or a slice's output panels) shared among the threads
 * so that none waits long for another that runs slower (a core another process shares, the
 * thread that also runs Python between kernels): each thread owns an equal share, which it
 * works through from the front a slice at a time, as an equal split does; a thread whose share
 * is done takes half of what another has not yet started (at least `least` units unless `most`
 * or the share's rest is smaller, at most `most`), from the back. Where the threads keep pace
 * nothing is taken and the work is the equal split's. The split changes no bit: each row's
 * sums run over k in order whichever thread makes them.
 *
 * Each share is one word, its first and its end unit (fewer than 2^32 units: a step's row
 * blocks or a slice's panels), updated by compare and swap, so its owner and a thread taking
 * from it never claim the same unit. */
#pragma once
#include <stdint.h>

#define CHUNK_LEAST_ROWS 64 /* the fewest rows a thread takes from another's share (`least`) */

/* A share: its first and its end unit (32 bits each) in one word, alone on its cache line (the
 * owner's claims do not contend with the other shares'). */
typedef struct {
    uint64_t word;
} __attribute__((aligned(64))) Share;

static inline uint64_t share_word(int64_t lo, int64_t hi) {
    return (uint64_t)lo << 32 | (uint64_t)hi;
}

/* The shares of `units` units among `threads` threads, near-equal, in order. */
static inline void share_units(Share *shares, int64_t units, int threads) {
    for (int t = 0; t < threads; t++)
        shares[t].word = share_word(t * units / threads, (t + 1) * units / threads);
}

/* Units from a share: `slice` from the front, or (back) half of what is left, within `least`
 * .. `most`, from the end; the first in *first, how many returned (0: the share is done). */
static inline int64_t take_units(Share *share, int back, int64_t slice, int64_t least,
                                 int64_t most, int64_t *first) {
    uint64_t v = __atomic_load_n(&share->word, __ATOMIC_RELAXED), w;
    int64_t lo, hi, n;
    do {
        lo = (int64_t)(v >> 32), hi = (int64_t)(v & 0xffffffffu);
        if (lo >= hi) return 0;
        n = back ? (hi - lo + 1) / 2 : slice;
        n = back && n < least ? least : n;
        n = back && n > most ? most : n;
        n = n > hi - lo ? hi - lo : n < 1 ? 1 : n; /* never an empty claim from a live share */
        w = back ? share_word(lo, hi - n) : share_word(lo + n, hi);
    } while (!__atomic_compare_exchange_n(&share->word, &v, w, 0, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    *first = back ? hi - n : lo;
    return n;
}

/* Thread t's next units: `slice` from its own share, else from another's (take_units); 0 when
 * all are done. */
static inline int64_t claim_units(Share *shares, int threads, int t, int64_t slice,
                                  int64_t least, int64_t most, int64_t *first) {
    int64_t n = take_units(shares + t, 0, slice, least, most, first);
    for (int i = 1; n == 0 && i < threads; i++)
        n = take_units(shares + (t + i) % threads, 1, slice, least, most, first);
    return n;
}
