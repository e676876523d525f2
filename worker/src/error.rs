//! What the node's operations refuse with; the API maps each to a status and code.

use crate::agent_client::Refused;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("no such sandbox on this worker")]
    SandboxNotFound,
    #[error("no such process in this sandbox")]
    ProcessNotFound,
    #[error("no command with this exec_id in this sandbox (kept 10 minutes after it ends)")]
    ExecNotFound,
    #[error("exec_id `{0}` names another command in this sandbox; choose another id")]
    ExecIdInUse(String),
    #[error("this sandbox's template has no python3 for code contexts")]
    NoPython,
    #[error("no such code context in this sandbox (it may have ended)")]
    ContextNotFound,
    #[error("this sandbox has {0} code contexts already; delete one first")]
    TooManyContexts(usize),
    #[error("process {0} has exited")]
    ProcessExited(u32),
    #[error("the process's standard input is closed")]
    StdinClosed,
    #[error("{0}")]
    SessionUser(String),
    #[error("this sandbox has {0} shell sessions already; end one with `exit`")]
    TooManySessions(usize),
    #[error("no such terminal session in this sandbox")]
    TerminalNotFound,
    #[error("this worker is at capacity")]
    AtCapacity,
    #[error("this sandbox runs {0} background processes already; wait for one to end or kill one")]
    TooManyProcesses(usize),
    #[error("this sandbox has {0} terminal sessions open already; close one first")]
    TooManyTerminals(usize),
    #[error("template `{0}` is not on this worker")]
    TemplateNotFound(String),
    #[error("the sandbox is paused; resume it first")]
    Paused,
    #[error("a sandbox with this id already exists")]
    Exists,
    #[error("template `{0}` exists already on this worker")]
    TemplateExists(String),
    #[error(
        "nothing listens on port {0} in the sandbox (a server must listen on 127.0.0.1 or 0.0.0.0)"
    )]
    PortClosed(u16),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error(transparent)]
    Internal(anyhow::Error),
}

impl From<anyhow::Error> for NodeError {
    fn from(error: anyhow::Error) -> Self {
        match error.downcast::<Refused>() {
            Ok(refused) => NodeError::Refused(refused),
            Err(error) => NodeError::Internal(error),
        }
    }
}
