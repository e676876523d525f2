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
    /// The sandbox gets this environment variable holding a look-alike placeholder; the
    /// proxy swaps the placeholder for the secret in requests to the secret's hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<String>,
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
    pub name: String,
    /// The secret (at most 64 KiB). Never shown again.
    pub value: String,
    /// Hosts it is added to requests for: `api.github.com`, `*.example.org` (subdomains, not
    /// the apex), `host:8443` (ports 80 and 443 unless one is named).
    pub hosts: Vec<String>,
    pub inject: Injection,
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
}

/// A secret's metadata (never its value).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Secret {
    pub id: Uuid,
    pub name: String,
    pub hosts: Vec<String>,
    pub inject: Injection,
    /// Grows by one with every new value.
    pub version: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SecretList {
    pub secrets: Vec<Secret>,
}
