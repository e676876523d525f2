//! Whether a tool call may run now: the run's approval rules (`sandbase_harness::approval`)
//! and the decisions made so far — on the call itself, or remembered for the run for the
//! same tool under the same rule.

use sandbase_api::agent_runs::ApprovalPolicy;
use sandbase_api::conversation::ToolCall;
use sandbase_harness::approval;
use serde_json::Value;

use super::run::Run;

/// What a call may do now.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    Run,
    /// The model is told why it did not run.
    Deny(String),
    /// A person must decide first (the rule's index).
    Ask(usize),
}

pub fn gate<B>(run: &Run<'_, B>, decisions: &Value, call: &ToolCall) -> Gate
where
    B: sandbase_mcp::Backend,
{
    // A call whose end was unknown runs again only when a person allowed it.
    if let Some(decision) =
        decisions.as_array().into_iter().flatten().find(|decision| {
            decision["call_id"] == call.id.as_str() && decision["uncertain"] == true
        })
    {
        return if decision["decision"] == "allow" {
            Gate::Run
        } else {
            Gate::Deny(
                "this call was under way when the gateway making it stopped, and a person chose \
                 not to run it again: it may have run wholly, in part, or not at all. Check the \
                 sandbox before you repeat it."
                    .to_owned(),
            )
        };
    }
    let kind = run.kind(call);
    let (policy, rule) = approval::policy(&run.row.approvals.0, kind, call);
    let rule = rule.unwrap_or(0);
    match policy {
        ApprovalPolicy::Allow => Gate::Run,
        ApprovalPolicy::Deny => Gate::Deny(format!(
            "this call was denied by the run's approval rules (rule {rule}): it did not run"
        )),
        ApprovalPolicy::Ask => {
            let label = approval::tool_label(kind, call);
            let decided = decisions.as_array().into_iter().flatten().find(|decision| {
                decision["call_id"] == call.id.as_str()
                    || (decision["remember"] == "run"
                        && decision["tool"] == label.as_str()
                        && decision["rule"] == rule)
            });
            match decided {
                Some(decision) if decision["decision"] == "allow" => Gate::Run,
                Some(decision) => {
                    let reason = decision["reason"].as_str().unwrap_or("no reason given");
                    Gate::Deny(format!(
                        "a person denied this call ({reason}): it did not run"
                    ))
                }
                None => Gate::Ask(rule),
            }
        }
    }
}
