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
 * - the real protein set (Debian's mmseqs2-examples): 20,000 sequences. */
#include <dirent.h>
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
    cleanup();
    TEST_MAIN_END();
}
