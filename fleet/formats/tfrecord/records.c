/* causal_lm's block records, a whole batch in one call: the bytes of blocks.py's Python path
 * beside it (the reference; tests/test_lm_speedups.py compares both). Built by setup.py into the
 * text jobs' C library and loaded with ctypes there (fleet_jobs/text/tokenizers/native.py), which hands
 * rec_blocks to blocks.py (through fleet_jobs/causal_lm/records.py).
 *
 * Each row of ids becomes one TFRecord frame of a tf.train.Example: the example's length (uint64
 * LE) and its masked crc32c, the example, its masked crc32c. The example holds, in name order,
 * "attention_mask" (when padded: the row's length in ones, then zeros, to the block's width) and
 * "input_ids" (the row's varints), each a map entry {key = name, value = Feature{int64_list =
 * Int64List{packed values}}} (field numbers in wire.py, the frame in framing.py). Everything is done
 * here, heads too (no cache of them, as the Python path keeps: a head costs less to write than
 * a lookup), and each example's crc is computed over all of it.
 *
 * crc32c (Castagnoli, reflected 0x82F63B78) is table-driven, slicing by 8, portable C: no
 * SSE4.2 or ARM CRC instructions, so the library builds on any CPU. No Python.h (see
 * wordpiece.c). No state between calls: calls from several threads at once are safe.
 */

#include <stdint.h>
#include <string.h>

#define REC_SHORT (-1)     /* the output buffer is too small */
#define REC_BAD_ID (-2)    /* an id outside [0, 2^35) (the Python path's limit) */
#define REC_BAD_LENGTH (-3) /* a row length outside [0, width] */

typedef struct {
    uint32_t t[8][256];
} crc_tables;

/* Made by each call (a few microseconds, against milliseconds for a batch): no state shared
 * between threads, nothing to initialize first. */
static void crc_init(crc_tables *tables) {
    uint32_t(*t)[256] = tables->t;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++)
            t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
}

/* crc32c of data extending crc (0 for a fresh one), as google_crc32c.extend. */
static uint32_t crc_extend(const crc_tables *tables, uint32_t crc, const uint8_t *p, int64_t n) {
    const uint32_t(*t)[256] = tables->t;
    uint32_t c = ~crc;
    while (n > 0 && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
        n--;
    }
    while (n >= 8) {
        /* Bytes assembled little-endian by hand: the same on any byte order, no unaligned loads. */
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
            t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n-- > 0)
        c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
    return ~c;
}

/* The exported crc (tests compare it with google_crc32c's on random bytes). */
uint32_t rec_crc32c(uint32_t crc, const uint8_t *data, int64_t n) {
    crc_tables tables;
    crc_init(&tables);
    return crc_extend(&tables, crc, data, n);
}

static uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static int varint_size(uint64_t v) {
    int n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* Bytes of a length-delimited field (tag byte, length varint, payload) of an n-byte payload. */
static int64_t field_size(int64_t n) { return 1 + varint_size((uint64_t)n) + n; }

/* feature_entry(name, packed_int64_feature(payload)) of a p-byte payload: its size; the bytes
 * before the payload written at out, *prefix of them. */
static int64_t entry(uint8_t *out, const char *name, int64_t name_len, int64_t p, int64_t *prefix) {
    int64_t inner = field_size(p), mid = field_size(inner), value = field_size(mid);
    int64_t key = field_size(name_len);
    uint8_t *q = out;
    *q++ = 0x0A; /* Features.feature (a map entry) */
    q = put_varint(q, (uint64_t)(key + value));
    *q++ = 0x0A; /* key */
    q = put_varint(q, (uint64_t)name_len);
    memcpy(q, name, (size_t)name_len);
    q += name_len;
    *q++ = 0x12; /* value: Feature */
    q = put_varint(q, (uint64_t)mid);
    *q++ = 0x1A; /* Feature.int64_list */
    q = put_varint(q, (uint64_t)inner);
    *q++ = 0x0A; /* Int64List.value, packed */
    q = put_varint(q, (uint64_t)p);
    *prefix = q - out;
    return field_size(key + value);
}

/* A row's varints written at p; returns their end, or NULL for an id outside [0, 2^35). Ids
 * below 2^14 (token ids mostly are) take one or two bytes, written without a branch; a row with
 * a bigger one is written again the general way. May write one byte past the end (room the
 * caller keeps: the crc goes there). */
#define PUT_ROW(T)                                                                                 \
    static uint8_t *put_row_##T(uint8_t *p, const T *row, int64_t width) {                         \
        uint8_t *q = p;                                                                            \
        uint64_t any = 0;                                                                          \
        for (int64_t j = 0; j < width; j++) {                                                      \
            uint64_t v = (uint64_t)(int64_t)row[j]; /* a negative id: a huge one */                \
            uint32_t more = v >= 0x80;                                                             \
            any |= v;                                                                              \
            q[0] = (uint8_t)(v | more << 7);                                                       \
            q[1] = (uint8_t)(v >> 7);                                                              \
            q += 1 + more;                                                                         \
        }                                                                                          \
        if (any < 1u << 14)                                                                        \
            return q;                                                                              \
        if (any >> 35)                                                                             \
            return NULL;                                                                           \
        for (int64_t j = 0; j < width; j++)                                                        \
            p = put_varint(p, (uint64_t)row[j]);                                                   \
        return p;                                                                                  \
    }
PUT_ROW(int32_t)
PUT_ROW(int64_t)

/* The framed records of `rows` blocks: ids (rows x ids_width, int32 when id_bytes is 4, else
 * int64, C order), each row's real length (lengths[i], the mask's ones; read only when padded),
 * the mask's width. Writes them end to end into out (cap bytes; 128 + width + 5 * ids_width a
 * row and 256 more are always enough) and returns how many bytes; REC_SHORT, REC_BAD_ID (and
 * *bad_row) or REC_BAD_LENGTH (and *bad_row) when it cannot.
 *
 * A row's varints come first, where the previous row's head ended (most rows' heads are the
 * same size), and are moved when this row's head is another size. */
int64_t rec_blocks(const void *ids, int id_bytes, int64_t rows, int64_t ids_width, const int64_t *lengths,
                   int padded, int64_t width, uint8_t *out, int64_t cap, int64_t *bad_row) {
    static const char MASK[] = "attention_mask", IDS[] = "input_ids";
    crc_tables tables;
    crc_init(&tables);
    uint8_t *p = out, *end = out + cap;
    int64_t mask_entry = 0, mask_prefix = 0;
    uint8_t mask_head[64];
    if (padded)
        mask_entry = entry(mask_head, MASK, sizeof MASK - 1, width, &mask_prefix);
    /* most a head takes: frame header, example prefix, mask entry, ids prefix */
    int64_t most = 12 + 11 + mask_entry + 64, guess = most;
    for (int64_t i = 0; i < rows; i++) {
        const void *row = (const char *)ids + i * ids_width * id_bytes;
        int64_t n = padded ? lengths[i] : 0;
        if (n < 0 || n > width) {
            *bad_row = i;
            return REC_BAD_LENGTH;
        }
        if (end - p < most + 5 * ids_width + 4)
            return REC_SHORT;
        uint8_t *v = p + guess;
        uint8_t *v_end = id_bytes == 4 ? put_row_int32_t(v, (const int32_t *)row, ids_width)
                                       : put_row_int64_t(v, (const int64_t *)row, ids_width);
        if (!v_end) {
            *bad_row = i;
            return REC_BAD_ID;
        }
        int64_t n_varints = v_end - v, ids_prefix = 0;
        uint8_t ids_head[64];
        int64_t body = mask_entry + entry(ids_head, IDS, sizeof IDS - 1, n_varints, &ids_prefix);
        int64_t example = field_size(body), head = 16 + example - 4 - n_varints;
        if (head != guess) {
            memmove(p + head, v, (size_t)n_varints);
            guess = head;
        }
        /* frame header: the length and its masked crc */
        for (int k = 0; k < 8; k++)
            p[k] = (uint8_t)((uint64_t)example >> (8 * k));
        put_u32(p + 8, masked(crc_extend(&tables, 0, p, 8)));
        uint8_t *start = p + 12, *q = start;
        *q++ = 0x0A; /* Example.features */
        q = put_varint(q, (uint64_t)body);
        if (padded) {
            memcpy(q, mask_head, (size_t)mask_prefix);
            q += mask_prefix;
            memset(q, 1, (size_t)n);
            memset(q + n, 0, (size_t)(width - n));
            q += width;
        }
        memcpy(q, ids_head, (size_t)ids_prefix);
        q += ids_prefix + n_varints;
        put_u32(q, masked(crc_extend(&tables, 0, start, q - start)));
        p = q + 4;
    }
    return p - out;
}
