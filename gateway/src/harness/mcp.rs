//! The MCP tools a run offers: its store servers' (called through the in-process MCP backend
//! as the run's key, priced by the store) and its remote servers' (called through the guarded
//! client with the credential the run was given). Each is offered as `LABEL__TOOL`.

use std::sync::Arc;

use sandbase_api::agent_runs::AgentTool;
use sandbase_api::conversation::ToolCall;
use sandbase_harness::ToolOutcome;
use sandbase_harness::tools;
use sandbase_mcp::Backend;
use serde_json::json;

use super::journal;
use super::remote_mcp::{self, Offer, RemoteServer, Target, named};
use super::run::{Halt, Run};

fn allowed(tool: &AgentTool, name: &str) -> bool {
    match tool {
        AgentTool::Mcp {
            allowed_tools: Some(allowed),
            ..
        } => allowed.iter().any(|allowed| allowed == name),
        _ => true,
    }
}

/// Offers the tools of the run's MCP servers; a remote server that cannot be listed is told
/// in an `error` event and offers nothing this time.
pub async fn offer<B: Backend>(run: &mut Run<'_, B>) -> Result<(), Halt> {
    let specs = run.row.tools.0.clone();
    let store: Vec<(String, &AgentTool)> = specs
        .iter()
        .filter_map(|tool| match tool {
            AgentTool::Mcp {
                server: Some(server),
                ..
            } => Some((format!("{server}."), tool)),
            _ => None,
        })
        .collect();
    if !store.is_empty() {
        for tool in run.backend.extra_tools(Some(&run.parts)).await {
            let Some((prefix, spec)) = store
                .iter()
                .find(|(prefix, _)| tool.name.starts_with(prefix.as_str()))
            else {
                continue;
            };
            if allowed(spec, &tool.name[prefix.len()..]) {
                add(run, &tool, Target::Store(tool.name.to_string()));
            }
        }
    }
    for (index, spec) in specs.iter().enumerate() {
        let Some(named) = named(index, spec) else {
            continue;
        };
        let (team, id) = (run.row.team_id, run.row.id);
        let listed = match RemoteServer::open(run.state, team, id, &named).await {
            Ok(server) => server.tools().await.map(|tools| (Arc::new(server), tools)),
            Err(why) => Err(why),
        };
        match listed {
            Ok((server, listed)) => {
                for mut tool in listed {
                    if !allowed(spec, &tool.name) {
                        continue;
                    }
                    let own = tool.name.to_string();
                    tool.name = format!("{}.{own}", server.label).into();
                    add(run, &tool, Target::Remote(server.clone(), own));
                }
            }
            Err(why) => {
                let label = remote_mcp::label_of(&named);
                let mut write = journal::quick(&run.state.db, &run.lease).await?;
                write
                    .event(
                        "error",
                        json!({ "code": "mcp_server_unreachable", "server": label,
                        "message": format!("the tools of `{label}` are not offered: {why}") }),
                    )
                    .await?;
                run.commit_quick(write).await?;
            }
        }
    }
    Ok(())
}

fn add<B>(run: &mut Run<'_, B>, tool: &rmcp::model::Tool, target: Target) {
    let definition = tools::mcp_definition(tool);
    run.mcp.push(Offer {
        model_name: definition.name.clone(),
        target,
        read_only: tools::mcp_read_only(tool),
    });
    run.tools.push(definition);
}

/// A call of an offered MCP tool.
pub async fn call<B: Backend>(run: &Run<'_, B>, call: &ToolCall) -> ToolOutcome {
    let Some(offer) = run.mcp.iter().find(|offer| offer.model_name == call.name) else {
        return ToolOutcome::error(format!("there is no tool `{}` in this run", call.name));
    };
    let arguments = call.arguments.as_object().cloned();
    match &offer.target {
        Target::Store(name) => match run
            .backend
            .call_extra(Some(&run.parts), name, arguments)
            .await
        {
            Some(result) => tools::mcp_outcome(&result),
            None => ToolOutcome::error(format!("the MCP server of `{name}` is gone")),
        },
        Target::Remote(server, name) => match server.call(name, arguments).await {
            Ok(result) => tools::mcp_outcome(&result),
            Err(why) => {
                ToolOutcome::error(format!("the MCP server `{}` failed: {why}", server.label))
            }
        },
    }
}
