//! Credentials in the vault. A value goes in and never comes out through the API: sandboxes
//! that name a credential get it added to their outbound requests by the egress proxy.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// How the credential is added to requests for its hosts. Exactly one of `header` (with
/// `format`), `basic`, `query` or `placeholder`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Injection {
    /// Set (or overwrite) this request header, e.g. `Authorization`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// The header's value, with `{value}` where the secret goes (default `{value}`), e.g.
    /// `Bearer {value}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// HTTP basic authentication with this user name and the secret as the password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic: Option<BasicAuth>,
    /// Set this query parameter to the secret, e.g. `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// The sandbox gets an environment variable holding a look-alike placeholder, which the
    /// proxy swaps for the secret in the credential headers of requests to the secret's hosts
    /// (`headers` names them); in their bodies and URLs only when the secret opts in, for the
    /// paths it names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<Placeholder>,
}

/// The variable's name (`"GITHUB_TOKEN"`), or the name and where else the placeholder is
/// swapped (`{"env": "GITHUB_TOKEN", "in_body": true, "paths": ["/v1/chat/*"]}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Placeholder {
    Env(String),
    Options(PlaceholderOptions),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlaceholderOptions {
    /// The environment variable holding the placeholder.
    pub env: String,
    /// Also swapped in request bodies (for `paths`). A body echoed back is scrubbed, but an
    /// upstream that stores what it is sent keeps the value: opt in only for APIs that need
    /// it.
    #[serde(default)]
    pub in_body: bool,
    /// Also swapped in the request's path and query (for `paths`).
    #[serde(default)]
    pub in_url: bool,
    /// Request paths the body and URL swaps apply to: exact, or a prefix ending in `*`
    /// (`/v1/chat/*`). Required with `in_body` or `in_url`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// The request headers it is swapped in (default: `authorization`,
    /// `proxy-authorization`, `x-api-key`, `api-key`, `private-token`, `x-auth-token`). In any
    /// other header it stays a placeholder, so an upstream echoing a header of the sandbox's
    /// choosing never hands back the value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<String>,
}

impl Placeholder {
    pub fn options(&self) -> PlaceholderOptions {
        match self {
            Placeholder::Env(env) => PlaceholderOptions {
                env: env.clone(),
                ..PlaceholderOptions::default()
            },
            Placeholder::Options(options) => options.clone(),
        }
    }
}

/// Who may attach a secret to a sandbox or run: `admin` (and owners; the default) or
/// `member` (everyone on the team).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UsableBy {
    #[default]
    Admin,
    Member,
}

impl UsableBy {
    pub fn as_str(self) -> &'static str {
        match self {
            UsableBy::Admin => "admin",
            UsableBy::Member => "member",
        }
    }

    pub fn parse(text: &str) -> Option<UsableBy> {
        match text {
            "admin" => Some(UsableBy::Admin),
            "member" => Some(UsableBy::Member),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSecretRequest {
    /// 1 to 64 letters, digits, `_`, `.` or `-`, starting with a letter or digit.
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    pub name: String,
    /// The secret (at most 64 KiB). Never shown again.
    #[schema(min_length = 1, max_length = 16384)]
    pub value: String,
    /// Hosts it is added to requests for: `api.github.com`, `*.example.org` (subdomains, not
    /// the apex), `host:8443` (ports 80 and 443 unless one is named).
    #[schema(min_items = 1, max_items = 32)]
    pub hosts: Vec<String>,
    pub inject: Injection,
    /// Who may attach it to a sandbox or run (default `admin`).
    #[serde(default)]
    pub usable_by: UsableBy,
}

/// A new version of a secret; `hosts` and `inject` change only when given.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSecretRequest {
    pub value: String,
    #[serde(default)]
    pub hosts: Option<Vec<String>>,
    #[serde(default)]
    pub inject: Option<Injection>,
    #[serde(default)]
    pub usable_by: Option<UsableBy>,
}

/// A secret's metadata (never its value).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Secret {
    pub id: Uuid,
    pub name: String,
    pub hosts: Vec<String>,
    pub inject: Injection,
    pub usable_by: UsableBy,
    /// Grows by one with every new value.
    pub version: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SecretList {
    pub secrets: Vec<Secret>,
}
