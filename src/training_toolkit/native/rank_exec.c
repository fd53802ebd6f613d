/*
 * training-toolkit-rank [--attempt N] [FILE]: what every MPI rank runs, instead of the user's command.
 *
 * Without FILE, the file is the one TRAINING_TOOLKIT_RANK_FILE names: that variable is set on each
 * host by its own train, for the process that starts its ranks there (mpirun's environment on the
 * first host, the worker's own sshd's SetEnv for orted/prted), so every host's ranks read their own
 * host's file, at a path only that host chose (unique even where hosts share /tmp).
 *
 * mpirun carries nothing of the job to a rank (Open MPI's launch messages travel in
 * clear): each host's train writes FILE once, on its own host, with the rank's working
 * directory, command and environment (runners/rank_env.py writes it, NUL-separated):
 *
 *     training-toolkit-rank-1 \0 CWD \0 ARGC \0 ARGV[0] \0 ... \0 NAME=VALUE \0 ...
 *
 * The rank's environment is FILE's, plus what Open MPI's runtime gave this process to
 * find its peers (OMPI_*, PMIX_*, PRTE_*, OPAL_*, ORTE_*, its *_NO_BACKTRACE flags); the
 * runtime's LD_LIBRARY_PATH entries (Open MPI 5 puts its own lib dir there) come before
 * FILE's; PWD is the rank's directory, TRAINING_TOOLKIT_RANK_PID its process and TRAINING_TOOLKIT_RANK_PARENT
 * this one's (native/rank_stop.c).  Nothing else of the inherited environment (sshd's session) survives, so a
 * rank sees the same on every host.  Then it enters CWD and starts the command as its child, and stays its
 * parent (run_rank, below): it passes the rank the signals the runtime or the platform sends it, and passes the
 * rank's end on to the runtime as the rank's own (the same code, or a death by the same signal), except during a
 * stop of its host's: then the end is held, so that Open MPI's runtime, which ends the whole job when one rank
 * ends badly, never sees it (docs/resilience.md).  It is the rank's subreaper: what the rank leaves running is
 * ended as the rank ends (end_leftovers), since Open MPI waits for a rank's output to close as well as for its
 * end.  Nothing of ours runs inside the runtime, and no Python starts.
 *
 * --attempt N (mpirun's line: the attempt it launches): FILE must hold the entry
 * TRAINING_TOOLKIT_RANK_ATTEMPT=N, which its host's train writes once it knows the attempt's hosts
 * (after the barrier that chose them, while mpirun may already be starting daemons): until it does,
 * the file is read again every 20 ms, for at most ATTEMPT_WAIT_S seconds, then the rank fails naming
 * the file and both attempts.  So no rank of attempt N starts from an earlier attempt's file (other
 * hosts, another world size).  That entry is the file's own: the rank's environment leaves it out.
 *
 * FILE's TRAINING_TOOLKIT_RANKS_DIR=DIR (its host's train gives it in every job of more than one host, beside the
 * paths of its two flags, TRAINING_TOOLKIT_RANK_STOP_FLAG and _RESTART_FLAG; agent/parts.py): once the rank is started, this process reports it there, as the file DIR/PID (the rank's pid) holding "RANK START\n":
 * its job-wide rank (OMPI_COMM_WORLD_RANK, else PMIX_RANK; -1 if the runtime named none) and its start time
 * (field 22 of /proc/PID/stat, which with the pid names one process for good).  The report is written whole
 * (a rename) and removed once the rank has ended.  So train knows its host's ranks although they are not its
 * children (they run under mpirun, orted/prted or Slurm's step daemon): supervise/reported.py reads them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAGIC "training-toolkit-rank-1"
#define LIBPATH "LD_LIBRARY_PATH="
#define RANK_FILE_VAR "TRAINING_TOOLKIT_RANK_FILE"
#define RANK_PID_VAR "TRAINING_TOOLKIT_RANK_PID"       /* native/rank_stop.c: the rank's own process */
#define RANK_PARENT_VAR "TRAINING_TOOLKIT_RANK_PARENT" /* and this one, its parent, which it tells of a SIGTERM */
#define RANK_STOP_FLAG_VAR "TRAINING_TOOLKIT_RANK_STOP_FLAG"
#define RANK_RESTART_FLAG_VAR "TRAINING_TOOLKIT_RANK_RESTART_FLAG"
#define STOP_WAIT_VAR "TRAINING_TOOLKIT_RANK_STOP_WAIT_MS"
#define ATTEMPT_ENTRY "TRAINING_TOOLKIT_RANK_ATTEMPT="
#define RANKS_DIR_VAR "TRAINING_TOOLKIT_RANKS_DIR"
#define ATTEMPT_WAIT_S 60
#define LEFTOVER_LINGER_S 1.0 /* what the rank left running: its SIGTERM's time before SIGKILL */
#define LEFTOVER_KILL_ROUNDS 100

extern char **environ;

static const char *const RUNTIME_PREFIXES[] = {"OMPI_", "PMIX_", "PRTE_", "OPAL_", "ORTE_", NULL};
/* and the supervisor's token (supervise/process.py: TRAINING_TOOLKIT_SUPERVISOR), which the ranks on mpirun's own
   host inherit from it, so that whatever they leave behind is found and ended with the job */
static const char *const RUNTIME_NAMES[] = {"HFI_NO_BACKTRACE=", "IPATH_NO_BACKTRACE=", "TRAINING_TOOLKIT_SUPERVISOR=", NULL};

static int fail(const char *what, const char *path)
{
    fprintf(stderr, "training-toolkit-rank: %s %s: %s\n", what, path, strerror(errno));
    return 127;
}

/* Whether `text` starts with `prefix`. */
static int starts(const char *text, const char *prefix)
{
    return strncmp(text, prefix, strlen(prefix)) == 0;
}

static int is_runtime(const char *entry)
{
    for (int i = 0; RUNTIME_PREFIXES[i]; i++)
        if (starts(entry, RUNTIME_PREFIXES[i]))
            return 1;
    for (int i = 0; RUNTIME_NAMES[i]; i++)
        if (starts(entry, RUNTIME_NAMES[i]))
            return 1;
    return 0;
}

/* Whether `entry` (NAME=VALUE) names a variable already in env[0..count). */
static int present(char **env, size_t count, const char *entry)
{
    size_t n = strcspn(entry, "=") + 1;
    for (size_t i = 0; i < count; i++)
        if (strncmp(env[i], entry, n) == 0)
            return 1;
    return 0;
}

/* ':'-separated `first`, then the entries of `second` that `first` lacks, as LD_LIBRARY_PATH=... */
static char *merge_paths(const char *first, const char *second)
{
    size_t size = strlen(LIBPATH) + strlen(first) + strlen(second) + 2;
    char *out = malloc(size);
    if (!out)
        return NULL;
    snprintf(out, size, "%s%s", LIBPATH, first);
    const char *p = second;
    while (*p) {
        size_t n = strcspn(p, ":");
        int found = 0;
        for (const char *q = first; *q;) {
            size_t m = strcspn(q, ":");
            if (m == n && strncmp(p, q, n) == 0)
                found = 1;
            q += m + (q[m] == ':');
        }
        if (!found && n > 0) {
            if (out[strlen(LIBPATH)] != '\0')
                strcat(out, ":");
            strncat(out, p, n);
        }
        p += n + (p[n] == ':');
    }
    return out;
}

static char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (len < cap)
            break;
        cap *= 2;
        char *bigger = realloc(buf, cap + 1);
        if (!bigger)
            free(buf);
        buf = bigger;
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf || failed) {
        free(buf);
        errno = failed ? EIO : ENOMEM;
        return NULL;
    }
    buf[len] = '\0';
    *size = len;
    return buf;
}

#include "nodepath.h"
#include "procread.h"

/* Whether the NUL-separated records of data[0..size) hold exactly `entry`. */
static int holds(const char *data, size_t size, const char *entry)
{
    for (size_t i = 0; i < size; i += strlen(data + i) + 1)
        if (strcmp(data + i, entry) == 0)
            return 1;
    return 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* FILE once it holds the attempt's entry (read again until then, bounded); NULL with a message otherwise. */
static char *read_attempt(const char *path, const char *attempt, size_t *size)
{
    size_t entry_size = strlen(ATTEMPT_ENTRY) + strlen(attempt) + 1;
    char *entry = malloc(entry_size);
    if (!entry) {
        fail("out of memory for", path);
        return NULL;
    }
    snprintf(entry, entry_size, "%s%s", ATTEMPT_ENTRY, attempt);
    double deadline = now_s() + ATTEMPT_WAIT_S;
    for (;;) {
        char *data = read_file(path, size);
        if (data && holds(data, *size, entry)) {
            free(entry);
            return data;
        }
        if (!data) { /* rewritten by rename: never missing while its train holds it */
            fail("cannot read", path);
            free(entry);
            return NULL;
        }
        free(data);
        if (now_s() > deadline) {
            fprintf(stderr, "training-toolkit-rank: %s holds no ranks of attempt %s after %d s: its host's train "
                            "did not write this attempt's file (a host that is not the attempt's?)\n",
                    path, attempt, ATTEMPT_WAIT_S);
            free(entry);
            return NULL;
        }
        struct timespec pause = {0, 20 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

/* The value of the first of entries[0..count) that starts with `prefix` (NAME=), else NULL. */
static const char *entry_value(char **entries, size_t count, const char *prefix)
{
    for (size_t i = 0; i < count; i++)
        if (starts(entries[i], prefix))
            return entries[i][strlen(prefix)] ? entries[i] + strlen(prefix) : NULL;
    return NULL;
}

static int exists(const char *path)
{
    return path != NULL && access(path, F_OK) == 0;
}

/* The start time of process `pid` (field 22 of its stat, clock ticks after boot), or -1. */
static long long start_time(pid_t pid)
{
    char state;
    pid_t ppid;
    unsigned long long start;
    return proc_stat(pid, &state, &ppid, &start) ? (long long)start : -1;
}

/* Report the rank `child` in `dir` (above, and supervise/reported.py), into `path` (the report's name, kept for its
   removal); a report that cannot be written is said once, and the rank runs all the same. */
static void report_rank(const char *dir, pid_t child, char *path, size_t size)
{
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!rank || !*rank)
        rank = getenv("PMIX_RANK");
    char tmp[4200];
    snprintf(path, size, "%s/%ld", dir, (long)child);
    snprintf(tmp, sizeof tmp, "%s/.%ld.tmp", dir, (long)child);
    FILE *f = fopen(tmp, "w");
    int ok = f != NULL && fprintf(f, "%s %lld\n", rank && *rank ? rank : "-1", start_time(child)) > 0;
    ok = (f != NULL && fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "training-toolkit-rank: cannot report rank %ld in %s: %s\n", (long)child, dir, strerror(errno));
        unlink(tmp);
        path[0] = '\0';
    }
}

/* The signals this process passes to its rank (Open MPI's runtime signals its own child: mpirun passes SIGUSR1,
   SIGUSR2, SIGTSTP/SIGCONT on; a platform's SIGTERM, SIGINT, SIGHUP), and SIGCHLD, its rank's end: all
   waited for with sigwaitinfo, blocked from before the fork, so none is lost and no handler runs. */
static const int PASSED[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT, SIGTSTP, SIGALRM, 0};

/* The rank's end, as its parent (this process) passes it on: its exit code, or its death by the same signal, with
   no core of this process.  So Open MPI's runtime sees exactly what it would have seen of the rank itself. */
static int mirror(int status)
{
    if (WIFEXITED(status))
        _exit(WEXITSTATUS(status));
    int sig = WTERMSIG(status);
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    signal(sig, SIG_DFL);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, sig);
    sigprocmask(SIG_UNBLOCK, &only, NULL);
    raise(sig);
    _exit(128 + sig);
}

/* Wait `ms` for the next signal of `set` (discarded: the rank is gone, nothing is passed on). */
static void pause_ms(const sigset_t *set, long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000 * 1000};
    sigtimedwait(set, NULL, &t);
}

/* Signal `sig` to every child of this process (0: count them), as the kernel lists them; the number found.  Each is
   this process's child, unreaped (only this thread reaps, between calls): its pid cannot name another process. */
static int signal_children(int sig)
{
    char name[48], buf[8192]; /* over a thousand children; more are found in the next round, as these end */
    snprintf(name, sizeof name, "task/%ld/children", (long)getpid());
    if (!proc_read(getpid(), name, buf, sizeof buf))
        return 0; /* none, or a kernel without the children files: nothing is found, and the rank's end is as before */
    int found = 0;
    for (char *p = buf, *end; *p; p = end) {
        long pid = strtol(p, &end, 10);
        if (end == p)
            break;
        if (sig)
            kill((pid_t)pid, sig);
        found++;
    }
    return found;
}

static void reap_all(void)
{
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
}

/* What the rank left running when it ended (a background helper, a daemon in a session of its own), ended: this
   process is the rank's subreaper, so all of it is its child by now.  SIGTERM, LEFTOVER_LINGER_S to end, then
   SIGKILL for what is left, and what that orphans in turn.  Else a leftover that holds the rank's output open keeps
   Open MPI's runtime waiting for the rank's end forever, and the job with it. */
static void end_leftovers(const sigset_t *set)
{
    reap_all();
    if (!signal_children(SIGTERM))
        return;
    double until = now_s() + LEFTOVER_LINGER_S;
    while (now_s() < until && signal_children(0)) {
        pause_ms(set, 20); /* SIGCHLD wakes it */
        reap_all();
    }
    for (int round = 0; round < LEFTOVER_KILL_ROUNDS && signal_children(SIGKILL); round++) {
        pause_ms(set, 20);
        reap_all();
    }
}

/* Start the rank as this process's child and stay its parent: pass it the signals above, and pass its end on to
   the runtime, unless its host stops the job.  Then the end is held (this process stays) while the host's stop
   flag exists, so that Open MPI's runtime never sees a rank end during a stop and ends no other rank for it: the
   stop is its host's train's, which ends what is left (docs/resilience.md, "A stop keeps every rank's save").

   A stop is known from the stop flag (its host's train makes it before it signals its ranks), or from a SIGTERM
   this process had, from the platform (Slurm signals every process of the job) or from the rank, told by its
   library (native/rank_stop.c) as it takes its first: then the end waits, `wait_ms` at most, for the host's
   decision: the stop flag (held), or the restart flag (a restart's stop: the runtime is to see every end). */
static int run_rank(char **command, char **env, char *rank_pid, char *rank_parent, const char *stop_flag,
                    const char *restart_flag, long wait_ms, const char *ranks_dir)
{
    sigset_t set, before;
    sigemptyset(&set);
    for (int i = 0; PASSED[i]; i++)
        sigaddset(&set, PASSED[i]);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, &before);
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); /* what the rank leaves behind becomes this process's (end_leftovers) */
    pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0)
        return fail("cannot start the rank for", command[0]);
    if (child == 0) {
        snprintf(rank_pid, 48, RANK_PID_VAR "=%ld", (long)getpid());
        snprintf(rank_parent, 48, RANK_PARENT_VAR "=%ld", (long)parent);
        sigprocmask(SIG_SETMASK, &before, NULL);
        environ = env; /* execvp looks the command up on the rank's own PATH */
        execvp(command[0], command);
        _exit(fail("cannot run", command[0]));
    }
    static char report[4200];
    if (ranks_dir)
        report_rank(ranks_dir, child, report, sizeof report);
    int status = 0, stop_seen = 0;
    for (;;) {
        siginfo_t info;
        int sig = sigwaitinfo(&set, &info);
        if (sig < 0)
            continue; /* EINTR: a stop/continue of this process */
        if (sig == SIGCHLD) { /* the rank's end, or that of a process it left, re-parented here: reaped too */
            int rank_ended = 0, other;
            for (pid_t ended; (ended = waitpid(-1, &other, WNOHANG)) > 0;)
                if (ended == child) {
                    status = other;
                    rank_ended = 1;
                }
            if (rank_ended)
                break;
            continue;
        }
        if (sig == SIGTERM)
            stop_seen = 1;
        if (info.si_pid != child) /* the rank's own note of its SIGTERM is not sent back */
            kill(child, sig);
    }
    end_leftovers(&set);
    if (report[0])
        unlink(report); /* the rank is gone: reported no more */
    if (stop_seen || exists(stop_flag)) {
        double until = now_s() + (double)wait_ms / 1000.0;
        while (now_s() < until && !exists(stop_flag) && !exists(restart_flag))
            pause_ms(&set, 10);
        while (exists(stop_flag)) /* held: its host's train ends the runtime, or removes the flag at the job's end */
            pause_ms(&set, 50);
    }
    return mirror(status);
}

int main(int argc, char **argv)
{
    const char *attempt = NULL;
    if (argc >= 3 && strcmp(argv[1], "--attempt") == 0) {
        attempt = argv[2];
        argv[2] = argv[0];
        argv += 2;
        argc -= 2;
        if (!*attempt || strspn(attempt, "0123456789") != strlen(attempt)) {
            fprintf(stderr, "training-toolkit-rank: --attempt takes a number, not '%s'\n", attempt);
            return 64;
        }
    }
    const char *named = argc == 1 ? node_path(getenv(RANK_FILE_VAR)) : NULL;
    if (argc > 2 || (argc == 1 && (!named || !*named))) {
        fprintf(stderr, "usage: training-toolkit-rank [--attempt N] [FILE] (FILE, else $" RANK_FILE_VAR ": written by train; "
                        "see runners/rank_env.py)\n");
        return 64;
    }
    if (argc == 1) {
        /* the file's path stands in argv[1] from here on, as if it had been given (messages name it) */
        static char *given[3];
        given[0] = argv[0];
        given[1] = (char *)named;
        argv = given;
    }
    size_t size = 0;
    char *data = attempt ? read_attempt(argv[1], attempt, &size) : read_file(argv[1], &size);
    if (!data)
        return attempt ? 127 : fail("cannot read", argv[1]);
    /* split into records */
    size_t records = 0;
    for (size_t i = 0; i < size; i++)
        records += data[i] == '\0';
    char **record = calloc(records + 1, sizeof(char *));
    if (!record)
        return fail("out of memory reading", argv[1]);
    for (size_t i = 0, r = 0; i < size && r < records; r++) {
        record[r] = data + i;
        i += strlen(data + i) + 1;
    }
    errno = EINVAL;
    if (records < 3 || strcmp(record[0], MAGIC) != 0)
        return fail("not a rank file of this version:", argv[1]);
    const char *cwd = record[1];
    char *end = NULL;
    long count = strtol(record[2], &end, 10);
    if (*end != '\0' || count < 1 || (size_t)count > records - 3)
        return fail("no command in", argv[1]);
    char **command = record + 3;
    char **file_env = command + count;
    size_t file_count = records - 3 - (size_t)count;
    char **saved = malloc((file_count + 1) * sizeof(char *));
    size_t inherited = 0;
    while (environ[inherited])
        inherited++;
    char **env = malloc((inherited + file_count + 6) * sizeof(char *));
    if (!saved || !env)
        return fail("out of memory for", argv[1]);
    for (size_t i = 0; i < file_count; i++)
        saved[i] = file_env[i];
    command[count] = NULL; /* the command's end, in the slot of the first entry (saved above) */
    size_t n = 0;
    const char *runtime_libs = NULL;
    for (size_t i = 0; i < inherited; i++) {
        if (is_runtime(environ[i]))
            env[n++] = environ[i];
        else if (starts(environ[i], LIBPATH))
            runtime_libs = environ[i] + strlen(LIBPATH);
    }
    size_t runtime_count = n;
    /* PWD names the directory the rank starts in, as Open MPI and a shell set it */
    size_t pwd_size = strlen("PWD=") + strlen(cwd) + 1;
    char *pwd = malloc(pwd_size);
    if (!pwd)
        return fail("out of memory for", argv[1]);
    snprintf(pwd, pwd_size, "PWD=%s", cwd);
    env[n++] = pwd;
    runtime_count = n;
    for (size_t i = 0; i < file_count; i++) {
        const char *entry = saved[i];
        if (!strchr(entry, '=') || present(env, runtime_count, entry) || starts(entry, ATTEMPT_ENTRY)
            || starts(entry, RANK_PID_VAR "=") || starts(entry, RANK_PARENT_VAR "="))
            continue; /* the attempt's entry is the file's, for --attempt: the rank does not see it; its pids are its own */
        if (runtime_libs && starts(entry, LIBPATH)) {
            char *merged = merge_paths(runtime_libs, entry + strlen(LIBPATH));
            if (!merged)
                return fail("out of memory for", argv[1]);
            env[n++] = merged;
            runtime_libs = NULL;
        } else {
            env[n++] = saved[i];
        }
    }
    if (runtime_libs) {
        char *merged = merge_paths(runtime_libs, "");
        if (!merged)
            return fail("out of memory for", argv[1]);
        env[n++] = merged;
    }
    const char *stop_flag = entry_value(saved, file_count, RANK_STOP_FLAG_VAR "=");
    const char *restart_flag = entry_value(saved, file_count, RANK_RESTART_FLAG_VAR "=");
    const char *wait_text = entry_value(saved, file_count, STOP_WAIT_VAR "=");
    long wait_ms = wait_text ? strtol(wait_text, NULL, 10) : 0;
    const char *ranks_dir = entry_value(saved, file_count, RANKS_DIR_VAR "=");
    /* the rank's own pid and its parent's (this process): set in the child, once it has one */
    static char rank_pid[48], rank_parent[48];
    env[n++] = rank_pid;
    env[n++] = rank_parent;
    env[n] = NULL;
    if (chdir(cwd) != 0)
        return fail("cannot enter the code directory", cwd);
    return run_rank(command, env, rank_pid, rank_parent, stop_flag, restart_flag, wait_ms, ranks_dir);
}
