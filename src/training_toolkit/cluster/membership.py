"""This host's seat in the job: the channel's server on the first host, a client elsewhere.

Runners see one small interface whatever the host's role: open, barrier,
report, end.  Deadlines and ports are settings (``settings.py``), so a platform
can set them without flags.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from queue import SimpleQueue

from training_toolkit.cluster.channel import ControlClient, ControlServer, Verdict
from training_toolkit.settings import Settings, parse

VERDICT_LINGER_S = 10.0


@dataclass(frozen=True)
class ChannelSettings:
    port: int
    join_timeout_s: float
    heartbeat_s: float
    peer_timeout_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> "ChannelSettings":
        return cls(settings.control_port, settings.join_timeout_s, settings.heartbeat_s, settings.peer_timeout_s)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "ChannelSettings":
        """The same, parsed by ``settings.parse`` (for callers not yet given ``RunContext.settings``)."""
        return cls.from_settings(parse(environ))


class Membership:
    def __init__(self, secret: bytes, hosts: Sequence[str], current: str, settings: ChannelSettings, events: SimpleQueue):
        self.hosts = tuple(hosts)
        self.current = current
        self.settings = settings
        self.is_master = current == self.hosts[0]
        kw = dict(heartbeat_s=settings.heartbeat_s, timeout_s=settings.peer_timeout_s)
        if self.is_master:
            self._server: ControlServer | None = ControlServer(secret, self.hosts[1:], settings.port, events, **kw)
            self._client: ControlClient | None = None
        else:
            self._server = None
            self._client = ControlClient(secret, current, self.hosts[0], settings.port, events, **kw)

    def open(self) -> None:
        """Serve, or join within the join deadline."""
        if self._server:
            self._server.start()
        else:
            assert self._client is not None
            self._client.connect(self.settings.join_timeout_s)

    def barrier(self) -> None:
        """Every host ready, or a ClusterError naming who is not."""
        if self._server:
            self._server.wait_ready(self.settings.join_timeout_s)
            self._server.release()
        else:
            assert self._client is not None
            self._client.ready()
            self._client.wait_go(self.settings.join_timeout_s)

    def report_failure(self, reason: str, exit_code: int) -> None:
        if self._client:
            self._client.failed(reason, exit_code)

    def report_done(self, exit_code: int) -> None:
        if self._client:
            self._client.done(exit_code)

    def fail(self, reason: str, exit_code: int) -> None:
        """This host failed: the first host makes it the job's verdict, the others report it there."""
        if self._server:
            self.announce(Verdict(exit_code, reason, self.current))
        else:
            self.report_failure(reason, exit_code)

    def announce(self, verdict: Verdict) -> None:
        """Tell every host the verdict; hosts still on their way get it when they join (bounded wait)."""
        if self._server:
            self._server.broadcast(verdict)
            self._server.linger(min(self.settings.join_timeout_s, VERDICT_LINGER_S))

    def close(self) -> None:
        if self._server:
            self._server.close()
        if self._client:
            self._client.close()
