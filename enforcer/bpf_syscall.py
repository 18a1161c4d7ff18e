"""BPF_PROG_TEST_RUN through the raw syscall (bcc's Python binding does not expose it).

The kernel plane changes its maps by running its `ctl` program on a crafted packet, so
that each change and its ring-buffer audit event happen in one kernel call.
"""

from __future__ import annotations

import ctypes as ct
import os
import platform

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_PROG_TEST_RUN = 10
ETH_HLEN = 14

_libc = ct.CDLL(None, use_errno=True)


class _TestAttr(ct.Structure):
    _fields_ = [
        ("prog_fd", ct.c_uint32),
        ("retval", ct.c_uint32),
        ("data_size_in", ct.c_uint32),
        ("data_size_out", ct.c_uint32),
        ("data_in", ct.c_uint64),
        ("data_out", ct.c_uint64),
        ("repeat", ct.c_uint32),
        ("duration", ct.c_uint32),
        ("ctx_size_in", ct.c_uint32),
        ("ctx_size_out", ct.c_uint32),
        ("ctx_in", ct.c_uint64),
        ("ctx_out", ct.c_uint64),
        ("flags", ct.c_uint32),
        ("cpu", ct.c_uint32),
        ("batch_size", ct.c_uint32),
        ("pad", ct.c_uint32),
    ]


def prog_test_run(prog_fd: int, payload: bytes) -> int:
    """Run a SCHED_CLS program once on `ETH_HLEN` zero bytes + payload; returns its retval."""
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:
        raise OSError(f"BPF_PROG_TEST_RUN: unsupported architecture {platform.machine()}")
    data = (ct.c_char * (ETH_HLEN + len(payload))).from_buffer_copy(b"\x00" * ETH_HLEN + payload)
    attr = _TestAttr(prog_fd=prog_fd, data_size_in=ct.sizeof(data), data_in=ct.addressof(data), repeat=1)
    rc = _libc.syscall(nr, BPF_PROG_TEST_RUN, ct.byref(attr), ct.sizeof(attr))
    if rc < 0:
        err = ct.get_errno()
        raise OSError(err, f"BPF_PROG_TEST_RUN failed: {os.strerror(err)}")
    return int(attr.retval)
