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
        // Every segment decoded once and checked (no `..` however encoded, no `\`, control
        // characters or double encodings), and the raw path under one of the routes.
        if let Err(why) = sandbase_api::segments::decoded(path) {
            return Err((404, format!("{why}; not {path}")));
        }
        if !STORE_PATHS.iter().any(|prefix| path.starts_with(prefix)) {
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

#[cfg(test)]
mod tests {
    use super::StoreAccess;

    fn prepared(path: &str) -> Result<(), (u16, String)> {
        let access = StoreAccess::new(
            http::HeaderValue::from_static("Bearer sbs_x"),
            http::HeaderValue::from_static("gateway:8080"),
        );
        let (mut parts, ()) = http::Request::get(path).body(()).unwrap().into_parts();
        access.prepare(&mut parts)
    }

    #[test]
    fn only_the_store_routes_pass_however_the_path_is_encoded() {
        assert!(prepared("/openai/v1/chat/completions").is_ok());
        assert!(prepared("/store/apis/search/v1/q%20x").is_ok());
        for attack in [
            "/openai/../v1/api-keys",
            "/openai/%2e%2e/v1/api-keys",
            "/store/apis/x/%252e%252e/admin",
            "/store/apis/x/..%5Cadmin",
            "/store/apis/x/.%09./admin",
            "/v1/api-keys",
            "/mcp",
        ] {
            assert_eq!(
                prepared(attack).map_err(|(status, _)| status),
                Err(404),
                "{attack}"
            );
        }
    }
}
