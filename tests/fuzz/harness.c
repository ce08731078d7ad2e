/* harness.c: the per-process input file of the fuzz targets (harness.h). */
#include "harness.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static char input_path[4096];
static char output_path[4096 + 16];
static int input_fd = -1;

static void remove_files(void) {
    if (input_fd >= 0) {
        close(input_fd);
        unlink(input_path);
        unlink(output_path);
        input_fd = -1;
    }
}

static void die(const char *what) {
    fprintf(stderr, "fuzz harness: %s %s: %s\n", what, input_path, strerror(errno));
    abort();
}

static void open_input(void) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    int n = snprintf(input_path, sizeof(input_path), "%s/pf-fuzz-XXXXXX", dir);
    if (n < 0 || (size_t)n >= sizeof(input_path)) die("TMPDIR too long:");
    input_fd = mkstemp(input_path);
    if (input_fd < 0) die("cannot create");
    snprintf(output_path, sizeof(output_path), "%s.out", input_path);
    atexit(remove_files);
}

void fuzz_fail(const char *check, const char *file, int line) {
    fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", check, file, line);
    abort();
}

const char *fuzz_input_file(const uint8_t *data, size_t size) {
    if (input_fd < 0) open_input();
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(input_fd, data + done, size - done, (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) die("cannot write");
        done += (size_t)w;
    }
    if (ftruncate(input_fd, (off_t)size) != 0) die("cannot truncate");
    return input_path;
}

const char *fuzz_output_path(void) {
    if (input_fd < 0) open_input();
    return output_path;
}

/* UBSan's defaults for every target: stop at the first report (the library is built to recover,
 * which compiles much faster, so this is what makes undefined behaviour a finding) and show its
 * stack. UBSAN_OPTIONS still overrides them. */
const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void) {
    return "halt_on_error=1:print_stacktrace=1";
}

/* splitmix64's finaliser: a well-mixed 64-bit value from libFuzzer's seed. */
static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15u;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
    return x ^ (x >> 31);
}

/* Sizes a reader must bound: around powers of two, the limits of 16, 32 and 64 bits, and the
 * counts whose bytes (4 or 8 per element) are 2^64, so wrap to 0. */
static const char *const edge_numbers[] = {
    "0",
    "1",
    "2",
    "3",
    "7",
    "8",
    "255",
    "256",
    "4095",
    "4096",
    "4097",
    "65535",
    "65536",
    "65537",
    "1048576",
    "1048577",
    "1073741824",
    "2147483647",
    "2147483648",
    "4294967295",
    "4294967296",
    "2305843009213693952",
    "4611686018427387904",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
};

/* Replaces one run of ASCII digits in h[0..n) (the r-th, counting round) by an edge number or
 * a random one of random width, within cap bytes; the new length, or SIZE_MAX if h has no
 * digits or no room. What a byte-level mutation reaches only by luck: "8" -> "48000". */
static int is_digit(uint8_t c) {
    return c >= '0' && c <= '9';
}

static size_t replace_number(uint8_t *h, size_t n, size_t cap, uint64_t r) {
    size_t runs = 0;
    for (size_t i = 0; i < n; i++) runs += is_digit(h[i]) && (i == 0 || !is_digit(h[i - 1]));
    if (runs == 0) return SIZE_MAX;
    size_t k = (size_t)(r % runs), b = 0, e = 0;
    for (size_t i = 0, seen = 0; i < n; i++) {
        if (is_digit(h[i]) && (i == 0 || !is_digit(h[i - 1])) && seen++ == k) {
            b = e = i;
            while (e < n && is_digit(h[e])) e++;
            break;
        }
    }
    char num[32];
    uint64_t r2 = mix(r);
    if (r2 % 2 == 0) {
        snprintf(num, sizeof(num), "%s",
                 edge_numbers[(r2 >> 1) % (sizeof(edge_numbers) / sizeof(edge_numbers[0]))]);
    } else {
        int bits = (int)((r2 >> 1) % 64) + 1;
        uint64_t v = mix(r2) >> (64 - bits);
        snprintf(num, sizeof(num), "%llu", (unsigned long long)v);
    }
    size_t len = strlen(num);
    if (n - (e - b) + len > cap) return SIZE_MAX;
    memmove(h + b + len, h + e, n - e);
    memcpy(h + b, num, len);
    return n - (e - b) + len;
}

/* Mutates the header data[off .. off + n) of an input of size bytes in place, moving what
 * follows it: by libFuzzer's default mutation (mode 0) or replace_number (mode 1). Returns the
 * header's new length, or SIZE_MAX (input unchanged) if it is empty or there is no room. cap_n
 * bounds the new length (what the length field can hold). */
static size_t mutate_header(uint8_t *data, size_t size, size_t max_size, size_t off, size_t n,
                            size_t cap_n, int mode, uint64_t r) {
    if (n == 0) return SIZE_MAX; /* libFuzzer's mutations want something to start from */
    size_t rest = size - off - n;
    if (max_size < off + rest + 1) return SIZE_MAX;
    size_t cap = max_size - off - rest;
    if (cap > cap_n) cap = cap_n;
    if (cap < n) return SIZE_MAX;
    uint8_t *h = malloc(cap + 1), *tail = malloc(rest + 1);
    if (!h || !tail) {
        free(h);
        free(tail);
        return SIZE_MAX;
    }
    memcpy(h, data + off, n);
    memcpy(tail, data + off + n, rest);
    size_t m = mode == 0 ? LLVMFuzzerMutate(h, n, cap) : replace_number(h, n, cap, r);
    if (m != SIZE_MAX) {
        memcpy(data + off, h, m);
        memcpy(data + off + m, tail, rest);
    }
    free(h);
    free(tail);
    return m;
}

size_t fuzz_mutate_safetensors(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    uint64_t r = mix(seed);
    if (r % 4 < 2 && size >= 8) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = n << 8 | data[i];
        if (n <= size - 8) {
            size_t m =
                mutate_header(data, size, max_size, 8, (size_t)n, SIZE_MAX, (int)(r % 4), r >> 2);
            if (m != SIZE_MAX) {
                for (int i = 0; i < 8; i++) data[i] = (uint8_t)((uint64_t)m >> (8 * i));
                return size - (size_t)n + m;
            }
        }
    }
    return LLVMFuzzerMutate(data, size, max_size);
}

size_t fuzz_mutate_npy(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    uint64_t r = mix(seed);
    if (r % 4 < 2 && size >= 10 && memcmp(data, "\x93NUMPY", 6) == 0) {
        size_t w = data[6] == 1 ? 2 : 4; /* the length's width: u16 in version 1.0, else u32 */
        if (size >= 8 + w) {
            size_t n = 0;
            for (size_t i = w; i > 0; i--) n = n << 8 | data[8 + i - 1];
            if (n <= size - 8 - w) {
                size_t cap_n = w == 2 ? 0xffff : 0xffffffff;
                size_t m =
                    mutate_header(data, size, max_size, 8 + w, n, cap_n, (int)(r % 4), r >> 2);
                if (m != SIZE_MAX) {
                    for (size_t i = 0; i < w; i++) data[8 + i] = (uint8_t)(m >> (8 * i));
                    return size - n + m;
                }
            }
        }
    }
    return LLVMFuzzerMutate(data, size, max_size);
}
