"""The agent's side of attestation: its host's TPM through tpm2-tools (Debian `tpm2-tools`).

    tpm = HostTpm("device:/dev/tpmrm0", Path("/var/lib/policyc-agent"))   # or swtpm:host=…,port=…
    ak_pub = tpm.attestation_key()       # TPM2B_PUBLIC; made once, kept (wrapped by the TPM) in the state dir
    quote = tpm.quote(nonce, (0, 1, 2, 7))

The attestation key (AK) is an ECC P-256 key made under the owner hierarchy's primary key,
restricted to signing what the TPM itself produces (`restricted|sign`), that never leaves
the TPM (`fixedtpm|fixedparent|sensitivedataorigin`); its private part is kept only in the
TPM's wrapped form. The primary key is re-derived from the TPM's seed for each use and
every transient object is flushed after each command (a TPM has few object slots).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from .tpm_quote import Quote, selection_text

AK_ATTRIBUTES = "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|restricted|sign"
TIMEOUT = 20.0  # seconds for one tpm2-tools command (a software TPM answers in milliseconds)


class TpmError(RuntimeError):
    """A tpm2-tools command failed: the message names it and the TPM's reason."""


class HostTpm:
    def __init__(self, tcti: str, state_dir: Path) -> None:
        self.tcti = tcti
        self.dir = Path(state_dir)

    def _run(self, *argv: str) -> None:
        env = {**os.environ, "TPM2TOOLS_TCTI": self.tcti}
        try:
            out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=TIMEOUT)
        except FileNotFoundError:
            raise TpmError(f"{argv[0]} is not installed (Debian: apt-get install tpm2-tools)") from None
        except subprocess.TimeoutExpired:
            raise TpmError(f"{argv[0]}: the TPM at `{self.tcti}` did not answer within {TIMEOUT:g} s") from None
        if out.returncode != 0:
            lines = [x for x in out.stderr.splitlines() if x.startswith("ERROR")] or out.stderr.splitlines() or ["no output"]
            raise TpmError(f"{argv[0]} (TPM `{self.tcti}`): {lines[-1].strip()}")

    def _flush(self) -> None:
        self._run("tpm2_flushcontext", "-t")

    def _load_ak(self, work: Path) -> Path:
        """The owner primary (re-derived from the TPM's seed), then the AK under it; both
        contexts in `work`; transient slots flushed after each step."""
        primary, ak = work / "primary.ctx", work / "ak.ctx"
        self._run("tpm2_createprimary", "-Q", "-C", "o", "-g", "sha256", "-G", "ecc", "-c", str(primary))
        self._flush()
        self._run("tpm2_load", "-Q", "-C", str(primary), "-u", str(self.dir / "ak.pub"), "-r", str(self.dir / "ak.priv"),
                  "-c", str(ak))
        self._flush()
        return ak

    def attestation_key(self) -> bytes:
        """The AK's TPM2B_PUBLIC: made on first use, read from the state dir afterwards."""
        pub, priv = self.dir / "ak.pub", self.dir / "ak.priv"
        if not (pub.exists() and priv.exists()):
            self.dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=self.dir) as tmp:
                work = Path(tmp)
                self._run("tpm2_createprimary", "-Q", "-C", "o", "-g", "sha256", "-G", "ecc", "-c", str(work / "primary.ctx"))
                self._flush()
                self._run("tpm2_create", "-Q", "-C", str(work / "primary.ctx"), "-G", "ecc:ecdsa-sha256:null", "-g", "sha256",
                          "-u", str(work / "ak.pub"), "-r", str(work / "ak.priv"), "-a", AK_ATTRIBUTES)
                self._flush()
                os.replace(work / "ak.priv", priv)
                os.replace(work / "ak.pub", pub)
        return pub.read_bytes()

    def quote(self, nonce: bytes, pcrs: tuple[int, ...]) -> Quote:
        """A quote over `pcrs` (SHA-256 bank) carrying `nonce`, with the PCR values it covers."""
        self.attestation_key()
        with tempfile.TemporaryDirectory(dir=self.dir) as tmp:
            work = Path(tmp)
            ak = self._load_ak(work)
            self._run("tpm2_quote", "-Q", "-c", str(ak), "-l", selection_text(pcrs), "-q", nonce.hex(), "-g", "sha256",
                      "-m", str(work / "quote.msg"), "-s", str(work / "quote.sig"), "-o", str(work / "quote.pcrs"),
                      "-F", "values")
            self._flush()
            values = (work / "quote.pcrs").read_bytes()
            if len(values) != 32 * len(pcrs):
                raise TpmError(f"tpm2_quote wrote {len(values)} bytes of PCR values for {len(pcrs)} PCRs")
            return Quote((work / "quote.msg").read_bytes(), (work / "quote.sig").read_bytes(),
                         tuple(values[i:i + 32] for i in range(0, len(values), 32)))

    def extend(self, pcr: int, data: bytes) -> None:
        """Extend a PCR with SHA-256 of `data` (what a boot stage measuring itself does)."""
        import hashlib

        self._run("tpm2_pcrextend", f"{pcr}:sha256={hashlib.sha256(data).hexdigest()}")
