/* One /proc/PID/NAME file read whole into buf (NUL-terminated) with no stdio and no malloc (a signal handler
   may call it).  Its length; 0 once the process is gone or on any error.
   Used by deadman.c (/proc/PID/stat). */
#ifndef TRAINING_TOOLKIT_PROCREAD_H
#define TRAINING_TOOLKIT_PROCREAD_H
#include <fcntl.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

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

#endif
