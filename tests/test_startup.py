"""Start-up: a bad setting stops every command with one line naming the variable; no traceback."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sandbank.config import Settings, load_settings, unknown_variables
from sandbank.errors import ConfigError
from sandbank.startup import check, check_data_dir, check_model, listen_socket, summary, version
from tests.support import data_dir

SANDBANK = str(Path(sys.executable).with_name("sandbank"))


def sandbank(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SANDBANK_")}
    return subprocess.run(
        [SANDBANK, *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"SANDBANK_MEMORY_LIMIT_MB": "lots"},
            "sandbank: SANDBANK_MEMORY_LIMIT_MB=lots is not valid: expected a whole number",
        ),
        (
            {"SANDBANK_LOG_LEVEL": "verbose"},
            "sandbank: SANDBANK_LOG_LEVEL=verbose is not valid: expected one of 'debug', "
            "'info', 'warning' or 'error'",
        ),
        (
            {"SANDBANK_PORT": "80800"},
            "sandbank: SANDBANK_PORT=80800 is not valid: expected a number <= 65535",
        ),
        (
            {"SANDBANK_CPU_LIMIT": "0"},
            "sandbank: SANDBANK_CPU_LIMIT=0 is not valid: expected a number > 0",
        ),
        (
            {"SANDBANK_EXEC_TIMEOUT_DEFAULT": "900"},
            "sandbank: SANDBANK_EXEC_TIMEOUT_DEFAULT=900 is above SANDBANK_EXEC_TIMEOUT_MAX=600: "
            "a default must not exceed its ceiling",
        ),
        (
            {"SANDBANK_IDLE_TIMEOUT_DEFAULT": "5000"},
            "sandbank: SANDBANK_IDLE_TIMEOUT_DEFAULT=5000 is above SANDBANK_IDLE_TIMEOUT_MAX=3600: "
            "a default must not exceed its ceiling",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert f"sandbank: {caught.value.message}" == expected


def test_a_bad_value_stops_serve_without_a_traceback() -> None:
    with data_dir() as data:
        done = sandbank("serve", "--data-dir", str(data), env={"SANDBANK_MEMORY_LIMIT_MB": "lots"})
    assert done.returncode == 2
    assert done.stderr == (
        "sandbank: SANDBANK_MEMORY_LIMIT_MB=lots is not valid: expected a whole number\n"
    )


def test_every_command_checks_the_settings() -> None:
    with data_dir() as data:
        done = sandbank("keys", "list", "--data-dir", str(data), env={"SANDBANK_PORT": "http"})
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "sandbank: SANDBANK_PORT=http is not valid: expected a whole number"
    )


def test_a_secret_setting_is_never_echoed() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(llm_api_key=12345678)
    assert "12345678" not in caught.value.message
    assert caught.value.message.startswith("SANDBANK_LLM_API_KEY=(hidden) is not valid")


def test_unknown_variables_are_named_with_the_closest_setting() -> None:
    unknown = unknown_variables(
        {"SANDBANK_MEMORYLIMIT_MB": "3", "SANDBANK_PORT": "1", "SANDBANK_ZZZ": "", "HOME": "/"}
    )
    assert unknown == [
        "SANDBANK_MEMORYLIMIT_MB is not a Sandbank setting: did you mean SANDBANK_MEMORY_LIMIT_MB?",
        "SANDBANK_ZZZ is not a Sandbank setting",
    ]


@pytest.mark.parametrize("command", [["serve"], ["users", "list"], ["doctor"]])
def test_a_misspelt_token_variable_stops_the_command(command: list[str]) -> None:
    """The issue's case: the API must never start open because a token variable is misspelt."""
    with data_dir() as data:
        done = sandbank(*command, "--data-dir", str(data), env={"SANDBANK_EXEC_TOKEN": "s3cret"})
        assert os.listdir(data) == []  # stopped before anything was made
    assert done.returncode == 2
    assert done.stderr == (
        "sandbank: SANDBANK_EXEC_TOKEN is not a Sandbank setting: did you mean "
        "SANDBANK_EXEC_TOKENS? (unset it, or rename it to the setting meant; README: "
        "Configuration)\n"
    )
    assert "s3cret" not in done.stderr


def test_a_typo_is_named_before_a_bad_value() -> None:
    with data_dir() as data:
        done = sandbank(
            "serve",
            "--data-dir",
            str(data),
            env={"SANDBANK_POOLSIZE": "1", "SANDBANK_LOG_LEVEL": "loud"},
        )
    assert done.returncode == 2
    assert done.stderr.startswith(
        "sandbank: SANDBANK_POOLSIZE is not a Sandbank setting: did you mean SANDBANK_POOL_SIZE?"
    )


def test_an_implicit_data_dir_is_warned_about(tmp_path: Path) -> None:
    done = subprocess.run(
        [SANDBANK, "keys", "list"],
        env={k: v for k, v in os.environ.items() if not k.startswith("SANDBANK_")},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert f"no --data-dir or SANDBANK_DATA_DIR given: using {tmp_path}/sandbank-data" in (
        done.stderr
    )


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "/etc/hostname/data",
            "SANDBANK_DATA_DIR=/etc/hostname/data cannot be created: /etc/hostname is a regular "
            "file; choose another path (e.g. /var/lib/sandbank)",
        ),
        (
            "/etc/hostname",
            "SANDBANK_DATA_DIR=/etc/hostname is a file, not a directory: choose a directory "
            "(e.g. /var/lib/sandbank)",
        ),
        (
            "/root/sandbank-data",
            "SANDBANK_DATA_DIR=/root/sandbank-data is under /root, a home directory that sandbox "
            "users cannot reach: use a directory outside it, such as /var/lib/sandbank",
        ),
        (
            "/proc/sandbank",
            "SANDBANK_DATA_DIR=/proc/sandbank is not writable",
        ),
    ],
)
def test_data_dir_problems_say_what_to_do(path: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_data_dir(Settings(data_dir=Path(path)))
    assert caught.value.message.startswith(expected)


def test_a_closed_parent_is_named() -> None:
    with data_dir() as top:
        closed = top / "closed"
        closed.mkdir(mode=0o700)
        with pytest.raises(ConfigError, match=r"is under .*/closed, which other users cannot"):
            check_data_dir(Settings(data_dir=closed / "data"))
        check_data_dir(Settings(data_dir=closed / "data", isolation="none"))  # no sandbox users
        assert (closed / "data").is_dir()


def test_an_unknown_provider_stops_serve_with_the_list() -> None:
    with data_dir() as data:
        done = sandbank(
            "serve", "--data-dir", str(data), env={"SANDBANK_LLM_MODEL": "opneai:gpt-4.1"}
        )
    assert done.returncode == 2
    line = done.stderr.strip()
    assert "\n" not in line
    assert line.startswith(
        "sandbank: SANDBANK_LLM_MODEL=opneai:gpt-4.1 names an unknown provider 'opneai': "
        "expected one of "
    )
    assert "openai" in line and "anthropic" in line and "ollama" in line


def test_a_model_without_a_provider_is_refused() -> None:
    with pytest.raises(ConfigError, match="expected provider:model"):
        check_model(Settings(llm_model="gpt-4.1"))
    check_model(Settings(llm_model="openai:gpt-4.1"))


def test_the_summary_names_the_parts_and_no_secret() -> None:
    settings = Settings(
        data_dir=Path("/srv/sb"),
        database_url="postgresql+psycopg://sb:hunter2@db.example:5433/sandbank",
        storage_url="s3://bucket/prefix",
        s3_secret_access_key="s3-secret-canary",
        llm_model="openai:gpt-4.1-mini",
        llm_base_url="http://me:url-secret-canary@127.0.0.1:8000/v1",
        llm_api_key="llm-key-canary",
        exec_tokens="exec-token-canary",
        pool_size=3,
    )
    line = summary(settings, tokens=1)
    assert "hunter2" not in line and "canary" not in line and "sb:" not in line
    for part in (
        "replica (interpreter API on a shared PostgreSQL) on http://127.0.0.1:8080",
        "serving the code-execution API at / (1 token(s)), the interpreter API at /api "
        "(API keys), the web page at /, metrics at /metrics",
        "isolation fork",
        "data dir /srv/sb",
        "database postgresql (db.example:5433/sandbank)",
        "storage s3 (s3://bucket/prefix",
        "model openai:gpt-4.1-mini at http://127.0.0.1:8000/v1",
        "pool size 3",
        f"max sessions {settings.max_sessions}",
    ):
        assert part in line


@pytest.mark.parametrize(
    ("settings", "start"),
    [
        (
            {},
            "single server on http://127.0.0.1:8080; serving the code-execution API at / "
            "(no tokens: loopback only), the interpreter API at /api (API keys), the web page at /",
        ),
        (
            {"role": "front", "fleet_token": "t", "fleet_dns": "nodes.svc:8080", "host": "0.0.0.0"},
            "fleet front (nodes: nodes.svc:8080) on http://0.0.0.0:8080; serving the "
            "code-execution API at / (2 token(s))",
        ),
        (
            {"role": "node", "fleet_token": "t", "fleet_node_name": "n-0"},
            "fleet node n-0 on http://127.0.0.1:8080; serving the code-execution API for the "
            "fleet's fronts (fleet token), sessions moved at a drain through local (",
        ),
        (
            {"exec_api": "separate", "web_ui": "off", "admin_token": "a"},
            "single server on http://127.0.0.1:8080; serving the code-execution API on "
            "http://127.0.0.1:8081 (no tokens: loopback only), the interpreter API at /api (API "
            "keys), metrics at /metrics, /admin/sessions;",
        ),
    ],
)
def test_the_summary_names_the_role_and_what_is_on(settings: dict[str, str], start: str) -> None:
    tokens = 2 if settings.get("role") == "front" else 0
    line = summary(Settings(**settings), tokens)  # type: ignore[arg-type]
    assert line.startswith(f"sandbank {version()}: {start}"), line
    if settings.get("role") == "node":
        assert "database" not in line and "model" not in line
    if settings.get("role") == "front":
        assert "isolation" not in line and "pool size" not in line


def test_a_missing_runtime_stops_serve_before_it_listens() -> None:
    with data_dir() as data:
        done = sandbank(
            "serve", "--data-dir", str(data), env={"SANDBANK_RUNTIME_DIR": "/nonexistent-rt"}
        )
    assert done.returncode == 2
    assert done.stderr == (
        "sandbank: the sandbox runtime is missing at /nonexistent-rt: run `make install` or set "
        "SANDBANK_RUNTIME_DIR\n"
    )


def test_an_unreadable_tokens_file_is_one_line() -> None:
    with data_dir() as data, pytest.raises(ConfigError) as caught:
        check(Settings(data_dir=data, exec_tokens_file=data / "missing"))
    assert caught.value.message == (
        f"SANDBANK_EXEC_TOKENS_FILE={data}/missing cannot be read (No such file or directory): "
        "expected a readable file of tokens, one per line"
    )


def test_an_unreachable_database_is_one_line_without_the_password() -> None:
    from tests.postgres import free_port

    url = f"postgresql+psycopg://sb:hunter2@127.0.0.1:{free_port()}/sandbank"
    with data_dir() as data, pytest.raises(ConfigError) as caught:
        check(Settings(data_dir=data, database_url=url, isolation="none"))
    message = caught.value.message
    assert message.startswith("SANDBANK_DATABASE_URL: cannot connect to postgresql (127.0.0.1:")
    assert message.endswith("check the URL and that the server runs")
    assert "hunter2" not in message and "\n" not in message


def test_connections_accepted_on_the_bound_socket_send_without_delay() -> None:
    """Nagle's algorithm off (TCP_NODELAY): an answer's head and body never wait for an ACK."""
    asyncio.run(_accept_one())


async def _accept_one() -> None:
    sock = listen_socket("127.0.0.1", 0)
    sock.listen()
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def made(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = writer.get_extra_info("socket")
        accepted.set_result(raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(made, sock=sock)
    port = sock.getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        assert await asyncio.wait_for(accepted, 5) == 1
    finally:
        writer.close()
        server.close()
        await server.wait_closed()
