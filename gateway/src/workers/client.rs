//! The typed client of the workers' internal API: the only place that builds its URLs (from
//! the api crate's `paths`), encodes their query parameters, carries the node token and sets timeouts on calls
//! to a worker. Worker refusals come back as [`WorkerError`] with the worker's own code when
//! the public API passes it on.

use std::time::Duration;

use http::StatusCode;
use sandbase_api::ErrorBody;
use sandbase_api::internal::{CreateSandbox, Exec, NODE_TOKEN_HEADER, PullTemplate, paths};
use sandbase_api::sandboxes::{EgressPolicy, ExecResult, TemplateName};
use sandbase_api::terminals::{OpenTerminalRequest, ResizeRequest};
use secrecy::SecretString;
use uuid::Uuid;

/// Creating a sandbox includes starting it (and, cold, waiting for its agent).
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
const REMOVE_TIMEOUT: Duration = Duration::from_secs(30);
/// Building a template from an uploaded archive.
const IMPORT_TIMEOUT: Duration = Duration::from_secs(1800);
/// Pulling an image from a registry, layer by layer.
const PULL_TIMEOUT: Duration = Duration::from_secs(3600);

pub use super::codes::WorkerCode;

/// A call to a worker that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The worker refused with a code the public API passes on, at the worker's status.
    #[error("{message}")]
    Refused {
        status: StatusCode,
        code: WorkerCode,
        message: String,
    },
    /// 502 `worker_error`: any other error answer (or the worker refused our node token).
    #[error("{0}")]
    Failed(String),
    /// 502 `worker_unreachable`: no answer.
    #[error("{0}")]
    Unreachable(String),
}

impl WorkerError {
    pub fn status_code(&self) -> StatusCode {
        match self {
            WorkerError::Refused { status, .. } => *status,
            WorkerError::Failed(_) | WorkerError::Unreachable(_) => StatusCode::BAD_GATEWAY,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            WorkerError::Refused { code, .. } => code.as_str(),
            WorkerError::Failed(_) => "worker_error",
            WorkerError::Unreachable(_) => "worker_unreachable",
        }
    }

    /// Whether the worker said it is full (the next worker may have room).
    pub fn is_at_capacity(&self) -> bool {
        matches!(
            self,
            WorkerError::Refused {
                code: WorkerCode::AtCapacity,
                ..
            }
        )
    }

    /// Whether the worker does not have the sandbox (any more).
    pub fn is_sandbox_not_found(&self) -> bool {
        matches!(
            self,
            WorkerError::Refused {
                code: WorkerCode::SandboxNotFound,
                ..
            }
        )
    }

    /// A worker's error answer, with the worker's code when the public API passes it on.
    pub async fn from_answer(answer: reqwest::Response) -> WorkerError {
        let status =
            StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        let Ok(body) = answer.json::<ErrorBody>().await else {
            return WorkerError::Failed("the worker answered with an error".to_owned());
        };
        if status == StatusCode::UNAUTHORIZED {
            tracing::error!("a worker refused this gateway's node token");
            return WorkerError::Failed("the worker refused the gateway".to_owned());
        }
        match WorkerCode::parse(&body.error.code) {
            Some(code) => WorkerError::Refused {
                status,
                code,
                message: body.error.message,
            },
            None => WorkerError::Failed(body.error.message),
        }
    }
}

/// A data-plane call on a sandbox, passed to its worker as it is (the answer streamed back).
pub enum SandboxCall {
    Exec(Box<Exec>),
    /// A named command and its output from `offset` (followed as NDJSON with `stream`).
    ExecStatus {
        exec_id: String,
        offset: u64,
        stream: bool,
    },
    ExecCancel {
        exec_id: String,
    },
    Code(CodeCall),
    Processes,
    Process {
        pid: u32,
    },
    ProcessStdin {
        pid: u32,
        close: bool,
        body: reqwest::Body,
    },
    ProcessSignal {
        pid: u32,
        signal: i32,
    },
    ReadPath {
        path: String,
    },
    WriteFile {
        path: String,
        body: reqwest::Body,
    },
    RemovePath {
        path: String,
        recursive: bool,
    },
    ArchiveOut {
        path: String,
    },
    ArchiveIn {
        path: String,
        body: reqwest::Body,
    },
    SetEgressPolicy(EgressPolicy),
    EgressFlows,
    Terminal(TerminalCall),
}

/// A call of the code endpoint.
pub enum CodeCall {
    Run(sandbase_api::code::RunCodeRequest),
    CreateContext(sandbase_api::code::CreateCodeContextRequest),
    ListContexts,
    DeleteContext { context: String },
    Interrupt { context: String },
}

/// A call about a sandbox's terminal sessions.
pub enum TerminalCall {
    Open(OpenTerminalRequest),
    List,
    Get {
        session: u32,
    },
    Close {
        session: u32,
    },
    Input {
        session: u32,
        body: reqwest::Body,
    },
    Resize {
        session: u32,
        size: ResizeRequest,
    },
    /// The session's output from `since`, as the agent's frames.
    Output {
        session: u32,
        since: u64,
    },
}

/// A successful answer of a worker to a [`SandboxCall`], still to be read.
pub struct WorkerAnswer(reqwest::Response);

impl WorkerAnswer {
    /// Headers of a worker's answer the public API passes on.
    pub const PASSED_ON_HEADERS: [&'static str; 3] =
        ["content-type", "x-sandbase-file-size", "x-sandbase-offset"];

    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.0.status().as_u16()).unwrap_or(StatusCode::OK)
    }

    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.0.headers().get(name).map(|value| value.as_bytes())
    }

    pub fn into_response(self) -> reqwest::Response {
        self.0
    }
}

/// Who owns what an archive upload unpacks.
#[derive(Debug, Clone, Copy)]
pub enum ArchiveOwner {
    /// The sandbox's root: read-only to the command (a run's inputs).
    Root,
    /// The owners the archive names (a snapshot restored).
    Archived,
}

/// Which worker to call: its id (whose credential the call carries) and its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerAddress {
    pub id: String,
    pub url: String,
}

/// The HTTP client of every worker, presenting each one its own credential.
pub struct WorkerClient {
    http: reqwest::Client,
    /// The deployment's node secret, from which every worker's credential is derived.
    secret: Option<SecretString>,
}

impl WorkerClient {
    /// `tls`: how to verify workers served over https (the internal channel's CA).
    pub fn new(
        secret: Option<SecretString>,
        tls: Option<&rustls::ClientConfig>,
    ) -> anyhow::Result<WorkerClient> {
        let mut http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(60));
        if let Some(tls) = tls {
            http = http.use_preconfigured_tls(tls.clone());
        }
        Ok(WorkerClient {
            http: http.build()?,
            secret,
        })
    }

    /// The worker a presented credential belongs to, when it is genuine (never, without a
    /// node secret configured). The one check of worker credentials.
    pub fn verify<'a>(&self, presented: &'a str) -> Option<&'a str> {
        super::credential::verify(self.secret.as_ref()?, presented)
    }

    pub(super) fn request(
        &self,
        method: reqwest::Method,
        worker: &WorkerAddress,
        path: &str,
    ) -> reqwest::RequestBuilder {
        let credential = self
            .secret
            .as_ref()
            .map(|secret| super::credential::derive(secret, &worker.id))
            .unwrap_or_default();
        self.http
            .request(method, format!("{}{path}", worker.url))
            .header(NODE_TOKEN_HEADER, credential)
    }

    async fn send(
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<reqwest::Response, WorkerError> {
        let answer = request.send().await.map_err(|error| {
            tracing::warn!(error = %error, "calling a worker ({what}) failed");
            WorkerError::Unreachable(format!("the worker did not answer ({what})"))
        })?;
        if answer.status().is_success() {
            Ok(answer)
        } else {
            Err(WorkerError::from_answer(answer).await)
        }
    }

    /// Starts a sandbox on a worker.
    pub async fn create_sandbox(
        &self,
        worker: &WorkerAddress,
        request: &CreateSandbox,
    ) -> Result<(), WorkerError> {
        if !request.credentials.is_empty() && !worker.url.starts_with("https://") {
            return Err(WorkerError::Failed(
                "credentials are sent to workers only over TLS".to_owned(),
            ));
        }
        let call = self
            .request(reqwest::Method::POST, worker, paths::SANDBOXES)
            .timeout(CREATE_TIMEOUT)
            .json(request);
        Self::send(call, "creating a sandbox").await.map(drop)
    }

    /// Freezes a sandbox (`pause`) or thaws it (`resume`).
    pub async fn set_paused(
        &self,
        worker: &WorkerAddress,
        id: Uuid,
        paused: bool,
    ) -> Result<(), WorkerError> {
        let part = if paused { "pause" } else { "resume" };
        let call = self
            .request(
                reqwest::Method::POST,
                worker,
                &paths::sandbox_part(&id.to_string(), part),
            )
            .timeout(REMOVE_TIMEOUT);
        Self::send(call, part).await.map(drop)
    }

    /// Removes a sandbox and everything of it from its worker.
    pub async fn remove_sandbox(
        &self,
        worker: &WorkerAddress,
        id: Uuid,
    ) -> Result<(), WorkerError> {
        let call = self
            .request(
                reqwest::Method::DELETE,
                worker,
                &paths::sandbox(&id.to_string()),
            )
            .timeout(REMOVE_TIMEOUT);
        Self::send(call, "removing a sandbox").await.map(drop)
    }

    /// A data-plane call, answered as a stream (no timeout: commands and downloads take
    /// as long as they take; the caller's disconnect ends them).
    pub async fn sandbox_call(
        &self,
        worker: &WorkerAddress,
        id: Uuid,
        call: SandboxCall,
    ) -> Result<WorkerAnswer, WorkerError> {
        let id = id.to_string();
        let request = match call {
            call @ (SandboxCall::Exec(_)
            | SandboxCall::ExecStatus { .. }
            | SandboxCall::ExecCancel { .. }) => self.command_request(worker, &id, call),
            SandboxCall::Processes => self.request(
                reqwest::Method::GET,
                worker,
                &paths::sandbox_part(&id, "processes"),
            ),
            SandboxCall::Process { pid } => self.request(
                reqwest::Method::GET,
                worker,
                &paths::process(&id, &pid.to_string()),
            ),
            SandboxCall::ProcessStdin { pid, close, body } => self
                .request(
                    reqwest::Method::POST,
                    worker,
                    &paths::process_part(&id, &pid.to_string(), "stdin"),
                )
                .query(&[("close", close)])
                .body(body),
            SandboxCall::ProcessSignal { pid, signal } => self
                .request(
                    reqwest::Method::POST,
                    worker,
                    &paths::process_part(&id, &pid.to_string(), "signal"),
                )
                .json(&serde_json::json!({ "signal": signal })),
            SandboxCall::ReadPath { path } => self
                .request(
                    reqwest::Method::GET,
                    worker,
                    &paths::sandbox_part(&id, "files"),
                )
                .query(&[("path", path.as_str())]),
            SandboxCall::WriteFile { path, body } => self
                .request(
                    reqwest::Method::PUT,
                    worker,
                    &paths::sandbox_part(&id, "files"),
                )
                .query(&[("path", path.as_str())])
                .body(body),
            SandboxCall::RemovePath { path, recursive } => self
                .request(
                    reqwest::Method::DELETE,
                    worker,
                    &paths::sandbox_part(&id, "files"),
                )
                .query(&[
                    ("path", path.as_str()),
                    ("recursive", if recursive { "true" } else { "false" }),
                ]),
            SandboxCall::ArchiveOut { path } => self
                .request(
                    reqwest::Method::GET,
                    worker,
                    &paths::sandbox_part(&id, "archive"),
                )
                .query(&[("path", path.as_str())]),
            SandboxCall::ArchiveIn { path, body } => self
                .request(
                    reqwest::Method::PUT,
                    worker,
                    &paths::sandbox_part(&id, "archive"),
                )
                .query(&[("path", path.as_str())])
                .body(body),
            SandboxCall::SetEgressPolicy(policy) => self
                .request(
                    reqwest::Method::PUT,
                    worker,
                    &paths::sandbox_part(&id, "egress-policy"),
                )
                .json(&policy),
            SandboxCall::EgressFlows => self.request(
                reqwest::Method::GET,
                worker,
                &paths::sandbox_part(&id, "egress"),
            ),
            SandboxCall::Terminal(call) => self.terminal_request(worker, &id, call),
            SandboxCall::Code(call) => self.code_request(worker, &id, call),
        };
        Self::send(request, "a sandbox call")
            .await
            .map(WorkerAnswer)
    }

    /// The request of a command call: run one, read or cancel a named one.
    fn command_request(
        &self,
        worker: &WorkerAddress,
        id: &str,
        call: SandboxCall,
    ) -> reqwest::RequestBuilder {
        match call {
            SandboxCall::Exec(exec) => self
                .request(
                    reqwest::Method::POST,
                    worker,
                    &paths::sandbox_part(id, "exec"),
                )
                .json(&exec),
            SandboxCall::ExecStatus {
                exec_id,
                offset,
                stream,
            } => self
                .request(reqwest::Method::GET, worker, &paths::exec(id, &exec_id, ""))
                .query(&[
                    ("offset", offset.to_string()),
                    ("stream", stream.to_string()),
                ]),
            SandboxCall::ExecCancel { exec_id } => self.request(
                reqwest::Method::POST,
                worker,
                &paths::exec(id, &exec_id, "cancel"),
            ),
            _ => unreachable!("not a command call"),
        }
    }

    /// The request of a code call.
    fn code_request(
        &self,
        worker: &WorkerAddress,
        id: &str,
        call: CodeCall,
    ) -> reqwest::RequestBuilder {
        use reqwest::Method;
        match call {
            CodeCall::Run(request) => self
                .request(Method::POST, worker, &paths::code(id, ""))
                .json(&request),
            CodeCall::CreateContext(request) => self
                .request(Method::POST, worker, &paths::code(id, "contexts"))
                .json(&request),
            CodeCall::ListContexts => {
                self.request(Method::GET, worker, &paths::code(id, "contexts"))
            }
            CodeCall::DeleteContext { context } => self.request(
                Method::DELETE,
                worker,
                &paths::code(id, &format!("contexts/{context}")),
            ),
            CodeCall::Interrupt { context } => self.request(
                Method::POST,
                worker,
                &paths::code(id, &format!("contexts/{context}/interrupt")),
            ),
        }
    }

    /// The request of a terminal call.
    fn terminal_request(
        &self,
        worker: &WorkerAddress,
        id: &str,
        call: TerminalCall,
    ) -> reqwest::RequestBuilder {
        use reqwest::Method;
        let at = |session: u32, part: &str| paths::terminal(id, &session.to_string(), part);
        match call {
            TerminalCall::Open(request) => self
                .request(Method::POST, worker, &paths::sandbox_part(id, "pty"))
                .json(&request),
            TerminalCall::List => {
                self.request(Method::GET, worker, &paths::sandbox_part(id, "pty"))
            }
            TerminalCall::Get { session } => self.request(Method::GET, worker, &at(session, "")),
            TerminalCall::Close { session } => {
                self.request(Method::DELETE, worker, &at(session, ""))
            }
            TerminalCall::Input { session, body } => self
                .request(Method::POST, worker, &at(session, "input"))
                .body(body),
            TerminalCall::Resize { session, size } => self
                .request(Method::POST, worker, &at(session, "resize"))
                .json(&size),
            TerminalCall::Output { session, since } => self
                .request(Method::GET, worker, &at(session, "output"))
                .query(&[("since", since)]),
        }
    }

    /// Unpacks a tar archive into `path` of a sandbox, owned by `owner`.
    pub async fn put_archive(
        &self,
        worker: &WorkerAddress,
        id: Uuid,
        path: &str,
        owner: ArchiveOwner,
        archive: impl Into<reqwest::Body>,
    ) -> Result<(), WorkerError> {
        let mut request = self
            .request(
                reqwest::Method::PUT,
                worker,
                &paths::sandbox_part(&id.to_string(), "archive"),
            )
            .query(&[("path", path)])
            .body(archive);
        match owner {
            ArchiveOwner::Root => request = request.header("x-sandbase-owner", "root"),
            ArchiveOwner::Archived => request = request.header("x-sandbase-owner", "keep"),
        }
        Self::send(request, "unpacking an archive").await.map(drop)
    }

    /// Runs a command to its end and returns its result.
    pub async fn exec(
        &self,
        worker: &WorkerAddress,
        id: Uuid,
        exec: &Exec,
    ) -> Result<ExecResult, WorkerError> {
        let request = self
            .request(
                reqwest::Method::POST,
                worker,
                &paths::sandbox_part(&id.to_string(), "exec"),
            )
            .json(exec);
        let answer = Self::send(request, "running a command").await?;
        answer
            .json()
            .await
            .map_err(|error| WorkerError::Failed(format!("reading a command's result: {error}")))
    }

    /// A directory of a sandbox as a tar stream, or `None` when it does not exist.
    pub async fn get_archive(
        &self,
        worker: &WorkerAddress,
        id: Uuid,
        path: &str,
    ) -> Result<Option<reqwest::Response>, WorkerError> {
        let request = self
            .request(
                reqwest::Method::GET,
                worker,
                &paths::sandbox_part(&id.to_string(), "archive"),
            )
            .query(&[("path", path)]);
        match Self::send(request, "archiving a directory").await {
            Ok(answer) => Ok(Some(answer)),
            Err(WorkerError::Unreachable(message)) => Err(WorkerError::Unreachable(message)),
            Err(WorkerError::Refused { .. } | WorkerError::Failed(_)) => Ok(None),
        }
    }

    /// Builds template `name` on a worker from an image archive or a root file system
    /// tarball (`format`: `image` or `rootfs`).
    pub async fn import_template(
        &self,
        worker: &WorkerAddress,
        name: &TemplateName,
        format: &str,
        archive: bytes::Bytes,
    ) -> Result<(), WorkerError> {
        let request = self
            .request(
                reqwest::Method::PUT,
                worker,
                &paths::template(name.as_str()),
            )
            .query(&[("format", format)])
            .timeout(IMPORT_TIMEOUT)
            .body(archive);
        Self::send(request, "importing a template").await.map(drop)
    }

    /// Pulls an image into template `name` on a worker; the answer is its NDJSON progress.
    pub async fn pull_template(
        &self,
        worker: &WorkerAddress,
        name: &TemplateName,
        pull: &PullTemplate,
    ) -> Result<reqwest::Response, WorkerError> {
        let request = self
            .request(
                reqwest::Method::POST,
                worker,
                &paths::template_pull(name.as_str()),
            )
            .timeout(PULL_TIMEOUT)
            .json(pull);
        Self::send(request, "pulling a template").await
    }

    /// Removes template `name` from a worker.
    pub async fn remove_template(
        &self,
        worker: &WorkerAddress,
        name: &TemplateName,
    ) -> Result<(), WorkerError> {
        let request = self.request(
            reqwest::Method::DELETE,
            worker,
            &paths::template(name.as_str()),
        );
        Self::send(request, "removing a template").await.map(drop)
    }
}
