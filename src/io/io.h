/* io.h: what the file readers and writers of src/io/ share: error messages that name the file,
 * complete writes, and temporary files for atomic replacement (write, then rename). */
#ifndef PF_IO_H
#define PF_IO_H

#include <stddef.h>

#include "internal.h"

/* Writes "name: <message>" to errmsg (if not NULL and errlen > 0) and returns st. */
PF_INTERNAL pf_status pf_io_fail(pf_status st, char *errmsg, size_t errlen, const char *name,
                                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Writes all n bytes to fd, retrying on EINTR and short writes; 0 on success, else an errno. */
PF_INTERNAL int pf_io_write_all(int fd, const void *buf, size_t n);

/* Creates "<path>.tmp.XXXXXX" exclusively, like mkstemp(3) but with mode 0666 so that the
 * final file gets the caller's umask like any other new file (mkstemp's 0600 would survive the
 * rename). Returns the fd, or -1 with errno set; tmp (cap bytes) receives the name. */
PF_INTERNAL int pf_io_create_temp(const char *path, char *tmp, size_t cap);

#endif
