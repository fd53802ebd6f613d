/*
 * Preloaded into mpirun, the Open MPI daemons and the ranks (LD_PRELOAD): a connection that a
 * listener accepts from outside the job is closed before the program sees it.
 *
 * Open MPI's runtime and BTL listen on every address and trust whoever connects (docs/security.md).
 * The listener guard (cluster/guard.py) attaches a socket filter to each listener from outside, but
 * in a container without CAP_NET_ADMIN the kernel refuses it, and the guard can only cut a
 * connection once it sees it (20-250 ms later), after the program has read what the outsider sent.
 * This library takes the place of accept() and accept4(): every connection the kernel hands over is
 * checked against the job's addresses first, and one from elsewhere is closed and the next one taken,
 * so the program only ever sees the job's hosts and loopback.  A nonblocking listener with no other
 * connection waiting gets EAGAIN, which every caller already handles; a blocking one waits for the
 * next connection, as it would have.
 *
 *   TRAINING_TOOLKIT_NETSHIM_ALLOW  the job's addresses, comma-separated (IPv4 or IPv6, an IPv6 one
 *                                   with its scope or not: fe80::1%eth0, fe80::1%2); unset: the
 *                                   library lets everything through (a child that cleared its
 *                                   environment but kept LD_PRELOAD)
 *   TRAINING_TOOLKIT_NETSHIM_PORTS  LOW-HIGH: only listeners on these local ports are checked (a
 *                                   rank's BTL range: a script's own server elsewhere is left
 *                                   alone); unset: every port
 *
 * Loopback (127/8, ::1) and non-IP sockets are always admitted; an IPv4-mapped IPv6 peer counts as
 * its IPv4 address.  A scoped entry admits its address on that interface only (a peer's scope is
 * the interface index the kernel gives a link-local peer); one without a scope, on any.  An entry
 * that is no address (or names no interface of this host) is skipped, and said once on stderr:
 * the rest of the list still holds, so one odd address of a host does not cut the job off.  A bad
 * PORTS value makes the library admit loopback only on every port (never an outsider), and it
 * says so once on stderr, as it says the first refusal.  Python hands the library only entries it
 * parses (runners/netshim.py, shim_address: the same rule, tested against this file).
 *
 * The rule is training_toolkit_netshim_admits(), exported so that the unit tests call it exactly.
 * Plain C, no Python.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ALLOW_VAR "TRAINING_TOOLKIT_NETSHIM_ALLOW"
#define PORTS_VAR "TRAINING_TOOLKIT_NETSHIM_PORTS"

struct allowed {
    struct in6_addr address; /* IPv4 as IPv4-mapped IPv6 */
    unsigned int scope;      /* an IPv6 entry's interface index; 0: any */
};

struct config {
    int active;              /* 0: pass everything through */
    int broken;              /* a bad PORTS value: admit loopback only */
    struct allowed *allowed;
    size_t count;
    size_t skipped;          /* entries of ALLOW that are no address: left out */
    int low, high;           /* local ports checked */
};

static struct config CONFIG; /* set once, before main(), read only after */
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static volatile int told; /* the first refusal is said, the rest are not */

static void say(const char *text)
{
    ssize_t ignored = write(2, text, strlen(text));
    (void)ignored;
}

/* An IPv6 address's scope: an interface's index (1..) or name; 0 on success */
static int parse_scope(const char *text, unsigned int *out)
{
    if (*text == '\0' || strlen(text) >= IF_NAMESIZE)
        return -1;
    if (*text >= '0' && *text <= '9') {
        unsigned long value = 0;
        for (const char *p = text; *p; p++) {
            if (*p < '0' || *p > '9' || value > 0xffffffffUL / 10)
                return -1;
            value = value * 10 + (unsigned long)(*p - '0');
        }
        if (value == 0 || value > 0xffffffffUL)
            return -1;
        *out = (unsigned int)value;
        return 0;
    }
    *out = if_nametoindex(text);
    return *out == 0 ? -1 : 0;
}

/* "a.b.c.d", or an IPv6 address with an optional "%SCOPE", as IPv6 (IPv4-mapped for IPv4); 0 on success */
static int parse_address(const char *text, struct allowed *out)
{
    struct in_addr v4;
    char address[INET6_ADDRSTRLEN];
    const char *percent = strchr(text, '%');
    size_t n = percent ? (size_t)(percent - text) : strlen(text);
    memset(out, 0, sizeof *out);
    if (percent == NULL && inet_pton(AF_INET, text, &v4) == 1) {
        out->address.s6_addr[10] = 0xff;
        out->address.s6_addr[11] = 0xff;
        memcpy(&out->address.s6_addr[12], &v4, 4);
        return 0;
    }
    if (n >= sizeof address)
        return -1;
    memcpy(address, text, n);
    address[n] = '\0';
    if (inet_pton(AF_INET6, address, &out->address) != 1)
        return -1;
    if (percent != NULL && parse_scope(percent + 1, &out->scope) != 0)
        return -1;
    if (!IN6_IS_ADDR_LINKLOCAL(&out->address))
        out->scope = 0; /* the kernel gives a scope to link-local peers only: elsewhere it cannot narrow */
    return 0;
}

static int parse_port(const char *text, const char *end, int *out)
{
    long value = 0;
    if (text == end || end - text > 5)
        return -1;
    for (const char *p = text; p < end; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        value = value * 10 + (*p - '0');
    }
    if (value < 1 || value > 65535)
        return -1;
    *out = (int)value;
    return 0;
}

static int mark_broken(struct config *c)
{
    c->broken = 1;
    c->low = 1;
    c->high = 65535;
    return -1;
}

/* fills c from the two variables' values (either NULL: unset); 0, or -1 with c->broken set (a bad PORTS,
   no memory).  An ALLOW entry that is no address is counted in c->skipped and left out. */
static int configure(struct config *c, const char *allow, const char *ports)
{
    memset(c, 0, sizeof *c);
    c->low = 1;
    c->high = 65535;
    if (allow == NULL)
        return 0;
    c->active = 1;
    if (ports != NULL) {
        const char *dash = strchr(ports, '-');
        if (dash == NULL || parse_port(ports, dash, &c->low) != 0 ||
            parse_port(dash + 1, dash + 1 + strlen(dash + 1), &c->high) != 0 || c->low > c->high) {
            return mark_broken(c);
        }
    }
    size_t entries = 1;
    for (const char *p = allow; *p; p++)
        entries += *p == ',';
    c->allowed = calloc(entries, sizeof *c->allowed);
    if (c->allowed == NULL)
        return mark_broken(c);
    const char *start = allow;
    for (;;) {
        const char *end = strchr(start, ',');
        size_t n = end ? (size_t)(end - start) : strlen(start);
        char text[INET6_ADDRSTRLEN + IF_NAMESIZE + 1];
        if (n > 0 && n < sizeof text) {
            memcpy(text, start, n);
            text[n] = '\0';
        }
        if (n > 0 && n < sizeof text && parse_address(text, &c->allowed[c->count]) == 0)
            c->count++;
        else
            c->skipped++;
        if (end == NULL)
            break;
        start = end + 1;
    }
    return 0;
}

static int is_loopback(const struct in6_addr *a)
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(a->s6_addr, mapped, 12) == 0)
        return a->s6_addr[12] == 127;
    return IN6_IS_ADDR_LOOPBACK(a);
}

/* 1: admit, 0: close.  peer: what accept() returned; local_port: the listener's (-1: unknown) */
static int admits(const struct config *c, const struct sockaddr *peer, socklen_t len, int local_port)
{
    struct in6_addr address;
    unsigned int scope = 0;
    if (!c->active)
        return 1;
    if (peer->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        memset(&address, 0, sizeof address);
        address.s6_addr[10] = 0xff;
        address.s6_addr[11] = 0xff;
        memcpy(&address.s6_addr[12], &((const struct sockaddr_in *)peer)->sin_addr, 4);
    } else if (peer->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        address = ((const struct sockaddr_in6 *)peer)->sin6_addr;
        scope = ((const struct sockaddr_in6 *)peer)->sin6_scope_id;
    } else {
        return 1; /* a unix socket (PMIx), or nothing the kernel said: not the network */
    }
    if (is_loopback(&address))
        return 1;
    if (local_port >= 0 && (local_port < c->low || local_port > c->high))
        return 1;
    if (c->broken)
        return 0;
    for (size_t i = 0; i < c->count; i++)
        if (memcmp(&c->allowed[i].address, &address, sizeof address) == 0 &&
            (c->allowed[i].scope == 0 || c->allowed[i].scope == scope))
            return 1;
    return 0;
}

/*
 * The rule, for the unit tests: whether a listener on local_port (-1: unknown) configured with the
 * two variables' values (NULL: unset) admits a connection from peer (an address's text, an IPv6 one
 * with "%SCOPE" as the kernel gives a link-local peer's interface).  -1: peer is no address.
 */
int training_toolkit_netshim_admits(const char *allow, const char *ports, const char *peer, int local_port)
{
    struct config c;
    struct allowed parsed;
    configure(&c, allow, ports);
    struct sockaddr_storage storage;
    socklen_t len;
    memset(&storage, 0, sizeof storage);
    struct sockaddr_in *v4 = (struct sockaddr_in *)&storage;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&storage;
    int result;
    if (inet_pton(AF_INET, peer, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        len = sizeof *v4;
    } else if (strlen(peer) < INET6_ADDRSTRLEN + IF_NAMESIZE && parse_address(peer, &parsed) == 0) {
        v6->sin6_family = AF_INET6;
        v6->sin6_addr = parsed.address;
        v6->sin6_scope_id = parsed.scope;
        len = sizeof *v6;
    } else {
        free(c.allowed);
        return -1;
    }
    result = admits(&c, (struct sockaddr *)&storage, len, local_port);
    free(c.allowed);
    return result;
}

/* Whether the two variables' values (NULL: unset) are good: 0; -1: PORTS is bad (the library admits
   loopback only); else the number of ALLOW's entries that are no address (the library leaves them out). */
int training_toolkit_netshim_valid(const char *allow, const char *ports)
{
    struct config c;
    int result = configure(&c, allow, ports);
    free(c.allowed);
    return result != 0 ? result : (int)c.skipped;
}

/* The entries of allow the library keeps, written to out (size bytes) in its own form, comma-separated
   ("a.b.c.d", an IPv6 address as inet_ntop writes it, "%INDEX" for a scope): how many, or -1 when
   out is too small or PORTS is bad.  For the round-trip tests. */
int training_toolkit_netshim_kept(const char *allow, char *out, size_t size)
{
    struct config c;
    size_t used = 0;
    int result = configure(&c, allow, NULL);
    if (result == 0 && size > 0)
        out[0] = '\0';
    for (size_t i = 0; result == 0 && i < c.count; i++) {
        char text[INET6_ADDRSTRLEN];
        char entry[INET6_ADDRSTRLEN + 16];
        const struct in6_addr *a = &c.allowed[i].address;
        if (IN6_IS_ADDR_V4MAPPED(a))
            inet_ntop(AF_INET, &a->s6_addr[12], text, sizeof text);
        else
            inet_ntop(AF_INET6, a, text, sizeof text);
        if (c.allowed[i].scope != 0)
            snprintf(entry, sizeof entry, "%s%s%%%u", i ? "," : "", text, c.allowed[i].scope);
        else
            snprintf(entry, sizeof entry, "%s%s", i ? "," : "", text);
        if (used + strlen(entry) + 1 > size)
            result = -1;
        else {
            memcpy(out + used, entry, strlen(entry) + 1);
            used += strlen(entry);
        }
    }
    free(c.allowed);
    return result == 0 ? (int)c.count : -1;
}

static void resolve(void)
{
    /* libc's own; idempotent, so a call before the constructor ran (another library's) finds them too */
    if (real_accept == NULL)
        real_accept = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    if (real_accept4 == NULL)
        real_accept4 = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
}

__attribute__((constructor)) static void start(void)
{
    resolve();
    if (configure(&CONFIG, getenv(ALLOW_VAR), getenv(PORTS_VAR)) != 0)
        say("training-toolkit netshim: " PORTS_VAR " is malformed (or no memory): listeners admit loopback only\n");
    else if (CONFIG.skipped)
        say("training-toolkit netshim: " ALLOW_VAR " has entries that are no address of this host: left out, "
            "the others admitted\n");
}

static int local_port_of(int fd)
{
    struct sockaddr_storage local;
    socklen_t len = sizeof local;
    if (getsockname(fd, (struct sockaddr *)&local, &len) != 0)
        return -1;
    if (local.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&local)->sin_port);
    if (local.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&local)->sin6_port);
    return -1;
}

static void tell(const struct sockaddr *peer, int port)
{
    char text[INET6_ADDRSTRLEN] = "?";
    char line[200];
    if (told)
        return;
    told = 1;
    if (peer->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)peer)->sin_addr, text, sizeof text);
    else
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)peer)->sin6_addr, text, sizeof text);
    snprintf(line, sizeof line,
             "training-toolkit netshim: closed a connection from %s to port %d (not a host of the job; "
             "further ones are not logged)\n", text, port);
    say(line);
}

/* accept until a connection the job admits, or the real call's own error; four: accept4(flags) */
static int checked_accept(int fd, struct sockaddr *addr, socklen_t *addrlen, int four, int flags)
{
    if (real_accept == NULL || real_accept4 == NULL)
        resolve(); /* before our constructor: CONFIG is still empty, everything passes */
    for (;;) {
        struct sockaddr_storage peer;
        socklen_t len = sizeof peer;
        int conn;
        if (!four) {
            if (real_accept == NULL) {
                errno = ENOSYS;
                return -1;
            }
            conn = real_accept(fd, (struct sockaddr *)&peer, &len);
        } else {
            if (real_accept4 == NULL) {
                errno = ENOSYS;
                return -1;
            }
            conn = real_accept4(fd, (struct sockaddr *)&peer, &len, flags);
        }
        if (conn < 0)
            return conn;
        int port = -1;
        if (!admits(&CONFIG, (struct sockaddr *)&peer, len, -1)) {
            port = local_port_of(conn);
            if (!admits(&CONFIG, (struct sockaddr *)&peer, len, port)) {
                tell((struct sockaddr *)&peer, port);
                close(conn); /* unread data: the outsider gets a reset */
                continue;
            }
        }
        if (addr != NULL && addrlen != NULL) {
            memcpy(addr, &peer, len < *addrlen ? len : *addrlen); /* truncated as the kernel does */
            *addrlen = len;
        }
        return conn;
    }
}

int accept(int fd, struct sockaddr *addr, socklen_t *addrlen)
{
    return checked_accept(fd, addr, addrlen, 0, 0);
}

int accept4(int fd, struct sockaddr *addr, socklen_t *addrlen, int flags)
{
    return checked_accept(fd, addr, addrlen, 1, flags);
}
