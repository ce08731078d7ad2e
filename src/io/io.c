/* io.c: helpers shared by the .npy, safetensors and text readers and writers. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "io/io.h"

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

int pf_io_create_temp(const char *path, char *tmp, size_t cap) {
    static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 30 ^ (uint64_t)getpid() << 16 ^
                 (uint64_t)(uintptr_t)tmp;
    x |= 1; /* xorshift's one fixed point is 0 */
    for (int attempt = 0; attempt < 100; attempt++) {
        char suffix[7];
        for (int i = 0; i < 6; i++) {
            x ^= x << 13; /* xorshift64: only needs to make collisions unlikely */
            x ^= x >> 7;
            x ^= x << 17;
            suffix[i] = chars[x % (sizeof(chars) - 1)];
        }
        suffix[6] = '\0';
        snprintf(tmp, cap, "%s.tmp.%s", path, suffix);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
}
