/* io.h: what the file readers and writers of src/io/ share beside the public pf_io_* of
 * performer.h (inputs that are regular files, atomic replacement of outputs): error messages
 * that name the file, and complete writes. */
#ifndef PF_IO_H
#define PF_IO_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* Writes "name: <message>" to errmsg (if not NULL and errlen > 0) and returns st. */
PF_INTERNAL pf_status pf_io_fail(pf_status st, char *errmsg, size_t errlen, const char *name,
                                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Writes all n bytes to fd, retrying on EINTR and short writes; 0 on success, else an errno. */
PF_INTERNAL int pf_io_write_all(int fd, const void *buf, size_t n);

#endif
