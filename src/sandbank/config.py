"""Settings: every knob, from `SANDBANK_*` variables; the only reader of the environment."""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .capacity import derived_max_sessions, derived_pool_growth, derived_pool_size, disk_room
from .egress.policy import NetworkPolicy
from .egress.resolver import FixedResolver
from .egress.sealing import parse_keys
from .errors import ConfigError, Unprocessable

MiB = 1024 * 1024
PREFIX = "SANDBANK_"
Isolation = Literal["bwrap", "fork", "gvisor", "none"]
ISOLATIONS: tuple[str, ...] = ("fork", "bwrap", "gvisor", "none")
# Variables of the project that are not settings: the installer's, the tests', and those the
# server sets inside a sandbox.
NOT_SETTINGS = frozenset(
    {
        "SANDBANK_EXTRA_PACKAGES",
        "SANDBANK_FILES_JSON",
        "SANDBANK_INTERRUPT_FD",
        "SANDBANK_PREIMPORT",
        "SANDBANK_WORKSPACE",
    }
)


def _default_runtime_dir() -> Path:
    # `make install` builds the server in <checkout>/.venv and the sandbox runtime in
    # <checkout>/.runtime, so the runtime sits beside the interpreter running us.
    return Path(sys.prefix).resolve().parent / ".runtime"


class Settings(BaseSettings):
    """All settings. The README's configuration table is checked against this class by a test."""

    model_config = SettingsConfigDict(env_prefix="SANDBANK_", extra="ignore")

    # --- server ---------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address `sandbank serve` listens on.")
    port: int = Field(8080, ge=0, le=65535, description="Port `sandbank serve` listens on.")
    data_dir: Path = Field(
        Path("./sandbank-data"),
        description="Where state lives: database, uploaded files, sandbox workspaces, keys.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level: `debug`, `info`, `warning` or `error`."
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="Log lines as readable `text`, or as `json` objects (one per line) for a "
        "log collector.",
    )
    max_connections: int = Field(
        0,
        ge=0,
        description="Client connections open at once, every listener together; past it a new "
        "connection is answered 503 and closed at once. 0 (the default) derives it: 4096, or "
        "less when the open-files limit leaves less beside what the sandboxes need.",
    )
    max_connections_per_client: int = Field(
        0,
        ge=0,
        description="Client connections open at once from one address (behind a proxy, the "
        "proxy's); past it, 503 and closed. 0 (the default): half of `max_connections`.",
    )
    head_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="Time a client has to send a request's line and headers, from its "
        "connection or the request's first byte; then 408 and the connection is closed.",
    )
    keepalive_timeout_seconds: float = Field(
        5.0, gt=0, description="How long an idle keep-alive connection stays open."
    )
    public_base_url: str = Field(
        "",
        description="Base URL clients reach this server at (for presigned URLs); "
        "empty means http://HOST:PORT.",
    )

    # --- sandbox runtime ------------------------------------------------------------------
    isolation: Isolation = Field(
        "fork",
        description="`fork` (the default): namespaces, seccomp and cgroups, each sandbox forked "
        "from a warm template that has imported the data stack (a few MiB per session, no cold "
        "start); `bwrap`, the same isolation with each sandbox a fresh bubblewrap and Python; "
        "`gvisor`, each sandbox a gVisor container (`runsc`): user code's system calls reach "
        "gVisor's user-space kernel, not the host's, at a cost in memory and latency; "
        "or `none`: an UNISOLATED development mode that must be chosen explicitly and logs a "
        "loud warning.",
    )
    isolation_choices: str = Field(
        "",
        description="Comma-separated isolations this server offers besides `isolation` (its "
        "default), e.g. `fork,gvisor`: CreateSession's `isolation` hint picks one. `none` "
        "cannot be offered beside an isolated one, nor `fork` beside `bwrap` (one host's "
        "sandboxes share its uids, cgroups and disks).",
    )
    tenant_isolation: str = Field(
        "",
        description="Tenants that must use a given isolation: comma-separated "
        "`TENANT=ISOLATION`, TENANT being at least 8 hex digits of the tenant's id (as for "
        "`tenant_max_sessions`). Their sessions get it without asking; a hint of another "
        "is refused (422). In a fleet, set it on the fronts (nodes see no clients' tenants).",
    )
    gvisor_platform: Literal["auto", "systrap", "kvm", "ptrace"] = Field(
        "auto",
        description="With `isolation=gvisor`: runsc's platform. `auto` tries `systrap` (runsc "
        "2023 and later), `kvm`, then `ptrace` at start and keeps the first that runs a program "
        "(kvm hangs where /dev/kvm is a nested device); `sandbank doctor` says which.",
    )
    fork_preimport_modules: str = Field(
        "",
        description="With `isolation=fork`: comma-separated modules the template imports "
        "besides numpy, pandas and matplotlib (e.g. the `SANDBANK_EXTRA_PACKAGES`), so "
        "every session shares them.",
    )
    fork_template_max_forks: int = Field(
        100,
        ge=0,
        description="With `isolation=fork`: sandboxes one template forks before a fresh one "
        "replaces it (a new address layout and str-hash secret, which the children of one "
        "template share); 0 never replaces it for this.",
    )
    fork_template_max_age_seconds: float = Field(
        600.0,
        ge=0,
        description="With `isolation=fork`: age past which a template is replaced at its next "
        "fork, so sandboxes sharing its secrets were all forked within this long of each "
        "other; 0 never replaces it for this.",
    )
    runtime_dir: Path = Field(
        default_factory=_default_runtime_dir,
        description="The sandbox's Python environment (built by `make install`), "
        "mounted read-only; default `.runtime` beside the server's venv.",
    )
    memory_limit_mb: int = Field(1024, ge=16, description="Memory per session (MiB).")
    pids_limit: int = Field(256, ge=8, description="Processes and threads per session.")
    cpu_limit: float = Field(1.0, gt=0, description="CPU cores per session (CFS quota).")
    disk_limit_mb: int = Field(
        1024,
        ge=4,
        description="Workspace disk per session (MiB), allocated on the data directory's file "
        'system when the session starts (README, "Disk"), so what a session was told it '
        "wrote is never lost to another's full disk.",
    )
    disk_reserve_mb: int = Field(
        1024,
        ge=0,
        description="Space kept free on the data directory's file system for the database, "
        "the objects and the logs (MiB): a session whose workspace would eat into it is "
        "refused with 503.",
    )
    tmp_limit_mb: int = Field(
        64, ge=1, description="Private /tmp per session (MiB; counts as memory)."
    )
    open_files_limit: int = Field(1024, ge=64, description="Open files per process.")
    output_limit_bytes: int = Field(
        1 * MiB, ge=1024, description="Captured output per stream per call, then truncated."
    )
    exec_timeout_default: int = Field(
        60, ge=1, description="Execute timeout when a call names none (seconds)."
    )
    exec_timeout_max: int = Field(
        600, ge=1, description="Ceiling on a call's timeout; larger values are clamped."
    )
    interrupt_grace_seconds: float = Field(
        2.0,
        gt=0,
        description="After an interrupt, how long code may take to yield before the "
        "interpreter is killed and restarted.",
    )
    pool_size: int = Field(
        -1,
        ge=-1,
        description="Sandboxes kept started and ready to lease; -1 (the default) derives it: "
        "with `isolation=fork` one per 20 of `max_sessions` (between 2 and 64, so a burst of "
        "new sessions is served from the pool), otherwise 2.",
    )
    pool_size_max: int = Field(
        -1,
        ge=-1,
        description="Most sandboxes the warm pool grows to when leases come in bursts (the "
        "leases of the last 10 s), so the next burst is served from it too; after 10 minutes "
        "without one it shrinks back to `pool_size`. It never holds more than the sessions not "
        "leased leave room for. -1 (the default): with `isolation=fork` and a derived "
        "`pool_size`, 64 or `max_sessions` if less; otherwise `pool_size` (no growth).",
    )
    pool_preimport: bool = Field(
        True,
        description="Whether pooled sandboxes pre-import the data stack (pandas, ...); with "
        "`isolation=fork`, whether they walk pandas' first-use paths before a lease (a faster "
        "first pandas call, for a few MiB more per session).",
    )
    max_sessions: int = Field(
        0,
        ge=0,
        description="Live sessions; past it the least recently used idle one is reclaimed. "
        "0 (the default) derives it from the machine's memory, its cores, "
        "`memory_limit_mb` and the isolation's measured cost of an idle session (README, "
        '"Capacity").',
    )
    max_sessions_per_tenant: int = Field(
        0,
        ge=0,
        description="Live sessions one tenant (exec token) may hold. 0 (the default): three "
        "quarters of `max_sessions` when several tokens are configured (so one tenant keeping "
        "every session busy never keeps the others out), else all of them. While a tenant "
        "waits for room, others at their fair share get no more; when the server is full, "
        "idle sessions of tenants over their fair share are reclaimed first, the caller's own "
        "before anyone else's.",
    )
    tenant_max_sessions: str = Field(
        "",
        description="Per-tenant exceptions to `max_sessions_per_tenant`: comma-separated "
        "`TENANT=N`, TENANT being at least 8 hex digits of the tenant's id: the SHA-256 of "
        "its token, whose first digits `/admin/sessions` shows.",
    )

    @model_validator(mode="after")
    def _isolations(self) -> Settings:
        offered = self.isolations()
        if "none" in offered and len(offered) > 1:
            raise ValueError(
                f"{PREFIX}ISOLATION_CHOICES: `none` (unisolated) cannot be offered beside an "
                "isolated backend"
            )
        if {"fork", "bwrap"} <= set(offered):
            raise ValueError(
                f"{PREFIX}ISOLATION_CHOICES: `fork` and `bwrap` are the same isolation; offer one"
            )
        for prefix, isolation in parse_tenant_isolation(self.tenant_isolation).items():
            if isolation not in offered and self.role != "front":  # a front's nodes offer them
                raise ValueError(
                    f"{PREFIX}TENANT_ISOLATION: {prefix}={isolation}, but this server offers "
                    f"{', '.join(offered)} ({PREFIX}ISOLATION, {PREFIX}ISOLATION_CHOICES)"
                )
        return self

    def isolations(self) -> list[str]:
        """The isolations this server offers, its default (`isolation`) first."""
        found: list[str] = [self.isolation]
        for item in (x.strip() for x in self.isolation_choices.split(",")):
            if not item:
                continue
            if item not in ISOLATIONS:
                raise ValueError(
                    f"{PREFIX}ISOLATION_CHOICES: {item!r} is not one of {', '.join(ISOLATIONS)}"
                )
            if item not in found:
                found.append(item)
        return found

    @field_validator("tenant_max_sessions")
    @classmethod
    def _tenant_limits(cls, value: str) -> str:
        parse_tenant_limits(value)  # raises with the offending entry
        return value

    idle_timeout_default: int = Field(
        600, ge=1, description="Idle timeout of a session that asks for none (seconds)."
    )
    idle_timeout_max: int = Field(3600, ge=1, description="Ceiling on a session's idle timeout.")
    max_lifetime_default: int = Field(
        3600, ge=1, description="Maximum lifetime of a session that asks for none (seconds)."
    )
    max_lifetime_max: int = Field(
        86400, ge=1, description="Ceiling on a session's maximum lifetime (seconds)."
    )
    reaper_interval_seconds: float = Field(
        5.0, gt=0, description="How often expired sessions are looked for."
    )
    pause_on_shutdown: bool = Field(
        True,
        description="On SIGTERM, pause every session within `shutdown_grace_seconds` (its "
        "workspace, variables and shell kept on disk; a call still running is interrupted "
        "first, as at a timeout) so the next start of this data directory resumes it under the "
        "same id; false ends them, and their calls, as before. On a fleet node, a drain "
        "(SIGTERM or /fleet/drain) moves them to the object store instead, for another node "
        "(or this one restarted) to continue under the same ids.",
    )
    pause_after_idle_seconds: int = Field(
        0,
        ge=0,
        description="Pause a session idle this long (no process, no memory: only its snapshot "
        "on disk), resumed by its next call; 0 (the default) keeps idle sessions running.",
    )
    checkpoint_after_idle_seconds: int = Field(
        0,
        ge=0,
        description="Snapshot a session idle this long without stopping it, so a crash of the "
        "server (SIGKILL, power) loses at most what ran since; 0 (the default): no checkpoints.",
    )
    max_paused_sessions: int = Field(
        10000,
        ge=0,
        description="Paused sessions kept on disk; past it the one paused longest ago ends.",
    )
    uid_base: int = Field(
        200000, ge=1000, description="First host uid given to sandboxes (one uid per session)."
    )
    uid_count: int = Field(50000, ge=1, description="How many uids from `uid_base` may be used.")
    cgroup_favor_dynmods: bool = Field(
        True,
        description="At start, remount the cgroup2 tree with `favordynmods` (Linux 6.0+) if it "
        "lacks it, so putting a sandbox in its cgroup takes well under a millisecond instead of "
        "~10 ms. It is a machine-wide setting; false leaves the mount as it is.",
    )
    uid_lock_dir: Path = Field(
        Path("/run/sandbank/uids"),
        description="Machine-wide directory of uid claim locks, shared by every server.",
    )

    # --- controlled egress (README "Network policy") ----------------------------------------
    egress_allow: str = Field(
        "none",
        description="Network policy every session gets: `none` (no network at all) or "
        "comma-separated `HOST:PORT` entries (a name, a `*.suffix` pattern, an address or a "
        "CIDR, IPv6 in brackets; PORT a number or `*`). Names go through Sandbank's filtering "
        "proxy; addresses that are not public are reached only when listed here or in "
        "`egress_allow_max`.",
    )
    egress_allow_max: str = Field(
        "",
        description="The widest policy a client may ask for with CreateSession's `network` "
        "hint, in the form of `egress_allow`; hints are clamped to it, never widened. Empty: "
        "`egress_allow`.",
    )
    egress_connections_per_session: int = Field(
        32, ge=1, description="Connections one session may have open through the proxy at once."
    )
    egress_bytes_per_session: int = Field(
        1024 * MiB,
        ge=1,
        description="Bytes (both directions) one session may move through the proxy over its "
        "life; past it, connections are closed and new ones refused.",
    )
    egress_rate_bytes: int = Field(
        50 * MiB,
        ge=0,
        description="Bytes per second every session together may move through the proxy; 0: "
        "no limit.",
    )
    extra_ca_file: Path | None = Field(
        None,
        description="A PEM file of CA certificates every sandbox trusts besides the system's "
        "(a corporate proxy's, a private index's): appended to the store sandboxes read at "
        "/etc/ssl/certs/ca-certificates.crt, which `SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`, "
        "`CURL_CA_BUNDLE` and `PIP_CERT` name.",
    )
    egress_test_hosts: str = Field(
        "",
        description="FOR TESTS ONLY: comma-separated `name=address` answers the proxy uses "
        "instead of DNS (names not listed do not resolve). Empty: the system resolver.",
    )
    egress_credentials_file: Path | None = Field(
        None,
        description="A TOML file of credentials the egress proxy adds to requests to their "
        'destinations, for every session whose policy reaches them (README, "Credentials"): '
        "`[[credential]]` tables with `destination` (`NAME:PORT` or `*.suffix:PORT`) and one "
        "of `headers`, `basic` or `query`. The values never enter a sandbox.",
    )
    credentials_key: SecretStr = Field(
        SecretStr(""),
        description="The key that seals the credentials tenants and users store through the "
        "APIs (base64 of 32 bytes: `openssl rand -base64 32`); several, comma-separated, to "
        "replace one: the first seals, each opens. Empty: nothing is stored (a session's own "
        "credentials, given at CreateSession, still work).",
    )

    @field_validator("egress_allow", "egress_allow_max")
    @classmethod
    def _network_policy(cls, value: str) -> str:
        NetworkPolicy.from_setting(value)  # raises with the offending entry
        return value

    @field_validator("egress_test_hosts")
    @classmethod
    def _test_hosts(cls, value: str) -> str:
        FixedResolver.parse(value)
        return value

    @field_validator("credentials_key")
    @classmethod
    def _credentials_key(cls, value: SecretStr) -> SecretStr:
        parse_keys(value.get_secret_value())  # says which key is wrong, never what it is
        return value

    # --- code-execution API -----------------------------------------------------------------
    exec_api: Literal["on", "off", "separate"] = Field(
        "on",
        description="Serve the code-execution API at the root of the server (`on`), not at "
        "all (`off`), or on a listener of its own at `exec_api_host`:`exec_api_port` "
        "(`separate`).",
    )
    e2b_api: Literal["on", "off"] = Field(
        "on",
        description="Serve E2B's API (control plane, envd, code interpreter) beside the "
        "code-execution API, wherever that is served, so the E2B SDKs work with "
        '`E2B_API_URL` and `E2B_SANDBOX_URL` set to this server (README, "Using the E2B SDKs"); '
        "API keys are the code-execution tokens.",
    )
    exec_api_host: str = Field(
        "127.0.0.1", description="Address of the code-execution API's own listener (`separate`)."
    )
    exec_api_port: int = Field(
        8081,
        ge=0,
        le=65535,
        description="Port of the code-execution API's own listener (`separate`).",
    )
    exec_tokens: SecretStr = Field(
        SecretStr(""),
        description="Comma-separated bearer tokens for the code-execution API; each is a "
        "tenant. Empty: no auth (loopback only).",
    )
    exec_tokens_file: Path | None = Field(
        None, description="A file of bearer tokens, one per line (added to `exec_tokens`)."
    )
    allow_unauthenticated: bool = Field(
        False,
        description="Serve without credentials on an address beyond loopback: the code-execution "
        "API without `exec_tokens`, or the interpreter API trusting `trusted_user_header` from "
        "any address. Only for a server that nothing but trusted clients can reach (a network "
        "policy, an authenticating gateway in front); otherwise such a server refuses to start.",
    )
    metrics_token: SecretStr = Field(
        SecretStr(""),
        description="Bearer token `GET /metrics` accepts (a Prometheus scraper's, which then "
        "needs no token that runs code); on a fleet node, it opens /metrics to it without the "
        "fleet token. Empty: /metrics takes the code-execution tokens, as the API does.",
    )
    admin_token: SecretStr = Field(
        SecretStr(""),
        description="Bearer token for the operator's endpoint `GET /admin/sessions` (the "
        "code-execution sessions this server holds; `sandbank sessions list --exec`); empty "
        "turns it off.",
    )
    allowed_hosts: str = Field(
        "localhost,127.0.0.1,[::1]",
        description="Comma-separated Host header values accepted (DNS-rebinding guard); "
        "`*` accepts any.",
    )
    put_file_max_bytes: int = Field(
        100 * MiB, ge=1, description="Largest file PutFile and uploads accept (bytes)."
    )
    list_files_max: int = Field(
        1000, ge=1, description="Most entries one ListFiles answer returns."
    )

    # --- storage: database and objects -------------------------------------------------------
    database_url: SecretStr = Field(
        SecretStr(""),
        description="SQLAlchemy URL of the database (`postgresql+psycopg://user:pw@host/db` "
        "or `sqlite:///path`); empty means the SQLite file DATA_DIR/sandbank.db.",
    )
    storage_url: str = Field(
        "",
        description="Where uploaded and produced files live: empty for DATA_DIR/objects, "
        "`s3://bucket/prefix` for S3, `memory://` for tests.",
    )
    s3_endpoint_url: str = Field(
        "", description="S3 endpoint for S3-compatible services (MinIO, ...); empty for AWS."
    )
    s3_region: str = Field("", description="S3 region; empty uses the AWS default chain.")
    s3_access_key_id: SecretStr = Field(
        SecretStr(""), description="S3 access key id; empty uses the AWS credential chain."
    )
    s3_secret_access_key: SecretStr = Field(
        SecretStr(""), description="S3 secret access key; empty uses the AWS credential chain."
    )
    signing_key: SecretStr = Field(
        SecretStr(""),
        description="HMAC key signing local upload/download URLs; empty means a random key "
        "created once at DATA_DIR/signing.key (mode 0600).",
    )
    presigned_url_expiry_seconds: int = Field(
        900, ge=1, description="How long presigned upload and download URLs stay valid."
    )

    # --- agent (the interpreter API's LLM loop) ---------------------------------------------
    llm_model: str = Field(
        "",
        description="The model the agent uses, as `provider:model` (e.g. `openai:gpt-4.1-mini`, "
        "`anthropic:claude-sonnet-4-5`, `ollama:qwen2.5-coder`). Empty: the agent is off and "
        "questions are refused with 503.",
    )
    llm_base_url: str = Field(
        "",
        description="Endpoint of the model's API, e.g. any OpenAI-compatible server "
        "(`http://127.0.0.1:8000/v1`); empty means the provider's usual endpoint.",
    )
    llm_api_key: SecretStr = Field(
        SecretStr(""),
        description="API key for the model's provider; empty means the provider's usual "
        "variable (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...).",
    )
    llm_offline: bool = Field(
        False,
        description="Refuse every model endpoint that is not on loopback (tests set it so "
        "they can never reach a real LLM); `SANDBANK_TEST_REAL_LLM=1` lifts it.",
    )
    test_real_llm: bool = Field(
        False,
        description="Lets the optional `real_llm` tests reach the configured model despite "
        "`llm_offline`.",
    )
    llm_timeout_seconds: float = Field(
        120.0, gt=0, description="Timeout of one request to the model (seconds)."
    )
    llm_max_retries: int = Field(
        4, ge=0, le=10, description="Retries of a model request answered 429 or 5xx."
    )
    llm_retry_base_seconds: float = Field(
        1.0,
        ge=0,
        description="First retry delay; each next one doubles, capped at 30 s (a server's "
        "Retry-After is honoured within that cap).",
    )
    llm_max_output_tokens: int = Field(
        4096, ge=16, description="Most tokens the model may write in one reply."
    )
    agent_max_steps: int = Field(
        20, ge=1, description="Model calls one answer may take before the run ends as an error."
    )
    agent_max_tokens: int = Field(
        400_000,
        ge=1,
        description="Input plus output tokens one answer may spend before the run ends as an "
        "error.",
    )
    agent_tool_timeout_seconds: float = Field(
        120.0,
        gt=0,
        description="Time one tool call of the agent may take; hitting it ends the run as an "
        "error.",
    )
    agent_run_timeout_seconds: float = Field(
        900.0, gt=0, description="Time one answer may take before the run ends as an error."
    )
    agent_tool_output_chars: int = Field(
        20_000,
        ge=200,
        description="Characters of one tool result shown to the model; longer ones are cut.",
    )
    agent_history_chars: int = Field(
        100_000,
        ge=1000,
        description="Characters of earlier turns sent back to the model; older tool outputs "
        "are shortened first, then the oldest turns dropped.",
    )
    agent_answer_format: Literal["markdown", "tags"] = Field(
        "markdown",
        description="How answers name the files they show: `markdown` (images as "
        "`![chart](figure_1.png)`, for this server's web page) or `tags` "
        "(`<png>figure_1.png</png>`, `<md>notes.md</md>`, `<plotly>plotly_1.json</plotly>`, as "
        "the interpreter spec's own web client reads them; this server's page shows those too).",
    )

    # --- interpreter API (/api) ---------------------------------------------------------------
    interpreter_api: Literal["on", "off"] = Field(
        "on", description="Serve the interpreter API (sessions, messages, files) under `/api`."
    )
    session_ttl_seconds: int = Field(
        7 * 24 * 3600,
        ge=1,
        description="Time to live of an interpreter session (seconds from creation); expired "
        "sessions are deleted with their messages, files and sandbox.",
    )
    session_expiry_interval_seconds: float = Field(
        60.0, gt=0, description="How often expired interpreter sessions are looked for (seconds)."
    )
    message_max_chars: int = Field(
        20_000, ge=1, description="Longest question a user may post (characters)."
    )
    max_sessions_per_user: int = Field(
        100, ge=1, description="Interpreter sessions one user may have at once."
    )
    event_stream_max_seconds: float = Field(
        600.0,
        gt=0,
        description="Longest life of one `GET /api/sessions/{id}/events` stream; a client "
        "still waiting reconnects with `from` (its run is not affected).",
    )
    max_event_streams: int = Field(
        256,
        ge=1,
        description="`GET /api/sessions/{id}/events` streams open at once on this server; past "
        "it, 503 with Retry-After (each one reads the store while its run goes).",
    )
    max_event_streams_per_user: int = Field(
        8, ge=1, description="Event streams one user may have open at once; past it, 429."
    )
    max_stored_bytes_per_user: int = Field(
        1024 * MiB,
        ge=1,
        description="Bytes of uploaded and produced files one user may keep across sessions.",
    )
    max_runs_per_user: int = Field(
        2,
        ge=1,
        description="Agent runs one user may have in progress at once; more are refused with 409.",
    )
    max_runs: int = Field(
        4,
        ge=1,
        description="Agent runs in progress (queued or running) at once across every replica "
        "sharing the database; more are refused with 503.",
    )
    runs_per_replica: int = Field(
        4,
        ge=1,
        description="Runs one server process works on at once; more wait, queued, for a "
        "replica with room.",
    )
    run_lease_seconds: float = Field(
        15.0,
        ge=1,
        description="Lease a replica holds on a run it works on, renewed while it works; a run "
        "whose replica died is taken over by another once its lease expires.",
    )
    run_poll_seconds: float = Field(
        1.0,
        gt=0,
        le=60,
        description="How often a replica renews its leases, reads cancel requests (posted to "
        "any replica) and claims waiting runs; keep it under a third of `run_lease_seconds`.",
    )
    shutdown_grace_seconds: float = Field(
        20.0,
        ge=0,
        description="On SIGTERM, how long running answers may take to finish before they are "
        "handed back, for another replica (or the next start) to continue.",
    )
    trusted_user_header: str = Field(
        "",
        description="Name of a header carrying the user id, set by an authenticating proxy "
        "(e.g. `X-Forwarded-User`); empty (the default) turns it off. Honoured only from "
        "`trusted_proxies`.",
    )
    trusted_proxies: str = Field(
        "",
        description="Comma-separated addresses or CIDRs (e.g. `10.0.0.0/8,127.0.0.1`) whose "
        "`trusted_user_header` is believed; requests from anywhere else must bring an API key.",
    )
    cors_origins: str = Field(
        "",
        description="Comma-separated origins allowed to call `/api` from a browser "
        "(CORS); empty allows the same origin only.",
    )
    sandbox_url: str = Field(
        "",
        description="Base URL of a code-execution API the interpreter runs its sandboxes on "
        "(any conforming backend, this server's included); empty uses this server's own "
        "runtime in-process.",
    )
    sandbox_token: SecretStr = Field(
        SecretStr(""), description="Bearer token for `sandbox_url`; empty sends none."
    )

    # --- fleet: sandboxes over many machines behind one endpoint -------------------------------
    role: Literal["all", "node", "front"] = Field(
        "all",
        description="`all`: one server holding its sandboxes (the default). `node`: a fleet "
        "machine serving its runtime's code-execution API to the fronts alone (needs "
        "`fleet_token`). `front`: a stateless fleet entry point serving both APIs with "
        "sandboxes placed on the nodes (needs `fleet_token` and `fleet_nodes` or `fleet_dns`).",
    )
    fleet_token: SecretStr = Field(
        SecretStr(""),
        description="Shared secret of a fleet: fronts present it to nodes, and it keys the "
        "HMAC that signs the session ids fronts hand out. Same value on every front and node.",
    )
    fleet_node_name: str = Field(
        "",
        description="A node's stable name in the fleet (a StatefulSet pod's name); empty "
        "means the host name.",
    )
    fleet_nodes: str = Field(
        "",
        description="A front's static node list: comma-separated `name=url` "
        "(e.g. `n0=http://10.0.0.5:8080,n1=http://10.0.0.6:8080`).",
    )
    fleet_dns: str = Field(
        "",
        description="A front's node list from DNS, as `host:port` (a Kubernetes headless "
        "Service); every A record is a node, named by its own capacity report.",
    )
    fleet_refresh_seconds: float = Field(
        1.0,
        gt=0,
        description="How often a front re-resolves its node list and asks each node for "
        "its capacity (a health check: one missed stops new sessions there, two in a row take "
        "the node out, its sessions answered as gone, until it answers again).",
    )
    fleet_connect_timeout_seconds: float = Field(
        1.0,
        gt=0,
        description="A front's timeout for connecting to a node and for a capacity report; "
        "a node that misses it is out.",
    )
    fleet_sample: int = Field(
        2,
        ge=1,
        description="How many eligible nodes a front samples for a new session before "
        "taking the least loaded (power of two choices).",
    )
    fleet_drain_grace_seconds: float = Field(
        30.0,
        ge=0,
        description="On SIGTERM a node takes no new sessions and waits this long for running "
        "calls to finish before moving (`pause_on_shutdown`) or ending its sessions (calls "
        "still running get a result).",
    )
    shutdown_delay_seconds: float = Field(
        0.0,
        ge=0,
        description="On SIGTERM, how long a front keeps serving while its /health answers "
        "503, so load balancers stop sending to it first (behind a Kubernetes Service: ~5).",
    )

    # --- web UI (/) ---------------------------------------------------------------------------
    web_ui: Literal["on", "off"] = Field(
        "on",
        description="Serve the browser UI at `/` (it needs the interpreter API, and uses only it).",
    )
    web_storage_origins: str = Field(
        "",
        description="Comma-separated origins the browser uploads to and downloads from when "
        "they are not this server (an S3 endpoint as browsers reach it), allowed in the page's "
        "Content-Security-Policy; the origin of `s3_endpoint_url` is added by itself.",
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _derived(self) -> Settings:
        if self.max_sessions == 0:
            # Isolated workspaces are disk images allocated whole: the data disk bounds them.
            room = (
                None
                if self.isolation == "none"
                else disk_room(self.data_dir, self.disk_limit_mb, self.disk_reserve_mb)
            )
            self.max_sessions = derived_max_sessions(
                self.isolation, self.memory_limit_mb, self.uid_count, disk_room=room
            )
        derived_pool = self.pool_size == -1
        if derived_pool:
            self.pool_size = derived_pool_size(self.isolation, self.max_sessions)
        if self.pool_size_max == -1:
            grows = derived_pool and self.isolation == "fork"
            self.pool_size_max = derived_pool_growth(self.max_sessions) if grows else 0
        self.pool_size_max = max(self.pool_size, self.pool_size_max)
        return self

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        for default, ceiling in (
            ("exec_timeout_default", "exec_timeout_max"),
            ("idle_timeout_default", "idle_timeout_max"),
            ("max_lifetime_default", "max_lifetime_max"),
        ):
            if getattr(self, default) > getattr(self, ceiling):
                raise ValueError(
                    f"{PREFIX}{default.upper()}={getattr(self, default)} is above "
                    f"{PREFIX}{ceiling.upper()}={getattr(self, ceiling)}: a default must not "
                    "exceed its ceiling"
                )
        return self


def parse_tenant_limits(text: str) -> dict[str, int]:
    """`TENANT=N,...` (TENANT: at least 8 hex digits of a tenant's id) as {prefix: N}."""
    found = _per_tenant(text, str.isdigit, "TENANT=N", "N: a whole number")
    return {prefix: int(number) for prefix, number in found.items()}


def parse_tenant_isolation(text: str) -> dict[str, str]:
    """`TENANT=ISOLATION,...` (TENANT: at least 8 hex digits of a tenant's id) as a dict."""
    return _per_tenant(
        text, ISOLATIONS.__contains__, "TENANT=ISOLATION",
        f"ISOLATION: one of {', '.join(ISOLATIONS)}",
    )  # fmt: skip


def forced_isolation(rules: Mapping[str, str], tenant: str, asked: str | None) -> str | None:
    """The isolation the operator forces on `tenant` (`SANDBANK_TENANT_ISOLATION`), None when
    no rule names it. `Unprocessable` when the client asked for another one."""
    forced = next((iso for prefix, iso in rules.items() if tenant.startswith(prefix)), None)
    if forced is not None and asked is not None and asked != forced:
        raise Unprocessable(
            f"isolation {asked!r} is not allowed for this client: its sessions run "
            f"{forced!r} (SANDBANK_TENANT_ISOLATION); leave it out"
        )
    return forced


def _per_tenant(
    text: str, valid_value: Callable[[str], bool], form: str, value_is: str
) -> dict[str, str]:
    """Comma-separated `TENANT=VALUE` entries, TENANT at least 8 hex digits of a tenant's id."""
    found: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        prefix, sep, value = entry.partition("=")
        prefix, value = prefix.strip().lower(), value.strip()
        valid = len(prefix) >= 8 and all(c in "0123456789abcdef" for c in prefix)
        if not sep or not valid or not valid_value(value):
            raise ValueError(
                f"{entry!r} is not {form} (TENANT: at least 8 hex digits of a tenant's id, "
                f"{value_is})"
            )
        found[prefix] = value
    return found


def variable(name: str) -> str:
    return f"{PREFIX}{name.upper()}"


def _accepted(error: Mapping[str, Any]) -> str:
    """What a setting accepts, in words, from one of pydantic's errors."""
    kind, ctx = error["type"], error.get("ctx") or {}
    words = {
        "int_parsing": "a whole number",
        "int_from_float": "a whole number",
        "float_parsing": "a number",
        "bool_parsing": "true or false (also 1/0, yes/no, on/off)",
        "path_type": "a path",
        "string_type": "text",
    }
    if kind in words:
        return str(words[kind])
    if kind == "literal_error":
        return f"one of {ctx.get('expected', '')}"
    bounds = {
        "greater_than_equal": ">=",
        "greater_than": ">",
        "less_than_equal": "<=",
        "less_than": "<",
    }
    if kind in bounds:
        limit = next(iter(ctx.values()), "")
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        return f"a number {bounds[kind]} {limit}"
    return str(error.get("msg", "another value")).removeprefix("Value error, ")


def describe_errors(error: ValidationError) -> str:
    """pydantic's errors as one line: each variable, its value and what it accepts."""
    parts = []
    for item in error.errors():
        loc = item.get("loc") or ()
        if not loc:  # a whole-model check: its message already names the variables
            parts.append(str(item.get("msg", "")).removeprefix("Value error, "))
            continue
        name = str(loc[0])
        value = item.get("input")
        shown = value.get_secret_value() if isinstance(value, SecretStr) else value
        if name in SECRET_SETTINGS:
            shown = "(hidden)"
        parts.append(f"{variable(name)}={shown!s} is not valid: expected {_accepted(item)}")
    return "; ".join(parts)


SECRET_SETTINGS = frozenset(
    name for name, field in Settings.model_fields.items() if field.annotation is SecretStr
)


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment (and command-line overrides); `ConfigError` if unusable."""
    try:
        return Settings(**overrides)
    except ValidationError as error:
        raise ConfigError(describe_errors(error)) from None


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """What is wrong with each `SANDBANK_*` variable that is no setting, with the closest known
    one. Every command stops on them: a misspelt token variable must never leave an API open."""
    env = os.environ if environ is None else environ
    known = [variable(name) for name in Settings.model_fields]
    warnings = []
    for name in sorted(env):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper in known or upper in NOT_SETTINGS:
            continue
        if upper.startswith(PREFIX + "TEST_"):
            continue  # the test suite's own knobs
        # Compared without the shared prefix, which would make any two names look alike.
        close = difflib.get_close_matches(
            upper.removeprefix(PREFIX).lower(), list(Settings.model_fields), n=1, cutoff=0.6
        )
        hint = f": did you mean {variable(close[0])}?" if close else ""
        warnings.append(f"{name} is not a Sandbank setting{hint}")
    return warnings


def check_variables(environ: Mapping[str, str] | None = None) -> None:
    """`ConfigError` naming every unknown `SANDBANK_*` variable (and the closest setting)."""
    unknown = unknown_variables(environ)
    if unknown:
        raise ConfigError(
            "; ".join(unknown) + " (unset it, or rename it to the setting meant; "
            "README: Configuration)"
        )
