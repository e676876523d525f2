//! `tools/call exec` of `true` over `/mcp` against the REST exec of `true` it wraps, the same
//! sandbox, alternately, each over a kept-alive connection: what the MCP layer adds.

use std::time::Instant;

use serde_json::{Value, json};

use super::{Api, Samples};

pub struct McpSamples {
    mcp: Samples,
    rest: Samples,
}

pub async fn mcp_samples(api: &Api, id: &str, calls: usize) -> McpSamples {
    let mut samples = McpSamples {
        mcp: Samples(Vec::new()),
        rest: Samples(Vec::new()),
    };
    for call in 0..calls {
        let body = json!({
            "jsonrpc": "2.0", "id": call, "method": "tools/call",
            "params": { "name": "exec", "arguments": { "sandbox_id": id, "argv": ["true"] } },
        });
        let started = Instant::now();
        let answer: Value = api
            .http
            .post(format!("{}/mcp", api.url))
            .bearer_auth(&api.token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .json(&body)
            .send()
            .await
            .expect("tools/call")
            .json()
            .await
            .expect("a JSON answer");
        samples.mcp.0.push(started.elapsed());
        assert_eq!(
            answer["result"]["structuredContent"]["exit_code"],
            json!(0),
            "{answer}"
        );
        let started = Instant::now();
        let (status, result) = api
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                json!({ "cmd": ["true"] }),
            )
            .await;
        samples.rest.0.push(started.elapsed());
        assert_eq!((status, &result["exit_code"]), (200, &json!(0)));
    }
    samples
}

impl McpSamples {
    pub fn print(mut self) {
        let (ours, theirs) = (self.mcp.ms(0.5), self.rest.ms(0.5));
        println!(
            "| `tools/call exec` of `true` over /mcp | {ours:.2} | {:.2} | `POST /v1/sandboxes/{{id}}/exec` of `true` | {theirs:.2} | {:.2} | {:.2} (+{:.2} ms) |",
            self.mcp.ms(0.99),
            self.rest.ms(0.99),
            ours / theirs,
            ours - theirs
        );
    }
}
