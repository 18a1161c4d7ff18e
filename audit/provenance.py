"""What an auditor's report must name besides the log: the bundle that was in force and
whether its signature was checked, the revision of the policy sources, the policyc that
wrote the report, and when and by whom it was generated.

The bundle is read through `compiler.bundle_io` (hash and signature verified there); the
sources are only fingerprinted (a git revision, or a digest of the `.contract` files' bytes),
never parsed: the audit side reads bundles, not policy source.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .errors import AuditInputError


def policyc_version() -> str:
    """The installed distribution's version (the package's own as a fallback)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("policyc")
    except PackageNotFoundError:
        from policyc import __version__

        return str(__version__)


def generated_by() -> str:
    """user@host of the process writing the report."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True, slots=True)
class BundleState:
    """A bundle file the auditor names (`--bundle`): its hash and what its signature showed."""

    path: str
    content_hash: str
    compiler_version: str
    signature: str  # "verified" | "not checked" | "unsigned" | "invalid"
    detail: str

    @property
    def verified(self) -> bool:
        return self.signature == "verified"


def bundle_state(path: str, public_key: Ed25519PublicKey | None) -> BundleState:
    """Load the bundle at `path` (its hash always checked); with `public_key`, its
    signature too. A bundle that fails its hash raises AuditInputError; one whose
    signature fails is reported `invalid` (the report is red)."""
    from policyc.compiler import bundle_io

    try:
        bundle = bundle_io.load(path)
    except bundle_io.BundleError as e:
        raise AuditInputError(f"--bundle: {e}") from None
    if bundle.signature is None:
        return BundleState(path, bundle.content_hash, bundle.compiler_version, "unsigned", "the bundle carries no signature")
    if public_key is None:
        return BundleState(path, bundle.content_hash, bundle.compiler_version, "not checked",
                           f"signed by key {bundle.signature.public_key[:16]}...; no --bundle-key given to check it")
    try:
        bundle_io.load(path, public_key=public_key)
    except bundle_io.BundleError as e:
        return BundleState(path, bundle.content_hash, bundle.compiler_version, "invalid", str(e))
    return BundleState(path, bundle.content_hash, bundle.compiler_version, "verified",
                       f"signature verified with the given key ({bundle.signature.public_key[:16]}...)")


def sources_revision(directory: str) -> str:
    """The policy sources' revision: `git <commit>` (`+dirty` when the tree differs from
    it), or, outside git, `sha256 <digest>` over the `.contract` files' paths and bytes."""
    d = Path(directory)
    if not d.is_dir():
        raise AuditInputError(f"--sources {directory}: not a directory")
    try:
        head = subprocess.run(["git", "-C", str(d), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=20)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(d), "status", "--porcelain", "--", "."], capture_output=True, text=True, timeout=20)
            return f"git {head.stdout.strip()}" + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    h = hashlib.sha256()
    files = sorted(p for p in d.rglob("*.contract") if p.is_file())
    if not files:
        raise AuditInputError(f"--sources {directory}: no .contract file under it and not a git checkout")
    for p in files:
        h.update(str(p.relative_to(d)).encode() + b"\0")
        try:
            h.update(p.read_bytes())
        except OSError as e:
            raise AuditInputError(f"{p}: cannot read: {e.strerror}") from None
        h.update(b"\0")
    return f"sha256 {h.hexdigest()} over {len(files)} .contract file(s)"
