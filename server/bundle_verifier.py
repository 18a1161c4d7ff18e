"""One trust policy for every way a bundle reaches the service.

`policyc serve --bundle B --public-key K` promises that only bundles signed by K serve.
That promise holds only if the start, `ReloadBundle(bundle_json=…)`,
`ReloadBundle(path=…)` and SIGHUP all load through the same check, so the service holds
one `BundleVerifier` and every path calls it: bounded read of a regular file, JSON,
schema, hash, the signature when a key is configured (an unsigned bundle is then
refused), and the compiler's own semantic checks (`compiler/revalidate.py`).

Loading is CPU- and I/O-bound (a 35 MB bundle is about a second), so the service calls
these methods from a worker thread, never on the serving loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from policyc.compiler import bundle_io
from policyc.compiler.bundle import Bundle

BundleError = bundle_io.BundleError


@dataclass(frozen=True)
class BundleVerifier:
    """`public_key`: when set, every bundle must carry a signature that verifies with it."""

    public_key: Ed25519PublicKey | None = None

    @property
    def requires_signature(self) -> bool:
        return self.public_key is not None

    def load_path(self, path: str | Path) -> Bundle:
        """A bundle file, verified; BundleError names the file and the problem."""
        return bundle_io.load(path, public_key=self.public_key)

    def load_text(self, text: str | bytes, origin: str = "<bundle>") -> Bundle:
        """A bundle's JSON as received (ReloadBundle's `bundle_json`), verified."""
        return bundle_io.loads(text, origin=origin, public_key=self.public_key)
