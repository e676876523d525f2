//! The one error type of the API. Every variant maps to a status and a stable machine code;
//! internal causes are logged and answered with an opaque 500. How it becomes an HTTP
//! answer is the HTTP layer's business (`http/error.rs`).

use http::StatusCode;
use uuid::Uuid;

use crate::workers::client::WorkerError;

pub type ApiResult<T> = Result<T, ApiError>;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the body is not valid JSON.
    #[error("{0}")]
    InvalidJson(String),
    /// 422: the request is well-formed but a field is missing or invalid.
    #[error("{0}")]
    InvalidRequest(String),
    /// 413: the body is larger than the configured limit (`server.body_limit_bytes`).
    #[error("request body is larger than this server accepts")]
    PayloadTooLarge,
    /// 415: the body is not `application/json`.
    #[error("expected a body with content-type application/json")]
    UnsupportedMediaType,
    /// 401: no credentials were sent.
    #[error("missing credentials: send `Authorization: Bearer <api key or session token>`")]
    Unauthenticated,
    /// 401: the API key is malformed, unknown, or its secret is wrong.
    #[error("invalid API key")]
    InvalidApiKey { team_id: Option<Uuid> },
    /// 401: the API key was revoked.
    #[error("this API key has been revoked")]
    ApiKeyRevoked { team_id: Uuid },
    /// 401: the API key is past its expiry time.
    #[error("this API key has expired")]
    ApiKeyExpired { team_id: Uuid },
    /// 401: the session token is malformed, tampered with, or its user left the team.
    #[error("invalid session token")]
    InvalidSession,
    /// 401: the session token is past its expiry time.
    #[error("session token has expired: log in again")]
    SessionExpired,
    /// 401: wrong e-mail or password.
    #[error("wrong e-mail or password")]
    InvalidCredentials,
    /// 403: authenticated, but the role does not allow this.
    #[error("{0}")]
    Forbidden(String),
    /// 404: no such resource in the caller's team.
    #[error("{0} not found")]
    NotFound(&'static str),
    /// 404: no route matches the path.
    #[error("no route for {0}")]
    RouteNotFound(String),
    /// 405: the route exists but not for this method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// 409: the e-mail address is already registered.
    #[error("an account with this e-mail address already exists")]
    EmailTaken,
    /// 409: the change conflicts with the current state.
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// 429: too many requests; retry after the given number of seconds.
    #[error("rate limit exceeded: retry after {retry_after_secs} s")]
    RateLimited { retry_after_secs: u64 },
    /// 503 `no_workers`: no worker is connected.
    #[error("no worker is connected to this gateway")]
    NoWorkers,
    /// 503 `no_capacity`: every worker that could host the sandbox is full.
    #[error("every worker with this template is full; retry later")]
    NoCapacity,
    /// 409 `sandbox_not_running`: the sandbox is creating or stopped.
    #[error("{0}")]
    SandboxNotRunning(String),
    /// A worker's answer passed on: its own status and code, or 502.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// Any status with its own stable code.
    #[error("{message}")]
    Problem {
        status: StatusCode,
        code: &'static str,
        message: String,
    },
    /// 503: a dependency (Postgres, Redis) is unavailable.
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// 500: a database failure; the cause is logged, not returned.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// 500: any other internal failure; the cause is logged, not returned.
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    pub fn problem(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::Problem {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn status_code(&self) -> StatusCode {
        match self {
            ApiError::InvalidJson(_) => StatusCode::BAD_REQUEST,
            ApiError::InvalidRequest(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unauthenticated
            | ApiError::InvalidApiKey { .. }
            | ApiError::ApiKeyRevoked { .. }
            | ApiError::ApiKeyExpired { .. }
            | ApiError::InvalidSession
            | ApiError::SessionExpired
            | ApiError::InvalidCredentials => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) | ApiError::RouteNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::EmailTaken | ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::NoWorkers | ApiError::NoCapacity => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::SandboxNotRunning(_) => StatusCode::CONFLICT,
            ApiError::Worker(error) => error.status_code(),
            ApiError::Problem { status, .. } => *status,
            ApiError::Database(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable machine code clients branch on.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidJson(_) => "invalid_json",
            ApiError::InvalidRequest(_) => "invalid_request",
            ApiError::PayloadTooLarge => "payload_too_large",
            ApiError::UnsupportedMediaType => "unsupported_media_type",
            ApiError::Unauthenticated => "unauthenticated",
            ApiError::InvalidApiKey { .. } => "invalid_api_key",
            ApiError::ApiKeyRevoked { .. } => "api_key_revoked",
            ApiError::ApiKeyExpired { .. } => "api_key_expired",
            ApiError::InvalidSession => "invalid_session",
            ApiError::SessionExpired => "session_expired",
            ApiError::InvalidCredentials => "invalid_credentials",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::RouteNotFound(_) => "route_not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::EmailTaken => "email_taken",
            ApiError::Conflict { code, .. } => code,
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::NoWorkers => "no_workers",
            ApiError::NoCapacity => "no_capacity",
            ApiError::SandboxNotRunning(_) => "sandbox_not_running",
            ApiError::Worker(error) => error.code(),
            ApiError::Problem { code, .. } => code,
            ApiError::Database(_) | ApiError::Internal(_) => "internal",
        }
    }

    /// Whether this error is a failed authentication (recorded in the audit log).
    pub fn is_authentication_failure(&self) -> bool {
        self.status_code() == StatusCode::UNAUTHORIZED
    }

    /// The team an authentication failure can be tied to, when the key was known.
    pub fn team_id(&self) -> Option<Uuid> {
        match self {
            ApiError::InvalidApiKey { team_id } => *team_id,
            ApiError::ApiKeyRevoked { team_id } | ApiError::ApiKeyExpired { team_id } => {
                Some(*team_id)
            }
            _ => None,
        }
    }
}

/// Maps a unique-constraint violation to `on_conflict`, and any other database error to a 500.
pub fn map_unique_violation(error: sqlx::Error, on_conflict: ApiError) -> ApiError {
    match &error {
        sqlx::Error::Database(database_error) if database_error.is_unique_violation() => {
            on_conflict
        }
        _ => ApiError::Database(error),
    }
}
