"""The error tree: every failure Sandbank reports, each knowing its HTTP status and stable code.

    SandbankError                      500  internal
    ├── BadRequest                     400  bad_request
    │   ├── UnknownTool                400  unknown_tool
    │   ├── IsADirectory               400  is_a_directory
    │   ├── Unprocessable              422  unprocessable
    │   └── UnsupportedMediaType       415  unsupported_media_type
    ├── Unauthorized                   401  unauthorized
    ├── Forbidden                      403  forbidden
    │   └── PathEscape                 403  path_escape
    ├── NotFound                       404  not_found
    │   └── SessionNotFound            404  session_not_found
    ├── Conflict                       409  conflict
    │   ├── RunInProgress              409  run_in_progress
    │   ├── TooManyRuns                409  too_many_runs
    │   └── QuotaExceeded              409  quota_exceeded
    ├── PayloadTooLarge                413  payload_too_large
    ├── AtCapacity                     503  at_capacity
    ├── SandboxError                   500  sandbox_error
    │   └── IsolationUnavailable       500  isolation_unavailable
    └── AgentError                     500  agent_error
        ├── ModelNotConfigured         503  model_not_configured
        ├── ModelEndpointRefused       503  model_endpoint_refused
        ├── ModelUnavailable           502  model_unavailable
        ├── RunLimitReached            500  run_limit_reached
        └── RunCancelled               500  run_cancelled

A user program's failure is never one of these: it is a result with a return code.
Foreign exceptions are translated into this tree at the edge that meets them.
"""

from __future__ import annotations


class SandbankError(Exception):
    status = 500
    code = "internal"

    def __init__(self, message: str = "internal error") -> None:
        super().__init__(message)
        self.message = message


class BadRequest(SandbankError):
    status = 400
    code = "bad_request"


class UnknownTool(BadRequest):
    code = "unknown_tool"


class Unprocessable(BadRequest):
    status = 422
    code = "unprocessable"


class UnsupportedMediaType(BadRequest):
    status = 415
    code = "unsupported_media_type"


class Unauthorized(SandbankError):
    status = 401
    code = "unauthorized"


class Forbidden(SandbankError):
    status = 403
    code = "forbidden"


class PathEscape(Forbidden):
    code = "path_escape"


class NotFound(SandbankError):
    status = 404
    code = "not_found"


class SessionNotFound(NotFound):
    code = "session_not_found"


class IsADirectory(BadRequest):
    code = "is_a_directory"


class Conflict(SandbankError):
    status = 409
    code = "conflict"


class RunInProgress(Conflict):
    code = "run_in_progress"


class TooManyRuns(Conflict):
    code = "too_many_runs"


class QuotaExceeded(Conflict):
    code = "quota_exceeded"


class PayloadTooLarge(SandbankError):
    status = 413
    code = "payload_too_large"


class AtCapacity(SandbankError):
    status = 503
    code = "at_capacity"

    def __init__(self, message: str = "at capacity", retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SandboxError(SandbankError):
    code = "sandbox_error"


class IsolationUnavailable(SandboxError):
    code = "isolation_unavailable"


class AgentError(SandbankError):
    code = "agent_error"


class ModelNotConfigured(AgentError):
    status = 503
    code = "model_not_configured"

    def __init__(
        self,
        message: str = "no model is configured: set SANDBANK_LLM_MODEL (e.g. "
        "openai:gpt-4.1-mini), and SANDBANK_LLM_API_KEY or the provider's usual key variable; "
        "SANDBANK_LLM_BASE_URL points it at any OpenAI-compatible server",
    ) -> None:
        super().__init__(message)


class ModelEndpointRefused(AgentError):
    status = 503
    code = "model_endpoint_refused"


class ModelUnavailable(AgentError):
    status = 502
    code = "model_unavailable"


class RunLimitReached(AgentError):
    code = "run_limit_reached"

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit  # which setting: agent_max_steps, agent_max_tokens, ...


class RunCancelled(AgentError):
    code = "run_cancelled"

    def __init__(self, message: str = "cancelled") -> None:
        super().__init__(message)
