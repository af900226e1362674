/* BERT's basic tokens and WordPiece over normalized text: the per-token part of
 * fleet_jobs/text/tokenizers/tokenization.py (BertTokenizer) in C, loaded with ctypes by fleet_jobs/text/tokenizers/native.py.
 *
 * Input: the NORMALIZED text (what BertTokenizer._normalize_pats returns, with _mark_words'
 * marks where they apply) as code points, one byte each (ASCII text) or four (UTF-32).
 * Each code point's class comes from a table the Python side builds from the same ranges
 * as its regexes, so both paths derive from one source:
 *
 *   basic tokens = [^\s{cjk}{p}]+ | [{cjk}] | [{p}]                          (plain)
 *                  [^\s\x00{cjk}{p}]+ | [{cjk}] | \x00[{cjk}] | [{p}]         (marked)
 *   and with WP_LINES each "\n" ends a line (its own token in the regexes).
 *
 * Each basic token then goes through WordPiece as BertTokenizer._wordpiece does it: greedy
 * longest match first, "##" continuation pieces, [UNK] for a token longer than
 * max_input_chars_per_word or with no match. With WP_WORDS the ids carry WORD_CONTINUES
 * as _wordpiece_flagged sets it. Instead of marks in the text, the caller may give the sorted
 * positions of the CJK characters a mark would precede (the text unmarked): the same ids,
 * without making the marked text.
 *
 * No Python.h: plain C with a tiny ABI, built by setup.py (an optional setuptools extension,
 * fleet_jobs/text/tokenizers/_ccore.abi3.so) without python3-dev, and loaded under any Python 3.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CLS_WS 1u     /* matches \s of Python's re (str patterns) */
#define CLS_CJK 2u    /* tokenization.CJK_RANGES */
#define CLS_PUNCT 4u  /* unicode_classes punctuation (P* and ASCII punctuation) */
#define CLS_MARK 8u   /* tokenization._MARK ("\x00"): only a separator in WP_WORDS mode */

#define WP_LINES 1 /* "\n" ends a line: each line's count of ids goes to line_lengths */
#define WP_WORDS 2 /* marked text, WORD_CONTINUES flags */

#define WORD_CONTINUES (1 << 30)
#define N_CODEPOINTS 0x110000u

typedef struct {
    uint32_t hash;
    uint32_t len; /* key length in code points */
    uint32_t off; /* key's start in pool */
    int32_t id;   /* -1: empty slot */
    uint8_t tail; /* a "##" piece (the key is what follows "##") */
} wp_entry;

typedef struct {
    uint8_t classes[N_CODEPOINTS];
    wp_entry *slots;
    uint64_t mask;
    uint32_t *pool;
    int64_t max_chars, max_head, max_tail;
    int32_t unk;
} wp_table;

static inline uint32_t mix(uint32_t h) { /* murmur3's finalizer */
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

#define HASH_BODY                                        \
    uint32_t h = 2166136261u ^ (uint32_t)tail;           \
    for (int64_t i = 0; i < len; i++)                    \
        h = (h ^ (uint32_t)s[i]) * 16777619u;            \
    return mix(h ^ (uint32_t)len);

static inline uint32_t hash_u32(const uint32_t *s, int64_t len, int tail) { HASH_BODY }
static inline uint32_t hash_u8(const uint8_t *s, int64_t len, int tail) { HASH_BODY }

void wp_free(wp_table *t) {
    if (!t) return;
    free(t->slots);
    free(t->pool);
    free(t);
}

/* n entries: entry i is pool[offsets[i]:offsets[i + 1]], a "##" piece when tail[i] (the key
 * without its "##"); ids[i] its id. Later entries replace earlier equal ones (as a dict does).
 * classes: N_CODEPOINTS bytes. Returns NULL when out of memory. */
wp_table *wp_new(const uint8_t *classes, const uint32_t *pool, int64_t pool_len, const int64_t *offsets,
                 const int32_t *ids, const uint8_t *tail, int64_t n, int32_t unk, int64_t max_chars,
                 int64_t max_head, int64_t max_tail) {
    wp_table *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    memcpy(t->classes, classes, N_CODEPOINTS);
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)n + 16) cap <<= 1;
    t->slots = malloc(cap * sizeof *t->slots);
    t->pool = malloc((pool_len ? pool_len : 1) * sizeof *t->pool);
    if (!t->slots || !t->pool) {
        wp_free(t);
        return NULL;
    }
    memcpy(t->pool, pool, pool_len * sizeof *t->pool);
    for (uint64_t i = 0; i < cap; i++) t->slots[i].id = -1;
    t->mask = cap - 1;
    t->unk = unk;
    t->max_chars = max_chars;
    t->max_head = max_head;
    t->max_tail = max_tail;
    for (int64_t i = 0; i < n; i++) {
        const uint32_t *key = t->pool + offsets[i];
        int64_t len = offsets[i + 1] - offsets[i];
        uint32_t h = hash_u32(key, len, tail[i]);
        for (uint64_t j = h & t->mask;; j = (j + 1) & t->mask) {
            wp_entry *e = &t->slots[j];
            if (e->id < 0) {
                e->hash = h;
                e->len = (uint32_t)len;
                e->off = (uint32_t)offsets[i];
                e->tail = tail[i];
                e->id = ids[i];
                break;
            }
            if (e->hash == h && e->len == len && e->tail == tail[i] &&
                !memcmp(t->pool + e->off, key, len * sizeof *key)) {
                e->id = ids[i];
                break;
            }
        }
    }
    return t;
}

/* One function body per input width (T): lookup, WordPiece, then the scan. */
#define DEFINE_TOKENIZER(SUFFIX, T)                                                                  \
    static inline int32_t lookup_##SUFFIX(const wp_table *t, const T *s, int64_t len, int tail) {    \
        uint32_t h = hash_##SUFFIX(s, len, tail);                                                    \
        for (uint64_t j = h & t->mask;; j = (j + 1) & t->mask) {                                     \
            const wp_entry *e = &t->slots[j];                                                        \
            if (e->id < 0) return -1;                                                                \
            if (e->hash == h && e->len == len && e->tail == tail) {                                  \
                const uint32_t *k = t->pool + e->off;                                                \
                int64_t i = 0;                                                                       \
                while (i < len && k[i] == (uint32_t)s[i]) i++;                                       \
                if (i == len) return e->id;                                                          \
            }                                                                                        \
        }                                                                                            \
    }                                                                                                \
                                                                                                     \
    /* flags: 0 none; 1 all but the first piece (a basic token); 2 all (a marked CJK character) */   \
    static int64_t wordpiece_##SUFFIX(const wp_table *t, const T *w, int64_t n, int flags,           \
                                      int32_t *out) {                                                \
        int32_t all = flags == 2 ? WORD_CONTINUES : 0, rest = flags ? WORD_CONTINUES : 0;            \
        if (n > t->max_chars) {                                                                      \
            out[0] = t->unk | all;                                                                   \
            return 1;                                                                                \
        }                                                                                            \
        int64_t start = 0, k = 0;                                                                    \
        while (start < n) {                                                                          \
            int64_t end = start + (start ? t->max_tail : t->max_head);                               \
            if (end > n) end = n;                                                                    \
            int32_t id = -1;                                                                         \
            while (end > start && (id = lookup_##SUFFIX(t, w + start, end - start, start > 0)) < 0)  \
                end--;                                                                               \
            if (end <= start) {                                                                      \
                out[0] = t->unk | all;                                                               \
                return 1;                                                                            \
            }                                                                                        \
            out[k] = id | (k ? rest : all);                                                          \
            k++;                                                                                     \
            start = end;                                                                             \
        }                                                                                            \
        return k;                                                                                    \
    }                                                                                                \
                                                                                                     \
    int64_t wp_tokenize_##SUFFIX(const wp_table *t, const T *text, int64_t n, int mode, int32_t *out, \
                                 int64_t *line_lengths, int64_t max_lines, const int64_t *marks,     \
                                 int64_t n_marks) {                                                  \
        const uint8_t *cls = t->classes;                                                             \
        const int lines = mode & WP_LINES, words = mode & WP_WORDS;                                  \
        const uint8_t stop = CLS_WS | CLS_CJK | CLS_PUNCT | (words ? CLS_MARK : 0);                  \
        int64_t i = 0, k = 0, line = 0, line_start = 0, m = 0;                                       \
        while (i < n) {                                                                              \
            uint32_t c = (uint32_t)text[i];                                                          \
            uint8_t cl = c < N_CODEPOINTS ? cls[c] : 0;                                              \
            if (!(cl & stop)) { /* a run of word characters */                                      \
                int64_t j = i + 1;                                                                   \
                while (j < n && !(((uint32_t)text[j] < N_CODEPOINTS ? cls[text[j]] : 0) & stop)) j++;  \
                k += wordpiece_##SUFFIX(t, text + i, j - i, words ? 1 : 0, out + k);                 \
                i = j;                                                                               \
            } else if (cl & (CLS_CJK | CLS_PUNCT)) {                                                 \
                int flags = words ? 1 : 0;                                                           \
                if (words && (cl & CLS_CJK) && m < n_marks) { /* a marked position? */               \
                    while (m < n_marks && marks[m] < i) m++;                                         \
                    if (m < n_marks && marks[m] == i) flags = 2;                                     \
                }                                                                                    \
                k += wordpiece_##SUFFIX(t, text + i, 1, flags, out + k);                             \
                i++;                                                                                 \
            } else if (lines && c == '\n') {                                                         \
                if (line < max_lines) line_lengths[line] = k - line_start;                           \
                line++;                                                                              \
                line_start = k;                                                                      \
                i++;                                                                                 \
            } else if ((cl & CLS_MARK) && words && i + 1 < n && (uint32_t)text[i + 1] < N_CODEPOINTS && \
                       (cls[text[i + 1]] & CLS_CJK)) { /* a CJK character that continues a word */   \
                k += wordpiece_##SUFFIX(t, text + i + 1, 1, 2, out + k);                             \
                i += 2;                                                                              \
            } else { /* whitespace, or a mark before no CJK character (matches nothing) */           \
                i++;                                                                                 \
            }                                                                                        \
        }                                                                                            \
        if (lines) {                                                                                 \
            if (line < max_lines) line_lengths[line] = k - line_start;                               \
            line++;                                                                                  \
        }                                                                                            \
        (void)line;                                                                                  \
        return k;                                                                                    \
    }

DEFINE_TOKENIZER(u32, uint32_t)
DEFINE_TOKENIZER(u8, uint8_t)

/* The number of lines wp_tokenize_* found is not returned: the caller checks the count of
 * newlines itself (it needs it before the call to size line_lengths). */
int wp_abi_version(void) { return 4; }

/* The sha256 of this file as setup.py compiled it: fleet_jobs/text/tokenizers/native.py loads no library built
 * from another wordpiece.c (a checkout edited since its last `pip install -e .`). */
#ifndef WP_SOURCE_SHA256
#define WP_SOURCE_SHA256 ""
#endif
const char *wp_source_sha256(void) { return WP_SOURCE_SHA256; }
