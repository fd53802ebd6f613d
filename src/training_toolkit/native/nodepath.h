/* "%n" in a path (Slurm's launch of the daemons: every daemon gets mpirun's one environment, and each host's
   directory is named after its node) becomes this node's SLURMD_NODENAME, which slurmstepd sets for every
   daemon and train gives mpirun (runners/mpi_launch.py, slurm_paths).  Any other path is returned as it is; NULL
   where "%n" is there but no node name is.  Used by rank_exec.c (the rank file's path, $TRAINING_TOOLKIT_RANK_FILE). */
#ifndef TRAINING_TOOLKIT_NODEPATH_H
#define TRAINING_TOOLKIT_NODEPATH_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *node_path(const char *path)
{
    const char *at = path ? strstr(path, "%n") : NULL;
    if (!at)
        return path;
    const char *node = getenv("SLURMD_NODENAME");
    if (!node || !*node || strchr(node, '/'))
        return NULL;
    size_t head = (size_t)(at - path), len = strlen(path) - 2 + strlen(node);
    char *out = malloc(len + 1);
    if (!out)
        return NULL;
    snprintf(out, len + 1, "%.*s%s%s", (int)head, path, node, at + 2);
    return out;
}

#endif
