"""Isolation: each test tries an escape from inside a real sandbox and asserts it fails."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading

import pytest

from sandbank.sandbox.backends.base import ISOLATION
from sandbank.sandbox.local import LocalSandboxes
from tests.sandbox.conftest import NOT_GVISOR, Shell
from tests.support import REPO

pytestmark = [pytest.mark.anyio, pytest.mark.claims(ISOLATION)]

SYSCALL_PROBE = """
import ctypes, errno, json
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    return r, errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
out = {
    "unshare_user": call(272, 0x10000000),
    "unshare_net": call(272, 0x40000000),
    "setns": call(308, 0, 0),
    "mount": call(165, 0, 0, 0, 0, 0),
    "ptrace_attach_1": call(101, 16, 1, 0, 0),
    "bpf": call(321, 0, 0, 0),
    "perf_event_open": call(298, 0, 0, -1, -1, 0),
    "keyctl": call(250, 0, 0, 0, 0, 0),
    "add_key": call(248, 0, 0, 0, 0, 0),
    "io_uring_setup": call(425, 1, 0),
    "init_module": call(175, 0, 0, 0),
    "finit_module": call(313, -1, 0, 0),
    "delete_module": call(176, 0, 0),
    "kexec_load": call(246, 0, 0, 0, 0),
    "kexec_file_load": call(320, -1, -1, 0, 0, 0),
    "pivot_root": call(155, 0, 0),
    "clone_newuser": call(56, 0x10000000 | 17, 0, 0, 0, 0),
    "userfaultfd": call(323, 0),
}
print(json.dumps(out))
"""


@pytest.mark.only_backends(*NOT_GVISOR)  # gVisor's kernel answers these (test_gvisor.py)
async def test_seccomp_denies_namespace_mount_ptrace_bpf_perf_keyctl_iouring_modules_kexec(
    sb: Shell,
) -> None:
    r = await sb.py(SYSCALL_PROBE)
    assert r.return_code == 0, r.stderr
    results = json.loads(r.stdout)
    for name, (ret, err) in results.items():
        assert ret == -1 and err == "EPERM", (name, ret, err)
    status = (
        await sb.sh("grep -E '^(Seccomp|NoNewPrivs|CapEff|CapPrm|CapBnd):' /proc/self/status")
    ).stdout
    assert "Seccomp:\t2" in status and "NoNewPrivs:\t1" in status
    assert "CapEff:\t0000000000000000" in status and "CapPrm:\t0000000000000000" in status


async def test_no_network_at_all(sb: Shell) -> None:
    r = await sb.py(
        "import socket\n"
        "for addr in [('1.1.1.1', 53), ('10.0.0.1', 80)]:\n"
        "    s = socket.socket(); s.settimeout(2)\n"
        "    try:\n"
        "        s.connect(addr); print('CONNECTED', addr)\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
        "print(sorted(n for _, n in socket.if_nameindex()))"
    )
    assert "CONNECTED" not in r.stdout
    assert r.stdout.count("refused") == 2
    assert r.stdout.strip().endswith("['lo']")


async def test_the_hosts_loopback_and_the_servers_port_are_unreachable(sb: Shell) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # closed at the end of the test
            accepted.append(listener.accept())

    threading.Thread(target=accept, daemon=True).start()
    try:
        r = await sb.py(
            "import socket\ns = socket.socket(); s.settimeout(2)\n"
            f"try:\n    s.connect(('127.0.0.1', {port})); print('CONNECTED')\n"
            "except OSError as e:\n    print('refused', e.errno)"
        )
        assert "refused" in r.stdout and not accepted
    finally:
        listener.close()


async def test_host_files_are_invisible(sb: Shell, runtime: LocalSandboxes) -> None:
    data_dir = runtime.settings.data_dir.resolve()
    probes = [
        "/etc/shadow", "/root", "/var", "/srv", "/run", "/sys",
        str(REPO), str(REPO / "src"), str(data_dir), str(data_dir / "sandboxes"),
        os.path.expanduser("~"),
    ]  # fmt: skip
    if runtime.settings.isolation == "gvisor":
        probes.remove("/sys")  # gVisor always mounts its own, synthetic: nothing of the host's
    r = await sb.py(
        f"import os, json\nprint(json.dumps({{p: os.path.exists(p) for p in {probes!r}}}))"
    )
    seen = json.loads(r.stdout)
    assert not any(seen.values()), seen
    # /home holds the link E2B's user home is (to the workspace), nothing of the host's.
    r = await sb.py("import os\nprint(os.listdir('/home'), os.readlink('/home/user'))")
    assert r.stdout == "['user'] /workspace\n", r.stderr
    r = await sb.sh("touch /usr/evil /opt/sandbank/runtime/evil /evil 2>&1; echo $?")
    if runtime.settings.isolation == "gvisor":
        # gVisor checks permissions before the mount's flags: EACCES, on read-only mounts
        assert r.stdout.count("Permission denied") == 3 and r.stdout.strip().endswith("1")
        mounts = (await sb.sh("cat /proc/mounts")).stdout.splitlines()
        for point in ("/", "/usr", "/opt/sandbank/runtime"):
            options = [m.split()[3] for m in mounts if m.split()[1] == point]
            assert options and all(o.split(",")[0] == "ro" for o in options), (point, mounts)
    else:
        assert "Read-only file system" in r.stdout and r.stdout.strip().endswith("1")


async def test_other_sessions_workspaces_are_invisible(runtime: LocalSandboxes) -> None:
    a = Shell(runtime, await runtime.create("tests"))
    b = Shell(runtime, await runtime.create("tests"))
    try:
        await a.sh("echo secret-of-a > private.txt")
        a_host = str(a.session.sandbox.workspace)
        r = await b.sh(
            f"ls {a_host} 2>&1; cat {a_host}/private.txt 2>&1; "
            # /usr and the runtime image are read-only images older than the secret (grepping
            # the image's 3 GiB took ~6 s a backend and could find nothing).
            "grep -rs 'secret-of-[a]' / --exclude-dir=proc --exclude-dir=usr "
            "--exclude-dir=runtime 2>/dev/null | head -1; true"
        )
        assert "secret-of-a" not in r.stdout
        assert (await b.sh("ls /workspace")).stdout == ""
        assert a.session.sandbox.uid != b.session.sandbox.uid
    finally:
        await runtime.destroy(a.session.id, "tests")
        await runtime.destroy(b.session.id, "tests")


async def test_own_pid_namespace_and_unprivileged_uid(sb: Shell) -> None:
    r = await sb.py(
        "import os, json\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        f"try:\n    os.kill({os.getpid()}, 0); reach = 'reached'\n"
        "except OSError as e:\n    reach = e.errno\n"
        "print(json.dumps([pids, os.getuid(), os.geteuid(), os.getgid(), reach]))"
    )
    pids, uid, euid, gid, reach = json.loads(r.stdout)
    assert max(pids) < 50 and len(pids) < 10  # only the sandbox's own processes
    assert uid == euid == gid == sb.session.sandbox.uid and uid >= 1000
    # Our server's pid does not exist inside: no host process can be signalled.
    if os.getpid() in pids:
        assert reach == "reached"  # a sandbox process with the same number, not us
    else:
        assert reach == 3  # ESRCH


async def test_clean_environment_no_server_secrets_reach_the_sandbox(
    runtime: LocalSandboxes, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = "canary-7f3e9a1c-do-not-leak"
    monkeypatch.setenv("SANDBANK_CANARY_SECRET", canary)
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    secret_file = runtime.settings.data_dir / "canary.key"
    secret_file.write_text(canary)
    secret_file.chmod(0o644)  # even world-readable, it is not mounted
    leaked_fd = os.open(secret_file, os.O_RDONLY)
    os.set_inheritable(leaked_fd, True)
    sh = Shell(runtime, await runtime.create("tests"))
    try:
        r = await sh.sh(
            "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c canary-7f3e; "
            "env | grep -c canary; ls -l /proc/self/fd /proc/1/fd 2>/dev/null; "
            # The pattern is written so it does not match this command's own text.
            "echo GREP:; grep -rl -D skip -e 'canary-7f3e9a1c-do-not-lea[k]' / --exclude-dir=proc "
            "--exclude-dir=sys --exclude-dir=usr --exclude-dir=runtime 2>/dev/null | head -3; true"
        )
        assert r.stdout.startswith("0\n0\n")
        assert str(secret_file) not in r.stdout and "canary" not in r.stdout
        assert r.stdout.endswith("GREP:\n"), r.stdout
    finally:
        os.close(leaked_fd)
        await runtime.destroy(sh.session.id, "tests")


async def test_the_sandbox_reads_no_host_path_and_no_server_state(
    sb: Shell, runtime: LocalSandboxes
) -> None:
    r = await sb.sh(
        "cat /proc/self/mountinfo /proc/1/cmdline /proc/1/environ "
        "/opt/sandbank/runtime/pyvenv.cfg /opt/sandbank/runtime/bin/activate | tr '\\0' '\\n'"
    )
    assert r.return_code == 0, r.stderr
    data_dir = str(runtime.settings.data_dir.resolve())
    leaks = (data_dir, str(REPO), str(runtime.backend.runtime_dir), sb.session.sandbox.id, "/run/")
    for leak in leaks:
        assert leak not in r.stdout, leak
    assert "PWD=" not in r.stdout and "/sandboxes/" not in r.stdout


# One backend is enough: every isolated backend mounts the same runtime image at the same path
# (their mounts are tested above). What is checked is that each script's interpreter line
# starts an interpreter inside: a `sitecustomize` on PYTHONPATH ends each Python as it starts
# (each tool's own imports under --help took ~35 s of the suite for the same answer).
@pytest.mark.only_backends("fork", "none", "fake")
async def test_every_console_script_of_the_runtime_runs_inside(sb: Shell) -> None:
    r = await sb.sh(
        "mkdir -p /tmp/stop; echo 'raise SystemExit(0)' > /tmp/stop/sitecustomize.py; "
        "cd /opt/sandbank/runtime/bin; for f in *; do "
        "case $(head -c 2 $f) in '#!') ;; *) continue;; esac; "
        "case $f in activate*|Activate*) continue;; esac; "
        "PYTHONPATH=/tmp/stop timeout 20 ./$f --help >/dev/null 2>/tmp/err; rc=$?; "
        'echo "$f $rc $(head -c 200 /tmp/err | tr "\\n" " ")"; done',
        timeout=300,  # some seventy scripts
    )
    scripts = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert {"pip", "f2py", "fonttools"} <= set(scripts), r.stdout
    for name, outcome in scripts.items():
        rc = int(outcome.split()[0])
        assert rc not in (126, 127) and "bad interpreter" not in outcome, (name, outcome)
    r = await sb.py(
        "import subprocess\n"
        "print(subprocess.run(['pip', 'list'], capture_output=True, text=True).stdout)"
    )
    assert "pandas" in r.stdout and "numpy" in r.stdout


async def test_pip_install_fails_at_once_saying_who_installs_packages(sb: Shell) -> None:
    for command in ("pip install sb-no-such-package", "python3 -m pip install sb-no-such-package"):
        r = await sb.sh(command, timeout=20)
        assert r.return_code != 0, command
        assert r.duration_ms < 15000
    r = await sb.sh("pip install sb-no-such-package")
    assert "installed by the server's operator" in r.stderr
