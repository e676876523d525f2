//! Preview URLs of a sandbox's ports: the public wire types.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// The header that carries a preview's token.
pub const PREVIEW_TOKEN_HEADER: &str = "x-sandbase-preview-token";
/// The query parameter of a signed preview URL (`EXPIRY.SIGNATURE`); the gateway trades it
/// for a cookie of the preview's host and redirects to the same URL without it.
pub const PREVIEW_SIGNATURE_PARAM: &str = "sandbase_preview";
/// The cookie a signed URL leaves on the preview's host (its own origin).
pub const PREVIEW_COOKIE: &str = "sandbase_preview";
/// The preview cookie's name over https: `__Host-` keeps it to the preview's own host,
/// `Secure`, path `/` (no sibling preview can set or shadow it).
pub const PREVIEW_COOKIE_SECURE: &str = "__Host-sandbase_preview";

/// Open a port of a sandbox at `{port}-{sandbox_id}.{preview domain}`. Asking again for the
/// same port replaces its token (the old one and its signed URLs stop working).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewPreview {
    /// A TCP port something in the sandbox listens on (127.0.0.1 or 0.0.0.0).
    #[schema(minimum = 1, maximum = 65535)]
    pub port: u16,
    /// Reachable by anyone with the URL, without token or signature.
    #[serde(default)]
    pub public: bool,
    /// How long the signed URL works (default 3600, at most 7 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 60, maximum = 604800)]
    pub signed_url_ttl_secs: Option<u64>,
}

/// A port of a sandbox reachable through its preview URL.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Preview {
    pub sandbox_id: Uuid,
    pub port: u16,
    /// `{scheme}://{port}-{sandbox_id}.{preview domain}/`; without `public`, send the token
    /// in `x-sandbase-preview-token` or open the signed URL.
    pub url: String,
    pub public: bool,
    pub created_at: DateTime<Utc>,
}

/// A preview just opened, with its credentials (shown once).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedPreview {
    #[serde(flatten)]
    pub preview: Preview,
    /// Sent as `x-sandbase-preview-token`; works until the preview is replaced or removed.
    pub token: String,
    /// The URL with an expiring signature, for a browser: the first visit leaves a cookie
    /// on the preview's host and redirects to the plain URL.
    pub signed_url: String,
    pub signed_url_expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PreviewList {
    pub previews: Vec<Preview>,
}
