"""The control channel's wire format and its cryptography, as pure functions.

One JSON object per line over TCP.  Everything a peer sends is checked here
before any other code looks at it: size, encoding, nesting, shape, and the
type and range of every field.  A frame that fails is a ``FrameError`` whose
message is one line; nothing an outsider sends can raise anything else.

A join is an ephemeral X25519 exchange: both sides derive an authentication
key and a session key from the shared value, salted with the job's secret
when the platform gave one.  With a secret, the keys prove that both sides
know it; without, they bind the join to this one exchange, so that what a
listener saw cannot be replayed or continued (see docs/security.md).  Every
later message carries a sequence number and an HMAC under the session key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import NamedTuple

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from training_toolkit.job.attempt import MAX_CAUSES, Attempt

PROTOCOL = 9  # 3: the welcome carries the job's attempt (a host that rejoins takes part in its next); 4: its hosts;
#              5: each go carries the attempt's active hosts (the others are spares);
#              6: each go carries every seated host's introduction (each host's ssh keys, for MPI's tree spawn);
#              7: each go carries the attempt's spares (its members: the active hosts and the spares);
#              8: what the job learnt (each go: the hosts retired, the last failures' causes; each restart: its
#                 cause), and the lead's word of each checkpoint marked (``mark``);
#              9: each ``mark`` carries its attempt and the lead's time
MAX_FRAME = 64 * 1024  # bytes in one line, newline included
MAX_WELCOME = 1024 * 1024  # bytes in the welcome, which lists every host (only a joining host reads one)
MAX_HOSTS = 100_000
MAX_TEXT = 4096  # characters in a reason, a host name, an introduction value
MAX_INTRO_ITEMS = 8
_KDF_LABEL = b"training-toolkit channel v2"


class FrameError(ValueError):
    """A frame or a field that is not what the protocol allows.  One line, safe to log."""


# Framing ------------------------------------------------------------------------------------------


def encode(message: dict) -> bytes:
    return (json.dumps(message, separators=(",", ":"), sort_keys=True) + "\n").encode()


def decode(line: bytes, limit: int = MAX_FRAME) -> dict:
    """One received line (at most ``limit`` bytes) as a JSON object, or a FrameError saying why not."""
    if len(line) > limit:
        raise FrameError(f"frame longer than {limit} bytes")
    if not line.endswith(b"\n"):
        raise FrameError("truncated frame (no end of line)")
    try:
        message = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise FrameError("frame is not UTF-8") from None
    except RecursionError:
        raise FrameError("frame nested too deeply") from None
    except ValueError:
        raise FrameError("frame is not JSON") from None
    if not isinstance(message, dict):
        raise FrameError("frame is not a JSON object")
    return message


def text(message: dict, key: str, *, limit: int = MAX_TEXT, optional: bool = False) -> str | None:
    value = message.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise FrameError(f"field {key!r} is not a string of at most {limit} characters")
    return value


def exit_code(message: dict, key: str = "code") -> int:
    value = message.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
        raise FrameError(f"field {key!r} is not an exit code (0-255)")
    return value


MAX_ATTEMPT = 10_000  # an attempt number


def attempt(message: dict, key: str = "n") -> int:
    """The job attempt a message belongs to (0 when absent: a host of a version before restarts)."""
    value = message.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_ATTEMPT:
        raise FrameError(f"field {key!r} is not an attempt number")
    return value


def job_attempt(message: dict) -> tuple[int, bool]:
    """The welcome's word on where the job is: its attempt, and whether that attempt's processes were started."""
    value = message.get("at")
    if not isinstance(value, dict) or set(value) != {"n", "go"} or not isinstance(value["go"], bool):
        raise FrameError("field 'at' is not a job attempt")
    return attempt(value), value["go"]


def hosts(message: dict, key: str = "hosts") -> tuple[str, ...]:
    """The welcome's membership: the job's hosts in rank order, the lead first, as the lead knows them."""
    value = message.get(key)
    if (not isinstance(value, list) or len(value) > MAX_HOSTS
            or not all(isinstance(host, str) and 0 < len(host) <= 255 for host in value)):
        raise FrameError(f"field {key!r} is not a list of at most {MAX_HOSTS} host names")
    if len(set(value)) != len(value):
        raise FrameError(f"field {key!r} names a host twice")
    return tuple(value)


def active(message: dict, job: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """A go's active hosts: the attempt's hosts in rank order (its lead first), checked as the welcome's, all of the job."""
    value = hosts(message, "active")
    if not job and not value:  # a channel that names no hosts (a test's)
        return value
    if not value or not job or not set(value) <= set(job):
        raise FrameError("field 'active' is not a list of hosts of the job")
    return value


def spares(message: dict, job: tuple[str, ...] | list[str], active: tuple[str, ...]) -> tuple[str, ...]:
    """A go's spares: hosts of the job waiting for a seat, none of them active, in the order they are called."""
    value = hosts(message, "spares")
    if not set(value) <= set(job) or set(value) & set(active):
        raise FrameError("field 'spares' is not a list of the job's hosts outside the attempt's active ones")
    return value


def seats(attempt: Attempt) -> dict[str, list]:
    """A go's fields for ``attempt`` (its number goes as every message's): what ``active``, ``spares``, ``retired`` and
    ``causes`` read back."""
    return {"active": list(attempt.active), "spares": list(attempt.spares), "retired": list(attempt.retired),
            "causes": list(attempt.causes)}


def retired(message: dict, job: tuple[str, ...] | list[str], seated: tuple[str, ...]) -> tuple[str, ...]:
    """A go's retired hosts (none when absent): hosts of the job the lead no longer seats, neither active nor spare."""
    value = hosts(message, "retired") if "retired" in message else ()
    if not set(value) <= set(job) or set(value) & set(seated):
        raise FrameError("field 'retired' is not a list of the job's hosts outside the attempt's active ones and spares")
    return value


def causes(message: dict, job: tuple[str, ...] | list[str]) -> tuple[str | None, ...]:
    """A go's causes (none when absent): for the last earlier attempts, the host whose ranks caused each failure, or
    null (``MAX_CAUSES`` at most: the retire rule reads the last few)."""
    value = message.get("causes", [])
    if not isinstance(value, list) or len(value) > MAX_CAUSES or not all(_is_cause(item, job) for item in value):
        raise FrameError(f"field 'causes' is not a list of at most {MAX_CAUSES} of the job's hosts or nulls")
    return tuple(value)


def cause(message: dict, job: tuple[str, ...] | list[str]) -> str | None:
    """A restart's cause (null when absent): the host whose ranks failed, or null (no one host's)."""
    value = message.get("cause")
    if not _is_cause(value, job):
        raise FrameError("field 'cause' is neither a host of the job nor null")
    return value


def _is_cause(value: object, job: tuple[str, ...] | list[str]) -> bool:
    return value is None or (isinstance(value, str) and value in job)


def welcome_signed(job_id: str, intro: dict, at: dict, members: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """What a welcome's MAC covers (``mac``/``verify`` parts): the job's id, the lead's introduction,
    the job's attempt and its hosts."""
    return ("welcome", job_id, canonical(intro), canonical(at), canonical(list(members)))


def welcome(auth: bytes, job_id: str, intro: dict, at: dict, members: list[str]) -> dict:
    """The lead's welcome: the job's id, its introduction, where the job is (``at``) and its hosts, signed."""
    return {"t": "welcome", "job": job_id, "intro": intro, "at": at, "hosts": members,
            "mac": mac(auth, *welcome_signed(job_id, intro, at, members))}


def introduction(message: dict) -> dict[str, str]:
    """What a host tells the others about itself (e.g. its ssh host key): a small map of strings."""
    value = message.get("intro", {})
    if not isinstance(value, dict) or len(value) > MAX_INTRO_ITEMS:
        raise FrameError(f"field 'intro' is not a map of at most {MAX_INTRO_ITEMS} entries")
    for key, item in value.items():
        if not isinstance(item, str) or len(key) > 64 or len(item) > MAX_TEXT:
            raise FrameError("field 'intro' holds something other than short strings")
    return dict(value)


def introductions(message: dict, job: tuple[str, ...] | list[str]) -> dict[str, dict[str, str]]:
    """A go's introductions: each seated host's own (``introduction``'s rules), of hosts of the job only."""
    value = message.get("intros", {})
    if not isinstance(value, dict) or len(value) > MAX_HOSTS:
        raise FrameError(f"field 'intros' is not a map of at most {MAX_HOSTS} hosts")
    if job and not set(value) <= set(job):
        raise FrameError("field 'intros' names a host that is not the job's")
    return {host: introduction({"intro": intro}) for host, intro in value.items()}


def nonce() -> str:
    return secrets.token_hex(16)


def is_nonce(value: object) -> bool:
    return isinstance(value, str) and len(value) == 32 and all(ch in "0123456789abcdef" for ch in value)


# Keys ---------------------------------------------------------------------------------------------


class SessionKeys(NamedTuple):
    auth: bytes  # signs the hello and the welcome
    session: bytes  # signs every later message


class KeyExchange:
    """One side's ephemeral X25519 key for one join."""

    def __init__(self) -> None:
        self._private = X25519PrivateKey.generate()
        raw = self._private.public_key().public_bytes_raw()
        self.public = raw.hex()

    def keys(self, peer_public: object, secret: bytes | None, transcript: str) -> SessionKeys:
        if not isinstance(peer_public, str) or len(peer_public) != 64:
            raise FrameError("field 'kx' is not a key")
        try:
            shared = self._private.exchange(X25519PublicKey.from_public_bytes(bytes.fromhex(peer_public)))
        except ValueError:  # not hex, or a low-order point
            raise FrameError("field 'kx' is not an X25519 public key") from None
        okm = _hkdf(shared, _KDF_LABEL + b"|" + (secret or b""), transcript.encode(), 64)
        return SessionKeys(auth=okm[:32], session=okm[32:])


def _hkdf(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """HKDF-SHA256 (RFC 5869), written out: two HMAC calls, no import."""
    prk = hmac.new(hashlib.sha256(salt).digest(), ikm, hashlib.sha256).digest()
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


def transcript(server_nonce: str, client_nonce: str, server_kx: str, client_kx: str, host: str) -> str:
    return "|".join((server_nonce, client_nonce, server_kx, client_kx, host))


def mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()


def canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def verify(key: bytes, claimed: object, *parts: str) -> bool:
    if not isinstance(claimed, str) or not claimed.isascii():  # compare_digest refuses other text
        return False
    return hmac.compare_digest(claimed, mac(key, *parts))


# Signed messages ------------------------------------------------------------------------------------


def sign(key: bytes, seq: int, kind: str, fields: dict, shared: dict[str, str] | None = None) -> bytes:
    """A signed frame: ``encode`` of the fields, the kind, the sequence number and a MAC over their ``canonical`` text.

    ``shared``: more fields, each already as its ``canonical`` text (``shared_fields``), for a message sent alike
    on many links (a go listing every host's introduction): encoded once, not once per link.  The frame is
    byte for byte the one those fields would make as values.
    """
    parts = {name: canonical(value) for name, value in {**fields, "t": kind, "seq": seq}.items()}
    parts.update(shared or {})
    parts["mac"] = json.dumps(mac(key, _canonical_object(parts)))
    return (_canonical_object(parts) + "\n").encode()


def shared_fields(fields: dict) -> dict[str, str]:
    """Fields as ``sign`` takes them in ``shared``: each value's ``canonical`` text, made once."""
    return {name: canonical(value) for name, value in fields.items()}


def _canonical_object(parts: dict[str, str]) -> str:
    """``canonical`` of an object whose values are given as their canonical text (sorted keys, no spaces)."""
    return "{" + ",".join(f"{json.dumps(name)}:{text}" for name, text in sorted(parts.items())) + "}"


def open_signed(key: bytes, expected_seq: int, message: dict) -> dict:
    """A signed message's body, once its MAC and sequence number check out."""
    claimed = message.pop("mac", None)
    if not verify(key, claimed, canonical(message)):
        raise FrameError("message failed authentication")
    if message.get("seq") != expected_seq:
        raise FrameError("message out of sequence (replayed?)")
    if not isinstance(message.get("t"), str):
        raise FrameError("message has no type")
    return message
