"""What one look at a network namespace's TCP sockets costs: /proc/net/tcp and tcp6 against the sock_diag dump.

The listener guard reads the table whenever a look sees a new socket (in cutting mode: while ranks
connect, every look); it used to read /proc/net/tcp{,6}, now it asks for the same rows through
netlink (``listeners.tcp_sockets``).  Both are timed in this process's namespace, interleaved, as
the median of ROUNDS reads; reading /proc costs the kernel's walk of its whole established hash and
its text, whatever the namespace holds.

Usage: .venv/bin/python bench/tcp_table.py [ROUNDS]   (default 200)
"""

from __future__ import annotations

import statistics
import sys
import time

from training_toolkit.cluster import listeners


def read_proc() -> None:
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            f.read()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    proc, dump = [], []
    with listeners.diag_socket() as nl:
        for _ in range(rounds):
            for samples, look in ((proc, read_proc), (dump, lambda: listeners.tcp_sockets(nl))):
                start = time.perf_counter()
                look()
                samples.append(time.perf_counter() - start)
    print(f"one read of this namespace's TCP sockets, median of {rounds} interleaved:")
    print(f"  /proc/net/tcp and tcp6 (text only, not parsed)  {statistics.median(proc) * 1e3:7.3f} ms")
    print(f"  sock_diag dump, parsed (listeners.tcp_sockets)  {statistics.median(dump) * 1e3:7.3f} ms")


if __name__ == "__main__":
    main()
