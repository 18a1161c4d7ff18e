"""The operator token a decision service makes for itself, and where a client on the same
machine finds it (as Jupyter's token: a secret in a file only its user can read).

Changing the fleet or the bundle (`RegisterInstance`, `DeregisterInstance`, `ReloadBundle`)
needs the operator role, loopback included: loopback is no boundary on a shared host. When
the operator gives no `--token operator:…` of their own, the service makes one at its first
start and keeps it in a file of mode 0600:

- a service with a state dir (the embedded default's `~/.local/state/policyc/serve-PORT`,
  or `--state-dir DIR`; a replica on a fixed port uses the default path for its port):
  `STATE_DIR/operator-token`, reused on every restart;
- a throw-away service (`--port 0`, `--state-dir none`): made anew at each start.

Either way the service publishes it in its runtime entry `RUNTIME/serve-PORT/operator-token`
under the user's runtime dir (`$XDG_RUNTIME_DIR/policyc`, else `/tmp/policyc-UID`, a
directory of mode 0700 that must belong to the user), keyed by the bound port, replaced at
each start and removed at stop: one place per port where a client looks first.

`find_for(server)` is the other side: for a loopback `host:port` it returns the token of the
service on that port from the runtime entry, then the default state dir. It sends nothing
to a listener another user owns (`/proc/net/tcp*` names the owner of a loopback listener),
so a process squatting a port cannot collect the token.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = "operator-token"
_TOKEN = re.compile(r"^[A-Za-z0-9_\-.~+/=]{16,256}$")


class TokenFileError(ValueError):
    """A token file or directory the service refuses to use (wrong owner, readable by others,
    not a token), with its path and the fix."""


@dataclass(frozen=True)
class OperatorToken:
    token: str
    path: Path | None  # the file it is in; None: given by the operator (`--token operator:…`)
    runtime: Path | None = None  # the runtime entry's copy for the bound port, removed at stop

    def published(self, port: int) -> "OperatorToken":
        """This token also in the runtime entry of `port`, where the CLI looks first (a kept
        token's state dir is not always the default one of its port: `--port 0 --state-dir D`)."""
        if self.path is None or self.runtime is not None:
            return self
        return OperatorToken(self.token, self.path, _write_entry(port, self.token))

    def remove(self) -> None:
        """The runtime entry's file and its directory, at stop (a kept file stays)."""
        if self.runtime is None:
            return
        try:
            self.runtime.unlink()
            self.runtime.parent.rmdir()
        except OSError:
            pass


def runtime_dir() -> Path:
    """The user's private runtime directory for policyc (made 0700 when absent)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "policyc" if xdg and Path(xdg).is_dir() else Path("/tmp") / f"policyc-{os.getuid()}"


def runtime_entry(port: int) -> Path:
    return runtime_dir() / f"serve-{port}"


def _private_dir(d: Path) -> None:
    """`d` exists, is a directory of this user and nobody else can enter it (a directory
    another user made first in /tmp would let them read or swap the token)."""
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise TokenFileError(f"{d}: not a directory (the operator token's place)")
    if st.st_uid != os.getuid():
        raise TokenFileError(f"{d}: belongs to uid {st.st_uid}, not to this user ({os.getuid()}); "
                             "the operator token cannot be kept there (remove it, or set XDG_RUNTIME_DIR)")
    if st.st_mode & 0o077:
        os.chmod(d, 0o700)


def read_token_file(path: Path) -> str:
    """The token in `path`, refused when others could have read it or it is not a token."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise TokenFileError(f"{path}: cannot read the token file ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TokenFileError(f"{path}: not a regular file")
        if st.st_mode & 0o077:
            raise TokenFileError(f"{path}: mode {stat.S_IMODE(st.st_mode):o} lets other users read the token; "
                                 "`chmod 600` it (or delete it: a new one is made at start)")
        data = os.read(fd, 1024)
    finally:
        os.close(fd)
    text = data.decode("ascii", "replace").strip()
    if not _TOKEN.match(text):
        raise TokenFileError(f"{path}: not a token (16 to 256 URL-safe characters)")
    return text


def _write_new(path: Path, token: str, *, replace: bool) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    if replace and os.path.lexists(tmp):  # left by a killed process that had this pid
        os.unlink(tmp)
    fd = os.open(tmp if replace else path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if replace:
        os.replace(tmp, path)


def kept(state_dir: Path) -> OperatorToken:
    """The token kept in `state_dir` (made at the first start, reused on every restart)."""
    _private_dir(state_dir)
    path = state_dir / FILE_NAME
    if not os.path.lexists(path):
        try:
            _write_new(path, secrets.token_urlsafe(32), replace=False)
        except FileExistsError:  # another start made it meanwhile: use that one
            pass
    return OperatorToken(read_token_file(path), path)


def _write_entry(port: int, token: str) -> Path:
    d = runtime_entry(port)
    _private_dir(d.parent)
    _private_dir(d)
    _write_new(d / FILE_NAME, token, replace=True)  # a killed service's stale entry for this port is replaced
    return d / FILE_NAME


def ephemeral(port: int) -> OperatorToken:
    """A new token for a throw-away service on `port`, in its runtime entry."""
    token = secrets.token_urlsafe(32)
    path = _write_entry(port, token)
    return OperatorToken(token, path, path)


# ---------------------------------------------------------------------- the client's side

def _split(server: str) -> tuple[str, int] | None:
    host, sep, port = server.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def is_loopback_name(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listener_uid(port: int) -> int | None:
    """The uid owning a TCP socket listening on `port` on this machine (any address), from
    /proc/net/tcp and tcp6; None when unknown (no such listener, not Linux)."""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if len(cols) > 7 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        return int(cols[7])
        except OSError:
            continue
    return None


def candidates(port: int) -> tuple[Path, ...]:
    """Where the token of the service on `port` may be, in the order looked at."""
    from policyc.cluster.serve_flags import default_state_dir

    kept_dir = default_state_dir(port)
    return (runtime_entry(port) / FILE_NAME,) + ((kept_dir / FILE_NAME,) if kept_dir is not None else ())


def find_for(server: str) -> tuple[str, Path] | None:
    """The operator token of the service at `server` (a loopback `host:port`) and its file,
    or None: not loopback, no file, or a listener that belongs to another user. A file that
    exists but is refused (readable by others) raises TokenFileError: said, not skipped."""
    where = _split(server)
    if where is None or not is_loopback_name(where[0]):
        return None
    owner = listener_uid(where[1])
    if owner is not None and owner != os.getuid():
        return None
    for path in candidates(where[1]):
        if os.path.lexists(path):
            return read_token_file(path), path
    return None
