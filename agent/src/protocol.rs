//! The wire protocol between the worker and the agent, over one Unix stream connection
//! per request.
//!
//! Every message is a frame: one kind byte, a big-endian `u32` length, then the payload.
//! Control messages are JSON ([`Request`] first, then [`Reply`]s); bytes travel in
//! `Stdout`, `Stderr` and `Data` frames so nothing is base64-encoded. A stream of data
//! frames ends with an `End` frame.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// Largest frame accepted, so a peer cannot make the other side allocate without bound.
pub const MAX_FRAME: usize = 4 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    Json = 1,
    Stdout = 2,
    Stderr = 3,
    Data = 4,
    End = 5,
}

impl FrameKind {
    pub fn from_byte(byte: u8) -> io::Result<FrameKind> {
        Ok(match byte {
            1 => FrameKind::Json,
            2 => FrameKind::Stdout,
            3 => FrameKind::Stderr,
            4 => FrameKind::Data,
            5 => FrameKind::End,
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown frame kind {other}"),
                ));
            }
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    pub payload: Vec<u8>,
}

pub fn write_frame(writer: &mut impl Write, kind: FrameKind, payload: &[u8]) -> io::Result<()> {
    let length = u32::try_from(payload.len())
        .ok()
        .filter(|length| *length as usize <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut header = [0u8; 5];
    header[0] = kind as u8;
    header[1..].copy_from_slice(&length.to_be_bytes());
    writer.write_all(&header)?;
    writer.write_all(payload)?;
    writer.flush()
}

pub fn write_json<T: Serialize>(writer: &mut impl Write, value: &T) -> io::Result<()> {
    let payload = serde_json::to_vec(value).map_err(io::Error::other)?;
    write_frame(writer, FrameKind::Json, &payload)
}

/// Reads one frame; `None` at a clean end of stream.
pub fn read_frame(reader: &mut impl Read) -> io::Result<Option<Frame>> {
    let mut header = [0u8; 5];
    match reader.read_exact(&mut header) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error),
    }
    let kind = FrameKind::from_byte(header[0])?;
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if length > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mut payload = vec![0; length];
    reader.read_exact(&mut payload)?;
    Ok(Some(Frame { kind, payload }))
}

/// Reads a JSON frame into `T`.
pub fn read_json<T: for<'de> Deserialize<'de>>(reader: &mut impl Read) -> io::Result<T> {
    match read_frame(reader)? {
        Some(Frame {
            kind: FrameKind::Json,
            payload,
        }) => serde_json::from_slice(&payload)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error)),
        Some(frame) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("expected a JSON frame, got {:?}", frame.kind),
        )),
        None => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        )),
    }
}

/// What the worker asks. File paths are interpreted inside the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Ping,
    /// Runs a process. With `stdin`, `Data` frames follow, then `End`.
    Exec(ExecRequest),
    /// Answers `Ok` with the file's [`Stat`], then its bytes as `Data` frames and `End`.
    ReadFile {
        path: String,
    },
    /// `Data` frames and `End` follow. Creates or truncates; parents are created.
    WriteFile {
        path: String,
        #[serde(default)]
        mode: Option<u32>,
        #[serde(default)]
        owner: Option<Owner>,
    },
    List {
        path: String,
    },
    Stat {
        path: String,
    },
    Mkdir {
        path: String,
        #[serde(default)]
        owner: Option<Owner>,
    },
    Remove {
        path: String,
        #[serde(default)]
        recursive: bool,
    },
    Rename {
        from: String,
        to: String,
    },
    /// Sends `signal` to the process group `pid` leads (a process the agent started).
    Signal {
        pid: u32,
        signal: i32,
    },
    /// Sends `signal` to every process descended from `pid` (a process the agent started),
    /// not to `pid` itself: a shell session's running command, its shell left alive.
    SignalDescendants {
        pid: u32,
        signal: i32,
    },
    /// Answers `Ok` with the directory's [`Stat`], then a tar stream of it as `Data` frames
    /// and `End`. Symbolic links are archived as links, never followed.
    TarOut {
        path: String,
    },
    /// `Data` frames with a tar stream and `End` follow; unpacked into `path` (created),
    /// entries owned by `owner` when given. Paths leaving `path` are refused.
    TarIn {
        path: String,
        #[serde(default)]
        owner: Option<Owner>,
        /// Give each entry the owner the archive names (a snapshot restored); `owner` is
        /// then ignored.
        #[serde(default)]
        keep_owners: bool,
    },
    /// Opens a terminal session: the command (a shell when `argv` is empty) on a new
    /// pseudo-terminal, as the session leader with the terminal as its controlling one.
    /// Answers `PtyOpened`; the session outlives the connection.
    PtyOpen(PtyRequest),
    /// Attaches to a session: answers `PtyAttached` (the offset its output starts at: `since`,
    /// or the oldest byte still kept), then its output as `Data` frames (`PtyLag` when this
    /// reader fell behind the kept output), and at the end `Exit` and `End`. The peer sends
    /// `Data` frames (input) and JSON [`PtyControl`] frames; closing detaches.
    PtyAttach {
        session: u32,
        #[serde(default)]
        since: u64,
        /// The session's output waits for this reader (the worker's, which records it):
        /// when it falls the kept output behind, the agent stops reading the terminal and
        /// the program blocks on a full terminal, as under a slow terminal emulator,
        /// instead of this reader lagging. One holder at a time; a holder stuck for
        /// [`HOLD_LIMIT`](crate::pty::HOLD_LIMIT) is let go (it lags from then on).
        #[serde(default)]
        hold: bool,
    },
    /// Signals a session's process group (`HUP` then `KILL` to end it).
    PtySignal {
        session: u32,
        signal: i32,
    },
}

/// A terminal session to open.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PtyRequest {
    #[serde(default)]
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: Option<Owner>,
    pub cols: u16,
    pub rows: u16,
}

/// What the attached peer may ask besides input.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum PtyControl {
    Resize { cols: u16, rows: u16 },
}

/// Who should own created files.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Run as this user (and group); the agent's own user when absent.
    #[serde(default)]
    pub user: Option<Owner>,
    /// Kill the process group after this long.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Whether `Data` frames with standard input follow.
    #[serde(default)]
    pub stdin: bool,
}

/// A control answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Ok(Option<Stat>),
    Listing(Vec<Entry>),
    /// The process started (sent before its output).
    Started {
        pid: u32,
    },
    Exit(ExitInfo),
    Error(AgentError),
    PtyOpened {
        session: u32,
        pid: u32,
    },
    /// Output follows from this offset (`lagged`: the bytes asked for were no longer kept).
    PtyAttached {
        offset: u64,
        lagged: bool,
    },
    /// This reader fell behind: output resumes at `offset`.
    PtyLag {
        offset: u64,
    },
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExitInfo {
    /// The exit code; `128 + signal` when killed by a signal, as shells report it.
    pub code: i32,
    #[serde(default)]
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AgentError {
    /// `not_found`, `permission_denied`, `already_exists`, `not_a_directory`,
    /// `is_a_directory`, `not_empty`, `no_space`, `invalid`, `spawn_failed` or `io`.
    pub kind: String,
    pub message: String,
}

impl AgentError {
    pub fn from_io(error: &io::Error, context: &str) -> AgentError {
        let kind = match error.kind() {
            io::ErrorKind::NotFound => "not_found",
            io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
                "permission_denied"
            }
            io::ErrorKind::AlreadyExists => "already_exists",
            io::ErrorKind::NotADirectory => "not_a_directory",
            io::ErrorKind::IsADirectory => "is_a_directory",
            io::ErrorKind::DirectoryNotEmpty => "not_empty",
            io::ErrorKind::InvalidInput
            | io::ErrorKind::InvalidFilename
            | io::ErrorKind::TooManyLinks => "invalid",
            io::ErrorKind::StorageFull
            | io::ErrorKind::QuotaExceeded
            | io::ErrorKind::FileTooLarge => "no_space",
            _ => "io",
        };
        AgentError {
            kind: kind.to_owned(),
            message: format!("{context}: {error}"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Stat {
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Seconds since the Unix epoch.
    pub modified: i64,
    #[serde(default)]
    pub link_target: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    #[serde(flatten)]
    pub stat: Stat,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_only_file_system_or_a_bad_name_is_the_callers_mistake() {
        use rustix::io::Errno;
        for (errno, kind) in [
            (Errno::ROFS, "permission_denied"),
            (Errno::NAMETOOLONG, "invalid"),
            (Errno::FBIG, "no_space"),
            (Errno::IO, "io"),
        ] {
            let error = io::Error::from(errno);
            assert_eq!(AgentError::from_io(&error, "/x").kind, kind, "{error}");
        }
    }

    #[test]
    fn frames_round_trip_and_oversized_frames_are_refused() {
        let mut buffer = Vec::new();
        write_frame(&mut buffer, FrameKind::Stdout, b"hello").expect("write");
        write_json(&mut buffer, &Request::Ping).expect("write");
        let mut reader = buffer.as_slice();
        assert_eq!(
            read_frame(&mut reader).expect("read"),
            Some(Frame {
                kind: FrameKind::Stdout,
                payload: b"hello".to_vec()
            })
        );
        assert_eq!(
            read_json::<Request>(&mut reader).expect("json"),
            Request::Ping
        );
        assert_eq!(read_frame(&mut reader).expect("eof"), None);

        let mut huge = vec![FrameKind::Data as u8];
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(read_frame(&mut huge.as_slice()).is_err());
        assert!(read_frame(&mut [9u8, 0, 0, 0, 0].as_slice()).is_err());
    }
}
