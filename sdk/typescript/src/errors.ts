// SandBase's refusals as exceptions, one class per kind of `error.code`.

export class SandbaseError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly requestId?: string,
  ) {
    super(`${status} ${code}: ${message}`);
    this.name = new.target.name;
  }
}

/** 401: no key, a wrong, revoked or expired key. */
export class AuthenticationError extends SandbaseError {}
/** 403: the key's role does not allow this. */
export class PermissionDenied extends SandbaseError {}
/** 404: nothing of that id in the caller's team. */
export class NotFound extends SandbaseError {}
/** 409: not in a state that allows this. */
export class Conflict extends SandbaseError {}
/** 400, 413, 415, 422: the request itself is refused. */
export class InvalidRequest extends SandbaseError {}
/** 402 `insufficient_credits`. */
export class InsufficientCredits extends SandbaseError {}
/** 402 `spend_cap_reached`: the key's or the sandbox's cap. */
export class SpendCapReached extends SandbaseError {}
/** 5xx: the server could not answer now. */
export class ServiceUnavailable extends SandbaseError {}
/** 429, with how long the server asked to wait (seconds). */
export class RateLimited extends SandbaseError {
  constructor(status: number, code: string, message: string, requestId?: string, readonly retryAfter?: number) {
    super(status, code, message, requestId);
  }
}

const BY_STATUS: Record<number, typeof SandbaseError> = {
  400: InvalidRequest,
  401: AuthenticationError,
  403: PermissionDenied,
  404: NotFound,
  409: Conflict,
  413: InvalidRequest,
  415: InvalidRequest,
  422: InvalidRequest,
};

/** The exception for an answer: by code first, then by status. */
export function errorFor(status: number, code: string, message: string, requestId?: string, retryAfter?: number): SandbaseError {
  if (code === "insufficient_credits") return new InsufficientCredits(status, code, message, requestId);
  if (code === "spend_cap_reached") return new SpendCapReached(status, code, message, requestId);
  if (status === 429 || code === "rate_limited") return new RateLimited(status, code, message, requestId, retryAfter);
  const Kind = BY_STATUS[status];
  if (Kind) return new Kind(status, code, message, requestId);
  if (status >= 500) return new ServiceUnavailable(status, code, message, requestId);
  return new SandbaseError(status, code, message, requestId);
}
