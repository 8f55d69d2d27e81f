"""Settings: every knob, from `SANDBANK_*` variables; the only reader of the environment."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024


def _default_runtime_dir() -> Path:
    # `make install` builds the server in <checkout>/.venv and the sandbox runtime in
    # <checkout>/.runtime, so the runtime sits beside the interpreter running us.
    return Path(sys.prefix).resolve().parent / ".runtime"


class Settings(BaseSettings):
    """All settings. The README's configuration table is checked against this class by a test."""

    model_config = SettingsConfigDict(env_prefix="SANDBANK_", extra="ignore")

    # --- server ---------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address `sandbank serve` listens on.")
    port: int = Field(8080, description="Port `sandbank serve` listens on.")
    data_dir: Path = Field(
        Path("./sandbank-data"),
        description="Where state lives: database, uploaded files, sandbox workspaces, keys.",
    )
    log_level: str = Field("info", description="Log level (debug, info, warning, error).")
    public_base_url: str = Field(
        "",
        description="Base URL clients reach this server at (for presigned URLs); "
        "empty means http://HOST:PORT.",
    )

    # --- sandbox runtime ------------------------------------------------------------------
    isolation: Literal["bwrap", "none"] = Field(
        "bwrap",
        description="`bwrap` (namespaces, seccomp, cgroups) or `none`: an UNISOLATED "
        "development mode that must be chosen explicitly and logs a loud warning.",
    )
    runtime_dir: Path = Field(
        default_factory=_default_runtime_dir,
        description="The sandbox's Python environment (built by `make install`), "
        "mounted read-only; default `.runtime` beside the server's venv.",
    )
    memory_limit_mb: int = Field(1024, ge=16, description="Memory per session (MiB).")
    pids_limit: int = Field(256, ge=8, description="Processes and threads per session.")
    cpu_limit: float = Field(1.0, gt=0, description="CPU cores per session (CFS quota).")
    disk_limit_mb: int = Field(1024, ge=4, description="Workspace disk per session (MiB).")
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
    pool_size: int = Field(2, ge=0, description="Sandboxes kept started and ready to lease.")
    pool_preimport: bool = Field(
        True, description="Whether pooled sandboxes pre-import the data stack (pandas, ...)."
    )
    max_sessions: int = Field(
        16,
        ge=1,
        description="Live sessions; past it the least recently used idle one is reclaimed.",
    )
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
    uid_base: int = Field(
        200000, ge=1000, description="First host uid given to sandboxes (one uid per session)."
    )
    uid_count: int = Field(50000, ge=1, description="How many uids from `uid_base` may be used.")
    uid_lock_dir: Path = Field(
        Path("/run/sandbank/uids"),
        description="Machine-wide directory of uid claim locks, shared by every server.",
    )

    # --- code-execution API -----------------------------------------------------------------
    exec_api: Literal["on", "off", "separate"] = Field(
        "on",
        description="Serve the code-execution API at the root of the server (`on`), not at "
        "all (`off`), or on a listener of its own at `exec_api_host`:`exec_api_port` "
        "(`separate`).",
    )
    exec_api_host: str = Field(
        "127.0.0.1", description="Address of the code-execution API's own listener (`separate`)."
    )
    exec_api_port: int = Field(
        8081, description="Port of the code-execution API's own listener (`separate`)."
    )
    exec_tokens: SecretStr = Field(
        SecretStr(""),
        description="Comma-separated bearer tokens for the code-execution API; each is a "
        "tenant. Empty: no auth (loopback only).",
    )
    exec_tokens_file: Path | None = Field(
        None, description="A file of bearer tokens, one per line (added to `exec_tokens`)."
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
        description="Agent runs in progress on this server at once; more are refused with 503.",
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
        "calls to finish before ending its sessions (calls still running get a result).",
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
