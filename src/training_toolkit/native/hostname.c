/*
 * Preloaded into every MPI rank (LD_PRELOAD): gethostname() returns the rank's own host.
 *
 * SageMaker gives every training container the same kernel host name ("aws"), so
 * without this every rank of every host reports one name: MPI_Get_processor_name,
 * NCCL's host names and scripts' per-host files and logs all collide.  The toolkit
 * sets SM_CURRENT_HOST per host (each host's train builds its own ranks' environment);
 * this library answers gethostname() with it.  Without SM_CURRENT_HOST (a child that
 * cleared its environment but kept LD_PRELOAD) it answers what the kernel says, as
 * glibc does: uname()'s nodename.  uname() itself is left alone, as the reference does.
 *
 * Plain C, no Python: it works in a rank written in any language.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

static int copy_name(char *name, size_t len, const char *value)
{
    size_t n = strlen(value);
    if (n + 1 > len) {
        /* glibc: the truncated name, and ENAMETOOLONG */
        if (len > 0)
            memcpy(name, value, len);
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(name, value, n + 1);
    return 0;
}

int gethostname(char *name, size_t len)
{
    const char *own = getenv("SM_CURRENT_HOST");
    if (own != NULL && *own != '\0')
        return copy_name(name, len, own);
    struct utsname uts;
    if (uname(&uts) != 0)
        return -1;
    return copy_name(name, len, uts.nodename);
}
