/* SentencePiece's unigram encoder (Model::EncodeOptimized of sentencepiece 0.2.3) over NORMALIZED
 * text, with a word cache, loaded with ctypes by fleet_jobs/causal_lm/unigram.py.
 *
 * The library's Viterbi runs over a whole document: at each character position it keeps the
 * best path ending there, its score a float (float sums, float comparisons; the first of equal
 * candidates stays), and where a position's score passes +-1e5 it takes that score off every
 * position from there to the farthest end reached. When no piece of the model holds U+2581 (the
 * escaped space) past its first character, every path breaks before each U+2581, so the
 * document is a chain of WORDS (a U+2581 and what follows it up to the next): the best path of
 * the document is the best path of each word, each started from the float score the previous
 * word ended on (A). word_float() below is that computation, the library's arithmetic
 * operation for operation, so its ids are the library's whatever A is.
 *
 * The cache: a word's path depends on A only through rounding. Its best path computed in
 * double from 0 says how close each of its decisions was (the margin: best minus runner-up at
 * every position with two candidates or more). The float computation from A errs by at most
 * (n + 2) * 2^-24 * (|A| + n * smax) per candidate (n bytes, so at most n additions, each
 * rounded once to float; smax the largest |score|); while twice that, and twice again for
 * slack, stays under the least margin, every decision is the one made in exact arithmetic,
 * and the cached path is the library's. The cache keeps, per word, the largest |A| for which
 * that holds; a word met with a larger |A| (deep into a long document), or whose decisions
 * tie, is computed again. A word's end score is then summed along the path as the library
 * sums it, so the next word starts from the library's own A.
 *
 * Unknown pieces: consecutive ones are merged into one id, or with byte fallback spelled as
 * byte pieces, as SentencePieceProcessor::PopulateSentencePieceText does.
 *
 * One caller at a time per model (the cache is written); no Python.h (see wordpiece.c).
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define UG_MAX_CACHED_WORD 256        /* bytes: longer words (long unspaced runs) are not kept */
#define UG_MAX_ARENA (32 << 20)       /* bytes of kept words and paths: past it the cache starts over */
#define UG_ROUNDOFF (1.0 / 16777216.0) /* 2^-24: float's unit roundoff */
#define UG_RESET 100000.0f             /* unigram_model.cc kScoreResetThreshold */

typedef struct {
    uint64_t key; /* (parent << 8 | byte) + 1; 0: empty */
    int32_t child;
} ug_edge;

typedef struct { /* a piece (or the unknown piece) over w[start:end] of a word */
    int32_t start, end, id;
} ug_cand;

typedef struct {
    uint64_t hash; /* 0: empty */
    int64_t off;   /* in arena: the word's bytes (padded to 8), then n_nodes (id, len) pairs */
    uint32_t len, n_nodes;
    double max_abs_a;
} ug_slot;

typedef struct { /* a double array's unit: node s's child by byte c is t = base[s] + c if check[t] == s */
    int32_t base, check, value; /* value: the piece id ending at this node, or -1 */
} ug_unit;

typedef struct {
    ug_unit *da; /* the pieces' trie as a double array (one load a byte) */
    int64_t da_cap;
    /* (while building: the trie as nodes and hashed edges) */
    int32_t *value; /* per trie node: a piece id, or -1 */
    int64_t n_nodes;
    ug_edge *edges;
    uint64_t edge_mask;
    float *score; /* per id */
    int32_t n_vocab, unk_id;
    float unk_score;
    double smax;
    int32_t byte_ids[256];
    int byte_fallback;
    /* the cache */
    ug_slot *slots;
    uint64_t slot_mask;
    int64_t used, max_words;
    uint8_t *arena;
    int64_t arena_len, arena_cap;
    /* scratch, per word */
    float *fs;
    double *ds, *d2;
    int32_t *st, *id;
    int32_t *path; /* (id, len) pairs */
    ug_cand *cands;
    int64_t cands_cap;
    int64_t scratch_cap;
    /* the normalizer: precompiled_charsmap's double array and replacement strings */
    const uint32_t *darts;
    int64_t darts_units;
    const char *replacements;
    int64_t replacements_len;
    uint8_t *charsmap; /* (the copy the two above point into) */
    int remove_extra_whitespaces, add_dummy_prefix;
    uint8_t ascii_plain[128]; /* 1: no rule of the charsmap starts with this byte (it is copied) */
    uint8_t *norm; /* one normalized document */
    int64_t norm_cap;
    int32_t *ids; /* the last ug_encode's ids */
    int64_t ids_cap;
    /* counters */
    int64_t hits, misses, recomputed;
} ug_model;

static inline uint64_t mix64(uint64_t h) { /* murmur3's 64-bit finalizer */
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static uint64_t hash_bytes(const uint8_t *p, int64_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t x;
        memcpy(&x, p, 8);
        h = mix64(h ^ x);
        p += 8;
        n -= 8;
    }
    uint64_t x = 0;
    memcpy(&x, p, (size_t)n);
    h = mix64(h ^ x ^ 0x5555555555555555ULL);
    return h ? h : 1;
}

static inline double abs_double(double x) { return x < 0 ? -x : x; } /* (no libm to link) */

static inline int one_char_len(uint8_t b) { /* util.h OneCharLen */
    static const int8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[b >> 4];
}

static inline int32_t edge_child(const ug_model *m, int32_t node, uint8_t b) {
    uint64_t key = (((uint64_t)node << 8) | b) + 1;
    for (uint64_t i = mix64(key) & m->edge_mask;; i = (i + 1) & m->edge_mask) {
        if (m->edges[i].key == key) return m->edges[i].child;
        if (m->edges[i].key == 0) return -1;
    }
}

static inline int32_t trie_child(const ug_model *m, int32_t s, uint8_t c) {
    const int64_t t = (int64_t)m->da[s].base + c;
    return t < m->da_cap && m->da[t].check == s ? (int32_t)t : -1;
}

void ug_free(ug_model *m) {
    if (!m) return;
    free(m->da);
    free(m->value);
    free(m->edges);
    free(m->score);
    free(m->slots);
    free(m->arena);
    free(m->fs);
    free(m->ds);
    free(m->d2);
    free(m->st);
    free(m->id);
    free(m->path);
    free(m->cands);
    free(m->charsmap);
    free(m->norm);
    free(m->ids);
    free(m);
}

/* While building: the free units as a list in order (next_free[i] > i; da_cap ends it), so a
 * search for room skips the full stretches. */
typedef struct {
    int32_t *next;
    int32_t *prev;
    int32_t head;
} ug_free_list;

static int da_room(ug_model *m, ug_free_list *fl, int64_t need) {
    if (need <= m->da_cap) return 1;
    int64_t cap = m->da_cap ? m->da_cap : 1024;
    while (cap < need) cap *= 2;
    if (cap > INT32_MAX) return 0;
    ug_unit *da = realloc(m->da, sizeof(ug_unit) * (size_t)cap);
    if (da) m->da = da;
    int32_t *next = realloc(fl->next, sizeof(int32_t) * (size_t)cap);
    if (next) fl->next = next;
    int32_t *prev = realloc(fl->prev, sizeof(int32_t) * (size_t)cap);
    if (prev) fl->prev = prev;
    if (!da || !next || !prev) return 0;
    /* the new units are free: after the last free unit before them */
    int32_t last = -1;
    for (int64_t i = m->da_cap - 1; i >= 0; i--)
        if (m->da[i].check == -1) {
            last = (int32_t)i;
            break;
        }
    for (int64_t i = m->da_cap; i < cap; i++) {
        da[i] = (ug_unit){0, -1, -1};
        next[i] = (int32_t)(i + 1);
        prev[i] = (int32_t)(i - 1);
    }
    prev[m->da_cap] = last;
    if (last >= 0)
        next[last] = (int32_t)m->da_cap;
    else
        fl->head = (int32_t)m->da_cap;
    m->da_cap = cap;
    return 1;
}

static void da_take(ug_model *m, ug_free_list *fl, int64_t t) {
    const int32_t p = fl->prev[t], n = fl->next[t];
    if (p >= 0)
        fl->next[p] = n;
    else
        fl->head = n;
    if (n < m->da_cap) fl->prev[n] = p;
}

/* The hashed trie as a double array: breadth first, each node's children placed at the first
 * base where all their slots are free. 0 when out of memory. */
static int to_double_array(ug_model *m) {
    const int64_t n = m->n_nodes;
    int64_t *first = calloc((size_t)n + 1, sizeof(int64_t)); /* children of node i: kids[first[i]:first[i+1]] */
    int32_t *kids = malloc(sizeof(int32_t) * (size_t)(n > 1 ? n - 1 : 1));
    uint8_t *labels = malloc((size_t)(n > 1 ? n - 1 : 1));
    int32_t *at = malloc(sizeof(int32_t) * (size_t)n); /* node -> its unit */
    int32_t *queue = malloc(sizeof(int32_t) * (size_t)n);
    int ok = first && kids && labels && at && queue;
    if (ok) {
        for (uint64_t i = 0; i <= m->edge_mask; i++)
            if (m->edges[i].key) first[((m->edges[i].key - 1) >> 8) + 1]++;
        for (int64_t i = 0; i < n; i++) first[i + 1] += first[i];
        int64_t *fill = calloc((size_t)n, sizeof(int64_t));
        ok = fill != NULL;
        for (uint64_t i = 0; ok && i <= m->edge_mask; i++) {
            if (!m->edges[i].key) continue;
            const int64_t parent = (int64_t)((m->edges[i].key - 1) >> 8);
            const uint8_t label = (uint8_t)((m->edges[i].key - 1) & 0xFF);
            int64_t j = first[parent] + fill[parent]++; /* (insertion sort by label) */
            while (j > first[parent] && labels[j - 1] > label) {
                labels[j] = labels[j - 1];
                kids[j] = kids[j - 1];
                j--;
            }
            labels[j] = label;
            kids[j] = m->edges[i].child;
        }
        free(fill);
    }
    int64_t head = 0, tail = 0;
    ug_free_list fl = {NULL, NULL, 0};
    ok = ok && da_room(m, &fl, 1024);
    if (ok) {
        da_take(m, &fl, 0);
        m->da[0] = (ug_unit){0, -2, m->value[0]};
        at[0] = 0;
        queue[tail++] = 0;
    }
    while (ok && head < tail) {
        const int32_t node = queue[head++];
        const int64_t k0 = first[node], k1 = first[node + 1];
        if (k0 == k1) continue;
        int64_t base = -1;
        for (int64_t f = fl.head;; f = fl.next[f]) { /* the first label's unit among the free ones */
            if (f >= m->da_cap) { /* none fits: room past the end */
                base = m->da_cap - labels[k0];
                if (base < 1) base = 1;
                if (!da_room(m, &fl, base + 256)) ok = 0;
                break;
            }
            base = f - labels[k0];
            if (base < 1) continue;
            if (!da_room(m, &fl, base + 256)) {
                ok = 0;
                break;
            }
            int64_t k = k0 + 1;
            while (k < k1 && m->da[base + labels[k]].check == -1) k++;
            if (k == k1) break;
        }
        if (!ok) break;
        m->da[at[node]].base = (int32_t)base;
        for (int64_t k = k0; k < k1; k++) {
            const int64_t t = base + labels[k];
            da_take(m, &fl, t);
            m->da[t] = (ug_unit){0, at[node], m->value[kids[k]]};
            at[kids[k]] = (int32_t)t;
            queue[tail++] = kids[k];
        }
    }
    free(fl.next);
    free(fl.prev);
    free(first);
    free(kids);
    free(labels);
    free(at);
    free(queue);
    return ok;
}

/* The trie of the model's NORMAL pieces (pool[offsets[i]:offsets[i+1]] is piece ids[i]),
 * every id's score (a float, as the model stores it), the unknown piece, and with byte
 * fallback each byte's piece id (byte_ids, else NULL). */
ug_model *ug_new(const uint8_t *pool, const int64_t *offsets, const int32_t *ids, int64_t n_pieces,
                 const float *scores, int32_t n_vocab, int32_t unk_id, float unk_score, double smax,
                 const int32_t *byte_ids, int64_t max_words, const uint8_t *charsmap, int64_t charsmap_len,
                 int remove_extra_whitespaces, int add_dummy_prefix) {
    ug_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->remove_extra_whitespaces = remove_extra_whitespaces;
    m->add_dummy_prefix = add_dummy_prefix;
    if (charsmap_len > 0) { /* <trie size (uint32 LE)><double array><NUL-terminated replacements> */
        uint32_t trie_size = 0;
        if (charsmap_len <= 4) goto bad;
        memcpy(&trie_size, charsmap, 4);
        if ((int64_t)trie_size >= charsmap_len - 4 || trie_size < 1024 || (trie_size & 0x3FF) != 0) goto bad;
        m->charsmap = malloc((size_t)charsmap_len);
        if (!m->charsmap) goto bad;
        memcpy(m->charsmap, charsmap, (size_t)charsmap_len);
        m->darts = (const uint32_t *)(m->charsmap + 4); /* (malloc's alignment) */
        m->darts_units = trie_size / 4;
        m->replacements = (const char *)m->charsmap + 4 + trie_size;
        m->replacements_len = charsmap_len - 4 - trie_size;
        if (m->replacements[m->replacements_len - 1] != '\0') goto bad;
    }
    for (int b = 0; b < 128; b++) {
        const uint32_t *a = m->darts;
        uint64_t pos = a ? ((a[0] >> 10) << ((a[0] & (1u << 9)) >> 6)) ^ (uint64_t)b : 0;
        m->ascii_plain[b] = !a || pos >= (uint64_t)m->darts_units || (a[pos] & ((1u << 31) | 0xFFu)) != (uint32_t)b;
    }
    int64_t max_nodes = offsets[n_pieces] + 1;
    uint64_t cap = 16;
    while (cap < (uint64_t)max_nodes * 2) cap <<= 1;
    m->value = malloc(sizeof(int32_t) * (size_t)max_nodes);
    m->edges = calloc(cap, sizeof(ug_edge));
    m->score = malloc(sizeof(float) * (size_t)(n_vocab > 0 ? n_vocab : 1));
    uint64_t slots = 1 << 12; /* (grown as words come: a small table stays in the CPU's caches) */
    m->slots = calloc(slots, sizeof(ug_slot));
    if (!m->value || !m->edges || !m->score || !m->slots) {
        ug_free(m);
        return NULL;
    }
    m->edge_mask = cap - 1;
    m->slot_mask = slots - 1;
    m->max_words = max_words;
    memcpy(m->score, scores, sizeof(float) * (size_t)n_vocab);
    m->n_vocab = n_vocab;
    m->unk_id = unk_id;
    m->unk_score = unk_score;
    m->smax = smax;
    m->byte_fallback = byte_ids != NULL;
    for (int b = 0; b < 256; b++) m->byte_ids[b] = byte_ids ? byte_ids[b] : unk_id;
    m->value[0] = -1;
    m->n_nodes = 1;
    for (int64_t p = 0; p < n_pieces; p++) {
        int32_t node = 0;
        for (int64_t k = offsets[p]; k < offsets[p + 1]; k++) {
            int32_t child = edge_child(m, node, pool[k]);
            if (child < 0) {
                uint64_t key = (((uint64_t)node << 8) | pool[k]) + 1;
                uint64_t i = mix64(key) & m->edge_mask;
                while (m->edges[i].key) i = (i + 1) & m->edge_mask;
                child = (int32_t)m->n_nodes++;
                m->value[child] = -1;
                m->edges[i].key = key;
                m->edges[i].child = child;
            }
            node = child;
        }
        m->value[node] = ids[p];
    }
    if (!to_double_array(m)) goto bad;
    free(m->edges);
    free(m->value);
    m->edges = NULL;
    m->value = NULL;
    return m;
bad:
    ug_free(m);
    return NULL;
}

static int grow_scratch(ug_model *m, int64_t n) {
    if (n + 1 <= m->scratch_cap) return 1;
    int64_t cap = m->scratch_cap ? m->scratch_cap : 256;
    while (cap < n + 1) cap *= 2;
    float *fs = realloc(m->fs, sizeof(float) * (size_t)cap);
    if (fs) m->fs = fs;
    double *ds = realloc(m->ds, sizeof(double) * (size_t)cap);
    if (ds) m->ds = ds;
    double *d2 = realloc(m->d2, sizeof(double) * (size_t)cap);
    if (d2) m->d2 = d2;
    int32_t *st = realloc(m->st, sizeof(int32_t) * (size_t)cap);
    if (st) m->st = st;
    int32_t *id = realloc(m->id, sizeof(int32_t) * (size_t)cap);
    if (id) m->id = id;
    int32_t *path = realloc(m->path, sizeof(int32_t) * 2 * (size_t)cap);
    if (path) m->path = path;
    if (!fs || !ds || !d2 || !st || !id || !path) return 0;
    m->scratch_cap = cap;
    return 1;
}

/* Back from position n along st/id into m->path, in order; returns the node count. */
static int64_t backtrack(ug_model *m, int64_t n) {
    int64_t k = 0;
    for (int64_t end = n; end > 0; end = m->st[end]) k++;
    int64_t i = k;
    for (int64_t end = n; end > 0; end = m->st[end]) {
        i--;
        m->path[2 * i] = m->id[end];
        m->path[2 * i + 1] = (int32_t)(end - m->st[end]);
    }
    return k;
}

/* A word's lattice, in the order the library visits it: for each character's first byte
 * (pos), the pieces that start there by increasing length, then, when none is exactly that
 * character, the unknown piece over it. Every character start has one candidate or more.
 * Into m->cands; returns how many, or -1 when out of memory. */
static int64_t word_lattice(ug_model *m, const uint8_t *w, int64_t n) {
    int64_t c = 0;
    for (int64_t pos = 0; pos < n;) {
        int has_single = 0;
        int64_t mblen = one_char_len(w[pos]);
        if (mblen > n - pos) mblen = n - pos;
        int32_t node = 0;
        for (int64_t k = pos; k <= n; k++) {
            int32_t v;
            if (k < n && (node = trie_child(m, node, w[k])) >= 0) {
                v = m->da[node].value;
                if (v < 0) continue;
                if (k + 1 - pos == mblen) has_single = 1;
            } else if (!has_single) {
                v = m->unk_id;
                k = pos + mblen - 1;
            } else {
                break;
            }
            if (c == m->cands_cap) {
                int64_t cap = m->cands_cap ? 2 * m->cands_cap : 1024;
                ug_cand *grown = realloc(m->cands, sizeof(ug_cand) * (size_t)cap);
                if (!grown) return -1;
                m->cands = grown;
                m->cands_cap = cap;
            }
            m->cands[c++] = (ug_cand){(int32_t)pos, (int32_t)(k + 1), v};
            if (v == m->unk_id) break;
        }
        pos += mblen;
    }
    return c;
}

static inline float cand_score(const ug_model *m, int32_t v) { return v == m->unk_id ? m->unk_score : m->score[v]; }

/* The library's Viterbi over one word's lattice (c candidates) from the float score a,
 * operation for operation (float sums and comparisons; past |RESET| a position's score is taken
 * off every score from it to the farthest end reached, as sentencepiece 0.2.3 does): the path
 * into m->path. */
static int64_t word_float(ug_model *m, int64_t n, int64_t c, float a) {
    float *sc = m->fs;
    int32_t *st = m->st, *id = m->id;
    for (int64_t i = 0; i <= n; i++) {
        sc[i] = 0;
        st[i] = -1;
    }
    sc[0] = a;
    int64_t frontier = 0, pos = -1;
    float till = 0;
    for (int64_t j = 0; j < c; j++) {
        const ug_cand x = m->cands[j];
        if (x.start != pos) { /* a new start: its score, reset where the library resets it */
            pos = x.start;
            till = sc[pos];
            if (till < -UG_RESET || till > UG_RESET) {
                const float offset = till;
                for (int64_t i = pos; i <= frontier; i++)
                    if (i == pos || st[i] != -1) sc[i] -= offset;
                till = 0.0f;
            }
        }
        if (x.end > frontier) frontier = x.end;
        const float cand = cand_score(m, x.id) + till;
        if (st[x.end] == -1 || cand > sc[x.end]) {
            sc[x.end] = cand;
            st[x.end] = x.start;
            id[x.end] = x.id;
        }
    }
    return backtrack(m, n);
}

/* The same Viterbi in double from 0, for the cache: the least margin between the best
 * candidate and the runner-up at any position (INFINITY if no position had two); the path
 * into m->path. */
static int64_t word_double(ug_model *m, int64_t n, int64_t c, double *margin) {
    double *sc = m->ds, *second = m->d2;
    int32_t *st = m->st, *id = m->id;
    for (int64_t i = 0; i <= n; i++) {
        sc[i] = 0;
        second[i] = -INFINITY;
        st[i] = -1;
    }
    for (int64_t j = 0; j < c; j++) {
        const ug_cand x = m->cands[j];
        const double cand = (double)cand_score(m, x.id) + sc[x.start];
        const int32_t t = x.end;
        if (st[t] == -1) {
            sc[t] = cand;
            st[t] = x.start;
            id[t] = x.id;
        } else if (cand > sc[t]) {
            second[t] = sc[t];
            sc[t] = cand;
            st[t] = x.start;
            id[t] = x.id;
        } else if (cand > second[t]) {
            second[t] = cand;
        }
    }
    double least = INFINITY;
    for (int64_t t = 1; t <= n; t++)
        if (st[t] != -1 && second[t] != -INFINITY && sc[t] - second[t] < least) least = sc[t] - second[t];
    *margin = least;
    return backtrack(m, n);
}

static void cache_clear(ug_model *m) {
    memset(m->slots, 0, sizeof(ug_slot) * (size_t)(m->slot_mask + 1));
    m->used = 0;
    m->arena_len = 0;
}

static ug_slot *cache_find(ug_model *m, const uint8_t *w, int64_t n, uint64_t h) {
    for (uint64_t i = h & m->slot_mask;; i = (i + 1) & m->slot_mask) {
        ug_slot *s = &m->slots[i];
        if (s->hash == 0) return s;
        if (s->hash == h && s->len == (uint32_t)n && memcmp(m->arena + s->off, w, (size_t)n) == 0) return s;
    }
}

/* Twice the slots, the words moved over; 0 when out of memory (the table stays as it was). */
static int cache_grow(ug_model *m) {
    uint64_t slots = 2 * (m->slot_mask + 1);
    ug_slot *table = calloc(slots, sizeof(ug_slot));
    if (!table) return 0;
    for (uint64_t i = 0; i <= m->slot_mask; i++) {
        if (!m->slots[i].hash) continue;
        uint64_t j = m->slots[i].hash & (slots - 1);
        while (table[j].hash) j = (j + 1) & (slots - 1);
        table[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = table;
    m->slot_mask = slots - 1;
    return 1;
}

/* Keeps a word's path (m->path, k nodes) for |A| up to max_abs_a. */
static void cache_put(ug_model *m, ug_slot *s, const uint8_t *w, int64_t n, uint64_t h, int64_t k,
                      double max_abs_a) {
    int64_t padded = (n + 7) & ~(int64_t)7;
    int64_t need = padded + 8 * k;
    if (m->used >= m->max_words || m->arena_len + need > UG_MAX_ARENA) {
        cache_clear(m);
        s = cache_find(m, w, n, h);
    } else if ((uint64_t)(m->used + 1) * 2 > m->slot_mask + 1) {
        if (!cache_grow(m)) return;
        s = cache_find(m, w, n, h);
    }
    if (m->arena_len + need > m->arena_cap) {
        int64_t cap = m->arena_cap ? m->arena_cap : (1 << 20);
        while (cap < m->arena_len + need) cap *= 2;
        uint8_t *arena = realloc(m->arena, (size_t)cap);
        if (!arena) return; /* not kept: the next time it is computed again */
        m->arena = arena;
        m->arena_cap = cap;
    }
    memcpy(m->arena + m->arena_len, w, (size_t)n);
    memcpy(m->arena + m->arena_len + padded, m->path, (size_t)(8 * k));
    s->hash = h;
    s->off = m->arena_len;
    s->len = (uint32_t)n;
    s->n_nodes = (uint32_t)k;
    s->max_abs_a = max_abs_a;
    m->arena_len += need;
    m->used++;
}

/* The largest |A| for which a word of n bytes whose decisions have this least margin keeps
 * its exact-arithmetic path under the library's float arithmetic (see the top). */
static double safe_abs_a(const ug_model *m, int64_t n, double margin) {
    if (margin == INFINITY) return INFINITY;
    if (!(margin > 0)) return -1;
    return margin / (4.0 * (double)(n + 2) * UG_ROUNDOFF) - (double)n * m->smax;
}

/* One word from score *a: its (id, len) nodes (into the cache's arena or m->path), *a moved on
 * to the word's end as the library sums it. NULL when out of memory. */
static const int32_t *ug_word(ug_model *m, const uint8_t *w, int64_t n, float *a, int64_t *k) {
    const int32_t *nodes;
    if (*a < -UG_RESET || *a > UG_RESET) *a = 0.0f; /* the library's reset at the word's first position */
    /* no position of the word can reach |RESET|: its scores are a's plus at most n pieces' */
    const int no_reset = abs_double((double)*a) + 1.001 * (double)n * m->smax + 1.0 < (double)UG_RESET;
    const int cacheable = n <= UG_MAX_CACHED_WORD;
    uint64_t h = 0;
    ug_slot *s = NULL;
    if (cacheable) {
        h = hash_bytes(w, n);
        s = cache_find(m, w, n, h);
        if (s->hash && no_reset && abs_double((double)*a) <= s->max_abs_a) {
            m->hits++;
            nodes = (const int32_t *)(m->arena + s->off + ((s->len + 7) & ~(uint32_t)7));
            *k = s->n_nodes;
            goto sum;
        }
    }
    if (!grow_scratch(m, n)) return NULL;
    const int64_t c = word_lattice(m, w, n);
    if (c < 0) return NULL;
    if (cacheable && s->hash == 0) {
        double margin;
        int64_t kd = word_double(m, n, c, &margin);
        double limit = safe_abs_a(m, n, margin);
        if (limit > 0) {
            m->misses++;
            cache_put(m, s, w, n, h, kd, limit);
            if (no_reset && abs_double((double)*a) <= limit) {
                nodes = m->path;
                *k = kd;
                goto sum;
            }
        }
    }
    m->recomputed++;
    *k = word_float(m, n, c, *a);
    /* the word's end score, as the library left it (its resets included) */
    *a = m->fs[n];
    return m->path;
sum:
    for (int64_t i = 0; i < *k; i++) {
        int32_t v = nodes[2 * i];
        *a = (v == m->unk_id ? m->unk_score : m->score[v]) + *a;
    }
    return nodes;
}

/* -- the normalizer (normalizer.cc of sentencepiece 0.2.3, without user-defined symbols) -- */

/* The longest rule of the charsmap at the start of in (darts-clone's commonPrefixSearch): its
 * replacement (NUL-terminated) and length, or NULL. */
static const char *longest_rule(const ug_model *m, const uint8_t *in, int64_t len, int64_t *rule_len) {
    const uint32_t *a = m->darts;
    const int64_t units = m->darts_units;
    const char *found = NULL;
    uint64_t pos = 0;
    int results = 0;
#define OFFSET(u) (((u) >> 10) << (((u) & (1u << 9)) >> 6))
    pos ^= OFFSET(a[0]);
    for (int64_t i = 0; i < len; i++) {
        pos ^= in[i];
        if (pos >= (uint64_t)units) break;
        uint32_t unit = a[pos];
        if ((unit & ((1u << 31) | 0xFFu)) != in[i]) break;
        pos ^= OFFSET(unit);
        if (pos >= (uint64_t)units) break;
        if ((unit >> 8) & 1) {
            if (++results > 32) break; /* normalizer.h kMaxTrieResultsSize: the library looks no further */
            int64_t value = (int64_t)(a[pos] & ((1u << 31) - 1));
            if (value < m->replacements_len) { /* (else the library copies the character) */
                found = m->replacements + value;
                *rule_len = i + 1;
            } else {
                found = NULL;
            }
        }
    }
#undef OFFSET
    return found;
}

/* One character's normalization: what replaces the start of in (*out, *out_len) and how many
 * bytes of in it takes. The input is valid UTF-8 (Python's str.encode made it). */
static int64_t normalize_prefix(const ug_model *m, const uint8_t *in, int64_t len, const uint8_t **out,
                                int64_t *out_len) {
    if (m->darts) {
        int64_t rule_len = 0;
        const char *rule = longest_rule(m, in, len, &rule_len);
        if (rule) {
            *out = (const uint8_t *)rule;
            *out_len = (int64_t)strlen(rule);
            return rule_len;
        }
    }
    int64_t n = one_char_len(in[0]);
    if (n > len) n = len;
    *out = in;
    *out_len = n;
    return n;
}

static int norm_room(ug_model *m, int64_t need) {
    if (need <= m->norm_cap) return 1;
    int64_t cap = m->norm_cap ? m->norm_cap : 4096;
    while (cap < need) cap *= 2;
    uint8_t *norm = realloc(m->norm, (size_t)cap);
    if (!norm) return 0;
    m->norm = norm;
    m->norm_cap = cap;
    return 1;
}

/* Normalizer::Normalize of one document into m->norm: its length, or -1 when out of memory. */
static int64_t normalize(ug_model *m, const uint8_t *in, int64_t len) {
    int64_t i = 0, o = 0;
    const uint8_t *rep;
    int64_t rep_len;
    if (m->remove_extra_whitespaces) { /* leading spaces */
        while (i < len) {
            int64_t took = normalize_prefix(m, in + i, len - i, &rep, &rep_len);
            if (!(rep_len == 1 && rep[0] == ' ')) break;
            i += took;
        }
    }
    if (i == len) return 0;
    if (m->add_dummy_prefix) {
        if (!norm_room(m, 3)) return -1;
        memcpy(m->norm, "\xe2\x96\x81", 3);
        o = 3;
    }
    int prev_space = m->remove_extra_whitespaces;
    while (i < len) {
        const uint8_t b = in[i];
        if (b < 0x80 && m->ascii_plain[b]) { /* (most text: the general case below, made short) */
            if (b == ' ') {
                if (!prev_space) {
                    if (!norm_room(m, o + 3)) return -1;
                    memcpy(m->norm + o, "\xe2\x96\x81", 3);
                    o += 3;
                    prev_space = m->remove_extra_whitespaces;
                }
            } else {
                if (!norm_room(m, o + 1)) return -1;
                m->norm[o++] = b;
                prev_space = 0;
            }
            i++;
            continue;
        }
        int64_t took = normalize_prefix(m, in + i, len - i, &rep, &rep_len);
        while (prev_space && rep_len > 0 && rep[0] == ' ') {
            rep++;
            rep_len--;
        }
        if (rep_len > 0) {
            if (!norm_room(m, o + 3 * rep_len)) return -1;
            for (int64_t j = 0; j < rep_len; j++) {
                if (rep[j] == ' ') {
                    memcpy(m->norm + o, "\xe2\x96\x81", 3);
                    o += 3;
                } else {
                    m->norm[o++] = rep[j];
                }
            }
            prev_space = rep[rep_len - 1] == ' ';
        }
        i += took;
        if (!m->remove_extra_whitespaces) prev_space = 0;
    }
    if (m->remove_extra_whitespaces) /* trailing spaces */
        while (o >= 3 && memcmp(m->norm + o - 3, "\xe2\x96\x81", 3) == 0) o -= 3;
    return o;
}

static int ids_room(ug_model *m, int64_t need) {
    if (need <= m->ids_cap) return 1;
    int64_t cap = m->ids_cap ? m->ids_cap : 4096;
    while (cap < need) cap *= 2;
    int32_t *ids = realloc(m->ids, sizeof(int32_t) * (size_t)cap);
    if (!ids) return 0;
    m->ids = ids;
    m->ids_cap = cap;
    return 1;
}

/* Encodes n_docs documents of UTF-8 text, text[ends[i-1]:ends[i]] (ends[-1] = 0), as
 * SentencePieceProcessor::Encode does (normalized, then the Viterbi word by word): the ids end
 * to end in ug_ids(m) (valid until the next call), each document's count of them in counts.
 * Returns the number of ids, or -1 when out of memory. */
int64_t ug_encode(ug_model *m, const uint8_t *raw, const int64_t *ends, int64_t n_docs, int64_t *counts) {
    int64_t o = 0, start = 0;
    for (int64_t d = 0; d < n_docs; d++) {
        const int64_t o0 = o;
        const int64_t end = normalize(m, raw + start, ends[d] - start);
        if (end < 0 || !ids_room(m, o + end)) return -1; /* (every id takes a byte) */
        const uint8_t *text = m->norm;
        int32_t *out = m->ids;
        float a = 0;
        int prev_unk = 0;
        for (int64_t pos = 0; pos < end;) {
            int64_t next = pos + 1;
            for (;;) { /* the next U+2581 (E2 96 81) after pos, or the end */
                const uint8_t *p = memchr(text + next, 0xE2, (size_t)(end - next));
                if (!p) {
                    next = end;
                    break;
                }
                next = p - text;
                if (next + 2 < end && p[1] == 0x96 && p[2] == 0x81) break;
                next++;
            }
            int64_t k;
            const int32_t *nodes = ug_word(m, text + pos, next - pos, &a, &k);
            if (!nodes) return -1;
            int64_t at = pos;
            for (int64_t i = 0; i < k; i++) {
                const int32_t v = nodes[2 * i], len = nodes[2 * i + 1];
                const int unk = v == m->unk_id;
                if (unk && m->byte_fallback) {
                    for (int64_t j = 0; j < len; j++) out[o++] = m->byte_ids[text[at + j]];
                } else if (!(unk && prev_unk)) {
                    out[o++] = v;
                }
                prev_unk = unk;
                at += len;
            }
            pos = next;
        }
        counts[d] = o - o0;
        start = ends[d];
    }
    return o;
}

const int32_t *ug_ids(const ug_model *m) { return m->ids; }

/* Counters since ug_new: words from the cache, words added to it, words computed again. */
void ug_stats(const ug_model *m, int64_t *out3) {
    out3[0] = m->hits;
    out3[1] = m->misses;
    out3[2] = m->recomputed;
}
