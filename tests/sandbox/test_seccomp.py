"""The seccomp filter built with libseccomp: this machine's architecture only, x32 refused."""

from __future__ import annotations

import platform
import struct

import pytest

from sandbank.sandbox.backends.base import ISOLATION
from sandbank.sandbox.host import seccomp
from tests.sandbox.conftest import Shell

pytestmark = [pytest.mark.anyio, pytest.mark.claims(ISOLATION)]

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
