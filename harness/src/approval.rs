//! Approval rules: which of a run's tool calls a person must allow first. The first rule
//! whose tool, read-only-ness and pattern match a call decides; no rule, `allow`. Patterns
//! are a convenience (a command can be written many ways): the sandbox is the boundary.

use regex::Regex;
use sandbase_api::agent_runs::{ApprovalPolicy, ApprovalRule};
use sandbase_api::conversation::ToolCall;

use crate::tools::ToolKind;

/// Checks the rules of a new run: a tool named, a pattern that compiles (and is not huge).
pub fn check(rules: &[ApprovalRule]) -> Result<(), String> {
    for (index, rule) in rules.iter().enumerate() {
        if rule.tool.trim().is_empty() {
            return Err(format!("approvals[{index}]: `tool` is empty"));
        }
        if let Some(pattern) = &rule.pattern {
            compile(pattern).map_err(|error| format!("approvals[{index}].match: {error}"))?;
        }
    }
    Ok(())
}

fn compile(pattern: &str) -> Result<Regex, regex::Error> {
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
}

/// The name a rule uses for a call's tool: `shell`, `files`, `python`, `mcp:SERVER` or the
/// function's name.
pub fn tool_label(kind: ToolKind, call: &ToolCall) -> String {
    match kind {
        ToolKind::Shell => "shell".to_owned(),
        ToolKind::Files { .. } => "files".to_owned(),
        ToolKind::Python => "python".to_owned(),
        ToolKind::Mcp { .. } => {
            let server = call.name.split("__").next().unwrap_or_default();
            format!("mcp:{server}")
        }
        ToolKind::Function | ToolKind::Unknown => call.name.clone(),
    }
}

/// The text a rule's pattern is matched against.
pub fn call_text(kind: ToolKind, call: &ToolCall) -> String {
    let field = |name: &str| call.arguments[name].as_str().unwrap_or_default().to_owned();
    match kind {
        ToolKind::Shell => field("command"),
        ToolKind::Python => field("code"),
        ToolKind::Files { .. } => format!("{} {}", field("command"), field("path")),
        _ => call.arguments.to_string(),
    }
}

/// What the rules say of a call, and the index of the rule that said it.
pub fn policy(
    rules: &[ApprovalRule],
    kind: ToolKind,
    call: &ToolCall,
) -> (ApprovalPolicy, Option<usize>) {
    let label = tool_label(kind, call);
    let text = call_text(kind, call);
    for (index, rule) in rules.iter().enumerate() {
        if rule.tool != "*" && rule.tool != label {
            continue;
        }
        if rule
            .read_only
            .is_some_and(|read_only| read_only != kind.is_read_only())
        {
            continue;
        }
        let matched = match &rule.pattern {
            Some(pattern) => compile(pattern).is_ok_and(|regex| regex.is_match(&text)),
            None => true,
        };
        if matched {
            return (rule.policy, Some(index));
        }
    }
    (ApprovalPolicy::Allow, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(
        tool: &str,
        pattern: Option<&str>,
        read_only: Option<bool>,
        policy: ApprovalPolicy,
    ) -> ApprovalRule {
        ApprovalRule {
            tool: tool.to_owned(),
            pattern: pattern.map(str::to_owned),
            read_only,
            policy,
        }
    }

    fn call(name: &str, arguments: serde_json::Value) -> ToolCall {
        ToolCall {
            id: "c".to_owned(),
            name: name.to_owned(),
            arguments,
        }
    }

    #[test]
    fn the_first_matching_rule_decides_and_no_rule_allows() {
        let rules = [
            rule("shell", Some("^(rm |git push)"), None, ApprovalPolicy::Ask),
            rule("mcp:github", None, Some(false), ApprovalPolicy::Ask),
            rule("*", Some("secret"), None, ApprovalPolicy::Deny),
        ];
        let shell = |command: &str| call("shell", json!({ "command": command }));
        assert_eq!(
            policy(&rules, ToolKind::Shell, &shell("rm -rf /work")),
            (ApprovalPolicy::Ask, Some(0))
        );
        assert_eq!(
            policy(&rules, ToolKind::Shell, &shell("ls")),
            (ApprovalPolicy::Allow, None)
        );
        assert_eq!(
            policy(&rules, ToolKind::Shell, &shell("cat secret")),
            (ApprovalPolicy::Deny, Some(2))
        );
        let push = call("github__push", json!({}));
        assert_eq!(
            policy(&rules, ToolKind::Mcp { read_only: false }, &push).0,
            ApprovalPolicy::Ask
        );
        assert_eq!(
            policy(&rules, ToolKind::Mcp { read_only: true }, &push).0,
            ApprovalPolicy::Allow
        );
        assert!(check(&[rule("shell", Some("(unclosed"), None, ApprovalPolicy::Ask)]).is_err());
    }
}
