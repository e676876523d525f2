//! Sign-up and login.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sandbase_api::{
    ErrorBody, LoginRequest, LoginResponse, Role, Session, SignupAccepted, SignupRequest,
    SignupResponse, SwitchTeamRequest, TeamMembership, VerifyEmailRequest,
};
use secrecy::SecretString;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::accounts;
use crate::audit::Audit;
use crate::audit::RequestContext;
use crate::auth::Actor;
use crate::auth::abuse::{self, Attempt};
use crate::auth::password;
use crate::error::{ApiError, ApiResult};
use crate::http::client_ip::ClientIp;
use crate::http::extract::ApiJson;
use crate::state::AppState;
use crate::verification;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(signup))
        .routes(routes!(verify_email))
        .routes(routes!(login))
        .routes(routes!(switch_team))
}

/// A sign-up's answer: the account at once, or (verifying e-mail) that a mail went out.
enum SignupAnswer {
    Created(Box<SignupResponse>),
    Accepted(SignupAccepted),
}

impl IntoResponse for SignupAnswer {
    fn into_response(self) -> Response {
        match self {
            SignupAnswer::Created(created) => (StatusCode::CREATED, Json(*created)).into_response(),
            SignupAnswer::Accepted(accepted) => {
                (StatusCode::ACCEPTED, Json(accepted)).into_response()
            }
        }
    }
}

/// Create an account: a user, their team, a first API key and a dashboard session. When the
/// gateway verifies e-mail addresses, the answer is 202 for every address (a code went to a
/// new one, a notice to a registered one) and the account gets its key at `/v1/auth/verify`.
#[utoipa::path(post, path = "/v1/auth/signup", tag = "auth", request_body = SignupRequest,
    responses(
        (status = 201, description = "Account created; the API key token is shown only here", body = SignupResponse),
        (status = 202, description = "E-mail verification is on: a mail went to the address", body = SignupAccepted),
        (status = 409, description = "E-mail already registered (`email_taken`)", body = ErrorBody),
        (status = 422, description = "Invalid field (`invalid_request`)", body = ErrorBody),
        (status = 429, description = "Too many sign-ups from this address or network (`rate_limited`, with `Retry-After`)", body = ErrorBody),
    ))]
async fn signup(
    State(state): State<AppState>,
    context: RequestContext,
    ClientIp(ip): ClientIp,
    ApiJson(request): ApiJson<SignupRequest>,
) -> ApiResult<SignupAnswer> {
    let audit = context.action("auth.signup");
    // Every sign-up is starter credits: an address gets a few an hour.
    abuse::admit(&state, Attempt::Signup, ip).await?;
    let email = accounts::parse_email(&request.email)?;
    let team_name = accounts::parse_name("team_name", &request.team_name)?;
    password::check_new(&request.password)?;
    let password_hash = state
        .auth
        .passwords
        .hash(SecretString::from(request.password))
        .await?;
    if state.settings.auth.verify_email {
        let account = verification::NewAccount {
            email: &email,
            team_name: &team_name,
            password_hash: &password_hash,
        };
        verification::sign_up(&state, &audit, account).await?;
        return Ok(SignupAnswer::Accepted(SignupAccepted {
            status: "verification_sent".to_owned(),
            email,
        }));
    }

    let mut transaction = state.db.begin().await?;
    let (user, team) =
        accounts::create_user_with_team(&mut transaction, &email, &password_hash, &team_name, true)
            .await?;
    let created = verification::open_account(&state, &audit, transaction, user, team).await?;
    Ok(SignupAnswer::Created(Box::new(created)))
}

/// Confirm a new account's e-mail address with the code mailed at sign-up: the account gets
/// its starter credits, its first API key (shown only here) and a session. A code works once.
#[utoipa::path(post, path = "/v1/auth/verify", tag = "auth", request_body = VerifyEmailRequest,
    responses(
        (status = 201, description = "Address confirmed; the API key token is shown only here", body = SignupResponse),
        (status = 422, description = "Unknown, used or expired code (`invalid_verification`)", body = ErrorBody),
        (status = 429, description = "Too many attempts from this address (`rate_limited`)", body = ErrorBody),
    ))]
async fn verify_email(
    State(state): State<AppState>,
    context: RequestContext,
    ClientIp(ip): ClientIp,
    ApiJson(request): ApiJson<VerifyEmailRequest>,
) -> ApiResult<(StatusCode, Json<SignupResponse>)> {
    let audit = context.action("auth.verify");
    // Codes are 256 random bits, but guessing is still a login-like attempt.
    abuse::admit(&state, Attempt::Login, ip).await?;
    let created = verification::verify(&state, &audit, request.token.trim()).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Log in with e-mail and password; returns a dashboard session for one of the user's teams.
#[utoipa::path(post, path = "/v1/auth/login", tag = "auth", request_body = LoginRequest,
    responses(
        (status = 200, description = "OK", body = LoginResponse),
        (status = 401, description = "Wrong e-mail or password (`invalid_credentials`)", body = ErrorBody),
        (status = 429, description = "Too many logins from this address or network (`rate_limited`, with `Retry-After`)", body = ErrorBody),
        (status = 503, description = "Too many passwords being checked at once (`busy`, with `Retry-After`)", body = ErrorBody),
    ))]
async fn login(
    State(state): State<AppState>,
    context: RequestContext,
    ClientIp(ip): ClientIp,
    ApiJson(request): ApiJson<LoginRequest>,
) -> ApiResult<Json<LoginResponse>> {
    let audit = context.action("auth.login");
    // Every login is a password guess: an address gets a few a minute.
    abuse::admit(&state, Attempt::Login, ip).await?;
    if request.password.len() > password::MAX_LENGTH * 4 {
        return Err(ApiError::InvalidCredentials);
    }
    let mut connection = state.db.acquire().await?;
    let user = accounts::find_user_by_email(&mut connection, request.email.trim()).await?;
    let stored_hash = user.as_ref().map(|user| user.password_hash.clone());
    let verified = state
        .auth
        .passwords
        .verify(SecretString::from(request.password), stored_hash)
        .await?;
    let user = match user {
        Some(user) if verified => user,
        _ => return Err(ApiError::InvalidCredentials),
    };
    // Said only to whoever knows the password.
    if !verification::is_verified(&state, user.id).await? {
        return Err(ApiError::EmailNotVerified);
    }
    open_session(&state, &audit, &mut connection, user, request.team_id).await
}

/// A session for `user` in `team_id` (the user's oldest team when absent), audited as the
/// user's.
async fn open_session(
    state: &AppState,
    audit: &Audit,
    connection: &mut sqlx::PgConnection,
    user: accounts::UserRow,
    team_id: Option<uuid::Uuid>,
) -> ApiResult<Json<LoginResponse>> {
    let memberships = accounts::memberships(&mut *connection, user.id).await?;
    let chosen = match team_id {
        Some(team_id) => memberships.iter().find(|(team, _)| team.id == team_id),
        None => memberships.first(),
    }
    .ok_or(ApiError::NotFound("team"))?;
    let team_id = chosen.0.id;
    let role: Role = chosen
        .1
        .parse()
        .map_err(|error: String| anyhow::anyhow!(error))?;
    audit
        .record_as(
            &mut *connection,
            Some(team_id),
            "user",
            Some(user.id.to_string()),
            Some(format!("user:{}", user.id)),
            serde_json::json!({}),
        )
        .await?;
    let (token, expires_at) = state.auth.sessions.issue(user.id, team_id)?;
    let teams: Vec<TeamMembership> = memberships
        .into_iter()
        .map(|(team, role)| TeamMembership {
            team: team.into(),
            role: role.parse().unwrap_or(Role::Member),
        })
        .collect();
    let team = teams
        .iter()
        .find(|membership| membership.team.id == team_id)
        .map(|membership| membership.team.clone())
        .ok_or_else(|| anyhow::anyhow!("chosen team vanished from the membership list"))?;
    Ok(Json(LoginResponse {
        user: user.to_api(),
        team,
        role,
        session: Session { token, expires_at },
        teams,
    }))
}

#[utoipa::path(post, path = "/v1/auth/switch", tag = "auth", request_body = SwitchTeamRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A new session, for the chosen team", body = LoginResponse),
        (status = 401, description = "No valid session (`unauthenticated`, `session_expired`)", body = ErrorBody),
        (status = 403, description = "API keys belong to one team (`forbidden`)", body = ErrorBody),
        (status = 404, description = "Not a team of the user (`not_found`)", body = ErrorBody),
    ))]
async fn switch_team(
    State(state): State<AppState>,
    principal: crate::auth::Principal,
    context: RequestContext,
    ApiJson(request): ApiJson<SwitchTeamRequest>,
) -> ApiResult<Json<LoginResponse>> {
    let audit = context.action("auth.switch");
    let Actor::User { id } = principal.actor else {
        return Err(ApiError::Forbidden(
            "an API key belongs to one team: log in to switch teams".to_owned(),
        ));
    };
    let mut connection = state.db.acquire().await?;
    let user = accounts::find_user(&mut connection, id)
        .await?
        .ok_or(ApiError::Unauthenticated)?;
    open_session(&state, &audit, &mut connection, user, Some(request.team_id)).await
}
