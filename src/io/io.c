/* io.c: helpers shared by the .npy, safetensors and text readers and writers. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/io.h"

#ifndef NAME_MAX
#define NAME_MAX 255
#endif

pf_status pf_io_fail(pf_status st, char *errmsg, size_t errlen, const char *name,
                     const char *fmt, ...) {
    if (errmsg && errlen > 0) {
        int n = snprintf(errmsg, errlen, "%s: ", name ? name : "(null)");
        if (n >= 0 && (size_t)n < errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(errmsg + n, errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return st;
}

int pf_io_write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno ? errno : EIO;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

pf_status pf_io_read_all(int fd, void *buf, size_t n, const char *path, char *errmsg,
                         size_t errlen) {
    if (fd < 0 || (!buf && n > 0))
        return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "no file or no buffer to read into");
    char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got > (1u << 30) ? (1u << 30) : n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return pf_io_fail(PF_EIO, errmsg, errlen, path, "read error: %s", strerror(errno));
        if (r == 0)
            return pf_io_fail(PF_EIO, errmsg, errlen, path,
                              "read error (the file shrank while it was read)");
        got += (size_t)r;
    }
    return PF_OK;
}

/* What a file of mode m is, in words, for messages. */
static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a folder";
    if (S_ISLNK(m)) return "a symbolic link";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

int pf_io_open_regular(const char *path, int64_t *size, pf_status *st, char *errmsg,
                       size_t errlen) {
    pf_status ignored;
    if (!st) st = &ignored;
    if (!size) {
        *st = pf_io_fail(PF_EINVAL, errmsg, errlen, path, "NULL size");
        return -1;
    }
    if (!path || !path[0]) {
        *st = pf_io_fail(PF_EINVAL, errmsg, errlen, path ? "(empty path)" : path,
                         "no file named");
        return -1;
    }
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        *st = pf_io_fail(PF_EIO, errmsg, errlen, path, "cannot open: %s", strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        *st = pf_io_fail(PF_EIO, errmsg, errlen, path, "cannot read: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        *st = pf_io_fail(PF_EIO, errmsg, errlen, path,
                         "is %s; only regular files are read (a stream could block or never "
                         "end)",
                         file_kind(sb.st_mode));
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *size = (int64_t)sb.st_size;
    *st = PF_OK;
    return fd;
}

pf_status pf_io_check_dest(const char *path, char *errmsg, size_t errlen) {
    if (!path || !path[0])
        return pf_io_fail(PF_EINVAL, errmsg, errlen, path ? "(empty path)" : path,
                          "no file named");
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return PF_OK;
        return pf_io_fail(PF_EIO, errmsg, errlen, path, "cannot write: %s", strerror(errno));
    }
    if (S_ISREG(sb.st_mode)) return PF_OK;
    return pf_io_fail(PF_EIO, errmsg, errlen, path,
                      "is %s; refusing to replace it (only a regular file or a new name can be "
                      "written)",
                      file_kind(sb.st_mode));
}

/* The registry: names of temporary files being written, NULL in free slots. Slots are taken and
 * freed with atomic operations; a signal handler only reads them. */
enum { TEMP_SLOTS = 64 };
static const char *volatile temp_slots[TEMP_SLOTS];

static void temp_register(const char *tmp) {
    for (int i = 0; i < TEMP_SLOTS; i++) {
        const char *none = NULL;
        if (__atomic_compare_exchange_n(&temp_slots[i], &none, tmp, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST))
            return;
    }
    /* all slots taken: this file is not removed on a signal (it is on any other failure) */
}

void pf_io_temp_forget(const char *tmp) {
    for (int i = 0; tmp && i < TEMP_SLOTS; i++) {
        const char *mine = tmp;
        if (__atomic_compare_exchange_n(&temp_slots[i], &mine, NULL, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST))
            return;
    }
}

void pf_io_temp_remove_all(void) {
    for (int i = 0; i < TEMP_SLOTS; i++) {
        const char *t = __atomic_load_n(&temp_slots[i], __ATOMIC_SEQ_CST);
        if (t) unlink(t);
    }
}

pf_status pf_io_atomic_begin(pf_io_atomic *w, const char *path, char *errmsg, size_t errlen) {
    static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static const char mid[] = ".tmp.";
    enum { SUFFIX = 6 };
    if (!w) return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "NULL writer");
    w->fd = -1;
    w->tmp = NULL;
    pf_status st = pf_io_check_dest(path, errmsg, errlen);
    if (st != PF_OK) return st;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t dirlen = (size_t)(base - path), baselen = strlen(base);
    if (baselen == 0) return pf_io_fail(PF_EIO, errmsg, errlen, path, "names a folder, not a file");
    /* the temporary name must be a legal name too: shorten the destination's part */
    size_t keep = baselen;
    if (keep + sizeof(mid) - 1 + SUFFIX > NAME_MAX) keep = NAME_MAX - (sizeof(mid) - 1) - SUFFIX;
    size_t cap = dirlen + keep + sizeof(mid) + SUFFIX;
    w->tmp = malloc(cap);
    if (!w->tmp) return pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory");

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 30 ^ (uint64_t)getpid() << 16 ^
                 (uint64_t)(uintptr_t)w->tmp;
    x |= 1; /* xorshift's one fixed point is 0 */
    for (int attempt = 0; attempt < 100; attempt++) {
        char suffix[SUFFIX + 1];
        for (int i = 0; i < SUFFIX; i++) {
            x ^= x << 13; /* xorshift64: only needs to make collisions unlikely */
            x ^= x >> 7;
            x ^= x << 17;
            suffix[i] = chars[x % (sizeof(chars) - 1)];
        }
        suffix[SUFFIX] = '\0';
        snprintf(w->tmp, cap, "%.*s%.*s%s%s", (int)dirlen, path, (int)keep, base, mid, suffix);
        /* 0666: the final file gets the caller's umask like any new file */
        w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (w->fd >= 0 || errno != EEXIST) break;
    }
    if (w->fd < 0) {
        int e = errno;
        free(w->tmp);
        w->tmp = NULL;
        return pf_io_fail(PF_EIO, errmsg, errlen, path, "cannot create a file: %s", strerror(e));
    }
    temp_register(w->tmp);
    return PF_OK;
}

pf_status pf_io_atomic_finish(pf_io_atomic *w, const char *path, int err, char *errmsg,
                              size_t errlen) {
    if (!w || !w->tmp) return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "no write begun");
    int e = err;
    /* fsync before rename: otherwise a crash soon after can leave an empty file at path on
     * file systems that delay allocation */
    if (!e && fsync(w->fd) != 0 && errno != EINVAL && errno != EROFS) e = errno;
    if (close(w->fd) != 0 && !e) e = errno;
    w->fd = -1;
    pf_status st = PF_OK;
    if (!e) {
        /* path may have become something else while the file was written */
        st = pf_io_check_dest(path, errmsg, errlen);
        if (st == PF_OK && rename(w->tmp, path) != 0) e = errno;
    }
    pf_io_temp_forget(w->tmp); /* renamed into place, or removed next */
    if (e || st != PF_OK) {
        unlink(w->tmp);
        if (e > 0) st = pf_io_fail(PF_EIO, errmsg, errlen, path, "cannot write: %s", strerror(e));
        else if (st == PF_OK) st = PF_EIO;
    }
    free(w->tmp);
    w->tmp = NULL;
    return st;
}
