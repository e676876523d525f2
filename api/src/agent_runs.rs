//! Agent runs: the harness's conversations (`/v1/agent-runs`). A run is a model, its
//! instructions and tools, a sandbox, limits and a key of its own; it goes turn by turn,
//! each turn model calls and the tool calls they ask for, journaled as steps before they
//! happen and told as events numbered without gaps.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::sandboxes::CreateSandboxRequest;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAgentRunRequest {
    /// Any model of the store (`GET /v1/store/models`), of either family.
    #[schema(min_length = 1, max_length = 200)]
    pub model: String,
    /// What the model is told first, after SandBase's own words about the sandbox.
    #[serde(default)]
    #[schema(max_length = 100000)]
    pub instructions: Option<String>,
    /// The first turn's input: a text, or messages.
    pub input: AgentInput,
    /// The tools the model may call (none: a conversation without tools).
    #[serde(default)]
    #[schema(max_items = 64)]
    pub tools: Vec<AgentTool>,
    /// Where the tools run: `POST /v1/sandboxes`'s body (the run makes the sandbox and
    /// destroys it when it ends), or `{"id": …}` of a sandbox of the team (never destroyed by
    /// the run). Absent: a sandbox of the default template.
    #[serde(default)]
    pub sandbox: Option<AgentSandbox>,
    #[serde(default)]
    pub limits: AgentLimits,
    /// Whether calls the model makes together may run together (only those that change
    /// nothing: file views and client functions; the rest run one at a time, in the
    /// model's order). Default true.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// What happens to a tool call a gateway was making when it died and that no worker
    /// knows the end of: `fail` (the default: the model is told it may not have run) or
    /// `ask` (the run waits for a person to decide whether it runs again) — whatever was
    /// finished is adopted, never run again.
    #[serde(default)]
    pub on_uncertain_tool: Option<UncertainTool>,
    /// Which tool calls need a person's approval: the first rule that matches a call decides
    /// (`allow`, `ask`, `deny`); a call no rule matches is allowed. Patterns are a
    /// convenience, not a boundary: the sandbox is the boundary.
    #[serde(default)]
    #[schema(max_items = 32)]
    pub approvals: Vec<ApprovalRule>,
    /// Seconds an idle run waits for a message before it is `completed` (default 3600).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 604800)]
    pub idle_timeout_secs: Option<u64>,
    /// Seconds a waiting run (`idle`, `requires_action`) keeps the sandbox it made, paused,
    /// before releasing it (default 86400): snapshotted first when `checkpoints` is on, then
    /// destroyed; the next turn starts a sandbox from the run's last snapshot (or afresh).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 604800)]
    pub max_wait_secs: Option<u64>,
    /// `every_turn`: the sandbox the run made is snapshotted at the end of each turn and when
    /// it is released (`checkpoint.taken` events; the run's `checkpoint`); `none` (default).
    #[serde(default)]
    pub checkpoints: Option<Checkpoints>,
    /// Up to 16 string pairs of the caller's own.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Answer at once with the run queued (true, the default), or once its first turn has
    /// stopped (`idle`, `requires_action` or ended) with the run as it then is (false).
    #[serde(default)]
    pub background: Option<bool>,
    /// Answer with the run's events as Server-Sent Events (as `GET …/events` streams them)
    /// until its first turn has stopped.
    #[serde(default)]
    pub stream: Option<bool>,
}

/// A turn's input: a text (one user message) or messages.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum AgentInput {
    Text(String),
    Messages(Vec<InputMessage>),
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    pub role: InputRole,
    #[schema(max_length = 1000000)]
    pub content: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InputRole {
    User,
    Assistant,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum AgentTool {
    /// `shell`: commands in one bash session in the sandbox (its directory and exported
    /// variables carry over), run as the sandbox user; the model sees at most 16 KiB of a
    /// command's output (its first and last 8 KiB).
    Shell,
    /// `files`: view (with line ranges), create, str_replace and insert on files in the
    /// sandbox.
    Files,
    /// `python`: Python in a context whose variables live on between calls (the code
    /// endpoint).
    Python,
    /// An MCP server's tools, offered to the model as `LABEL__TOOL` (a tool the server marks
    /// read-only runs beside other such calls). Exactly one of: `server`, one of the store's
    /// (the operator's `[[store.mcp_servers]]`, its credential injected by the gateway, each
    /// call priced as the store prices it); `server_url`, a remote one the team names
    /// (Streamable HTTP), reached only at a public address (resolved, checked and dialled as
    /// checked, no redirect followed), with a credential given here (`credential`: kept by
    /// the vault, never shown or journaled) or a team secret bound to its host
    /// (`credential_secret`).
    Mcp {
        /// A store MCP server by name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
        server: Option<String>,
        /// A remote MCP server's endpoint (`https://…` or `http://…`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(min_length = 8, max_length = 2048, pattern = "^https?://")]
        server_url: Option<String>,
        /// What the model sees before its tools' names (`LABEL__TOOL`) and approval rules name
        /// (`mcp:LABEL`); a remote server's host's first label when not given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
        server_label: Option<String>,
        /// A remote server's token, sent as `Authorization: Bearer …`. Write-only: the vault
        /// keeps it for this run, and no answer, event, export or log line holds it.
        #[serde(default, skip_serializing)]
        #[schema(value_type = Option<String>, write_only, min_length = 1, max_length = 4096)]
        credential: Option<Secret>,
        /// A remote server's credential from the team's secrets (`POST /v1/secrets`),
        /// injected as the secret says; the secret must be bound to the server's host.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
        credential_secret: Option<String>,
        /// Only these of the server's tools (all when not given).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(max_items = 128)]
        allowed_tools: Option<Vec<String>>,
    },
    /// A function the client runs: the run waits in `requires_action` until its result is
    /// posted (`POST …/inputs`, `tool_result`).
    Function {
        #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
        name: String,
        #[serde(default)]
        #[schema(max_length = 4096)]
        description: Option<String>,
        /// Its arguments' JSON Schema (an object).
        #[serde(default)]
        parameters: Option<Value>,
    },
}

/// A value a client gives once and never sees again (only its length is ever told).
#[derive(Clone, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[secret, {} bytes]", self.0.len())
    }
}

/// A rule of a run's approvals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRule {
    /// The tool: `shell`, `files`, `python`, `mcp:SERVER`, or `*` for any.
    #[schema(min_length = 1, max_length = 80)]
    pub tool: String,
    /// A regular expression the call must match: a `shell` call's command, a `python` call's
    /// code, a `files` call's `COMMAND PATH`, an MCP call's arguments as JSON.
    #[serde(default, rename = "match")]
    #[schema(max_length = 1000)]
    pub pattern: Option<String>,
    /// Only calls that change nothing (`true`) or calls that may change something (`false`).
    #[serde(default)]
    pub read_only: Option<bool>,
    pub policy: ApprovalPolicy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalPolicy {
    Allow,
    /// The run waits in `requires_action` for a decision.
    Ask,
    /// The model is told the call was denied.
    Deny,
}

/// A decision on a call that waits for approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allow,
    Deny,
}

/// How far a decision reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Remember {
    /// This call only.
    Call,
    /// Every later call of the same tool under the same rule, in this run.
    Run,
}

/// The sandbox of a run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum AgentSandbox {
    /// A sandbox of the team, by id.
    Existing(ExistingSandbox),
    /// A sandbox the run makes (and destroys when it ends).
    New(Box<CreateSandboxRequest>),
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExistingSandbox {
    pub id: Uuid,
}

/// What a run may do before it stops (`limited`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentLimits {
    /// Turns in all (default 100).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 10000)]
    pub max_turns: Option<u32>,
    /// Tool calls in all (default 1000).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100000)]
    pub max_tool_calls: Option<u32>,
    /// Credits in all (a decimal, e.g. "0.50"): the cap of the run's own key, which every
    /// model call, tool call and its sandbox's runtime count against.
    #[serde(default)]
    pub max_credits: Option<String>,
    /// Seconds of stepping in all, waits for people not counted (default 86400).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 604800)]
    pub max_wall_secs: Option<u64>,
    /// When a limit is reached: `stop` (the default: the run ends `limited`) or `ask` (it
    /// waits in `requires_action` with a `limit` action until new limits are posted,
    /// `POST …/inputs` `limits`, or it is cancelled).
    #[serde(default)]
    pub on_limit: Option<OnLimit>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Checkpoints {
    None,
    EveryTurn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnLimit {
    Stop,
    Ask,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UncertainTool {
    /// The model is told the call may or may not have run.
    Fail,
    /// The run waits in `requires_action` for a decision on the call (an `approval` action
    /// with `uncertain: true`): `allow` runs it again, `deny` tells the model it may or may
    /// not have run.
    Ask,
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentRunStatus {
    /// Made, not yet stepped by a gateway.
    Queued,
    /// A turn is going on.
    Running,
    /// Waiting for the client: `required_actions` says what.
    RequiresAction,
    /// A turn ended; the run takes a message (`POST …/inputs`).
    Idle,
    Completed,
    Failed,
    Cancelled,
    /// A limit stopped it (`error.code` says which).
    Limited,
}

impl AgentRunStatus {
    pub fn is_final(self) -> bool {
        matches!(
            self,
            AgentRunStatus::Completed
                | AgentRunStatus::Failed
                | AgentRunStatus::Cancelled
                | AgentRunStatus::Limited
        )
    }
}

/// Something the run waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RequiredAction {
    /// The result of a client function (`POST …/inputs` `tool_result` with this `call_id`).
    ToolResult {
        call_id: String,
        name: String,
        arguments: Value,
    },
    /// A decision on a call an approval rule asks about (`POST …/inputs`, `approval`), by a
    /// person or a key of at least the run creator's role that is not the run's own.
    Approval {
        call_id: String,
        name: String,
        arguments: Value,
        /// The tool as the rules name it (`shell`, `mcp:SERVER`…).
        tool: String,
        /// The rule's index in `approvals` (0 for an uncertain call).
        rule: u32,
        /// The call was under way when the gateway making it stopped, and no worker knows
        /// its end (`on_uncertain_tool: ask`): `allow` runs it again, `deny` tells the model
        /// that it may or may not have run.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        uncertain: bool,
    },
    /// A limit the run reached (`on_limit: ask`): it goes on once new limits allow it
    /// (`POST …/inputs`, `limits`), or may be cancelled.
    Limit {
        /// `max_tool_calls`, `max_wall_secs` or `max_credits`.
        limit: String,
        message: String,
    },
}

/// An agent run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentRun {
    pub id: Uuid,
    pub status: AgentRunStatus,
    pub model: String,
    #[serde(default)]
    pub instructions: Option<String>,
    pub tools: Vec<AgentTool>,
    /// The run's sandbox, once it has one.
    #[serde(default)]
    pub sandbox_id: Option<Uuid>,
    /// Whether the run made its sandbox (and destroys it when it ends).
    pub owns_sandbox: bool,
    /// The last snapshot of the sandbox the run made (`checkpoints: every_turn`).
    #[serde(default)]
    pub checkpoint: Option<Uuid>,
    pub limits: AgentLimits,
    pub approvals: Vec<ApprovalRule>,
    pub required_actions: Vec<RequiredAction>,
    /// Turns begun, and tool calls made, so far.
    pub turns: u32,
    pub tool_calls: u32,
    /// Tokens of every model call so far.
    pub usage: crate::conversation::Usage,
    /// What its model calls cost, in micro-credits.
    pub cost_micro: i64,
    /// The number of its last event (`GET …/events?after=`).
    pub last_seq: i64,
    /// The run's own key (a child of its creator's).
    #[serde(default)]
    pub key_id: Option<Uuid>,
    /// Why it stopped, when it failed or was limited.
    #[serde(default)]
    pub error: Option<crate::ErrorDetail>,
    pub metadata: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentRunList {
    pub agent_runs: Vec<AgentRun>,
}

/// One entry of a run's stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentRunEvent {
    /// 1, 2, 3… without gaps.
    pub seq: i64,
    pub run_id: Uuid,
    pub turn: u32,
    pub at: DateTime<Utc>,
    /// `run.created`, `run.status`, `sandbox.ready`, `turn.started`, `turn.completed`,
    /// `checkpoint.taken`, `sandbox.released`, `model.started`, `model.retry`, `model.delta`
    /// (a piece of the answer as it streams), `model.completed`, `context.elided`,
    /// `tool.called`, `tool.output.delta` (a command's output as it is printed),
    /// `tool.completed`, `approval.requested`, `approval.resolved`, `input.received`,
    /// `cancel.requested`, `limit.reached`, `error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub data: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentRunEventPage {
    pub events: Vec<AgentRunEvent>,
    /// The run's status when the page was read.
    pub status: AgentRunStatus,
    /// Whether more events than this page holds were there already.
    pub has_more: bool,
}

/// One step of the ledger: a model call or a tool call, written before it happened.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentRunStep {
    pub seq: u32,
    pub turn: u32,
    /// `model` or `tool`.
    pub kind: String,
    /// `intended` (begun), `completed`, `failed`, `interrupted` (its end unknown).
    pub state: String,
    /// The model, or the tool.
    pub name: String,
    #[serde(default)]
    pub call_id: Option<String>,
    pub args: Value,
    /// A model step: usage, stop reason, latency, the store request; a tool step: its exit
    /// code or error, duration and the exec id its output is kept under.
    #[serde(default)]
    pub result: Option<Value>,
    pub cost_micro: i64,
    pub started_at: DateTime<Utc>,
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentRunStepList {
    pub steps: Vec<AgentRunStep>,
}

/// One turn of a run: its input, its steps and what they cost.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentRunTurn {
    pub turn: u32,
    /// The turn's first message (its input), in the typed conversation form.
    #[serde(default)]
    pub input: Option<Value>,
    pub model_steps: u32,
    pub tool_steps: u32,
    /// What its steps cost, in micro-credits (1 credit = 1 000 000).
    pub cost_micro: i64,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended (none: it goes on, or waits for its client).
    #[serde(default)]
    pub completed_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentRunTurnList {
    pub turns: Vec<AgentRunTurn>,
}

/// Something sent to a run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum AgentRunInput {
    /// A user message: the next turn's input (queued when a turn is going on).
    Message {
        #[schema(min_length = 1, max_length = 1000000)]
        content: String,
    },
    /// The result of a client function the run waits for.
    ToolResult {
        #[schema(min_length = 1, max_length = 128)]
        call_id: String,
        #[schema(max_length = 1000000)]
        output: String,
        #[serde(default)]
        is_error: bool,
    },
    /// A decision on a call that waits for approval.
    Approval {
        #[schema(min_length = 1, max_length = 128)]
        call_id: String,
        decision: Decision,
        #[serde(default)]
        #[schema(max_length = 2000)]
        reason: Option<String>,
        /// `call` (the default) or `run`.
        #[serde(default)]
        remember: Option<Remember>,
    },
    /// New limits: those given replace the run's, the rest stay (`max_credits` becomes the
    /// cap of the run's key and of the sandbox it made). A run waiting on a limit it reached
    /// goes on. Needs a person or a key of at least the run creator's role that is neither
    /// the run's own key nor one it made.
    Limits { limits: AgentLimits },
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelAgentRunRequest {
    /// `tool`: the call `call_id` only (the model gets its output marked cancelled and the
    /// turn goes on); `turn`: the turn ends and the run is idle; `run` (the default): the run
    /// ends, `cancelled`.
    #[serde(default)]
    pub scope: Option<CancelScope>,
    /// The call to cancel, with `scope: tool`.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 128)]
    pub call_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CancelScope {
    Tool,
    Turn,
    Run,
}
