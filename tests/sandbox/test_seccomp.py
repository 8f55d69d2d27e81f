"""The seccomp filter built with libseccomp: this machine's architecture only, x32 refused."""

from __future__ import annotations

import json
import platform
import struct

import pytest

from sandbank.sandbox.backends.base import ISOLATION
from sandbank.sandbox.host import seccomp
from tests.sandbox.conftest import NOT_GVISOR, Shell

# The host's seccomp filter: gVisor's kernel answers user code instead (test_gvisor.py).
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.claims(ISOLATION),
    pytest.mark.only_backends(*NOT_GVISOR),
]

X86_64 = platform.machine() == "x86_64"


def test_the_filter_checks_the_architecture_first_and_kills_any_other() -> None:
    program = seccomp.build_filter()
    insns = [struct.unpack("HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    assert insns[0] == (0x20, 0, 0, 4)  # load seccomp_data.arch
    code, _, jf, arch = insns[1]
    assert code == 0x15 and arch == seccomp.ARCHES[platform.machine()]
    assert insns[1 + 1 + jf] == (0x06, 0, 0, seccomp.SCMP_ACT_KILL_PROCESS)


@pytest.mark.skipif(not X86_64, reason="the x32 ABI exists on x86_64 only")
async def test_a_call_through_the_x32_abi_kills_the_caller(sb: Shell) -> None:
    r = await sb.py(
        "import subprocess, sys\n"
        "code = 'import ctypes; ctypes.CDLL(None).syscall(0x40000000 | 39); print(\"alive\")'\n"
        "p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)\n"
        "print(p.returncode, p.stdout.strip())"
    )
    assert r.stdout == "-31 \n", r  # SIGSYS, before the call could run


FAMILY_PROBE = """
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
SOCKET, SOCKETPAIR = 41, 53
def call(nr, family, kind):
    ctypes.set_errno(0)
    pair = (ctypes.c_int * 2)()
    extra = [ctypes.byref(pair)] if nr == SOCKETPAIR else []
    r = libc.syscall(nr, ctypes.c_long(family), kind, 0, *extra)
    if r < 0:
        return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
    for fd in ([r] if nr == SOCKET else list(pair)):
        os.close(fd)
    return "ok"
kinds = [socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET]
families = list(range(70)) + [128, 255, 1024, 2**31 - 1]
# The kernel reads an int: garbage in the upper half must not smuggle vsock (40) or packet (17).
families += [(1 << 32) | 40, (1 << 40) | 17, (1 << 63) | 40]
out = {}
for nr, name in ((SOCKET, "socket"), (SOCKETPAIR, "socketpair")):
    for family in families:
        out[f"{name} {family}"] = sorted({call(nr, family, k) for k in kinds})
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    out["python vsock"] = "created"
except OSError as e:
    out["python vsock"] = errno.errorcode[e.errno]
print(json.dumps(out))
"""


async def test_only_unix_ip_and_netlink_sockets_can_be_made_vsock_packet_alg_and_the_rest_refused(
    sb: Shell,
) -> None:
    r = await sb.py(FAMILY_PROBE)
    assert r.return_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out.pop("python vsock") == "EAFNOSUPPORT"
    allowed = {1, 2, 10, 16}
    for probe, errors in out.items():
        _, family = probe.split()
        if int(family) in allowed:
            # The family passes the filter; the kernel may still refuse a type (raw IP:
            # EPERM without CAP_NET_RAW) or socketpair (EOPNOTSUPP) itself.
            assert "EAFNOSUPPORT" not in errors, probe
        else:
            assert errors == ["EAFNOSUPPORT"], (probe, errors)
    assert "ok" in out["socketpair 1"] and "ok" in out["socket 2"] and "ok" in out["socket 16"]


NEW_CALLS_PROBE = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
me = libc.syscall(434, os.getpid(), 0)  # pidfd_open of itself: allowed
print(json.dumps({
    "pidfd_open": "ok" if me >= 0 else "refused",
    "pidfd_getfd": call(438, me, 0, 0),
    "process_madvise": call(440, me, 0, 0, 0, 0),
    "process_mrelease": call(448, me, 0),
    "quotactl_fd": call(443, 0, 0, 0, 0),
    "memfd_secret": call(447, 0),
    "cachestat": call(451, 0, 0, 0, 0),
    "statmount": call(457, 0, 0, 0, 0),
    "listmount": call(458, 0, 0, 0, 0),
    "open_tree_attr": call(467, -100, 0, 0, 0, 0),
    "fanotify_init": call(300, 0, 0),
    "unreviewed 470": call(470),
    "unreviewed 511": call(511),
    "close_range": call(436, 1000, 1010, 0),
}))
"""


@pytest.mark.skipif(not X86_64, reason="the probe uses x86_64 numbers for the older calls")
async def test_calls_added_since_the_list_was_written_are_refused_or_reviewed(sb: Shell) -> None:
    r = await sb.py(NEW_CALLS_PROBE)
    assert r.return_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out.pop("pidfd_open") == "ok" and out.pop("close_range") == "ok"
    assert out.pop("unreviewed 470") == "ENOSYS" and out.pop("unreviewed 511") == "ENOSYS"
    assert out == dict.fromkeys(out, "EPERM"), out
