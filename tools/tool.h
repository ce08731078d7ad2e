/* tool.h: what the `performer` command's files share: the subcommands and the argument
 * helpers (tools/performer.c).
 *
 * Exit codes: 0 success, 1 the work failed (a file is missing or malformed, inputs disagree,
 * the library returned an error), 2 the command line is wrong (unknown command or flag,
 * missing or malformed value). Every message goes to stderr as "performer <cmd>: ...". */
#ifndef PF_TOOL_H
#define PF_TOOL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "performer.h"

#define TOOL_EXIT_OK 0
#define TOOL_EXIT_FAIL 1
#define TOOL_EXIT_USAGE 2

/* ---- subcommands: argv[0] is the command's name, argv[1..] its arguments --------------- */

int cmd_attn(int argc, char **argv);
void cmd_attn_help(void);
extern const char cmd_attn_synopsis[];

int cmd_demo(int argc, char **argv);
void cmd_demo_help(void);
extern const char cmd_demo_synopsis[];

int cmd_train(int argc, char **argv);
void cmd_train_help(void);
extern const char cmd_train_synopsis[];

int cmd_sample(int argc, char **argv);
void cmd_sample_help(void);
extern const char cmd_sample_synopsis[];

int cmd_approx(int argc, char **argv);
void cmd_approx_help(void);
extern const char cmd_approx_synopsis[];

/* ---- messages ----------------------------------------------------------------------------- */

/* Prints "performer <cmd>: <message>\n" to stderr. Returns TOOL_EXIT_FAIL. */
int tool_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The same, adding "(see 'performer <cmd> --help')". Returns TOOL_EXIT_USAGE. */
int tool_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- the argument cursor ------------------------------------------------------------------ */

/* Walks argv[1..argc). A command loops `while (tool_next(&a))` and tests the current
 * argument with tool_opt / tool_flag; anything unmatched goes to tool_unknown. A value can be
 * given as "--name value" or "--name=value". */
#define TOOL_MAX_FLAGS 64

typedef struct tool_args {
    const char *cmd;
    int argc;
    char **argv;
    int i;      /* the argument being looked at */
    int failed; /* a usage error was reported */
    const char *seen[TOOL_MAX_FLAGS]; /* the flags matched so far: each may be given once */
    int nseen;
} tool_args;

void tool_args_init(tool_args *a, const char *cmd, int argc, char **argv);

/* Advances to the next argument; 0 when there is none or a usage error happened. An argument
 * --help or -h in a flag's place (not a flag's value) prints the command's help and exits 0. */
int tool_next(tool_args *a);

/* 1 if the current argument is the valued flag `name` ("--q"); *value is then its value. A
 * missing value, or a flag given twice, is reported (usage error, a->failed set) and still
 * returns 1 with *value NULL. */
int tool_opt(tool_args *a, const char *name, const char **value);

/* 1 if the current argument is the boolean flag `name`. "--name=..." is a usage error. */
int tool_flag(tool_args *a, const char *name);

/* 1 if flag `name` was matched by tool_opt or tool_flag (given on the command line). */
int tool_given(const tool_args *a, const char *name);

/* Reports the current argument as unknown. Returns TOOL_EXIT_USAGE. */
int tool_unknown(tool_args *a);

/* ---- strict number parsing: all of s must be the number, in [lo, hi]; else a usage error
 * naming the flag ("performer attn: --features: expected a positive integer, got 'abc'") and
 * a->failed is set. Each returns 1 on success. -------------------------------------------- */

int tool_parse_int(tool_args *a, const char *flag, const char *s, long lo, long hi, int *out);
int tool_parse_u64(tool_args *a, const char *flag, const char *s, uint64_t *out);
/* A finite double in [lo, hi]; lo_open makes the range (lo, hi]. */
int tool_parse_double(tool_args *a, const char *flag, const char *s, double lo, double hi,
                      int lo_open, double *out);

/* One of `names` (a NULL-terminated list): its index, or -1 with a usage error listing them. */
int tool_parse_choice(tool_args *a, const char *flag, const char *s, const char *const *names);

/* ---- files ------------------------------------------------------------------------------- */

/* Like tool_opt for a flag that names a file: an empty value is a usage error ("--out: empty
 * file name") instead of a path the system cannot open. */
int tool_path_opt(tool_args *a, const char *name, const char **value);

/* The files one run writes (tools/outputs.c). Each is checked before the work starts: its
 * folder exists and is writable, it is absent or a regular file (a symbolic link, device,
 * FIFO or folder is refused, never replaced), and no two outputs, nor an output and an input,
 * are the same file. The results are written to temporary names beside them and renamed into
 * place together at the end, so a run that fails leaves every file that was there before as
 * it was. */
#define TOOL_MAX_OUTPUTS 8

typedef struct tool_output {
    const char *flag; /* the flag that named it, for messages */
    char path[4096];
    char canon[4352]; /* its folder's real path and its name: equal files compare equal */
    int exists;       /* a file was there when it was added: its device and inode */
    unsigned long long dev, ino;
    char *tmp; /* the staged file beside path, or NULL */
} tool_output;

typedef struct tool_outputs {
    const char *cmd;
    tool_output o[TOOL_MAX_OUTPUTS];
    int n;
} tool_outputs;

void tool_outputs_init(tool_outputs *s, const char *cmd);

/* Adds the output `path` named by `flag` after the checks above. 0, or an exit code after the
 * message (TOOL_EXIT_USAGE when two outputs name one file). */
int tool_outputs_add(tool_outputs *s, const char *flag, const char *path);

/* 0 if the input `path` (named by `flag`) is none of the outputs, else TOOL_EXIT_USAGE after
 * a message. */
int tool_outputs_check_input(const tool_outputs *s, const char *flag, const char *path);

/* Output i's temporary file (created empty, exclusively, beside it) for a writer that
 * replaces it whole (pf_npy_write); NULL after a message. */
const char *tool_outputs_stage(tool_outputs *s, int i);

/* The same, opened for writing text; NULL after a message. */
FILE *tool_outputs_open(tool_outputs *s, int i);

/* Renames every staged file into place, after checking every destination again. 0, or an
 * exit code after a message, with the staged files removed. */
int tool_outputs_commit(tool_outputs *s);

/* Removes the staged files (a failed run); the destinations are untouched. */
void tool_outputs_discard(tool_outputs *s);

/* Removes output i's staged file only: tool_outputs_commit then leaves its destination alone. */
void tool_outputs_drop(tool_outputs *s, int i);

/* One text file written atomically through stdio: to a temporary file beside path, renamed
 * over it at the end (path must be a regular file or new). */
typedef struct tool_text {
    const char *cmd;
    pf_io_atomic w;
    FILE *f; /* write here */
} tool_text;

/* Starts writing path. 0, or an exit code after a message. */
int tool_text_begin(tool_text *t, const char *cmd, const char *path);

/* Ends it: with ok and every write done, renamed over path; otherwise removed (no message:
 * the caller says why). 0, or an exit code. */
int tool_text_end(tool_text *t, const char *path, int ok);

/* Checks before any work that `path` can be created: its folder exists and is writable and
 * path is not a folder. 0 if fine, else writes why to msg (naming path) and returns -1. A
 * final write can still fail; this only catches the common mistakes early. */
int tool_check_writable(const char *path, char *msg, size_t cap);

/* Finds the plotting script `name` (readable) into path: in $PERFORMER_SCRIPTS, then the
 * executable's ../scripts or ../../scripts (build/ or build/tools/ of a checkout), then ./scripts.
 * 1 if found, else 0. */
int tool_find_script(char *path, size_t cap, const char *name);

/* The same for a file shipped in the source tree's data/ (the demo's trained model): in
 * $PERFORMER_DATA, then the executable's ../data or ../../data, then ./data. */
int tool_find_data(char *path, size_t cap, const char *name);

/* What tool_plot did. */
typedef enum {
    TOOL_PLOT_OK,
    TOOL_PLOT_NO_PYTHON,     /* no /usr/bin/python3 */
    TOOL_PLOT_NO_SCRIPT,     /* tool_find_script found nothing */
    TOOL_PLOT_NO_MATPLOTLIB, /* the script's exit status 3 */
    TOOL_PLOT_FAILED         /* it could not be run, or failed */
} tool_plot_status;

/* Draws png with /usr/bin/python3 SCRIPT IN TMP [ARG1 [ARG2]], SCRIPT the plotting script
 * `name` (tool_find_script, its path left in script), TMP a temporary name beside png that is
 * renamed to png on success and removed otherwise. */
tool_plot_status tool_plot(const char *name, const char *in, const char *png, const char *arg1,
                           const char *arg2, char *script, size_t cap);

/* Formats a shape as "(2, 3, 4)" (or "()") into buf. */
const char *tool_shape_str(char *buf, size_t cap, const int64_t *shape, int ndim);

/* The CRC-32 of the regular file at path (tools/crc32.c, zlib's) as 8 lowercase hex digits and
 * a NUL: Python's zlib.crc32 of its bytes. 0, or -1 with msg (cap bytes) naming the file and why. */
int tool_crc32_file(const char *path, char hex[9], char *msg, size_t cap);

/* Milliseconds since an arbitrary start (CLOCK_MONOTONIC). */
double tool_now_ms(void);

/* --threads N: the OpenMP team size of what the command runs next (n > 0; 0 leaves OpenMP's
 * default); nothing in a build without OpenMP. */
void tool_set_threads(int n);

#endif
