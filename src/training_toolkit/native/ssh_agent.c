/*
 * training-toolkit-ssh HOST COMMAND...: the rsh agent of mpirun and of every Open MPI daemon over ssh.
 *
 * It runs `ssh -F CONFIG HOST COMMAND...`, CONFIG being the file TRAINING_TOOLKIT_SSH_CONFIG names.
 * Open MPI hands its agent string on to the daemons it starts, which start others in their turn
 * (tree spawn), so the string must hold on every host; each host's job ssh files are in a
 * directory of a random name of its own (unique even where hosts share a parent).  So the string
 * is this program's path (the same on every host: the same image) and each host's train sets the
 * variable for the processes that log in from it: mpirun's environment on the first host, its own
 * sshd's SetEnv (every session: orted/prted, and the ssh they run) elsewhere (runners/mpi_ssh.py).
 *
 * Without the variable it says so and exits 255 (ssh's own code for a failed connection), never
 * falls back on the user's or the system's ssh config.  The ssh it runs is `ssh` on PATH.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CONFIG_VAR "TRAINING_TOOLKIT_SSH_CONFIG"

int main(int argc, char **argv)
{
    const char *config = getenv(CONFIG_VAR);
    if (config == NULL || config[0] != '/') {
        fprintf(stderr, "training-toolkit-ssh: %s is %s: this host's job ssh config is not known here\n",
                CONFIG_VAR, config == NULL ? "not set" : "not an absolute path");
        return 255;
    }
    const char *program = "ssh";
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (args == NULL) {
        fprintf(stderr, "training-toolkit-ssh: out of memory\n");
        return 255;
    }
    args[0] = (char *)program;
    args[1] = "-F";
    args[2] = (char *)config;
    for (int i = 1; i < argc; i++)
        args[i + 2] = argv[i];
    args[argc + 2] = NULL;
    execvp(program, args);
    fprintf(stderr, "training-toolkit-ssh: cannot run %s: %s\n", program, strerror(errno));
    return 255;
}
