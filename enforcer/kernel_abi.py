"""The byte layouts shared with `kernel/enforcer.bpf.c`, mirrored in ctypes.

Kept in one file so that a change to a C struct has exactly one Python counterpart to edit.
"""

from __future__ import annotations

import ctypes as ct
from enum import IntEnum

from policyc.enforcer.endpoint import Endpoint


class CEndpoint(ct.Structure):
    _fields_ = [("addr", ct.c_uint32 * 4), ("port", ct.c_uint16), ("pad", ct.c_uint16)]

    @staticmethod
    def of(ep: Endpoint) -> "CEndpoint":
        c = CEndpoint()
        ct.memmove(ct.addressof(c), ep.packed16(), 16)
        c.port = ep.port
        return c

    def endpoint(self) -> Endpoint:
        return Endpoint.from_packed16(bytes(self)[:16], self.port)


class CEvent(ct.Structure):
    _fields_ = [
        ("ts_ns", ct.c_uint64),
        ("kind", ct.c_uint32),
        ("op", ct.c_uint32),
        ("rule", ct.c_uint32),
        ("stream_id", ct.c_uint32),
        ("flags", ct.c_uint32),
        ("result", ct.c_int32),
        ("a", CEndpoint),
        ("b", CEndpoint),
        ("value", ct.c_uint64),
        ("value2", ct.c_uint64),
    ]


class CCtlCmd(ct.Structure):
    _fields_ = [
        ("op", ct.c_uint32),
        ("rule", ct.c_uint32),
        ("key", CEndpoint),
        ("val", CEndpoint),
        ("arg", ct.c_uint64),
        ("arg2", ct.c_uint64),
    ]


class EventKind(IntEnum):
    STREAM_DONE = 1
    CONNECT_REDIRECT = 2
    TC_DROP = 3
    MAP_CHANGE = 4
    H2_DESYNC = 5


class MapOp(IntEnum):
    QUARANTINE_SET = 1
    QUARANTINE_DEL = 2
    BACKEND_SET = 3
    BACKEND_DEL = 4
    RULE_SET = 5
    RULE_DEL = 6
    CONFIG_SET = 7


class ConfigSlot(IntEnum):
    TC_DROP_QUARANTINED = 0
    STREAM_BUDGET_NS = 1


STREAM_F_RST = 1
STREAM_F_OVER_BUDGET = 2


class CFlowKey(ct.Structure):
    _fields_ = [("src", CEndpoint), ("dst", CEndpoint), ("proto", ct.c_uint8), ("hook", ct.c_uint8), ("pad", ct.c_uint16)]


class CBackendKey(ct.Structure):
    _fields_ = [("id", ct.c_uint32), ("hook", ct.c_uint8), ("toward", ct.c_uint8), ("pad", ct.c_uint16)]
