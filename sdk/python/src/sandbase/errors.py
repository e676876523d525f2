"""SandBase's refusals as exceptions, one class per kind of `error.code`."""

from __future__ import annotations


class SandbaseError(Exception):
    """An answer of the API that is not a success: its status, machine code and message."""

    def __init__(
        self, status: int, code: str, message: str, request_id: str | None = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id


class AuthenticationError(SandbaseError):
    """401: no key, a wrong, revoked or expired key, an expired session."""


class PermissionDenied(SandbaseError):
    """403: the key's role does not allow this."""


class NotFound(SandbaseError):
    """404: no such sandbox, process, file, key… in the caller's team."""


class Conflict(SandbaseError):
    """409: the resource is not in a state that allows this."""


class InvalidRequest(SandbaseError):
    """422 (or 400, 413, 415): the request itself is refused."""


class InsufficientCredits(SandbaseError):
    """402 `insufficient_credits`: the team's credits do not cover this."""


class SpendCapReached(SandbaseError):
    """402 `spend_cap_reached`: the key's or the sandbox's cap is spent."""


class RateLimited(SandbaseError):
    """429: too many requests; `retry_after` is how long the server asked to wait."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, code, message, request_id)
        self.retry_after = retry_after


class ServiceUnavailable(SandbaseError):
    """503 (and other 5xx): the server could not answer now."""


def error_for(
    status: int,
    code: str,
    message: str,
    request_id: str | None = None,
    retry_after: float | None = None,
) -> SandbaseError:
    """The exception for an answer: by code first, then by status."""
    if code == "insufficient_credits":
        return InsufficientCredits(status, code, message, request_id)
    if code == "spend_cap_reached":
        return SpendCapReached(status, code, message, request_id)
    if status == 429 or code == "rate_limited":
        return RateLimited(status, code, message, request_id, retry_after)
    kinds: dict[int, type[SandbaseError]] = {
        401: AuthenticationError,
        403: PermissionDenied,
        404: NotFound,
        409: Conflict,
        400: InvalidRequest,
        413: InvalidRequest,
        415: InvalidRequest,
        422: InvalidRequest,
    }
    if status in kinds:
        return kinds[status](status, code, message, request_id)
    if status >= 500:
        return ServiceUnavailable(status, code, message, request_id)
    return SandbaseError(status, code, message, request_id)
