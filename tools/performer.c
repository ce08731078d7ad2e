/* performer.c: the `performer` command: dispatch to a subcommand, --help, --version, and the
 * argument helpers every subcommand uses (tool.h). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "mpi/tool_mpi.h"
#include "tool.h"

/* ---- messages ----------------------------------------------------------------------------- */

/* "performer <cmd>: <message><suffix>" on stderr, or held until the ranks agree (tool_mpi.h). */
static void vreport(const char *cmd, const char *suffix, const char *fmt, va_list ap) {
    char line[16384]; /* a message names at most a few paths of at most 4096 bytes */
    size_t n = (size_t)snprintf(line, sizeof(line), "performer%s%s: ", cmd ? " " : "",
                                cmd ? cmd : "");
    if (n < sizeof(line)) vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    n = strlen(line);
    if (n < sizeof(line)) snprintf(line + n, sizeof(line) - n, "%s", suffix);
    if (!tool_mpi_hold(line)) fprintf(stderr, "%s\n", line);
}

int tool_fail(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(cmd, "", fmt, ap);
    va_end(ap);
    return TOOL_EXIT_FAIL;
}

int tool_usage(const char *cmd, const char *fmt, ...) {
    char see[128];
    snprintf(see, sizeof(see), " (see 'performer %s%s--help')", cmd ? cmd : "", cmd ? " " : "");
    va_list ap;
    va_start(ap, fmt);
    vreport(cmd, see, fmt, ap);
    va_end(ap);
    return TOOL_EXIT_USAGE;
}

/* ---- the argument cursor ------------------------------------------------------------------ */

void tool_args_init(tool_args *a, const char *cmd, int argc, char **argv) {
    memset(a, 0, sizeof(*a));
    a->cmd = cmd;
    a->argc = argc;
    a->argv = argv;
}

static void command_help(const char *cmd);

int tool_next(tool_args *a) {
    if (a->failed) return 0;
    a->i++;
    if (a->i < a->argc && (strcmp(a->argv[a->i], "--help") == 0 || strcmp(a->argv[a->i], "-h") == 0)) {
        command_help(a->cmd);
        exit(fflush(stdout) == 0 && !ferror(stdout) ? TOOL_EXIT_OK : TOOL_EXIT_FAIL);
    }
    return a->i < a->argc;
}

/* Records that flag `name` matched; a usage error if it already had. 1 if it is new. */
static int first_time(tool_args *a, const char *name) {
    for (int k = 0; k < a->nseen; k++) {
        if (strcmp(a->seen[k], name) == 0) {
            tool_usage(a->cmd, "%s is given twice", name);
            a->failed = 1;
            return 0;
        }
    }
    if (a->nseen < TOOL_MAX_FLAGS) a->seen[a->nseen++] = name;
    return 1;
}

int tool_opt(tool_args *a, const char *name, const char **value) {
    const char *arg = a->argv[a->i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0 || (arg[n] != '=' && arg[n] != '\0')) return 0;
    if (!first_time(a, name)) {
        *value = NULL;
        return 1;
    }
    if (arg[n] == '=') {
        *value = arg + n + 1;
        return 1;
    }
    if (a->i + 1 >= a->argc) {
        tool_usage(a->cmd, "%s: missing value", name);
        a->failed = 1;
        *value = NULL;
        return 1;
    }
    *value = a->argv[++a->i];
    return 1;
}

int tool_path_opt(tool_args *a, const char *name, const char **value) {
    if (!tool_opt(a, name, value)) return 0;
    if (*value && !**value) {
        tool_usage(a->cmd, "%s: empty file name", name);
        a->failed = 1;
        *value = NULL;
    }
    return 1;
}

int tool_flag(tool_args *a, const char *name) {
    const char *arg = a->argv[a->i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0 || (arg[n] != '=' && arg[n] != '\0')) return 0;
    if (!first_time(a, name)) return 1;
    if (arg[n] == '=') {
        tool_usage(a->cmd, "%s takes no value", name);
        a->failed = 1;
        return 1;
    }
    return arg[n] == '\0';
}

int tool_given(const tool_args *a, const char *name) {
    for (int k = 0; k < a->nseen; k++) {
        if (strcmp(a->seen[k], name) == 0) return 1;
    }
    return 0;
}

int tool_unknown(tool_args *a) {
    const char *arg = a->argv[a->i];
    if (arg[0] == '-')
        tool_usage(a->cmd, "unknown option '%s'", arg);
    else
        tool_usage(a->cmd, "unexpected argument '%s'", arg);
    a->failed = 1;
    return TOOL_EXIT_USAGE;
}

/* ---- numbers ------------------------------------------------------------------------------ */

static void describe_int_range(char *buf, size_t cap, long lo, long hi) {
    if (lo == 1 && hi == INT_MAX)
        snprintf(buf, cap, "a positive integer");
    else if (lo == 0 && hi == INT_MAX)
        snprintf(buf, cap, "a non-negative integer");
    else
        snprintf(buf, cap, "an integer from %ld to %ld", lo, hi);
}

int tool_parse_int(tool_args *a, const char *flag, const char *s, long lo, long hi, int *out) {
    char what[96];
    describe_int_range(what, sizeof(what), lo, hi);
    char *end = NULL;
    errno = 0;
    long v = s && *s ? strtol(s, &end, 10) : 0;
    /* strtol skips leading spaces; a number is digits only, so refuse those too. */
    if (!s || !*s || *end != '\0' || errno == ERANGE || s[0] == ' ' || s[0] == '\t' || v < lo ||
        v > hi || v < INT_MIN || v > INT_MAX) {
        tool_usage(a->cmd, "%s: expected %s, got '%s'", flag, what, s ? s : "");
        a->failed = 1;
        return 0;
    }
    *out = (int)v;
    return 1;
}

int tool_parse_u64(tool_args *a, const char *flag, const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    int ok = s && s[0] >= '0' && s[0] <= '9'; /* strtoull would accept "-1" and " 1" */
    unsigned long long v = ok ? strtoull(s, &end, 10) : 0;
    if (!ok || *end != '\0' || errno == ERANGE || v > UINT64_MAX) {
        tool_usage(a->cmd, "%s: expected a non-negative integer below 2^64, got '%s'", flag,
                   s ? s : "");
        a->failed = 1;
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

int tool_parse_double(tool_args *a, const char *flag, const char *s, double lo, double hi,
                      int lo_open, double *out) {
    char *end = NULL;
    errno = 0;
    /* a number as written: no leading white space (strtod skips it) and no hexadecimal */
    int ok = s && (isdigit((unsigned char)s[0]) || s[0] == '-' || s[0] == '+' || s[0] == '.') &&
             !strpbrk(s, "xXpP");
    double v = ok ? strtod(s, &end) : 0;
    ok = ok && *end == '\0' && errno != ERANGE && isfinite(v) && v <= hi &&
         (lo_open ? v > lo : v >= lo);
    if (!ok) {
        if (lo == 0 && lo_open && hi == HUGE_VAL)
            tool_usage(a->cmd, "%s: expected a positive number, got '%s'", flag, s ? s : "");
        else if (lo == 0 && hi == HUGE_VAL)
            tool_usage(a->cmd, "%s: expected a non-negative number, got '%s'", flag, s ? s : "");
        else
            tool_usage(a->cmd, "%s: expected a number in %s%g, %g], got '%s'", flag,
                       lo_open ? "(" : "[", lo, hi, s ? s : "");
        a->failed = 1;
        return 0;
    }
    *out = v;
    return 1;
}

int tool_parse_choice(tool_args *a, const char *flag, const char *s, const char *const *names) {
    for (int i = 0; names[i]; i++) {
        if (strcmp(s, names[i]) == 0) return i;
    }
    char list[256];
    size_t n = 0;
    list[0] = '\0';
    for (int i = 0; names[i] && n < sizeof(list); i++) {
        const char *sep = !names[i + 1] && i > 0 ? " or " : i > 0 ? ", " : "";
        n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", sep, names[i]);
    }
    tool_usage(a->cmd, "%s: unknown value '%s'; expected %s", flag, s, list);
    a->failed = 1;
    return -1;
}

/* ---- files and small things --------------------------------------------------------------- */

int tool_check_writable(const char *path, char *msg, size_t cap) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(msg, cap, "%s: cannot write: it is a folder", path);
        return -1;
    }
    char folder[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(folder, sizeof(folder), ".");
    } else if (slash == path) {
        snprintf(folder, sizeof(folder), "/");
    } else {
        size_t n = (size_t)(slash - path);
        if (n >= sizeof(folder)) n = sizeof(folder) - 1;
        memcpy(folder, path, n);
        folder[n] = '\0';
    }
    if (stat(folder, &st) != 0) {
        snprintf(msg, cap, "%s: cannot write: folder '%s': %s", path, folder, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(msg, cap, "%s: cannot write: '%s' is not a folder", path, folder);
        return -1;
    }
    if (access(folder, W_OK | X_OK) != 0) {
        snprintf(msg, cap, "%s: cannot write: folder '%s': %s", path, folder, strerror(errno));
        return -1;
    }
    return 0;
}

/* name in the folder `dir` of the source tree: $env/name, then the executable's ../dir/name or
 * ../../dir/name (build/ or build/tools/ of a checkout), then ./dir/name. 1 if readable. */
static int find_in_tree(char *path, size_t cap, const char *env_name, const char *dir,
                        const char *name) {
    const char *env = getenv(env_name);
    if (env && *env) {
        snprintf(path, cap, "%s/%s", env, name);
        if (access(path, R_OK) == 0) return 1;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(path, cap, "%s/../%s/%s", exe, dir, name);
            if (access(path, R_OK) == 0) return 1;
            snprintf(path, cap, "%s/../../%s/%s", exe, dir, name);
            if (access(path, R_OK) == 0) return 1;
        }
    }
    snprintf(path, cap, "%s/%s", dir, name);
    return access(path, R_OK) == 0;
}

int tool_find_script(char *path, size_t cap, const char *name) {
    return find_in_tree(path, cap, "PERFORMER_SCRIPTS", "scripts", name);
}

int tool_find_data(char *path, size_t cap, const char *name) {
    return find_in_tree(path, cap, "PERFORMER_DATA", "data", name);
}

tool_plot_status tool_plot(const char *name, const char *in, const char *png, const char *arg1,
                           const char *arg2, char *script, size_t cap) {
    const char *py = "/usr/bin/python3";
    if (access(py, X_OK) != 0) return TOOL_PLOT_NO_PYTHON;
    if (!tool_find_script(script, cap, name)) return TOOL_PLOT_NO_SCRIPT;
    pf_io_atomic w; /* a fresh file beside png (png itself must be a regular file or new) */
    if (pf_io_atomic_begin(&w, png, NULL, 0) != PF_OK) return TOOL_PLOT_FAILED;
    close(w.fd);
    const char *tmp = w.tmp;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        execl(py, "python3", script, in, tmp, arg1, arg2, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    tool_plot_status st = TOOL_PLOT_OK;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status))
        st = TOOL_PLOT_FAILED;
    else if (WEXITSTATUS(status) == 3) /* the scripts' code for "no matplotlib / numpy" */
        st = TOOL_PLOT_NO_MATPLOTLIB;
    else if (WEXITSTATUS(status) != 0 || pf_io_check_dest(png, NULL, 0) != PF_OK)
        st = TOOL_PLOT_FAILED;
    pf_io_temp_forget(tmp);
    if (st == TOOL_PLOT_OK && rename(tmp, png) != 0) st = TOOL_PLOT_FAILED;
    if (st != TOOL_PLOT_OK) unlink(tmp);
    free(w.tmp);
    return st;
}

const char *tool_shape_str(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t n = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "%s)", ndim == 1 ? "," : "");
    return buf;
}

double tool_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void tool_set_threads(int n) {
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
#else
    (void)n;
#endif
}

/* ---- dispatch ----------------------------------------------------------------------------- */

typedef struct command {
    const char *name;
    const char *summary;
    const char *synopsis;
    int (*run)(int argc, char **argv);
    void (*help)(void);
    /* Under mpirun with more than one rank (the MPI build, performer-mpi): NULL if the command
     * runs there, else why it does not (it is then refused on every rank, before it starts). */
    const char *one_process;
} command;

static const command commands[] = {
    /* attn splits the sequence across the ranks with --method favor (cmd_attn.c) */
    {"attn", "attention (exact or FAVOR+) on .npy inputs", cmd_attn_synopsis, cmd_attn,
     cmd_attn_help, NULL},
    {"demo", "exact vs FAVOR+ time, memory and error as L grows", cmd_demo_synopsis, cmd_demo,
     cmd_demo_help, "it times exact attention, which needs every key in one process"},
    {"train", "train the byte-level language model (proteins, Bible, any text)",
     cmd_train_synopsis, cmd_train, cmd_train_help, NULL},
    {"sample", "continue a prompt with a trained language model", cmd_sample_synopsis,
     cmd_sample, cmd_sample_help, "sampling runs in one process"},
    {"approx", "estimator error against exact attention: experiments, CSV and plots",
     cmd_approx_synopsis, cmd_approx, cmd_approx_help,
     "it compares with exact attention, which needs every key in one process"},
};
static const int n_commands = (int)(sizeof(commands) / sizeof(commands[0]));

static void print_help(void) {
    printf("performer %s: fast attention over long sequences with random features\n"
           "(FAVOR+, Choromanski et al. 2020) and exact softmax attention.\n\n"
           "usage: performer <command> [options]\n"
           "       performer <command> --help    every option of a command, with defaults\n"
           "       performer --help | --version\n\n"
           "commands:\n",
           pf_version());
    for (int c = 0; c < n_commands; c++)
        printf("  %-6s %s\n", commands[c].name, commands[c].summary);
    printf("\n");
    for (int c = 0; c < n_commands; c++) printf("%s\n", commands[c].synopsis);
    printf("Arrays are NumPy .npy files: float32 ('<f4'), C order; lengths are int32 or int64.\n"
           "Exit status: 0 success, 1 the work failed (bad file, inputs disagree, library\n"
           "error), 2 bad command line.\n");
}

/* The rank mpirun (Open MPI, or a PMI launcher: MPICH, Intel MPI, Slurm) gave this process,
 * and the number of ranks, read from its environment before MPI starts; 0 and 1 without one. */
static int launcher_value(const char *const *vars) {
    for (int i = 0; vars[i]; i++) {
        const char *v = getenv(vars[i]);
        char *end = NULL;
        long x = v && *v ? strtol(v, &end, 10) : -1;
        if (end && *end == '\0' && x >= 0 && x <= INT_MAX) return (int)x;
    }
    return -1;
}
static int launcher_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", NULL};
    int r = launcher_value(vars);
    return r < 0 ? 0 : r;
}

/* OpenBLAS picks its kernel set when it loads, from a table of CPU models, and falls back to a
 * generic set on a model it does not know, or on AMD's AVX2 cores runs its slower "Zen" set
 * (pf_blas_core_advised). It reads OPENBLAS_CORETYPE only then, so the cure is to start again
 * with it set: done once (PF_BLAS_FALLBACK, holding the set OpenBLAS chose, marks the second
 * start), and never over a set the user chose. 1 if the process is to start again (both
 * variables are then set); when it cannot be done, one line on stderr (blas_core_warn) names
 * the remedy. */
static void blas_core_warn(const char *want) {
    if (launcher_rank() == 0) /* under mpirun, once */
        fprintf(stderr,
                "performer: warning: OpenBLAS runs its %s kernels, slower than its %s ones this "
                "CPU runs: start with OPENBLAS_CORETYPE=%s set\n",
                pf_blas_core(), want, want);
}

static int blas_core_restart(void) {
    const char *want = pf_blas_core_advised();
    if (!want) return 0;
    const char *fallback = getenv("PF_BLAS_FALLBACK");
    if (!getenv("OPENBLAS_CORETYPE") && !fallback) {
        if (setenv("PF_BLAS_FALLBACK", pf_blas_core(), 1) == 0 &&
            setenv("OPENBLAS_CORETYPE", want, 1) == 0)
            return 1;
        unsetenv("OPENBLAS_CORETYPE"); /* not restarted: as it was */
        unsetenv("PF_BLAS_FALLBACK");
    } else if (!fallback) {
        return 0; /* OPENBLAS_CORETYPE is the user's choice */
    }
    blas_core_warn(want);
    return 0;
}

static int launcher_size(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", NULL};
    int n = launcher_value(vars);
    return n < 1 ? 1 : n;
}

/* Started by mpirun with more than one rank: this performer has no MPI, so the MPI build of the
 * tool, performer-mpi beside this executable (where make and make install put it), runs instead
 * with the same arguments and environment (the OpenBLAS restart's variables included: one start
 * does for both). Returns only with one rank; exits 2 when there is no performer-mpi to run
 * (then rank 0 says so). PF_MPI_RELAUNCH marks the second start: never a loop. */
static void mpi_relaunch(char **argv) {
    int n = launcher_size();
    if (n < 2) return;
    char exe[4096 + 16], why[4096 + 64] = "";
    ssize_t len = readlink("/proc/self/exe", exe, 4096);
    char *slash = NULL;
    if (len > 0 && len < 4096) {
        exe[len] = '\0';
        if ((slash = strrchr(exe, '/'))) strcpy(slash + 1, "performer-mpi");
    }
    if (!slash) {
        snprintf(why, sizeof(why), "this executable's folder is unknown (/proc/self/exe)");
    } else if (getenv("PF_MPI_RELAUNCH")) {
        snprintf(why, sizeof(why), "%s is not the MPI build", exe);
    } else if (access(exe, X_OK) != 0) {
        snprintf(why, sizeof(why), "no performer-mpi beside it");
    } else if (setenv("PF_MPI_RELAUNCH", "1", 1) == 0) {
        fflush(NULL);
        execv(exe, argv);
        snprintf(why, sizeof(why), "%s: %s", exe, strerror(errno));
    }
    if (launcher_rank() == 0)
        fprintf(stderr,
                "performer: started by mpirun with %d ranks, but this performer was built "
                "without MPI (%s): install libopenmpi-dev/openmpi-bin (make setup) and "
                "rebuild\n",
                n, why);
    else
        sleep(1); /* mpirun ends the job at the first failed rank: let rank 0 say why first */
    exit(TOOL_EXIT_USAGE);
}

/* The help of command `cmd` (tool_next's --help). */
static void command_help(const char *cmd) {
    for (int c = 0; c < n_commands; c++) {
        if (strcmp(cmd, commands[c].name) == 0) commands[c].help();
    }
}

/* A command's exit status, made a failure if what it wrote to stdout was lost (a full disk,
 * a closed or broken pipe): a run whose results did not arrive did not succeed. */
static int finish(int rc) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "performer: cannot write to standard output: %s\n", strerror(errno));
        return rc ? rc : TOOL_EXIT_FAIL;
    }
    return rc;
}

/* Removes the temporary files of outputs still being written, then dies of the signal as it
 * would have: an interrupted run leaves what was there before and nothing else. */
static void on_signal(int sig) {
    pf_io_temp_remove_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

static int dispatch(int argc, char **argv);

int main(int argc, char **argv) {
    /* 0, 1 and 2 open (on /dev/null if closed): else the first file opened would become the
     * standard output, and messages would land in it */
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", fd ? O_WRONLY : O_RDONLY) != fd) return 127;
    }
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
    for (int k = 0; k < 4; k++) {
        if (signal(sigs[k], on_signal) == SIG_IGN) signal(sigs[k], SIG_IGN); /* kept ignored */
    }
    int restart = blas_core_restart();
    /* first: under mpirun, performer-mpi restarts in the plain performer's place */
    if (!tool_mpi_build) mpi_relaunch(argv);
    if (restart) {
        fflush(NULL);
        execv("/proc/self/exe", argv);
        unsetenv("OPENBLAS_CORETYPE"); /* not restarted: as it was, and say so */
        unsetenv("PF_BLAS_FALLBACK");
        blas_core_warn(pf_blas_core_advised());
    }
    tool_mpi_init(&argc, &argv); /* (performer-mpi: MPI starts) */
    /* every rank's verdict agreed on: one message, the same exit status on all */
    return tool_mpi_agree(dispatch(argc, argv));
}

/* The command line: a command, --help, --version. */
static int dispatch(int argc, char **argv) {
    if (argc < 2) {
        print_help();
        return TOOL_EXIT_USAGE;
    }
    const char *name = argv[1];
    if ((strcmp(name, "--version") == 0 || strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) &&
        argc > 2)
        return tool_usage(NULL, "%s takes no arguments, got '%s'", name, argv[2]);
    if (strcmp(name, "help") == 0 && argc > 3)
        return tool_usage(NULL, "help takes one command name, got '%s' too", argv[3]);
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        print_help();
        return finish(TOOL_EXIT_OK);
    }
    if (strcmp(name, "--version") == 0) {
        /* (tests/run.sh reads the kernel set performer set from the second form) */
        const char *fallback = getenv("PF_BLAS_FALLBACK");
        char mpi[256] = "";
        if (tool_mpi_build)
            snprintf(mpi, sizeof(mpi), "MPI build (%s), %d rank%s; ", tool_mpi_library(),
                     tool_mpi_size(), tool_mpi_size() == 1 ? "" : "s");
        if (fallback && !pf_blas_core_advised())
            printf("performer %s (%svector kernels: %s; OpenBLAS kernels: %s, set by performer "
                   "over OpenBLAS's choice of %s)\n",
                   pf_version(), mpi, pf_simd_path(), pf_blas_core(), fallback);
        else
            printf("performer %s (%svector kernels: %s; OpenBLAS kernels: %s)\n", pf_version(),
                   mpi, pf_simd_path(), pf_blas_core());
        return finish(TOOL_EXIT_OK);
    }
    if (strcmp(name, "help") == 0) {
        if (argc < 3) {
            print_help();
            return finish(TOOL_EXIT_OK);
        }
        name = argv[2];
        for (int c = 0; c < n_commands; c++) {
            if (strcmp(name, commands[c].name) == 0) {
                commands[c].help();
                return finish(TOOL_EXIT_OK);
            }
        }
        return tool_usage(NULL, "unknown command '%s'", name);
    }
    for (int c = 0; c < n_commands; c++) {
        if (strcmp(name, commands[c].name) != 0) continue;
        if (tool_mpi_size() > 1 && commands[c].one_process) {
            tool_fail(name, "does not run under mpirun with more than one rank (%d here): %s; "
                            "start it without mpirun (only attn --method favor cuts the "
                            "sequence across ranks)",
                      tool_mpi_size(), commands[c].one_process);
            return TOOL_EXIT_USAGE;
        }
        return finish(commands[c].run(argc - 1, argv + 1));
    }
    if (name[0] == '-') return tool_usage(NULL, "unknown option '%s'", name);
    return tool_usage(NULL, "unknown command '%s'", name);
}
