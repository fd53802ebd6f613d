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
 * A SIGTERM waiting in the runtime counts as the flag too (Open MPI 4's mpirun and orted start with
 * SIGTERM blocked: runners/mpi_command.py), for the runtime and for its ranks' MPI_Abort (the
 * parent's, read from /proc): where the platform signals every process of the job at once (Slurm's
 * scancel and --time), a rank whose handler ends at once may end before its host's train has made
 * the file, and under Slurm's own launch of the daemons (docs/slurm.md) a worker's ranks are in
 * another step than its train, signalled by another step daemon, in either order.  The runtime's
 * blocked SIGTERM is there before any rank can act on its own (a step daemon signals its processes in
 * one pass, microseconds apart), and nothing but a stop leaves it there.
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
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define FLAG_VAR "TRAINING_TOOLKIT_STOP_FLAG"
#define RANK_FLAG_VAR "TRAINING_TOOLKIT_RANK_STOP_FLAG"

static const char *flag;      /* the runtime's: set once, before main(), read only after */
static const char *rank_flag; /* a rank's */

static const char *path_of(const char *name)
{
    const char *value = getenv(name);
    return value && *value ? value : NULL;
}

#include "nodepath.h"

__attribute__((constructor)) static void init(void)
{
    flag = node_path(path_of(FLAG_VAR));
    rank_flag = path_of(RANK_FLAG_VAR);
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

/* Whether process `pid` has a SIGTERM waiting (its /proc status's ShdPnd), read without stdio. */
static int term_waiting_in(pid_t pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *line = strstr(buf, "\nShdPnd:");
    if (!line)
        return 0;
    unsigned long long pending = strtoull(line + 8, NULL, 16);
    return (pending >> (SIGTERM - 1)) & 1;
}

static int runtime_stopping(void)
{
    return flag != NULL && (stopping(flag) || term_waiting());
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

/* MPI_Comm is a pointer in Open MPI and an int in MPICH: either passes through a uintptr_t unchanged. */
int MPI_Abort(uintptr_t comm, int code)
{
    static int (*real_abort)(uintptr_t, int);
    if (rank_flag != NULL && (stopping(rank_flag) || term_waiting_in(getppid()))) {
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
