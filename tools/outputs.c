/* outputs.c: the files a command writes (tool.h's tool_outputs): every one checked before the
 * work, written to a temporary name beside it, and renamed into place only when all of them
 * are ready, so a failed run leaves every file that existed before it as it was. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tool.h"

void tool_outputs_init(tool_outputs *s, const char *cmd) {
    memset(s, 0, sizeof(*s));
    s->cmd = cmd;
}

/* "folder/name" of path with the folder resolved (realpath), so that "o.npy", "./o.npy" and
 * "d/../o.npy" compare equal. 0, or -1 after a message. */
static int canonical(const tool_outputs *s, const char *flag, const char *path, char *out,
                     size_t cap) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
        return tool_fail(s->cmd, "%s %s: names a folder; give a file name", flag, path), -1;
    char dir[PATH_MAX], real[PATH_MAX];
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == path)
        snprintf(dir, sizeof(dir), "/");
    else
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    if (!realpath(dir, real))
        return tool_fail(s->cmd, "%s %s: cannot write: folder '%s': %s", flag, path, dir,
                         strerror(errno)),
               -1;
    struct stat sb;
    if (stat(real, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return tool_fail(s->cmd, "%s %s: cannot write: '%s' is not a folder", flag, path, dir), -1;
    if (access(real, W_OK | X_OK) != 0)
        return tool_fail(s->cmd, "%s %s: cannot write: folder '%s': %s", flag, path, dir,
                         strerror(errno)),
               -1;
    int n = snprintf(out, cap, "%s/%s", strcmp(real, "/") == 0 ? "" : real, base);
    if (n < 0 || (size_t)n >= cap)
        return tool_fail(s->cmd, "%s %s: path too long", flag, path), -1;
    return 0;
}

int tool_outputs_add(tool_outputs *s, const char *flag, const char *path) {
    if (!path || !*path) return tool_usage(s->cmd, "%s: empty file name", flag);
    if (s->n >= TOOL_MAX_OUTPUTS) return tool_fail(s->cmd, "too many outputs");
    tool_output *o = &s->o[s->n];
    memset(o, 0, sizeof(*o));
    o->flag = flag;
    int n = snprintf(o->path, sizeof(o->path), "%s", path);
    if (n < 0 || (size_t)n >= sizeof(o->path))
        return tool_fail(s->cmd, "%s %s: path too long", flag, path);
    if (canonical(s, flag, path, o->canon, sizeof(o->canon)) != 0) return TOOL_EXIT_FAIL;
    char msg[1024];
    if (pf_io_check_dest(path, msg, sizeof(msg)) != PF_OK)
        return tool_fail(s->cmd, "%s %s", flag, msg);
    struct stat sb;
    o->exists = stat(path, &sb) == 0;
    o->dev = o->exists ? sb.st_dev : 0;
    o->ino = o->exists ? sb.st_ino : 0;
    for (int i = 0; i < s->n; i++) {
        const tool_output *p = &s->o[i];
        if (strcmp(p->canon, o->canon) == 0 ||
            (p->exists && o->exists && p->dev == o->dev && p->ino == o->ino))
            return tool_usage(s->cmd, "%s %s and %s %s name the same file; each output needs "
                                      "its own",
                              p->flag, p->path, flag, path);
    }
    s->n++;
    return 0;
}

int tool_outputs_check_input(const tool_outputs *s, const char *flag, const char *path) {
    if (!path) return 0;
    struct stat sb;
    int exists = stat(path, &sb) == 0;
    char canon[PATH_MAX + 256] = "";
    char real[PATH_MAX];
    if (realpath(path, real)) snprintf(canon, sizeof(canon), "%s", real);
    for (int i = 0; i < s->n; i++) {
        const tool_output *o = &s->o[i];
        if ((exists && o->exists && o->dev == sb.st_dev && o->ino == sb.st_ino) ||
            (canon[0] && strcmp(canon, o->canon) == 0))
            return tool_usage(s->cmd, "%s %s is also an output (%s %s): an input is never "
                                      "overwritten",
                              flag, path, o->flag, o->path);
    }
    return 0;
}

const char *tool_outputs_stage(tool_outputs *s, int i) {
    tool_output *o = &s->o[i];
    if (o->tmp) return o->tmp;
    pf_io_atomic w;
    char msg[1024];
    if (pf_io_atomic_begin(&w, o->path, msg, sizeof(msg)) != PF_OK) {
        tool_fail(s->cmd, "%s", msg);
        return NULL;
    }
    close(w.fd);
    o->tmp = w.tmp; /* an empty file of ours, replaced by the writer */
    return o->tmp;
}

FILE *tool_outputs_open(tool_outputs *s, int i) {
    const char *tmp = tool_outputs_stage(s, i);
    if (!tmp) return NULL;
    FILE *f = fopen(tmp, "w");
    if (!f) tool_fail(s->cmd, "%s: cannot write: %s", tmp, strerror(errno));
    return f;
}

int tool_outputs_commit(tool_outputs *s) {
    char msg[1024];
    /* every destination checked again first: nothing is renamed unless all can be */
    for (int i = 0; i < s->n; i++) {
        if (!s->o[i].tmp) continue;
        if (pf_io_check_dest(s->o[i].path, msg, sizeof(msg)) != PF_OK) {
            tool_outputs_discard(s);
            return tool_fail(s->cmd, "%s %s; nothing written", s->o[i].flag, msg);
        }
    }
    for (int i = 0; i < s->n; i++) {
        tool_output *o = &s->o[i];
        if (!o->tmp) continue;
        pf_io_temp_forget(o->tmp);
        if (rename(o->tmp, o->path) != 0) {
            int e = errno;
            tool_outputs_discard(s);
            return tool_fail(s->cmd, "%s: cannot write: %s%s", o->path, strerror(e),
                             i ? " (the outputs before it were written)" : "");
        }
        free(o->tmp);
        o->tmp = NULL;
    }
    return 0;
}

void tool_outputs_discard(tool_outputs *s) {
    for (int i = 0; i < s->n; i++) {
        if (!s->o[i].tmp) continue;
        pf_io_temp_forget(s->o[i].tmp);
        unlink(s->o[i].tmp);
        free(s->o[i].tmp);
        s->o[i].tmp = NULL;
    }
}

int tool_text_begin(tool_text *t, const char *cmd, const char *path) {
    char msg[1024];
    t->cmd = cmd;
    if (pf_io_atomic_begin(&t->w, path, msg, sizeof(msg)) != PF_OK) return tool_fail(cmd, "%s", msg);
    int fd = dup(t->w.fd);
    t->f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!t->f) {
        int e = errno ? errno : EIO;
        if (fd >= 0) close(fd);
        pf_io_atomic_finish(&t->w, path, e, NULL, 0);
        return tool_fail(cmd, "%s: cannot write: %s", path, strerror(e));
    }
    return 0;
}

int tool_text_end(tool_text *t, const char *path, int ok) {
    /* the error of the write that failed, as the system said it (ENOSPC on a full disk): the
     * buffered rest goes out in fflush, which sets errno; a write that failed earlier left it */
    int werr = 0;
    errno = 0;
    if (fflush(t->f) != 0 || ferror(t->f)) werr = errno ? errno : EIO;
    errno = 0;
    if (fclose(t->f) != 0 && !werr) werr = errno ? errno : EIO;
    char msg[1024];
    pf_status st = pf_io_atomic_finish(&t->w, path, ok && !werr ? 0 : werr ? werr : -1, msg,
                                       sizeof(msg));
    if (ok && st != PF_OK) return tool_fail(t->cmd, "%s", msg);
    return ok ? 0 : TOOL_EXIT_FAIL;
}

void tool_outputs_drop(tool_outputs *s, int i) {
    tool_output *o = &s->o[i];
    if (!o->tmp) return;
    pf_io_temp_forget(o->tmp);
    unlink(o->tmp);
    free(o->tmp);
    o->tmp = NULL;
}
