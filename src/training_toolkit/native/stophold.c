/*
 * While this host's train stops the job, Open MPI's runtime on this host neither learns that a rank
 * ended nor kills one, and a rank's MPI_Abort ends that rank alone.  Preloaded into mpirun and the
 * daemons (orted, prted), and into the ranks (for MPI_Abort only).
 *
 * A stop is the agent's (docs/resilience.md, "A stop keeps every rank's save"): every host's train
 * gives its own ranks the stopping signal and the grace period, and ends what is left itself.  But
 * Open MPI ends the whole job as soon as one rank ends badly: a non-zero exit (Open MPI 4 with
 * orte_abort_on_non_zero_status, PRRTE's default in Open MPI 5), a death by signal, an exit without
 * MPI_Finalize, or MPI_Abort, which is what `python -m mpi4py` makes of a handler's sys.exit(143).
 * Then it kills every other rank, and its daemons exit, which ends the ranks that initialised MPI
 * (their runtime gives up on a lost daemon): the ranks still saving die.  None of that can be
 * configured for a stop alone, and a rank that fails outside a stop must still end the job at once,
 * so, for the length of the stop only:
 *
 *   TRAINING_TOOLKIT_STOP_FLAG       (the runtime's) a file's path on this host: while it exists,
 *                                    waitpid() says no child has ended (the runtime does not see a
 *                                    rank's end, so it decides no abort) and kill()/killpg() aimed
 *                                    at another process send nothing
 *   TRAINING_TOOLKIT_RANK_STOP_FLAG  (a rank's) the same file: while it exists, MPI_Abort() exits
 *                                    the calling process with the error code, as if the job had
 *                                    been aborted, without telling the runtime
 *
 * A SIGTERM the runtime has had counts as the flag too, from then on: where the platform signals every
 * process of the job at once (Slurm's scancel and --time), it may come before its host's train has made
 * the file, and under Slurm's own launch of the daemons (docs/slurm.md) a worker's daemon and ranks are
 * in another step than its train, signalled by another step daemon, in either order.  Open MPI 4's
 * mpirun and orted start with SIGTERM blocked (runners/mpi_command.py): it waits in them, and counts
 * for their ranks' MPI_Abort too (the parent's, read from /proc).  Open MPI 5's prterun and prted take
 * it, and PRRTE's answer is to end its ranks at once (SIGCONT, 0.25 s, SIGTERM, 0.25 s, SIGKILL): the
 * library notes it (the trampoline below) before PRRTE's handler runs.  Except under
 *
 *   TRAINING_TOOLKIT_RESTART_FLAG    (the runtime's) a file's path on this host: while it exists, a
 *                                    SIGTERM holds nothing (its host's train ends it for a restart)
 *
 * A rank's own end, where the platform may signal it before its host's train (native, for the rank
 * alone: the process training-toolkit-rank became, TRAINING_TOOLKIT_RANK_PID; its children pass through):
 *
 *   TRAINING_TOOLKIT_RANK_STOP_WAIT_MS   once the rank has had a SIGTERM, its end (MPI_Abort, exit(),
 *                                        _exit(), or SIGTERM's default death) waits, up to this long,
 *                                        until its host has decided what the stop is: the stop flag
 *                                        exists (its runtime holds), its runtime has a SIGTERM waiting,
 *                                        or the restart flag exists (a restart's stop: nothing held)
 *   TRAINING_TOOLKIT_RANK_RESTART_FLAG   that restart flag's path
 *
 * SIGTERMs that reach a rank within TRAINING_TOOLKIT_RANK_STOP_WAIT_MS of its first are one stop: the program's
 * handler runs once (the platform's signal, srun's forward and the host's train's are one stop).  The same for a
 * process of the user's script that the toolkit starts itself where the platform signals every process (Slurm:
 * one_stop.py): it has the variable but no TRAINING_TOOLKIT_RANK_PID, so it names itself there, and what it
 * starts is not the rank; without TRAINING_TOOLKIT_RANK_STOP_FLAG nothing of its end waits.
 *
 * Slurm signals every process of the job in one pass of its step daemon, but a pass is not atomic: on a
 * loaded node a rank whose handler exits at once ended, called MPI_Abort even, before the pass reached
 * mpirun, and before its host's train had made the flag, so the runtime ended every rank still saving
 * (seen in CI).  To know that a SIGTERM came, the library stands between the program and SIGTERM's
 * disposition: sigaction() and signal() for SIGTERM set and report the program's own disposition as
 * always, while the one installed is a trampoline that notes the signal, then runs the program's
 * handler (or, for SIG_DFL, a rank waits as above and dies of SIGTERM).  The runtime's is the same.
 *
 * Unset or empty: the library passes everything through.  train creates the file before it
 * signals its ranks and removes it before the next attempt starts (runners/mpi.py); the processes
 * of a stopped job are ended by train, as every stop's are.  Plain C, no Python.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define FLAG_VAR "TRAINING_TOOLKIT_STOP_FLAG"
#define RANK_FLAG_VAR "TRAINING_TOOLKIT_RANK_STOP_FLAG"
#define RESTART_FLAG_VAR "TRAINING_TOOLKIT_RESTART_FLAG"
#define RANK_RESTART_FLAG_VAR "TRAINING_TOOLKIT_RANK_RESTART_FLAG"
#define WAIT_VAR "TRAINING_TOOLKIT_RANK_STOP_WAIT_MS"
#define RANK_PID_VAR "TRAINING_TOOLKIT_RANK_PID"

static const char *flag;         /* the runtime's: set once, before main(), read only after */
static const char *restart_flag; /* the runtime's, or a rank's: its host's train stops it for a restart */
static const char *rank_flag;    /* a rank's */
static long wait_ms;             /* > 0: this process is a rank: SIGTERMs within it are one stop; with rank_flag (MPI)
                                    its end after one waits, as long at most, for its host's decision */
static pid_t owner;              /* the rank, or the runtime, whose SIGTERM is noted (a child forked from it is not) */

static volatile sig_atomic_t got_term;  /* the owner has had a SIGTERM */
static volatile sig_atomic_t end_held;  /* its end has waited once already */
static struct sigaction program_term;   /* SIGTERM's disposition as the program set it: what sigaction() reports */
static int (*real_sigaction)(int, const struct sigaction *, struct sigaction *);

static const char *path_of(const char *name)
{
    const char *value = getenv(name);
    return value && *value ? value : NULL;
}

#include "nodepath.h"
#include "procread.h"

static void trampoline(int sig, siginfo_t *info, void *context);

/* Install the trampoline for SIGTERM, keeping `act`'s mask and flags (SA_RESETHAND is emulated). */
static int install(const struct sigaction *act)
{
    struct sigaction mine = *act;
    if (act->sa_handler == SIG_IGN) /* (sa_handler and sa_sigaction share their storage: SIG_IGN either way) */
        return real_sigaction(SIGTERM, act, NULL); /* ignored: nothing comes to note */
    mine.sa_sigaction = trampoline;
    mine.sa_flags = (act->sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
    return real_sigaction(SIGTERM, &mine, NULL);
}

static long number(const char *text)
{
    char *end = NULL;
    long value = text ? strtol(text, &end, 10) : 0;
    return text && *end == '\0' && value > 0 ? value : 0;
}

__attribute__((constructor)) static void init(void)
{
    flag = node_path(path_of(FLAG_VAR));
    rank_flag = path_of(RANK_FLAG_VAR);
    real_sigaction = (int (*)(int, const struct sigaction *, struct sigaction *))dlsym(RTLD_NEXT, "sigaction");
    long wait = number(path_of(WAIT_VAR));
    if (wait && !path_of(RANK_PID_VAR)) { /* a process the toolkit started itself, not through training-toolkit-rank */
        char own[24];
        snprintf(own, sizeof own, "%ld", (long)getpid());
        setenv(RANK_PID_VAR, own, 1); /* it is the rank, what it starts is not */
    }
    int rank = wait && number(path_of(RANK_PID_VAR)) == (long)getpid();
    if (!real_sigaction || !(rank || flag))
        return;
    if (real_sigaction(SIGTERM, NULL, &program_term) != 0 || install(&program_term) != 0)
        return;
    owner = getpid();
    if (rank) {
        restart_flag = path_of(RANK_RESTART_FLAG_VAR);
        wait_ms = wait;
    } else {
        restart_flag = node_path(path_of(RESTART_FLAG_VAR));
    }
}

static int stopping(const char *path)
{
    return path != NULL && access(path, F_OK) == 0;
}

/* Whether this process (the runtime) has a SIGTERM waiting: blocked, so the platform's stop is on. */
static int term_waiting(void)
{
    sigset_t set;
    return sigpending(&set) == 0 && sigismember(&set, SIGTERM) == 1;
}

/* Whether process `pid` has a SIGTERM waiting (its /proc status's ShdPnd): async-signal-safe, no stdio. */
static int term_waiting_in(pid_t pid)
{
    char buf[4096];
    if (!proc_read(pid, "status", buf, sizeof buf))
        return 0;
    const char *p = strstr(buf, "\nShdPnd:");
    if (!p)
        return 0;
    unsigned long long pending = 0;
    for (p += 8; *p == ' ' || *p == '\t'; p++)
        ;
    for (;; p++) {
        int d = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
        if (d < 0)
            break;
        pending = pending << 4 | (unsigned)d;
    }
    return (pending >> (SIGTERM - 1)) & 1;
}

/* The rank, after a SIGTERM: wait (once, bounded) until its host has decided what the stop is. */
static void hold_back_end(void)
{
    if (!wait_ms || !rank_flag || !got_term || end_held || getpid() != owner)
        return;
    end_held = 1;
    for (long waited = 0; waited < wait_ms; waited += 10) {
        if (stopping(rank_flag) || stopping(restart_flag) || term_waiting_in(getppid()))
            return;
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

static long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void trampoline(int sig, siginfo_t *info, void *context)
{
    static long first_ms; /* the rank's first SIGTERM */
    struct sigaction program = program_term;
    if (getpid() == owner && !wait_ms) {
        got_term = 1; /* the runtime: a platform's stop (runtime_stopping) */
    } else if (getpid() == owner) {
        long now = now_ms();
        /* the same stop, sent again (Slurm signals every process, the rank's host's train its ranks, srun
           forwards): one run of the program's handler, not a second one inside the first (its save begun anew) */
        if (got_term && now - first_ms < wait_ms)
            return;
        first_ms = got_term ? first_ms : now;
        got_term = 1;
    }
    if (program.sa_flags & SA_RESETHAND) {
        program_term.sa_handler = SIG_DFL;
        program_term.sa_flags &= ~(SA_SIGINFO | SA_RESETHAND);
    }
    if (program.sa_handler == SIG_DFL) { /* SIG_DFL and SIG_IGN whatever the flags: the storage is shared */
        hold_back_end();
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        real_sigaction(SIGTERM, &dfl, NULL);
        raise(SIGTERM); /* blocked in its own handler: delivered, with its default, when this returns */
    } else if (program.sa_handler == SIG_IGN) {
        return;
    } else if (program.sa_flags & SA_SIGINFO) {
        program.sa_sigaction(sig, info, context);
    } else {
        program.sa_handler(sig);
    }
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (!real_sigaction)
        real_sigaction = (int (*)(int, const struct sigaction *, struct sigaction *))dlsym(RTLD_NEXT, "sigaction");
    if (sig != SIGTERM || !owner)
        return real_sigaction(sig, act, old);
    if (getpid() != owner) {
        /* a child of the owner, before its exec: vfork()'s shares this memory (Python's subprocess resets its
           handlers there), so it changes nothing here; it reports the program's disposition for the trampoline */
        struct sigaction was;
        if (real_sigaction(sig, act, &was) != 0)
            return -1;
        if (old)
            *old = (was.sa_flags & SA_SIGINFO) && was.sa_sigaction == trampoline ? program_term : was;
        return 0;
    }
    struct sigaction was = program_term;
    if (act) {
        if (install(act) != 0)
            return -1;
        program_term = *act;
    }
    if (old)
        *old = was;
    return 0;
}

sighandler_t signal(int sig, sighandler_t handler)
{
    static sighandler_t (*real_signal)(int, sighandler_t);
    if (sig != SIGTERM || !owner) {
        if (!real_signal)
            real_signal = (sighandler_t(*)(int, sighandler_t))dlsym(RTLD_NEXT, "signal");
        return real_signal(sig, handler);
    }
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    act.sa_flags = SA_RESTART; /* glibc's signal(): BSD semantics */
    if (sigaction(SIGTERM, &act, &old) != 0)
        return SIG_ERR;
    return old.sa_handler;
}

__attribute__((destructor)) static void at_exit(void)
{
    hold_back_end(); /* exit() after a SIGTERM: the end is seen by the runtime once this returns */
}

void _exit(int status)
{
    static void (*real_exit)(int);
    hold_back_end();
    if (!real_exit)
        real_exit = (void (*)(int))dlsym(RTLD_NEXT, "_exit");
    if (real_exit)
        real_exit(status);
    syscall(SYS_exit_group, status);
    for (;;)
        ;
}

/* The runtime holds while its host's stop flag exists, and once it has had a SIGTERM (waiting, where it starts
   with SIGTERM blocked, or taken) unless its host's train stops it for a restart. */
static int runtime_stopping(void)
{
    return flag != NULL && (stopping(flag) || ((got_term || term_waiting()) && !stopping(restart_flag)));
}

/* Whether a signal to `pid` (kill()'s meaning: -N is a group, 0 our own group) is held now. */
int training_toolkit_stophold_holds(pid_t pid, int sig)
{
    return sig != 0 && pid != getpid() && runtime_stopping();
}

int kill(pid_t pid, int sig)
{
    static int (*real_kill)(pid_t, int);
    if (training_toolkit_stophold_holds(pid, sig))
        return 0;
    if (!real_kill)
        real_kill = (int (*)(pid_t, int))dlsym(RTLD_NEXT, "kill");
    return real_kill(pid, sig);
}

int killpg(pid_t group, int sig)
{
    static int (*real_killpg)(pid_t, int);
    if (training_toolkit_stophold_holds(-group, sig))
        return 0;
    if (!real_killpg)
        real_killpg = (int (*)(pid_t, int))dlsym(RTLD_NEXT, "killpg");
    return real_killpg(group, sig);
}

pid_t waitpid(pid_t pid, int *status, int options)
{
    static pid_t (*real_waitpid)(pid_t, int *, int);
    while (runtime_stopping()) {
        if (options & WNOHANG)
            return 0; /* "no child has changed state": the zombie stays until train ends the runtime */
        usleep(50000);
    }
    if (!real_waitpid)
        real_waitpid = (pid_t(*)(pid_t, int *, int))dlsym(RTLD_NEXT, "waitpid");
    return real_waitpid(pid, status, options);
}

/* Whether this rank's runtime holds (a stop of its host's): its peers' ends are not seen, nor is its own. */
static int runtime_holds(void)
{
    return rank_flag != NULL && (stopping(rank_flag) || term_waiting_in(getppid()));
}

/* MPI_Comm is a pointer in Open MPI and an int in MPICH: either passes through a uintptr_t unchanged. */
int MPI_Abort(uintptr_t comm, int code)
{
    static int (*real_abort)(uintptr_t, int);
    hold_back_end();
    if (runtime_holds()) {
        fflush(NULL);
        _exit(code & 0xff ? code & 0xff : 1);
    }
    if (!real_abort)
        real_abort = (int (*)(uintptr_t, int))dlsym(RTLD_NEXT, "MPI_Abort");
    if (!real_abort) {
        errno = ENOSYS;
        return -1;
    }
    return real_abort(comm, code);
}

/* During a stop a rank's MPI_Finalize is no meeting: the runtime holds, so a peer that ended first (its own
   MPI_Abort above, a death) is never reported, and Open MPI 4's finalize waited for it until the grace ran out
   (seen: a rank whose handler ran twice, the second SystemExit escaping mpi4py's abort).  It returns at once;
   the rank's exit status is the program's, its host's train judges it. */
int MPI_Finalize(void)
{
    static int (*real_finalize)(void);
    hold_back_end();
    if (runtime_holds())
        return 0; /* MPI_SUCCESS */
    if (!real_finalize)
        real_finalize = (int (*)(void))dlsym(RTLD_NEXT, "MPI_Finalize");
    if (!real_finalize) {
        errno = ENOSYS;
        return -1;
    }
    return real_finalize();
}
