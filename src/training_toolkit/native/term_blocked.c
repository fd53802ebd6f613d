/*
 * training-toolkit-term-blocked PROGRAM [ARG...]: run PROGRAM with SIGTERM blocked.
 *
 * Open MPI 5's daemons (prted) start this way (runners/mpi_command.py): a platform that signals every
 * process of the job (Slurm's scancel and --time) would otherwise make each daemon end its ranks at once,
 * their saves with them; blocked, the SIGTERM waits and the ranks alone take theirs (Open MPI unblocks every
 * signal in the ranks it starts).  coreutils' `env --block-signal=TERM` does the same, and starts mpirun and
 * Open MPI 4's orted, but PRRTE cuts a launch agent's value at its first '=' when it passes it on to the
 * daemons it starts (tree spawn), so the daemons' agent must be a command without one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: training-toolkit-term-blocked PROGRAM [ARG...]\n");
        return 125;
    }
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    if (sigprocmask(SIG_BLOCK, &term, NULL) != 0) {
        fprintf(stderr, "training-toolkit-term-blocked: cannot block SIGTERM: %s\n", strerror(errno));
        return 125;
    }
    execvp(argv[1], argv + 1);
    fprintf(stderr, "training-toolkit-term-blocked: cannot run %s: %s\n", argv[1], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}
