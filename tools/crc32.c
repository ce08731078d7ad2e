/* crc32.c: the CRC-32 of a file (zlib's crc32_z), for the record a run keeps of the checkpoint
 * it started from (`performer train --init-from`): the same number as Python's
 * zlib.crc32(open(FILE, "rb").read()), printed as 8 hex digits. An identity, not a seal. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "tool.h"

int tool_crc32_file(const char *path, char hex[9], char *msg, size_t cap) {
    int64_t size;
    pf_status st;
    int fd = pf_io_open_regular(path, &size, &st, msg, cap);
    if (fd < 0) return -1;
    uLong crc = crc32_z(0L, Z_NULL, 0);
    static unsigned char buf[1 << 16];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            snprintf(msg, cap, "%s: read error: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        if (n == 0) break;
        crc = crc32_z(crc, buf, (z_size_t)n);
    }
    close(fd);
    snprintf(hex, 9, "%08lx", (unsigned long)crc);
    return 0;
}
