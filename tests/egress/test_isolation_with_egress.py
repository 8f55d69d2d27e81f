"""Every isolation test of tests/sandbox, run again in sandboxes that have an egress policy."""

from __future__ import annotations

import pytest

from tests.sandbox.conftest import sb, session
from tests.sandbox.test_isolation import (
    test_clean_environment_no_server_secrets_reach_the_sandbox,
    test_host_files_are_invisible,
    test_no_network_at_all,
    test_other_sessions_workspaces_are_invisible,
    test_own_pid_namespace_and_unprivileged_uid,
    test_seccomp_denies_namespace_mount_ptrace_bpf_perf_keyctl_iouring_modules_kexec,
    test_the_hosts_loopback_and_the_servers_port_are_unreachable,
    test_the_sandbox_reads_no_host_path_and_no_server_state,
)

pytestmark = pytest.mark.anyio

# Collected here with this package's `runtime` fixture: an operator policy is on.
__all__ = [
    "sb",
    "session",
    "test_clean_environment_no_server_secrets_reach_the_sandbox",
    "test_host_files_are_invisible",
    "test_no_network_at_all",
    "test_other_sessions_workspaces_are_invisible",
    "test_own_pid_namespace_and_unprivileged_uid",
    "test_seccomp_denies_namespace_mount_ptrace_bpf_perf_keyctl_iouring_modules_kexec",
    "test_the_hosts_loopback_and_the_servers_port_are_unreachable",
    "test_the_sandbox_reads_no_host_path_and_no_server_state",
]
