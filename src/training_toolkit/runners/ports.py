"""Free-port checks before a server starts (TensorFlow's, torch.distributed's store).

A clear error naming the port beats a gRPC or c10d stack trace.
"""

from __future__ import annotations

import socket

from training_toolkit.core.errors import ClusterError


def check_free(port: int, what: str, host: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as exc:
            raise ClusterError(f"port {port} for the {what} on {host} is not free: {exc.strerror or exc}") from None
