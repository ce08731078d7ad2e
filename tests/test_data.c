/* test_data.c: corpora for the language model.
 *
 * - FASTA: multi-line records, CRLF, blank lines, lower case, empty records; the documents
 *   are exactly the joined sequences; a gzip copy (written here with zlib) reads the same;
 * - text: documents end at line ends, their concatenation is the file (+ a final '\n');
 * - the split depends on the documents only: the same file gives the same bytes, reversing
 *   the record order gives the same validation set; its size is binomial(n, f) within 5 SD;
 * - batches: deterministic in (seed, stream), targets are the tokens shifted by one, windows
 *   lie inside the split;
 * - bad input: missing file, folder, empty, white space only, binary, a stray byte in a
 *   sequence (line and column named), data before the first header, headers only, damaged
 *   and truncated gzip, data after the last gzip member, a FIFO, /dev/zero: each a clear
 *   error (concatenated gzip members read as one);
 * - the real protein set (Debian's mmseqs2-examples): 20,000 sequences;
 * - MQAR (pf_mqar_batch), read back here without the generator's code: N distinct keys and N
 *   distinct values in their byte ranges at the start, every answer target at a query position
 *   (2N + an even offset) whose key appears earlier, paired with that value, exactly Q of them,
 *   the keys asked evenly (Q <= N: all different), filler elsewhere with target -1; the same
 *   arguments give the same bytes, another seed or stream others, sequence b is the same whatever
 *   B; the query slots follow the weights 1/(g+1) (each slot's frequency within 5 SD over 20,000
 *   sequences); impossible settings refused. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "model/data.h"

#define PROTEINS "/usr/share/doc/mmseqs2/example-data/DB.fasta.gz"

static char dir[256];

static const char *tpath(const char *name) {
    static char buf[4][512];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
    return buf[k];
}

static void write_file(const char *path, const char *s, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) exit(2);
    fwrite(s, 1, n, f);
    fclose(f);
}

static void write_gz(const char *path, const char *s, size_t n) {
    gzFile g = gzopen(path, "wb");
    if (!g) exit(2);
    gzwrite(g, s, (unsigned)n);
    gzclose(g);
}

static void expect_error(const char *path, pf_corpus_format fmt, pf_status want,
                         const char *needle) {
    pf_corpus c;
    char msg[512];
    pf_status st = pf_corpus_load(&c, path, fmt, 0.1, msg, sizeof(msg));
    CHECK(st == want, "%s: status %s, expected %s (%s)", path, pf_status_str(st),
          pf_status_str(want), msg);
    CHECK(strstr(msg, needle) != NULL, "message '%s' lacks '%s'", msg, needle);
    CHECK(strstr(msg, path) != NULL, "message '%s' does not name the file", msg);
    if (st == PF_OK) pf_corpus_free(&c);
}

static const char fasta[] = "\n>sp|A1|first protein\r\nMKV\r\nLLA\r\n\r\n"
                            ">empty record\n"
                            ">tr|B2 second\nacde\nFGH*\n"
                            ">third\n  \nWY-X.\n";

static void test_fasta(void) {
    pf_docs d;
    char msg[256];
    CHECK_STATUS(pf_docs_fasta(&d, (const uint8_t *)fasta, strlen(fasta), "t", msg, sizeof(msg)),
                 PF_OK);
    const char *want[] = {"MKVLLA\n", "acdeFGH*\n", "WY-X.\n"};
    CHECK(d.count == 3, "%zu documents, expected 3", d.count);
    for (size_t i = 0; i < d.count && i < 3; i++) {
        CHECK(d.len[i] == strlen(want[i]) && memcmp(d.bytes + d.start[i], want[i], d.len[i]) == 0,
              "document %zu is '%.*s'", i, (int)d.len[i], d.bytes + d.start[i]);
    }
    pf_docs_free(&d);
    pf_docs_free(&d);

    /* plain and gzip give the same corpus */
    write_file(tpath("p.fa"), fasta, strlen(fasta));
    write_gz(tpath("p.fa.gz"), fasta, strlen(fasta));
    pf_corpus a, b;
    CHECK_STATUS(pf_corpus_load(&a, tpath("p.fa"), PF_CORPUS_AUTO, 0.3, msg, sizeof(msg)), PF_OK);
    CHECK_STATUS(pf_corpus_load(&b, tpath("p.fa.gz"), PF_CORPUS_AUTO, 0.3, msg, sizeof(msg)),
                 PF_OK);
    CHECK(a.n[0] == b.n[0] && a.n[1] == b.n[1] && memcmp(a.bytes[0], b.bytes[0], a.n[0]) == 0 &&
              memcmp(a.bytes[1], b.bytes[1], a.n[1]) == 0,
          "gzip and plain corpora differ");
    CHECK(a.docs[0] + a.docs[1] == 3 && a.docs[0] >= 1 && a.docs[1] >= 1,
          "split %zu + %zu documents", a.docs[0], a.docs[1]);
    CHECK(a.n[0] + a.n[1] == 7 + 9 + 6, "split holds %zu bytes", a.n[0] + a.n[1]);
    pf_corpus_free(&a);
    pf_corpus_free(&b);
}

static void test_text(void) {
    /* 300 lines of 30 bytes: documents of >= 2048 bytes end at line ends */
    size_t n = 300 * 30;
    char *t = xmalloc(n + 1);
    for (int i = 0; i < 300; i++) {
        char line[64];
        snprintf(line, sizeof(line), "line %4d of the test text...\n", i % 10000);
        memcpy(t + i * 30, line, 30);
    }
    pf_docs d;
    char msg[256];
    CHECK_STATUS(pf_docs_text(&d, (const uint8_t *)t, n - 1, PF_TEXT_DOC, "t", msg, sizeof(msg)),
                 PF_OK); /* without the final '\n': it is added */
    size_t total = 0;
    int ok = 1;
    for (size_t i = 0; i < d.count; i++) {
        ok &= d.start[i] == total && d.bytes[d.start[i] + d.len[i] - 1] == '\n';
        if (i + 1 < d.count) ok &= d.len[i] >= PF_TEXT_DOC && d.len[i] < PF_TEXT_DOC + 30;
        total += d.len[i];
    }
    CHECK(ok && total == n && memcmp(d.bytes, t, n) == 0, "text documents do not tile the file");
    CHECK(d.count == 5, "%zu text documents, expected 5 (9000 bytes in >= 2048 pieces)", d.count);
    pf_docs_free(&d);
    free(t);
}

static void test_split(void) {
    /* 2000 distinct records; validation fraction 0.1 */
    enum { NDOC = 2000 };
    size_t cap = NDOC * 64;
    char *f = xmalloc(cap), *r = xmalloc(cap);
    size_t nf = 0, nr = 0;
    char rec[NDOC][64];
    for (int i = 0; i < NDOC; i++) {
        snprintf(rec[i], sizeof(rec[i]), ">s%d\nMK%c%c%c%cA\n", i, 'A' + i % 26, 'A' + i / 26 % 26,
                 'A' + i / 676 % 26, 'C' + i % 7);
    }
    for (int i = 0; i < NDOC; i++) {
        nf += (size_t)sprintf(f + nf, "%s", rec[i]);
        nr += (size_t)sprintf(r + nr, "%s", rec[NDOC - 1 - i]);
    }
    write_file(tpath("fwd.fa"), f, nf);
    write_file(tpath("rev.fa"), r, nr);
    pf_corpus a, a2, b;
    char msg[256];
    CHECK_STATUS(pf_corpus_load(&a, tpath("fwd.fa"), PF_CORPUS_FASTA, 0.1, msg, sizeof(msg)),
                 PF_OK);
    CHECK_STATUS(pf_corpus_load(&a2, tpath("fwd.fa"), PF_CORPUS_FASTA, 0.1, msg, sizeof(msg)),
                 PF_OK);
    CHECK_STATUS(pf_corpus_load(&b, tpath("rev.fa"), PF_CORPUS_FASTA, 0.1, msg, sizeof(msg)),
                 PF_OK);
    CHECK(a.n[1] == a2.n[1] && memcmp(a.bytes[1], a2.bytes[1], a.n[1]) == 0,
          "two loads split differently");
    /* expected 200 validation documents, SD sqrt(2000 * 0.1 * 0.9) = 13.4: within 5 SD */
    CHECK(a.docs[1] > 200 - 67 && a.docs[1] < 200 + 67, "%zu validation documents", a.docs[1]);
    CHECK(a.docs[1] == b.docs[1] && a.n[1] == b.n[1], "order changed the split size");
    /* the same documents: every line of a's validation split occurs in b's */
    int same = 1;
    for (size_t i = 0, s = 0; i < a.n[1]; i++) {
        if (a.bytes[1][i] != '\n') continue;
        size_t len = i + 1 - s;
        int found = 0;
        for (size_t j = 0, t = 0; j < b.n[1] && !found; j++) {
            if (b.bytes[1][j] != '\n') continue;
            found = j + 1 - t == len && memcmp(b.bytes[1] + t, a.bytes[1] + s, len) == 0;
            t = j + 1;
        }
        same &= found;
        s = i + 1;
    }
    CHECK(same, "reversing the file changed which documents validate");

    /* batches */
    enum { B = 4, T = 16 };
    int32_t t1[B * T], g1[B * T], t2[B * T], g2[B * T];
    CHECK_STATUS(pf_corpus_batch(&a, PF_SPLIT_TRAIN, t1, g1, B, T, 5, 9), PF_OK);
    CHECK_STATUS(pf_corpus_batch(&a, PF_SPLIT_TRAIN, t2, g2, B, T, 5, 9), PF_OK);
    CHECK(memcmp(t1, t2, sizeof(t1)) == 0 && memcmp(g1, g2, sizeof(g1)) == 0,
          "same stream, different batch");
    int shifted = 1, inside = 1;
    for (int b2 = 0; b2 < B; b2++) {
        for (int t = 0; t + 1 < T; t++) shifted &= g1[b2 * T + t] == t1[b2 * T + t + 1];
        /* the window occurs in the split */
        uint8_t w[T + 1];
        for (int t = 0; t < T; t++) w[t] = (uint8_t)t1[b2 * T + t];
        w[T] = (uint8_t)g1[b2 * T + T - 1];
        int found = 0;
        for (size_t o = 0; o + T + 1 <= a.n[0] && !found; o++)
            found = memcmp(a.bytes[0] + o, w, T + 1) == 0;
        inside &= found;
    }
    CHECK(shifted && inside, "targets are not the next bytes of a window of the split");
    CHECK_STATUS(pf_corpus_batch(&a, PF_SPLIT_TRAIN, t2, g2, B, T, 5, 10), PF_OK);
    CHECK(memcmp(t1, t2, sizeof(t1)) != 0, "another stream gave the same batch");
    /* the longest window: the whole split */
    int32_t *tl = xmalloc(sizeof(int32_t) * a.n[1]), *gl = xmalloc(sizeof(int32_t) * a.n[1]);
    CHECK_STATUS(pf_corpus_batch(&a, PF_SPLIT_VAL, tl, gl, 1, (int)a.n[1], 5, 10), PF_EINVAL);
    CHECK_STATUS(pf_corpus_batch(&a, PF_SPLIT_VAL, tl, gl, 1, (int)a.n[1] - 1, 5, 10), PF_OK);
    CHECK(tl[0] == a.bytes[1][0] && gl[a.n[1] - 2] == a.bytes[1][a.n[1] - 1],
          "the whole-split window is not the split");
    free(tl);
    free(gl);
    CHECK_STATUS(pf_corpus_batch(&a, 2, t2, g2, B, T, 5, 10), PF_EINVAL);
    pf_corpus_free(&a);
    pf_corpus_free(&a2);
    pf_corpus_free(&b);
    free(f);
    free(r);
}

static void test_errors(void) {
    expect_error(tpath("missing.fa"), PF_CORPUS_AUTO, PF_EIO, "No such file");
    expect_error(dir, PF_CORPUS_AUTO, PF_EIO, "folder");
    write_file(tpath("empty"), "", 0);
    expect_error(tpath("empty"), PF_CORPUS_AUTO, PF_EFORMAT, "empty");
    expect_error(tpath("empty"), PF_CORPUS_FASTA, PF_EFORMAT, "empty");
    write_file(tpath("blank"), " \n\n\t\n", 5);
    expect_error(tpath("blank"), PF_CORPUS_AUTO, PF_EFORMAT, "empty");
    write_file(tpath("bin"), "abc\0def\n", 8);
    expect_error(tpath("bin"), PF_CORPUS_AUTO, PF_EFORMAT, "NUL byte at offset 3");
    const char bad[] = ">x\nMKV\nMK7V\n";
    write_file(tpath("bad.fa"), bad, strlen(bad));
    expect_error(tpath("bad.fa"), PF_CORPUS_AUTO, PF_EFORMAT, "line 3, column 3: byte 0x37");
    const char before[] = "MKV\n>x\nMKV\n";
    write_file(tpath("before.fa"), before, strlen(before));
    expect_error(tpath("before.fa"), PF_CORPUS_FASTA, PF_EFORMAT, "before the first '>'");
    const char hdr[] = ">x\n>y\n\n";
    write_file(tpath("hdr.fa"), hdr, strlen(hdr));
    expect_error(tpath("hdr.fa"), PF_CORPUS_AUTO, PF_EFORMAT, "no sequences");

    /* gzip: a corrupted body and a cut-short stream */
    size_t n = 20000;
    char *s = xmalloc(n);
    for (size_t i = 0; i < n; i++) s[i] = "ACDEFGHIKLMNPQRSTVWY\n"[(i * 7 + i / 13) % 21];
    s[0] = '>';
    write_gz(tpath("g.gz"), s, n);
    FILE *fp = fopen(tpath("g.gz"), "rb");
    char *gz = xmalloc(n + 64);
    size_t gn = fread(gz, 1, n + 64, fp);
    fclose(fp);
    write_file(tpath("cut.gz"), gz, gn / 2);
    expect_error(tpath("cut.gz"), PF_CORPUS_AUTO, PF_EFORMAT, "damaged gzip");
    for (size_t i = 20; i < 60 && i < gn; i++) gz[i] ^= 0x5a;
    write_file(tpath("bad.gz"), gz, gn);
    expect_error(tpath("bad.gz"), PF_CORPUS_AUTO, PF_EFORMAT, "damaged gzip");

    /* gzip members in a row read as one stream (as gzip itself does); anything else after
     * the last member is an error, not silently dropped */
    char *two = xmalloc(2 * gn + 16);
    memcpy(two, gz, gn); /* gz is damaged by now: write it again */
    write_gz(tpath("g2.gz"), s, n);
    fp = fopen(tpath("g2.gz"), "rb");
    gn = fread(two, 1, gn + 64, fp);
    fclose(fp);
    memcpy(two + gn, two, gn);
    write_file(tpath("twice.gz"), two, 2 * gn);
    char msg[512];
    uint8_t *raw = NULL;
    size_t rn = 0;
    CHECK_STATUS(pf_file_read(tpath("twice.gz"), &raw, &rn, msg, sizeof(msg)), PF_OK);
    CHECK(rn == 2 * n && raw && memcmp(raw, s, n) == 0 && memcmp(raw + n, s, n) == 0,
          "two gzip members: %zu bytes, expected %zu", rn, 2 * n);
    free(raw);
    memcpy(two + gn, "trailing garbage\n", 17);
    write_file(tpath("trail.gz"), two, gn + 17);
    expect_error(tpath("trail.gz"), PF_CORPUS_AUTO, PF_EFORMAT, "17 bytes after the end of");
    memset(two + gn, 0, 8); /* zero padding is not a member either */
    write_file(tpath("zeros.gz"), two, gn + 8);
    expect_error(tpath("zeros.gz"), PF_CORPUS_AUTO, PF_EFORMAT, "after the end of the gzip");
    free(two);
    free(gz);
    free(s);

    /* streams are refused at once, before a blocking open: a FIFO with no writer would hang,
     * /dev/zero never ends */
    CHECK(mkfifo(tpath("fifo"), 0600) == 0, "mkfifo");
    expect_error(tpath("fifo"), PF_CORPUS_AUTO, PF_EIO, "FIFO");
    unlink(tpath("fifo"));
    pf_corpus zc;
    pf_status zs = pf_corpus_load(&zc, "/dev/zero", PF_CORPUS_AUTO, 0.1, msg, sizeof(msg));
    CHECK(zs == PF_EIO && strstr(msg, "a device"), "/dev/zero: %s: %s", pf_status_str(zs), msg);
    if (zs == PF_OK) pf_corpus_free(&zc);
}

static void test_proteins(void) {
    if (access(PROTEINS, R_OK) != 0) {
        CHECK(0, "%s is missing: run scripts/setup.sh (package mmseqs2-examples)", PROTEINS);
        return;
    }
    pf_corpus c;
    char msg[512];
    CHECK_STATUS(pf_corpus_load(&c, PROTEINS, PF_CORPUS_AUTO, 0.05, msg, sizeof(msg)), PF_OK);
    CHECK(c.docs[0] + c.docs[1] == 20000, "%zu + %zu sequences, expected 20000", c.docs[0],
          c.docs[1]);
    /* 5% of 20000 = 1000, SD 30.8: within 5 SD */
    CHECK(c.docs[1] > 1000 - 155 && c.docs[1] < 1000 + 155, "%zu validation sequences", c.docs[1]);
    /* 9,075,569 bytes of sequence lines = residues + one '\n' per line; with one '\n' per
     * sequence instead, the total is residues + 20000 */
    printf("proteins: %zu train bytes (%zu sequences), %zu validation bytes (%zu)\n", c.n[0],
           c.docs[0], c.n[1], c.docs[1]);
    int letters = 1;
    for (size_t i = 0; i < c.n[0]; i++) {
        uint8_t b = c.bytes[0][i];
        letters &= (b >= 'A' && b <= 'Z') || b == '\n';
    }
    CHECK(letters, "a byte other than A-Z and '\\n' in the protein corpus");
    pf_corpus_free(&c);
}

/* ---- MQAR --------------------------------------------------------------------------------- */

/* The invariants of one MQAR sequence (tok, tgt: T each) for task t; 1 if all hold. */
static int mqar_sequence_ok(const pf_mqar *t, const int32_t *tok, const int32_t *tgt, int T) {
    const int N = t->pairs, K = t->keys;
    int seen_key[256] = {0}, seen_val[256] = {0}, asked[256] = {0};
    for (int i = 0; i < N; i++) {
        int k = tok[2 * i], v = tok[2 * i + 1];
        if (k < 0 || k >= K || v < K || v >= 2 * K || seen_key[k]++ || seen_val[v]++) {
            CHECK(0, "pair %d: key %d, value %d (K %d): out of range or repeated", i, k, v, K);
            return 0;
        }
        if (tgt[2 * i] != -1 || tgt[2 * i + 1] != -1) {
            CHECK(0, "pair %d has a target", i);
            return 0;
        }
    }
    int answers = 0;
    for (int p = 2 * N; p < T; p++) {
        if (tok[p] < 0 || tok[p] > 255) {
            CHECK(0, "token %d at %d", tok[p], p);
            return 0;
        }
        if (tgt[p] < 0) { /* filler: neither a key nor a value */
            if (tgt[p] != -1 || tok[p] < 2 * K) {
                CHECK(0, "position %d: token %d, target %d: not filler", p, tok[p], tgt[p]);
                return 0;
            }
            continue;
        }
        answers++;
        /* a query: at an even offset after the pairs, its key earlier with exactly this value */
        int found = -1;
        for (int i = 0; i + 1 < p; i++)
            if (tok[i] == tok[p] && i < 2 * N && i % 2 == 0) found = i;
        if ((p - 2 * N) % 2 != 0 || found < 0 || tok[found + 1] != tgt[p]) {
            CHECK(0, "position %d: key %d, target %d: not a query of an earlier pair", p, tok[p],
                  tgt[p]);
            return 0;
        }
        asked[tok[p]]++;
    }
    if (answers != t->queries) {
        CHECK(0, "%d answers, expected %d", answers, t->queries);
        return 0;
    }
    /* every key asked floor(Q/N) or ceil(Q/N) times */
    const int lo = t->queries / N, hi = (t->queries + N - 1) / N;
    for (int i = 0; i < N; i++) {
        int a = asked[tok[2 * i]];
        if (a < lo || a > hi) {
            CHECK(0, "key %d asked %d times (Q %d, N %d)", tok[2 * i], a, t->queries, N);
            return 0;
        }
    }
    return 1;
}

static void test_mqar(void) {
    pf_mqar d = pf_mqar_default();
    CHECK(d.pairs == 8 && d.queries == 8 && d.keys == 64, "default %d %d %d", d.pairs, d.queries,
          d.keys);
    CHECK_STATUS(pf_mqar_check(&d, 32), PF_OK);
    CHECK_STATUS(pf_mqar_check(&d, 31), PF_EINVAL); /* 2N + 2Q = 32 */
    const struct {
        int pairs, queries, keys, T;
        pf_status want;
    } checks[] = {{1, 1, 1, 4, PF_OK},         {127, 1, 127, 256, PF_OK},
                  {4, 28, 16, 64, PF_OK},       {0, 1, 8, 64, PF_EINVAL},
                  {9, 1, 8, 64, PF_EINVAL},     {1, 0, 8, 64, PF_EINVAL},
                  {1, 1, 0, 64, PF_EINVAL},     {1, 1, 128, 64, PF_EINVAL},
                  {4, 29, 16, 64, PF_EINVAL},   {1, 1, 1, 3, PF_EINVAL}};
    for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]); i++) {
        pf_mqar t = {checks[i].pairs, checks[i].queries, checks[i].keys};
        CHECK_STATUS(pf_mqar_check(&t, checks[i].T), checks[i].want);
    }
    CHECK_STATUS(pf_mqar_check(NULL, 64), PF_EINVAL);

    /* the invariants, on Zoology's Q = N, Q > N (keys asked again), Q < N with an odd T, and
     * every key used */
    const struct {
        pf_mqar t;
        int T;
    } cases[] = {{{8, 8, 64}, 64}, {{4, 28, 16}, 64}, {{3, 2, 3}, 11}, {{127, 1, 127}, 256}};
    enum { B = 16 };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const pf_mqar *t = &cases[c].t;
        const int T = cases[c].T;
        int32_t *tok = malloc(sizeof(int32_t) * B * T), *tgt = malloc(sizeof(int32_t) * B * T);
        int32_t *tok2 = malloc(sizeof(int32_t) * B * T), *tgt2 = malloc(sizeof(int32_t) * B * T);
        if (!tok || !tgt || !tok2 || !tgt2) exit(2);
        CHECK_STATUS(pf_mqar_batch(t, tok, tgt, B, T, 5, 9), PF_OK);
        for (int b = 0; b < B; b++)
            if (!mqar_sequence_ok(t, tok + b * T, tgt + b * T, T)) {
                fprintf(stderr, "  case %zu, sequence %d\n", c, b);
                break;
            }
        /* deterministic; sequence b whatever B; another seed, another stream: other bytes */
        CHECK_STATUS(pf_mqar_batch(t, tok2, tgt2, B, T, 5, 9), PF_OK);
        CHECK(memcmp(tok, tok2, sizeof(int32_t) * B * T) == 0 &&
                  memcmp(tgt, tgt2, sizeof(int32_t) * B * T) == 0,
              "case %zu: the same arguments gave other sequences", c);
        CHECK_STATUS(pf_mqar_batch(t, tok2, tgt2, 3, T, 5, 9), PF_OK);
        CHECK(memcmp(tok, tok2, sizeof(int32_t) * 3 * T) == 0 &&
                  memcmp(tgt, tgt2, sizeof(int32_t) * 3 * T) == 0,
              "case %zu: the first 3 sequences depend on B", c);
        CHECK_STATUS(pf_mqar_batch(t, tok2, tgt2, B, T, 6, 9), PF_OK);
        CHECK(memcmp(tok, tok2, sizeof(int32_t) * B * T) != 0, "case %zu: seed 6 = seed 5", c);
        CHECK_STATUS(pf_mqar_batch(t, tok2, tgt2, B, T, 5, 10), PF_OK);
        CHECK(memcmp(tok, tok2, sizeof(int32_t) * B * T) != 0, "case %zu: stream 10 = 9", c);
        /* no two sequences of a batch alike */
        for (int b = 1; b < B; b++)
            CHECK(memcmp(tok, tok + b * T, sizeof(int32_t) * T) != 0, "case %zu: sequence %d = 0",
                  c, b);
        free(tok), free(tgt), free(tok2), free(tgt2);
    }

    /* the slots: one pair, one query, S = 15 slots (T 32): slot g with probability
     * (1/(g+1)) / H(15), each frequency over n sequences within 5 SD */
    {
        const pf_mqar t = {1, 1, 8};
        enum { T = 32, S = 15, NS = 20000 };
        int32_t *tok = malloc(sizeof(int32_t) * NS * T), *tgt = malloc(sizeof(int32_t) * NS * T);
        if (!tok || !tgt) exit(2);
        CHECK_STATUS(pf_mqar_batch(&t, tok, tgt, NS, T, 11, 0), PF_OK);
        int count[S] = {0};
        for (int b = 0; b < NS; b++)
            for (int p = 2; p < T; p++)
                if (tgt[b * T + p] >= 0) count[(p - 2) / 2]++;
        double H = 0;
        for (int g = 0; g < S; g++) H += 1.0 / (g + 1);
        for (int g = 0; g < S; g++) {
            double pr = 1.0 / (g + 1) / H, mean = NS * pr, sd = sqrt(NS * pr * (1 - pr));
            CHECK(fabs(count[g] - mean) < 5 * sd, "slot %d: %d queries, expected %.0f +- %.0f", g,
                  count[g], mean, sd);
        }
        free(tok), free(tgt);
    }

    int32_t a[64], b2[64];
    const pf_mqar ok = {2, 2, 4};
    CHECK_STATUS(pf_mqar_batch(NULL, a, b2, 1, 64, 1, 0), PF_EINVAL);
    CHECK_STATUS(pf_mqar_batch(&ok, NULL, b2, 1, 64, 1, 0), PF_EINVAL);
    CHECK_STATUS(pf_mqar_batch(&ok, a, NULL, 1, 64, 1, 0), PF_EINVAL);
    CHECK_STATUS(pf_mqar_batch(&ok, a, b2, 0, 64, 1, 0), PF_EINVAL);
    CHECK_STATUS(pf_mqar_batch(&ok, a, b2, 1, 7, 1, 0), PF_EINVAL); /* 2N + 2Q = 8 > 7 */
}

static void cleanup(void) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[600];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

int main(void) {
    snprintf(dir, sizeof(dir), "/tmp/pf_test_data_XXXXXX");
    if (!mkdtemp(dir)) return 2;
    test_fasta();
    test_text();
    test_split();
    test_errors();
    test_proteins();
    test_mqar();
    cleanup();
    TEST_MAIN_END();
}
