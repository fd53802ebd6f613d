/* Reading /proc with no stdio and no malloc (a signal handler may call it): one file (proc_read), and a process's
   state, parent and start time (proc_stat).  Used by deadman.c and rank_exec.c. */
#ifndef TRAINING_TOOLKIT_PROCREAD_H
#define TRAINING_TOOLKIT_PROCREAD_H
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* One /proc/PID/NAME file read into buf (NUL-terminated; one read, at most size - 1 bytes).  Its length; 0 once the
   process is gone or on any error. */
static size_t proc_read(pid_t pid, const char *name, char *buf, size_t size)
{
    char path[64] = "/proc/", digits[24];
    int n = 0;
    for (unsigned long v = (unsigned long)pid; n == 0 || v; v /= 10)
        digits[n++] = (char)('0' + v % 10);
    size_t at = strlen(path), len = strlen(name);
    if (at + (size_t)n + 1 + len >= sizeof path || size < 2)
        return 0;
    while (n)
        path[at++] = digits[--n];
    path[at++] = '/';
    memcpy(path + at, name, len + 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t got = read(fd, buf, size - 1);
    close(fd);
    if (got <= 0)
        return 0;
    buf[got] = '\0';
    return (size_t)got;
}

/* The state, parent and start time (clock ticks after boot: with the pid, the process's identity) of
   /proc/PID/stat; 0 once the process is gone. */
static int proc_stat(pid_t pid, char *state, pid_t *ppid, unsigned long long *start)
{
    char buf[1024];
    if (!proc_read(pid, "stat", buf, sizeof buf))
        return 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses: fields follow its last ')' */
    if (p == NULL || p[1] != ' ')
        return 0;
    p += 2;
    *state = *p;
    /* after the name: state(3) ppid(4) ... starttime(22) */
    char *field = p;
    int ppid_value = 0;
    for (int i = 3; i <= 22; i++) {
        if (i == 4)
            ppid_value = atoi(field);
        if (i == 22) {
            char *end = NULL;
            *start = strtoull(field, &end, 10);
            *ppid = ppid_value;
            return end != field;
        }
        field = strchr(field, ' ');
        if (field == NULL)
            return 0;
        field++;
    }
    return 0;
}

#endif
