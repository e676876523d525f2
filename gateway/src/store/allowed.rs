//! Which models a key may call: its `allowed_models` (glob patterns, `*` for any text) and
//! those of every ancestor that has a list. Checked on each call, with the lineage the
//! call's admission needs anyway.

use uuid::Uuid;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Most patterns on a key.
const MAX_PATTERNS: usize = 32;

/// A key's list as asked for at creation: 1 to 32 patterns of printable characters.
pub fn validate(patterns: Option<Vec<String>>) -> ApiResult<Option<Vec<String>>> {
    let Some(patterns) = patterns else {
        return Ok(None);
    };
    let valid = |pattern: &String| {
        !pattern.is_empty() && pattern.len() <= 128 && pattern.bytes().all(|b| b.is_ascii_graphic())
    };
    if patterns.is_empty() || patterns.len() > MAX_PATTERNS || !patterns.iter().all(valid) {
        return Err(ApiError::InvalidRequest(format!(
            "`allowed_models` takes 1 to {MAX_PATTERNS} patterns such as \"openai/*\" (no spaces, at most 128 characters each)"
        )));
    }
    Ok(Some(patterns))
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters.
pub fn matches(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The calling key and its ancestors (for admission), once `model` is found allowed by each
/// of them that restricts models; 403 `model_not_allowed` otherwise.
pub async fn lineage_allowing(
    state: &AppState,
    key: Option<Uuid>,
    model: &str,
) -> ApiResult<Vec<Uuid>> {
    let Some(key) = key else {
        return Ok(Vec::new());
    };
    let rows = match state.store.lineages.get(key) {
        Some(rows) => rows,
        None => {
            // A key's ancestors and model lists never change once it exists.
            let rows: Vec<(Uuid, Option<Vec<String>>)> = sqlx::query_as(
                "SELECT id, allowed_models FROM api_keys \
                 WHERE id = $1 OR id IN (SELECT unnest(lineage) FROM api_keys WHERE id = $1)",
            )
            .bind(key)
            .fetch_all(&state.db)
            .await?;
            state.store.lineages.put(key, rows)
        }
    };
    let allowed = rows.iter().all(|(_, patterns)| {
        patterns
            .as_ref()
            .is_none_or(|patterns| patterns.iter().any(|pattern| matches(pattern, model)))
    });
    if !allowed {
        return Err(ApiError::ModelNotAllowed(model.to_owned()));
    }
    Ok(rows.iter().map(|(id, _)| *id).collect())
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn globs_match_as_written() {
        assert!(matches("openai/*", "openai/gpt-4o"));
        assert!(!matches("openai/*", "anthropic/claude"));
        assert!(matches("*", "anything"));
        assert!(matches(
            "anthropic/claude-*-4*",
            "anthropic/claude-sonnet-4-5"
        ));
        assert!(!matches(
            "anthropic/claude-*-4*",
            "anthropic/claude-3-haiku"
        ));
        assert!(matches("openai/gpt-4o", "openai/gpt-4o"));
        assert!(!matches("openai/gpt-4o", "openai/gpt-4o-mini"));
        assert!(!matches("a*a", "a"));
        assert!(matches("a*a", "aa"));
    }
}
