/*
 * training-toolkit-deadman [--no-pidfd] [--marker NAME=VALUE]... [--dir PATH]... [--then PROGRAM [ARG...]]
 *
 * The toolkit's one dead-man switch (supervise/deadman.py starts it and speaks to it).  It runs
 * in a session of its own with a pipe from its owner (train, or training-toolkit local) on its
 * standard input, and blocks reading it.  The owner writes lines:
 *
 *     watch PID START   hold this process (START: field 22 of /proc/PID/stat, read by the owner
 *                       while PID was its unreaped child): it and its descendants are ended
 *     done              the owner ended and removed everything itself: exit 0 at once
 *
 * The end of the input without "done" means the owner died (SIGKILL included).  Then it ends,
 * with SIGKILL, every process it holds, every process whose environment has one of the markers
 * as a whole entry, and every descendant of one of these; removes each --dir (without following
 * links); and, with --then, executes PROGRAM in its place (the container reaper).
 *
 * A process is never signalled by a bare pid after a look: a pidfd is opened first, then the
 * process at that pid is read again and must be the one the look saw (the same start time; for
 * a descendant, still the child of a held process that is still running), and only then is it
 * signalled, through the pidfd.  Every process found is first stopped (SIGSTOP), so nothing it
 * forks escapes the search, and killed once the search finds nothing new.
 *
 * Without pidfds (pidfd_open fails with ENOSYS: Linux before 5.3, some sandboxes; --no-pidfd
 * forces it, for tests) it checks the start time again just before kill(2) by pid: a window of
 * microseconds instead of none.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "procread.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

#define MAX_MARKERS 8
#define MAX_DIRS 8
#define ROUNDS 100         /* searches, ROUND_NS apart: what forks while it is being ended is found */
#define ROUND_NS 50000000L
#define QUIET_ROUNDS 2     /* searches in a row that find nothing new: done */

struct member {
    pid_t pid;
    int fd;                /* -1: no pidfd (ENOSYS) */
    unsigned long long start;
    int killed;
};

static const char *markers[MAX_MARKERS];
static size_t nmarkers;
static const char *dirs[MAX_DIRS];
static size_t ndirs;
static struct member *members;
static size_t nmembers, capacity;
static int no_pidfd;

static int usage(void)
{
    fputs("usage: training-toolkit-deadman [--no-pidfd] [--marker NAME=VALUE]... [--dir PATH]... "
          "[--then PROGRAM [ARG...]]\n", stderr);
    return 64;
}

/* Whether one of the markers is a whole entry of the process's environment (read whole, however long). */
static int has_marker(pid_t pid)
{
    static char *buf;
    static size_t size;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t len = 0;
    for (;;) {
        if (size - len < 2) {
            size_t grown = size ? 2 * size : 1 << 16;
            char *more = realloc(buf, grown);
            if (more == NULL)
                break; /* what was read is looked at */
            buf = more;
            size = grown;
        }
        ssize_t n = read(fd, buf + len, size - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    if (buf == NULL)
        return 0;
    buf[len] = '\0';
    for (size_t at = 0; at < len; at += strlen(buf + at) + 1)
        for (size_t m = 0; m < nmarkers; m++)
            if (strcmp(buf + at, markers[m]) == 0)
                return 1;
    return 0;
}

static int open_pidfd(pid_t pid)
{
    if (no_pidfd)
        return -1;
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0 && errno == ENOSYS)
        no_pidfd = 1;
    return fd;
}

/* Whether a member still runs: its pidfd is not readable yet (or, without pidfds, its pid still
   names a process with its start time that is not a zombie). */
static int running(const struct member *m)
{
    if (m->fd >= 0) {
        struct pollfd p = {.fd = m->fd, .events = POLLIN};
        return poll(&p, 1, 0) == 0;
    }
    char state;
    pid_t ppid;
    unsigned long long start;
    return proc_stat(m->pid, &state, &ppid, &start) && start == m->start && state != 'Z';
}

static void send_to(struct member *m, int sig)
{
    if (m->fd >= 0) {
        syscall(SYS_pidfd_send_signal, m->fd, sig, NULL, 0);
        return;
    }
    char state;
    pid_t ppid;
    unsigned long long start;
    if (proc_stat(m->pid, &state, &ppid, &start) && start == m->start)
        kill(m->pid, sig);
}

static struct member *find_member(pid_t pid)
{
    for (size_t i = 0; i < nmembers; i++)
        if (members[i].pid == pid && running(&members[i]))
            return &members[i];
    return NULL;
}

/* Hold PID, seen by a look with START (and, for a descendant, with the parent PARENT):
   a pidfd first, then the same process must still be there.  Returns whether it is held. */
static int hold(pid_t pid, unsigned long long start, pid_t parent)
{
    if (nmembers == capacity) {
        size_t grown = capacity ? 2 * capacity : 64;
        struct member *more = realloc(members, grown * sizeof *members);
        if (more == NULL)
            return 0;
        members = more;
        capacity = grown;
    }
    int fd = open_pidfd(pid);
    if (fd < 0 && !no_pidfd)
        return 0; /* gone already */
    char state;
    pid_t ppid;
    unsigned long long now;
    int same = proc_stat(pid, &state, &ppid, &now) && now == start;
    if (same && parent > 0)
        same = ppid == parent && find_member(parent) != NULL;
    if (!same) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    members[nmembers++] = (struct member){.pid = pid, .fd = fd, .start = start, .killed = 0};
    return 1;
}

static int is_member(pid_t pid, unsigned long long start)
{
    for (size_t i = 0; i < nmembers; i++)
        if (members[i].pid == pid && members[i].start == start)
            return 1;
    return 0;
}

/* One look at every process: hold (and stop) those not held yet.  Returns how many. */
static int search(void)
{
    DIR *proc = opendir("/proc");
    if (proc == NULL)
        return 0;
    pid_t self = getpid();
    int found = 0;
    struct dirent *entry;
    while ((entry = readdir(proc)) != NULL) {
        char *end;
        long value = strtol(entry->d_name, &end, 10);
        if (*end != '\0' || value <= 0 || value == self)
            continue;
        pid_t pid = (pid_t)value;
        char state;
        pid_t ppid;
        unsigned long long start;
        if (!proc_stat(pid, &state, &ppid, &start) || state == 'Z' || is_member(pid, start))
            continue;
        pid_t parent = find_member(ppid) != NULL ? ppid : 0;
        if (parent == 0 && !(nmarkers && has_marker(pid)))
            continue;
        if (hold(pid, start, parent)) {
            send_to(&members[nmembers - 1], SIGSTOP); /* forks nothing more while the search goes on */
            found++;
        }
    }
    closedir(proc);
    return found;
}

static void kill_all(void)
{
    for (size_t i = 0; i < nmembers; i++)
        if (!members[i].killed) {
            send_to(&members[i], SIGKILL);
            members[i].killed = 1;
        }
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)type;
    (void)ftw;
    remove(path);
    return 0;
}

/* Reads the owner's lines until "done" (returns 1) or the end of the input (returns 0). */
static int watch(void)
{
    char buf[4096];
    size_t len = 0;
    for (;;) {
        ssize_t n = read(0, buf + len, sizeof buf - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            buf[len] = '\0';
            return strcmp(buf, "done") == 0; /* the last word without its newline counts too */
        }
        len += (size_t)n;
        buf[len] = '\0';
        char *line = buf, *nl;
        while ((nl = strchr(line, '\n')) != NULL) {
            *nl = '\0';
            int pid;
            unsigned long long start;
            if (strcmp(line, "done") == 0)
                return 1;
            if (sscanf(line, "watch %d %llu", &pid, &start) == 2 && pid > 0)
                hold((pid_t)pid, start, 0);
            line = nl + 1;
        }
        len = strlen(line);
        memmove(buf, line, len);
        if (len == sizeof buf - 1)
            len = 0; /* a line too long to be ours */
    }
}

int main(int argc, char **argv)
{
    char **then = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--then") == 0 && i + 1 < argc) {
            then = argv + i + 1;
            break;
        } else if (strcmp(argv[i], "--marker") == 0 && i + 1 < argc && nmarkers < MAX_MARKERS) {
            markers[nmarkers++] = argv[++i];
        } else if (strcmp(argv[i], "--no-pidfd") == 0) {
            no_pidfd = 1;
        } else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc && ndirs < MAX_DIRS) {
            dirs[ndirs++] = argv[++i];
        } else {
            return usage();
        }
    }
    signal(SIGPIPE, SIG_IGN);
    if (watch())
        return 0;
    /* the owner died: whatever it held or marked ends now */
    for (size_t i = 0; i < nmembers; i++)
        send_to(&members[i], SIGSTOP);
    struct timespec pause = {0, ROUND_NS};
    int quiet = 0;
    for (int round = 0; round < ROUNDS && quiet < QUIET_ROUNDS; round++) {
        if (search() > 0) {
            quiet = 0;
            continue;
        }
        kill_all();
        quiet++;
        nanosleep(&pause, NULL);
    }
    kill_all();
    for (size_t i = 0; i < ndirs; i++)
        nftw(dirs[i], remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (then != NULL) {
        execvp(then[0], then);
        fprintf(stderr, "training-toolkit-deadman: cannot run %s: %s\n", then[0], strerror(errno));
        return 127;
    }
    return 0;
}
