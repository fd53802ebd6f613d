/*
 * A rank's stop: one stop for SIGTERMs that come together, and, once the stop is on, an MPI_Abort that ends
 * this rank alone and an MPI_Finalize that waits for nobody.  Preloaded into the user's processes only: MPI's
 * ranks (runners/mpi_launch.py), and the script's processes where the platform signals every process itself
 * (runners/one_stop.py).  Nothing of it runs in Open MPI's runtime (mpirun, orted, prted): that the runtime
 * sees no rank end during a stop is the rank's parent's doing (native/rank_exec.c), not this library's.
 *
 *   TRAINING_TOOLKIT_RANK_STOP_WAIT_MS  SIGTERMs that reach the process within this many milliseconds of its
 *                                       first are one stop: the program's handler runs once (the platform's
 *                                       signal, its host's train's and the rank parent's pass are one stop)
 *   TRAINING_TOOLKIT_RANK_PID           the process that is the rank (training-toolkit-rank sets it for its
 *                                       child; one that has none names itself): what it starts is not
 *   TRAINING_TOOLKIT_RANK_PARENT        the rank's parent, training-toolkit-rank: told of the rank's first
 *                                       SIGTERM (a SIGTERM of its own), so that it knows a stop is on even
 *                                       where the platform's signal reached the rank first
 *   TRAINING_TOOLKIT_RANK_STOP_FLAG     a file's path on the rank's host: while it exists, its host's train
 *                                       stops its ranks
 *
 * During a stop (the rank has had a SIGTERM, or the stop flag exists): MPI_Abort() exits the calling process
 * with the error code, as if the job had been aborted, without telling the runtime (which would end every
 * other rank, their saves with them: `python -m mpi4py` makes a handler's sys.exit(143) an MPI_Abort); and
 * MPI_Finalize() returns at once, since a peer that ended first is never reported to the others (its parent
 * holds its end), and Open MPI's finalize would wait for it until the grace ran out.  The rank's exit status
 * is the program's; its host's train judges it.
 *
 * To know that a SIGTERM came, the library stands between the program and SIGTERM's disposition: sigaction()
 * and signal() for SIGTERM set and report the program's own disposition as always, while the one installed is
 * a trampoline that notes the signal, then runs the program's handler (or, for SIG_DFL, dies of SIGTERM).
 * Unset or empty variables: the library passes everything through.  Plain C, no Python.
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
#include <sys/types.h>
#include <unistd.h>

#define RANK_FLAG_VAR "TRAINING_TOOLKIT_RANK_STOP_FLAG"
#define WAIT_VAR "TRAINING_TOOLKIT_RANK_STOP_WAIT_MS"
#define RANK_PID_VAR "TRAINING_TOOLKIT_RANK_PID"
#define RANK_PARENT_VAR "TRAINING_TOOLKIT_RANK_PARENT"

static const char *rank_flag; /* set once, before main(), read only after */
static long wait_ms;          /* > 0: this process is a rank: SIGTERMs within it are one stop */
static pid_t owner;           /* the rank (a child forked from it is not) */
static pid_t parent;          /* its parent, training-toolkit-rank, told of its first SIGTERM; 0: none */

static volatile sig_atomic_t got_term; /* the rank has had a SIGTERM */
static struct sigaction program_term;  /* SIGTERM's disposition as the program set it: what sigaction() reports */
static int (*real_sigaction)(int, const struct sigaction *, struct sigaction *);

static const char *path_of(const char *name)
{
    const char *value = getenv(name);
    return value && *value ? value : NULL;
}

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
    real_sigaction = (int (*)(int, const struct sigaction *, struct sigaction *))dlsym(RTLD_NEXT, "sigaction");
    long wait = number(path_of(WAIT_VAR));
    if (!wait || !real_sigaction)
        return;
    if (!path_of(RANK_PID_VAR)) { /* a process the toolkit started itself, not through training-toolkit-rank */
        char own[24];
        snprintf(own, sizeof own, "%ld", (long)getpid());
        setenv(RANK_PID_VAR, own, 1); /* it is the rank, what it starts is not */
    }
    if (number(path_of(RANK_PID_VAR)) != (long)getpid())
        return;
    if (real_sigaction(SIGTERM, NULL, &program_term) != 0 || install(&program_term) != 0)
        return;
    owner = getpid();
    wait_ms = wait;
    rank_flag = path_of(RANK_FLAG_VAR);
    long told = number(path_of(RANK_PARENT_VAR));
    parent = told && told == (long)getppid() ? (pid_t)told : 0;
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
    if (getpid() == owner) {
        long now = now_ms();
        /* the same stop, sent again (Slurm signals every process, the rank's host's train its ranks, the rank's
           parent passes the platform's on): one run of the program's handler, not a second one inside the first */
        if (got_term && now - first_ms < wait_ms)
            return;
        if (!got_term && parent && getppid() == parent && (!info || info->si_pid != parent)) {
            int saved = errno;
            kill(parent, SIGTERM); /* a stop is on: the parent holds the rank's end (native/rank_exec.c) */
            errno = saved;
        }
        first_ms = got_term ? first_ms : now;
        got_term = 1;
    }
    if (program.sa_flags & SA_RESETHAND) {
        program_term.sa_handler = SIG_DFL;
        program_term.sa_flags &= ~(SA_SIGINFO | SA_RESETHAND);
    }
    if (program.sa_handler == SIG_DFL) { /* SIG_DFL and SIG_IGN whatever the flags: the storage is shared */
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
    /* the program's disposition changes with the trampoline left in place: SIGTERM is blocked meanwhile, so that
       one arriving in between runs neither the old handler nor a trampoline with half of the new one */
    sigset_t term, before;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &term, &before);
    struct sigaction was = program_term;
    int rc = 0;
    if (act) {
        rc = install(act);
        if (rc == 0)
            program_term = *act;
    }
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (rc != 0)
        return -1;
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

/* Whether this rank's stop is on: it has had a SIGTERM, or its host's train stops its ranks. */
static int stopping(void)
{
    return owner == getpid() && (got_term || (rank_flag != NULL && access(rank_flag, F_OK) == 0));
}

/* MPI_Comm is a pointer in Open MPI and an int in MPICH: either passes through a uintptr_t unchanged. */
int MPI_Abort(uintptr_t comm, int code)
{
    static int (*real_abort)(uintptr_t, int);
    if (stopping()) {
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

int MPI_Finalize(void)
{
    static int (*real_finalize)(void);
    if (stopping())
        return 0; /* MPI_SUCCESS */
    if (!real_finalize)
        real_finalize = (int (*)(void))dlsym(RTLD_NEXT, "MPI_Finalize");
    if (!real_finalize) {
        errno = ENOSYS;
        return -1;
    }
    return real_finalize();
}
