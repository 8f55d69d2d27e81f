"""The error tree: every failure Sandbank reports, each knowing its status, code and number.

    SandbankError                      500  internal                  1000
    ├── BadRequest                     400  bad_request               1001
    │   ├── UnknownTool                400  unknown_tool              1002
    │   ├── Unprocessable              422  unprocessable             1003
    │   ├── UnsupportedMediaType       415  unsupported_media_type    1004
    │   ├── IsADirectory               400  is_a_directory            1005
    │   ├── UriTooLong                 414  uri_too_long              1006
    │   ├── HeadersTooLarge            431  headers_too_large         1007
    │   └── RequestTimeout             408  request_timeout           1008
    ├── Unauthorized                   401  unauthorized              1010
    ├── Forbidden                      403  forbidden                 1011
    │   └── PathEscape                 403  path_escape               1012
    ├── NotFound                       404  not_found                 1020
    │   └── SessionNotFound            404  session_not_found         1021
    ├── Conflict                       409  conflict                  1030
    │   ├── AlreadyExists              409  already_exists            1031
    │   ├── RunInProgress              409  run_in_progress           1110
    │   ├── TooManyRuns                409  too_many_runs             1111
    │   ├── QuotaExceeded              409  quota_exceeded            1112
    │   └── LeaseLost                  409  lease_lost                1113
    ├── PayloadTooLarge                413  payload_too_large         1040
    │   └── QuotaError                 413  quota_error               1041
    ├── AtCapacity                     503  at_capacity               1050
    │   ├── TooManyConnections         503  too_many_connections      1051
    │   ├── TenantShareReached         503  tenant_share_reached      1053
    │   └── DiskReserved               503  disk_reserved             1054
    ├── TooManyStreams                 429  too_many_streams          1052
    ├── StorageFull                    507  storage_full              1055
    ├── SandboxError                   500  sandbox_error             1060
    │   ├── ProtocolError              502  protocol_error            1062
    │   ├── SandboxUnavailable         503  sandbox_unavailable       1063
    │   ├── SnapshotDamaged            500  snapshot_damaged          1064
    │   └── PauseFailed                503  pause_failed              1065
    ├── Misdirected                    421  misdirected               1070
    ├── MethodNotAllowed               405  method_not_allowed        1080
    ├── ConfigError                    500  config_error              1090
    │   └── IsolationUnavailable       500  isolation_unavailable     1061
    └── AgentError                     500  agent_error               1100
        ├── ModelNotConfigured         503  model_not_configured      1101
        ├── ModelEndpointRefused       503  model_endpoint_refused    1102
        ├── ModelUnavailable           502  model_unavailable         1103
        ├── RunLimitReached            500  run_limit_reached         1104
        ├── RunCancelled               500  run_cancelled             1105
        └── ModelUnreachable           503  model_unreachable         1106

The number is the interpreter API's `error_code`; codes and numbers are unique (a test says
so). A user program's failure is never one of these: it is a result with a return code.
`ConfigError`s stop the server at start with their message. Foreign exceptions are
translated into this tree at the edge that meets them.
"""

from __future__ import annotations


class SandbankError(Exception):
    """Any failure Sandbank reports; unexpected ones are this root (500)."""

    status = 500
    code = "internal"
    number = 1000

    def __init__(self, message: str = "internal error") -> None:
        super().__init__(message)
        self.message = message


class BadRequest(SandbankError):
    """The request cannot be served as sent."""

    status = 400
    code = "bad_request"
    number = 1001


class UnknownTool(BadRequest):
    """An Execute names a tool kind this backend does not run."""

    code = "unknown_tool"
    number = 1002


class Unprocessable(BadRequest):
    """A known field is missing or of the wrong type (the code-execution API's 422)."""

    status = 422
    code = "unprocessable"
    number = 1003


class UnsupportedMediaType(BadRequest):
    """The body is not of the media type the operation takes."""

    status = 415
    code = "unsupported_media_type"
    number = 1004


class UriTooLong(BadRequest):
    """The request line is longer than the server reads."""

    status = 414
    code = "uri_too_long"
    number = 1006


class HeadersTooLarge(BadRequest):
    """The request's headers are more, or larger, than the server reads."""

    status = 431
    code = "headers_too_large"
    number = 1007


class RequestTimeout(BadRequest):
    """The request's headers did not arrive in time."""

    status = 408
    code = "request_timeout"
    number = 1008


class Unauthorized(SandbankError):
    """A credential is missing or rejected (the code-execution API)."""

    status = 401
    code = "unauthorized"
    number = 1010


class Forbidden(SandbankError):
    """The caller may not do this (the interpreter API's missing credential, too)."""

    status = 403
    code = "forbidden"
    number = 1011


class PathEscape(Forbidden):
    """A path leaves the workspace or goes through a symbolic link."""

    code = "path_escape"
    number = 1012


class NotFound(SandbankError):
    """No such thing."""

    status = 404
    code = "not_found"
    number = 1020


class SessionNotFound(NotFound):
    """No such session (or not the caller's)."""

    code = "session_not_found"
    number = 1021


class IsADirectory(BadRequest):
    """A file operation named a directory."""

    code = "is_a_directory"
    number = 1005


class Conflict(SandbankError):
    """The resource is not in a state that allows this."""

    status = 409
    code = "conflict"
    number = 1030


class AlreadyExists(Conflict):
    """What was to be made is there already (a directory)."""

    code = "already_exists"
    number = 1031


class RunInProgress(Conflict):
    """A question was posted while the session's run is going."""

    code = "run_in_progress"
    number = 1110


class TooManyRuns(Conflict):
    """The user already has the most runs allowed at once."""

    code = "too_many_runs"
    number = 1111


class QuotaExceeded(Conflict):
    """A per-user quota (sessions, stored bytes) is reached."""

    code = "quota_exceeded"
    number = 1112


class LeaseLost(Conflict):
    """The replica no longer holds the run (taken over, or its session deleted): stop it."""

    code = "lease_lost"
    number = 1113


class PayloadTooLarge(SandbankError):
    """A body or file is over its cap, or the workspace disk is full."""

    status = 413
    code = "payload_too_large"
    number = 1040


class QuotaError(PayloadTooLarge):
    """A file a run produced is not saved: over the file size limit or the storage quota."""

    code = "quota_error"
    number = 1041


class AtCapacity(SandbankError):
    """No room now: retry after `retry_after` seconds."""

    status = 503
    code = "at_capacity"
    number = 1050

    def __init__(self, message: str = "at capacity", retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TooManyConnections(AtCapacity):
    """The server, or this client address, holds the most connections allowed."""

    code = "too_many_connections"
    number = 1051


class TenantShareReached(AtCapacity):
    """The tenant holds its share of the sessions while the server is full."""

    code = "tenant_share_reached"
    number = 1053


class DiskReserved(AtCapacity):
    """The data disk cannot hold another workspace beside what is reserved."""

    code = "disk_reserved"
    number = 1054


class TooManyStreams(SandbankError):
    """The caller has the most event streams open at once."""

    status = 429
    code = "too_many_streams"
    number = 1052


class StorageFull(SandbankError):
    """The server's own storage (objects, database) has no room left."""

    status = 507
    code = "storage_full"
    number = 1055


class SandboxError(SandbankError):
    """The sandbox could not run the call at all (not the program's own failure)."""

    code = "sandbox_error"
    number = 1060


class ProtocolError(SandboxError):
    """A sandbox backend (a worker, a remote backend, a node) answered outside its protocol."""

    status = 502
    code = "protocol_error"
    number = 1062


class SandboxUnavailable(SandboxError):
    """No sandbox can be started just now (its fork template is being replaced): retry."""

    status = 503
    code = "sandbox_unavailable"
    number = 1063

    def __init__(self, message: str = "no sandbox can start now", retry_after: int = 2) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SnapshotDamaged(SandboxError):
    """A paused session's snapshot is torn or was changed on disk: refused, never half-used."""

    code = "snapshot_damaged"
    number = 1064


class PauseFailed(SandboxError):
    """A session could not be paused (or checkpointed); it keeps running as it was."""

    status = 503
    code = "pause_failed"
    number = 1065

    def __init__(self, message: str = "the session could not be paused", retry_after: int = 5):
        super().__init__(message)
        self.retry_after = retry_after


class Misdirected(SandbankError):
    """The Host header is not one this server serves (a DNS-rebinding guard)."""

    status = 421
    code = "misdirected"
    number = 1070


class MethodNotAllowed(SandbankError):
    """The resource does not take this method."""

    status = 405
    code = "method_not_allowed"
    number = 1080


class ConfigError(SandbankError):
    """The settings or the machine do not allow starting: the message says what to change."""

    code = "config_error"
    number = 1090


class IsolationUnavailable(ConfigError):
    """This machine lacks what the chosen isolation needs."""

    code = "isolation_unavailable"
    number = 1061


class AgentError(SandbankError):
    """The agent could not answer."""

    code = "agent_error"
    number = 1100


class ModelNotConfigured(AgentError):
    """No model is configured: questions are refused at once."""

    status = 503
    code = "model_not_configured"
    number = 1101

    def __init__(
        self,
        message: str = "no model is configured: set SANDBANK_LLM_MODEL (e.g. "
        "openai:gpt-4.1-mini), and SANDBANK_LLM_API_KEY or the provider's usual key variable; "
        "SANDBANK_LLM_BASE_URL points it at any OpenAI-compatible server",
    ) -> None:
        super().__init__(message)


class ModelEndpointRefused(AgentError):
    """The model's endpoint is refused (offline mode and not on loopback)."""

    status = 503
    code = "model_endpoint_refused"
    number = 1102


class ModelUnavailable(AgentError):
    """The model's provider failed, after retries."""

    status = 502
    code = "model_unavailable"
    number = 1103


class RunLimitReached(AgentError):
    """A run hit one of its limits (steps, tokens, time)."""

    code = "run_limit_reached"
    number = 1104

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit  # which setting: agent_max_steps, agent_max_tokens, ...


class RunCancelled(AgentError):
    """The run was cancelled by its user."""

    code = "run_cancelled"
    number = 1105

    def __init__(self, message: str = "cancelled") -> None:
        super().__init__(message)


class ModelUnreachable(AgentError):
    """The model's endpoint does not answer (refused, unresolvable, cut off): said at once,
    in words, with what the operator must look at."""

    status = 503
    code = "model_unreachable"
    number = 1106


def error_classes() -> list[type[SandbankError]]:
    """Every class of the tree, the root first."""
    found: list[type[SandbankError]] = [SandbankError]
    for cls in found:
        found.extend(c for c in cls.__subclasses__() if c.__module__ == __name__)
    return found


def error_numbers() -> dict[str, int]:
    """Each error code and its number, as the interpreter API publishes them."""
    return {cls.code: cls.number for cls in sorted(error_classes(), key=lambda c: c.number)}
