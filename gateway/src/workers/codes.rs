//! The worker's error codes the public API passes on, by name.

/// The worker's error codes the public API passes on; any other is `worker_error` (502).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerCode {
    SandboxNotFound,
    ProcessNotFound,
    ExecNotFound,
    ExecIdInUse,
    ContextNotFound,
    TooManyContexts,
    PythonNotAvailable,
    ProcessExited,
    StdinClosed,
    SessionUserMismatch,
    TooManySessions,
    AtCapacity,
    TemplateNotFound,
    TemplateExists,
    VolumeNotFound,
    InvalidRequest,
    PathNotFound,
    PermissionDenied,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    DiskFull,
    SpawnFailed,
    SandboxIoError,
    TooManyProcesses,
    TooManyTerminals,
    SandboxPaused,
    TerminalNotFound,
    PortClosed,
}

impl WorkerCode {
    const ALL: [WorkerCode; 30] = [
        WorkerCode::SandboxNotFound,
        WorkerCode::ProcessNotFound,
        WorkerCode::ExecNotFound,
        WorkerCode::ExecIdInUse,
        WorkerCode::ContextNotFound,
        WorkerCode::TooManyContexts,
        WorkerCode::PythonNotAvailable,
        WorkerCode::ProcessExited,
        WorkerCode::StdinClosed,
        WorkerCode::SessionUserMismatch,
        WorkerCode::TooManySessions,
        WorkerCode::AtCapacity,
        WorkerCode::TemplateNotFound,
        WorkerCode::TemplateExists,
        WorkerCode::VolumeNotFound,
        WorkerCode::InvalidRequest,
        WorkerCode::PathNotFound,
        WorkerCode::PermissionDenied,
        WorkerCode::AlreadyExists,
        WorkerCode::NotADirectory,
        WorkerCode::IsADirectory,
        WorkerCode::DirectoryNotEmpty,
        WorkerCode::DiskFull,
        WorkerCode::SpawnFailed,
        WorkerCode::SandboxIoError,
        WorkerCode::TooManyProcesses,
        WorkerCode::TooManyTerminals,
        WorkerCode::SandboxPaused,
        WorkerCode::TerminalNotFound,
        WorkerCode::PortClosed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkerCode::SandboxNotFound => "sandbox_not_found",
            WorkerCode::ProcessNotFound => "process_not_found",
            WorkerCode::ExecNotFound => "exec_not_found",
            WorkerCode::ExecIdInUse => "exec_id_in_use",
            WorkerCode::ContextNotFound => "context_not_found",
            WorkerCode::TooManyContexts => "too_many_contexts",
            WorkerCode::PythonNotAvailable => "python_not_available",
            WorkerCode::ProcessExited => "process_exited",
            WorkerCode::StdinClosed => "stdin_closed",
            WorkerCode::SessionUserMismatch => "session_user_mismatch",
            WorkerCode::TooManySessions => "too_many_sessions",
            WorkerCode::AtCapacity => "at_capacity",
            WorkerCode::TemplateNotFound => "template_not_found",
            WorkerCode::TemplateExists => "template_exists",
            WorkerCode::VolumeNotFound => "volume_not_found",
            WorkerCode::InvalidRequest => "invalid_request",
            WorkerCode::PathNotFound => "path_not_found",
            WorkerCode::PermissionDenied => "permission_denied",
            WorkerCode::AlreadyExists => "already_exists",
            WorkerCode::NotADirectory => "not_a_directory",
            WorkerCode::IsADirectory => "is_a_directory",
            WorkerCode::DirectoryNotEmpty => "directory_not_empty",
            WorkerCode::DiskFull => "disk_full",
            WorkerCode::SpawnFailed => "spawn_failed",
            WorkerCode::SandboxIoError => "sandbox_io_error",
            WorkerCode::TooManyProcesses => "too_many_processes",
            WorkerCode::TooManyTerminals => "too_many_terminals",
            WorkerCode::SandboxPaused => "sandbox_paused",
            WorkerCode::TerminalNotFound => "terminal_not_found",
            WorkerCode::PortClosed => "port_closed",
        }
    }

    pub(super) fn parse(code: &str) -> Option<WorkerCode> {
        WorkerCode::ALL
            .into_iter()
            .find(|known| known.as_str() == code)
    }
}
