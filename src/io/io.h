/* io.h: what the file readers and writers of src/io/ share: error messages that name the file,
 * complete writes, opening inputs that are regular files, and atomic replacement of outputs
 * (a temporary file beside the destination, then rename) that never replaces anything but a
 * regular file. */
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

/* Opens path for reading if it is a regular file, and returns the descriptor (close-on-exec)
 * and its size in *size. Anything else is refused before it can block or run forever: the
 * open is non-blocking (a FIFO with no writer would hang a plain open) and a folder, FIFO,
 * device (/dev/zero never ends) or socket is PF_EIO with errmsg saying what it is. Returns -1
 * with *st set (PF_EIO; PF_EINVAL for a NULL or empty path) on failure. */
PF_INTERNAL int pf_io_open_regular(const char *path, int64_t *size, pf_status *st, char *errmsg,
                                   size_t errlen);

/* Reads exactly n bytes from fd into buf, retrying on EINTR and short reads. PF_OK, or PF_EIO
 * with errmsg naming path (a read error, or the file ended early: it shrank while read). */
PF_INTERNAL pf_status pf_io_read_all(int fd, void *buf, size_t n, const char *path, char *errmsg,
                                     size_t errlen);

/* PF_OK if path may be replaced by a new regular file: it does not exist, or it is a regular
 * file. A symbolic link, folder, device, FIFO or socket is PF_EIO with a message: replacing
 * one would destroy it (`--out /dev/null` run as root would replace the device), and writing
 * through a link is not done silently. An empty path is PF_EINVAL. */
PF_INTERNAL pf_status pf_io_check_dest(const char *path, char *errmsg, size_t errlen);

/* The temporary files of atomic replacements in progress are registered (pf_io_atomic_begin
 * registers, pf_io_atomic_finish forgets), so that a process stopped by a signal can remove
 * them: pf_io_temp_remove_all is async-signal-safe (unlink only), for a signal handler. A
 * caller that keeps a temporary file past pf_io_atomic_begin without pf_io_atomic_finish (the
 * tool's staged outputs) calls pf_io_temp_forget before renaming or removing it. */
PF_INTERNAL void pf_io_temp_forget(const char *tmp);
PF_INTERNAL void pf_io_temp_remove_all(void);

/* An atomic replacement in progress: write to fd, then pf_io_atomic_finish. */
typedef struct pf_io_atomic {
    int fd;
    char *tmp; /* the temporary file's name, beside the destination */
} pf_io_atomic;

/* Checks path (pf_io_check_dest) and creates a new temporary file beside it, mode 0666 less
 * the umask like any new file: "<path>.tmp.XXXXXX", with the destination's name shortened
 * when that would exceed NAME_MAX, so any legal name can be written. PF_OK, or PF_EIO /
 * PF_EINVAL / PF_ENOMEM with errmsg naming path. */
PF_INTERNAL pf_status pf_io_atomic_begin(pf_io_atomic *w, const char *path, char *errmsg,
                                         size_t errlen);

/* Ends a replacement begun by pf_io_atomic_begin: with err == 0 (no error while writing), the
 * file is flushed to disk, path checked again, and the file renamed over path; otherwise, or
 * if any of that fails, the temporary file is removed and path left as it was. err is an
 * errno from the writes (or -1 for a failure already reported). PF_OK or PF_EIO. */
PF_INTERNAL pf_status pf_io_atomic_finish(pf_io_atomic *w, const char *path, int err,
                                          char *errmsg, size_t errlen);

#endif
