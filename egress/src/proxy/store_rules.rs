//! What a request to the store host becomes (the store host's rules, apart from the
//! connection that carries them): one of the store's routes, none of the sandbox's own
//! credentials, the sandbox's store credential and the gateway's name.

use http::HeaderValue;

/// The routes of the gateway a sandbox may reach through the store host.
const STORE_PATHS: [&str; 3] = ["/openai/", "/anthropic/", "/store/apis/"];

/// The flow log's name for the credential the proxy adds.
pub(super) const STORE_CREDENTIAL: &str = "sandbase-store";

/// What a store session adds to each request.
pub(super) struct StoreAccess {
    authorization: HeaderValue,
    authority: HeaderValue,
}

impl StoreAccess {
    pub(super) fn new(authorization: HeaderValue, authority: HeaderValue) -> StoreAccess {
        StoreAccess {
            authorization,
            authority,
        }
    }

    /// Makes `parts` a request to the store: refused (status, why) outside its routes; the
    /// sandbox's credentials taken out, the sandbox's store credential put in.
    pub(super) fn prepare(&self, parts: &mut http::request::Parts) -> Result<(), (u16, String)> {
        let path = parts.uri.path();
        let dotted = path.split('/').any(|segment| {
            segment == "." || segment == ".." || segment.to_ascii_lowercase().contains("%2e")
        });
        if dotted || !STORE_PATHS.iter().any(|prefix| path.starts_with(prefix)) {
            return Err((
                404,
                format!("the store serves {}; not {path}", STORE_PATHS.join(", ")),
            ));
        }
        let theirs: Vec<http::HeaderName> = parts
            .headers
            .keys()
            .filter(|name| {
                let name = name.as_str();
                matches!(name, "authorization" | "x-api-key" | "api-key" | "cookie")
                    || name.starts_with("x-sandbase-")
            })
            .cloned()
            .collect();
        for name in theirs {
            parts.headers.remove(name);
        }
        parts
            .headers
            .insert(http::header::AUTHORIZATION, self.authorization.clone());
        parts
            .headers
            .insert(http::header::HOST, self.authority.clone());
        Ok(())
    }
}
