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
    /// 403 `exceeds_parent_key`: a key asked for more than the key making it has.
    #[error("{0}")]
    ExceedsParentKey(String),
    /// 403 `restricted_key`: a key with a cap, an expiry or a parent key may not do this
    /// (membership changes are for people and unrestricted keys).
    #[error("{0}")]
    RestrictedKey(String),
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
    /// 409 `already_member`: the user is in the team already (the e-mail address).
    #[error("{0} is already a member of this team")]
    AlreadyMember(String),
    /// 409 `last_owner`: the change would leave the team without an owner.
    #[error("a team needs at least one owner: make someone else owner first")]
    LastOwner,
    /// 409 `secret_exists`: a secret of this name exists.
    #[error("a secret named `{0}` exists; PUT /v1/secrets/{0} sets a new value")]
    SecretExists(String),
    /// 422 `unknown_credential`: the team has no secret of this name.
    #[error("this team has no secret named `{0}` (POST /v1/secrets)")]
    UnknownCredential(String),
    /// 403 `credential_not_usable`: the secret may be attached only by a higher role.
    #[error("the secret `{0}` may be attached only by the {1} role or above (its `usable_by`)")]
    CredentialNotUsable(String, sandbase_api::Role),
    /// 501 `vault_not_configured`: no vault key on this deployment.
    #[error("the credential vault has no key on this deployment (vault.keys or vault.key_file)")]
    VaultNotConfigured,
    /// 409 `egress_not_enabled`: the sandbox was created without egress.
    #[error("this sandbox was created without egress (loopback only); create one with `egress`")]
    EgressNotEnabled,
    /// 422 `credentials_need_egress`: credentials without an egress policy.
    #[error(
        "credentials are added to requests leaving through the egress proxy: give `egress.allow` with their hosts"
    )]
    CredentialsNeedEgress,
    /// 402 `insufficient_credits`: the team's credits do not cover the first minute.
    #[error(
        "the team's credits do not cover this sandbox's first minute; buy credits or ask an admin"
    )]
    InsufficientCredits,
    /// 409 `recording_quota_reached`: the team's kept recordings fill its quota.
    #[error(
        "the team's recordings hold {used_mb} MiB of its {quota_mb} MiB quota: delete some (DELETE /v1/recordings/{{id}}) or ask with `record: false`"
    )]
    RecordingQuotaReached { used_mb: u64, quota_mb: u64 },
    /// 402 `spend_cap_reached`: a spend cap (the key's, an ancestor's, or the calling
    /// sandbox's) does not cover what this would cost.
    #[error(
        "a spend cap (`max_credits` of this API key, a key it was made from, or the sandbox) does not cover this"
    )]
    SpendCapReached,
    /// 422 `template_not_found`: no live worker has the template.
    #[error("no worker has the template `{0}`")]
    TemplateNotFound(String),
    /// 422 `volume_not_found`: no live worker with the template offers the volumes.
    #[error(
        "no worker has the template `{0}` and the volumes asked for (a writable mount needs a volume your team may write)"
    )]
    VolumeNotFound(String),
    /// 422 `isolation_unavailable`: no live worker offers the isolation level asked for.
    #[error("no worker offers {0} isolation (the node needs runsc for gvisor)")]
    IsolationUnavailable(&'static str),
    /// 503 `worker_unavailable`: the sandbox's worker is not live.
    #[error("the worker hosting this sandbox is not reachable")]
    WorkerUnavailable,
    /// 404 `unknown_worker`: a heartbeat from a worker that never registered.
    #[error("this worker is not registered")]
    UnknownWorker,
    /// 401 `invalid_node_token`: an internal call without a genuine worker credential.
    #[error("missing or wrong worker credential")]
    InvalidNodeToken,
    /// 403 `worker_mismatch`: a worker speaking for another worker.
    #[error("this credential belongs to another worker")]
    WorkerMismatch,
    /// 401 `invalid_operator_token`: an operator route without the operator token.
    #[error(
        "operator routes take the operator token (`Authorization: Bearer <auth.operator_token>`)"
    )]
    InvalidOperatorToken,
    /// 422 `unknown_price`: a usage event the price table has no price for.
    #[error("{0}")]
    UnknownPrice(String),
    /// 501 `billing_not_configured`: Stripe is not set up (which key is missing).
    #[error("{0}")]
    BillingNotConfigured(&'static str),
    /// 502 `stripe_error`: Stripe did not create the checkout.
    #[error("Stripe could not create the checkout; try again")]
    StripeError,
    /// 400 `invalid_signature`: a webhook whose signature does not verify.
    #[error("the Stripe-Signature header does not verify")]
    InvalidSignature,
    /// 409 `run_not_finished`: the run is still queued or running.
    #[error("the run is {0}")]
    RunNotFinished(&'static str),
    /// 410 `artifact_expired`: the run's artifact was deleted when its retention ended.
    #[error("this run's artifact was kept for its retention period and then deleted")]
    ArtifactExpired,
    /// 404 `no_artifact`: the run left no outputs directory.
    #[error("this run left no artifact (its outputs directory was missing)")]
    NoArtifact,
    /// 429: too many requests; retry after the given number of seconds.
    #[error("rate limit exceeded: retry after {retry_after_secs} s")]
    RateLimited { retry_after_secs: u64 },
    /// 429 `sandbox_quota_reached`: the team holds its quota of sandboxes.
    #[error(
        "the team holds its quota of {0} sandboxes at once: destroy one, or ask the operator for more"
    )]
    SandboxQuotaReached(u32),
    /// 503 `no_workers`: no worker is connected.
    #[error("no worker is connected to this gateway")]
    NoWorkers,
    /// 503 `no_secure_worker`: credentials go to workers only over TLS, and none is reached so.
    #[error(
        "credentials travel to workers only over TLS, and no worker that could host this sandbox is reached over https (the operator configures internal_tls)"
    )]
    NoSecureWorker,
    /// 503 `no_capacity`: every worker that could host the sandbox is full.
    #[error("every worker with this template is full; retry later")]
    NoCapacity,
    /// 409 `sandbox_not_running`: the sandbox is creating or stopped.
    #[error("{0}")]
    SandboxNotRunning(String),
    /// 401 `invalid_ticket`: an attach ticket that is unknown, used or expired.
    #[error("this attach ticket is unknown, used or expired: ask for a new one")]
    InvalidTicket,
    /// 501 `previews_not_configured`: the operator set no `previews.domain`.
    #[error("preview URLs are not configured on this deployment (previews.domain)")]
    PreviewsNotConfigured,
    /// 401 `preview_unauthorized`: a preview that is not public, without its token or a
    /// current signature.
    #[error(
        "this preview needs its token in x-sandbase-preview-token, or a signed URL that has not expired"
    )]
    PreviewUnauthorized,
    /// 503 `preview_busy`: the preview, its sandbox or the gateway holds as many preview
    /// connections as it may.
    #[error("{0}")]
    PreviewBusy(String),
    /// 422 `unsupported_parameter`: a model call asks for what the store does not pass on or
    /// does not price.
    #[error("{0}")]
    UnsupportedParameter(String),
    /// 426 `websocket_required`: a WebSocket route asked without a proper handshake.
    #[error("this route is a WebSocket: {0}")]
    WebSocketRequired(String),
    /// 403 `preview_cross_site`: a request riding a preview's cookie from another site (a
    /// `fetch`, a script, an image, a frame, a WebSocket of another origin).
    #[error(
        "this preview's cookie is not accepted on requests another site makes: open the preview itself, or send its token in x-sandbase-preview-token"
    )]
    PreviewCrossSite,
    /// 502 `preview_failed`: the server in the sandbox did not answer.
    #[error("{0}")]
    PreviewFailed(String),
    /// 404 `model_not_found`: no model of that id in the store (of that family).
    #[error("no model `{0}` in the store: GET /v1/store/models lists them")]
    ModelNotFound(String),
    /// 404 `api_not_found`: no paid API of that name in the store.
    #[error("no API `{0}` in the store: GET /v1/store/apis lists them")]
    StoreApiNotFound(String),
    /// 403 `model_not_allowed`: the key may not call this model.
    #[error("this API key may not call model `{0}`")]
    ModelNotAllowed(String),
    /// 502 `upstream_auth_failed`: the provider refused the operator's credential.
    #[error("the provider refused the operator's credential; the operator has to fix it")]
    UpstreamAuthFailed,
    /// 502 `upstream_failed`: the provider could not be reached or broke off.
    #[error("the provider could not be reached: {0}")]
    UpstreamFailed(String),
    /// 504 `upstream_timeout`: the provider did not answer in time.
    #[error("the provider did not answer in time")]
    UpstreamTimeout,
    /// A worker's answer passed on: its own status and code, or 502.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// 422 `invalid_verification`: an unknown, used or expired verification code.
    #[error("this verification code is unknown, used or expired: sign up again for a new one")]
    InvalidVerification,
    /// 403 `email_not_verified`: the account's address is not proved yet.
    #[error("confirm your e-mail address first: the code is in the mail sent at sign-up")]
    EmailNotVerified,
    /// 503 `busy`: every password-hashing slot is taken; retry in a second.
    #[error("the server is busy checking passwords; retry in a second")]
    Busy,
    /// 503: a dependency (Postgres, Redis) is unavailable.
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// 500: a database failure; the cause is logged, not returned.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// 500: any other internal failure; the cause is logged, not returned.
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
    /// A refusal with its own status and code (the harness's: `agent_run_finished`,
    /// `idempotency_key_reused`, …), each documented on its route.
    #[error("{message}")]
    Refused {
        status: StatusCode,
        code: &'static str,
        message: String,
    },
}

impl ApiError {
    pub fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Refused { status, .. } => *status,
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
            ApiError::Forbidden(_)
            | ApiError::ExceedsParentKey(_)
            | ApiError::RestrictedKey(_)
            | ApiError::PreviewCrossSite
            | ApiError::CredentialNotUsable(..) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) | ApiError::RouteNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::WebSocketRequired(_) => StatusCode::UPGRADE_REQUIRED,
            ApiError::PreviewBusy(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::EmailTaken
            | ApiError::AlreadyMember(_)
            | ApiError::LastOwner
            | ApiError::RecordingQuotaReached { .. }
            | ApiError::SecretExists(_)
            | ApiError::EgressNotEnabled
            | ApiError::RunNotFinished(_) => StatusCode::CONFLICT,
            ApiError::UnknownCredential(_)
            | ApiError::CredentialsNeedEgress
            | ApiError::TemplateNotFound(_)
            | ApiError::VolumeNotFound(_)
            | ApiError::IsolationUnavailable(_)
            | ApiError::UnknownPrice(_)
            | ApiError::UnsupportedParameter(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::VaultNotConfigured | ApiError::BillingNotConfigured(_) => {
                StatusCode::NOT_IMPLEMENTED
            }
            ApiError::InsufficientCredits | ApiError::SpendCapReached => {
                StatusCode::PAYMENT_REQUIRED
            }
            ApiError::WorkerUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::UnknownWorker | ApiError::NoArtifact => StatusCode::NOT_FOUND,
            ApiError::InvalidNodeToken | ApiError::InvalidOperatorToken => StatusCode::UNAUTHORIZED,
            ApiError::WorkerMismatch | ApiError::EmailNotVerified => StatusCode::FORBIDDEN,
            ApiError::InvalidVerification => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::ArtifactExpired => StatusCode::GONE,
            ApiError::StripeError => StatusCode::BAD_GATEWAY,
            ApiError::InvalidSignature => StatusCode::BAD_REQUEST,
            ApiError::RateLimited { .. } | ApiError::SandboxQuotaReached(_) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::Unavailable(_) | ApiError::Busy => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::NoWorkers | ApiError::NoCapacity | ApiError::NoSecureWorker => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::SandboxNotRunning(_) => StatusCode::CONFLICT,
            ApiError::InvalidTicket | ApiError::PreviewUnauthorized => StatusCode::UNAUTHORIZED,
            ApiError::PreviewsNotConfigured => StatusCode::NOT_IMPLEMENTED,
            ApiError::PreviewFailed(_) => StatusCode::BAD_GATEWAY,
            ApiError::ModelNotFound(_) | ApiError::StoreApiNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::ModelNotAllowed(_) => StatusCode::FORBIDDEN,
            ApiError::UpstreamAuthFailed | ApiError::UpstreamFailed(_) => StatusCode::BAD_GATEWAY,
            ApiError::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Worker(error) => error.status_code(),
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
            ApiError::Refused { code, .. } => code,
            ApiError::Unauthenticated => "unauthenticated",
            ApiError::InvalidApiKey { .. } => "invalid_api_key",
            ApiError::ApiKeyRevoked { .. } => "api_key_revoked",
            ApiError::ApiKeyExpired { .. } => "api_key_expired",
            ApiError::InvalidSession => "invalid_session",
            ApiError::SessionExpired => "session_expired",
            ApiError::InvalidCredentials => "invalid_credentials",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::ExceedsParentKey(_) => "exceeds_parent_key",
            ApiError::RestrictedKey(_) => "restricted_key",
            ApiError::NotFound(_) => "not_found",
            ApiError::RouteNotFound(_) => "route_not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::EmailTaken => "email_taken",
            ApiError::AlreadyMember(_) => "already_member",
            ApiError::LastOwner => "last_owner",
            ApiError::RecordingQuotaReached { .. } => "recording_quota_reached",
            ApiError::SecretExists(_) => "secret_exists",
            ApiError::UnknownCredential(_) => "unknown_credential",
            ApiError::CredentialNotUsable(..) => "credential_not_usable",
            ApiError::VaultNotConfigured => "vault_not_configured",
            ApiError::EgressNotEnabled => "egress_not_enabled",
            ApiError::CredentialsNeedEgress => "credentials_need_egress",
            ApiError::InsufficientCredits => "insufficient_credits",
            ApiError::SpendCapReached => "spend_cap_reached",
            ApiError::TemplateNotFound(_) => "template_not_found",
            ApiError::VolumeNotFound(_) => "volume_not_found",
            ApiError::IsolationUnavailable(_) => "isolation_unavailable",
            ApiError::WorkerUnavailable => "worker_unavailable",
            ApiError::UnknownWorker => "unknown_worker",
            ApiError::InvalidNodeToken => "invalid_node_token",
            ApiError::WorkerMismatch => "worker_mismatch",
            ApiError::InvalidOperatorToken => "invalid_operator_token",
            ApiError::UnknownPrice(_) => "unknown_price",
            ApiError::BillingNotConfigured(_) => "billing_not_configured",
            ApiError::StripeError => "stripe_error",
            ApiError::InvalidSignature => "invalid_signature",
            ApiError::RunNotFinished(_) => "run_not_finished",
            ApiError::NoArtifact => "no_artifact",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Busy => "busy",
            ApiError::ArtifactExpired => "artifact_expired",
            ApiError::InvalidVerification => "invalid_verification",
            ApiError::EmailNotVerified => "email_not_verified",
            ApiError::NoSecureWorker => "no_secure_worker",
            ApiError::SandboxQuotaReached(_) => "sandbox_quota_reached",
            ApiError::NoWorkers => "no_workers",
            ApiError::NoCapacity => "no_capacity",
            ApiError::SandboxNotRunning(_) => "sandbox_not_running",
            ApiError::InvalidTicket => "invalid_ticket",
            ApiError::PreviewsNotConfigured => "previews_not_configured",
            ApiError::PreviewUnauthorized => "preview_unauthorized",
            ApiError::PreviewCrossSite => "preview_cross_site",
            ApiError::WebSocketRequired(_) => "websocket_required",
            ApiError::UnsupportedParameter(_) => "unsupported_parameter",
            ApiError::PreviewBusy(_) => "preview_busy",
            ApiError::PreviewFailed(_) => "preview_failed",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::ModelNotAllowed(_) => "model_not_allowed",
            ApiError::StoreApiNotFound(_) => "api_not_found",
            ApiError::UpstreamAuthFailed => "upstream_auth_failed",
            ApiError::UpstreamFailed(_) => "upstream_failed",
            ApiError::UpstreamTimeout => "upstream_timeout",
            ApiError::Worker(error) => error.code(),
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
