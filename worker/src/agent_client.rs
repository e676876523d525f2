//! The worker's side of the agent protocol, asynchronous: one connection per request to the
//! agent's socket (bind-mounted out of the sandbox into the worker's run directory).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use sandbase_agent::protocol::{
    AgentError, Entry, ExecRequest, ExitInfo, FrameKind, MAX_FRAME, Owner, PtyRequest, Reply,
    Request, Stat,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

#[derive(Debug, Clone)]
pub struct AgentClient {
    socket: PathBuf,
}

/// What a running command produces, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Started { pid: u32 },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(ExitInfo),
}

/// A refusal by the agent (missing file, command not found…), as opposed to a broken channel.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.message)]
pub struct Refused(pub AgentError);

impl AgentClient {
    pub fn new(socket: PathBuf) -> AgentClient {
        AgentClient { socket }
    }

    async fn connect(&self, request: &Request) -> anyhow::Result<UnixStream> {
        let mut stream = connect_without_following(&self.socket).await?;
        write_frame(&mut stream, FrameKind::Json, &serde_json::to_vec(request)?).await?;
        Ok(stream)
    }

    /// Starts a command and streams its events; the channel ends after `Exit` (or an error).
    pub async fn exec(
        &self,
        request: ExecRequest,
        stdin: Option<Vec<u8>>,
    ) -> anyhow::Result<mpsc::Receiver<anyhow::Result<ExecEvent>>> {
        let (events, _) = self.start(request, stdin, false).await?;
        Ok(events)
    }

    /// Starts a command; with `keep_stdin_open` its standard input stays open (after
    /// `initial`) for the returned [`Stdin`] to write to.
    pub async fn start(
        &self,
        request: ExecRequest,
        initial: Option<Vec<u8>>,
        keep_stdin_open: bool,
    ) -> anyhow::Result<(mpsc::Receiver<anyhow::Result<ExecEvent>>, Option<Stdin>)> {
        let with_stdin = initial.is_some() || keep_stdin_open;
        let stream = self
            .connect(&Request::Exec(ExecRequest {
                stdin: with_stdin,
                ..request
            }))
            .await?;
        let (mut reader, mut writer) = stream.into_split();
        if let Some(input) = initial {
            for chunk in input.chunks(MAX_FRAME / 4) {
                write_frame(&mut writer, FrameKind::Data, chunk).await?;
            }
        }
        let (stdin, kept) = if keep_stdin_open {
            (Some(Stdin { writer }), None)
        } else {
            if with_stdin {
                write_frame(&mut writer, FrameKind::End, &[]).await?;
            }
            // Dropping a write half shuts the socket down for writing; it lives as long as
            // the reader instead.
            (None, Some(writer))
        };
        let (sender, receiver) = mpsc::channel(64);
        tokio::spawn(async move {
            let _kept = kept;
            loop {
                let event = match read_frame(&mut reader).await {
                    Ok(Some((FrameKind::Stdout, payload))) => Ok(ExecEvent::Stdout(payload)),
                    Ok(Some((FrameKind::Stderr, payload))) => Ok(ExecEvent::Stderr(payload)),
                    Ok(Some((FrameKind::Json, payload))) => {
                        match serde_json::from_slice(&payload) {
                            Ok(Reply::Started { pid }) => Ok(ExecEvent::Started { pid }),
                            Ok(Reply::Exit(exit)) => Ok(ExecEvent::Exit(exit)),
                            Ok(Reply::Error(error)) => Err(anyhow::Error::new(Refused(error))),
                            Ok(other) => Err(anyhow::anyhow!("unexpected answer {other:?}")),
                            Err(error) => {
                                Err(anyhow::Error::new(error).context("a malformed answer"))
                            }
                        }
                    }
                    Ok(Some((kind, _))) => Err(anyhow::anyhow!("unexpected {kind:?} frame")),
                    Ok(None) => Err(anyhow::anyhow!("the agent closed the connection")),
                    Err(error) => Err(error),
                };
                let last = !matches!(
                    event,
                    Ok(ExecEvent::Started { .. } | ExecEvent::Stdout(_) | ExecEvent::Stderr(_))
                );
                if sender.send(event).await.is_err() || last {
                    return;
                }
            }
        });
        Ok((receiver, stdin))
    }

    /// Runs a command to the end: (stdout, stderr, exit).
    pub async fn run(
        &self,
        request: ExecRequest,
        stdin: Option<Vec<u8>>,
    ) -> anyhow::Result<(Vec<u8>, Vec<u8>, ExitInfo)> {
        let mut events = self.exec(request, stdin).await?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        while let Some(event) = events.recv().await {
            match event? {
                ExecEvent::Started { .. } => {}
                ExecEvent::Stdout(bytes) => stdout.extend(bytes),
                ExecEvent::Stderr(bytes) => stderr.extend(bytes),
                ExecEvent::Exit(exit) => return Ok((stdout, stderr, exit)),
            }
        }
        bail!("the command's events ended without an exit")
    }

    /// Reads a whole file (capped at `limit` bytes).
    pub async fn read_file(&self, path: &str, limit: usize) -> anyhow::Result<(Stat, Vec<u8>)> {
        let mut stream = self
            .connect(&Request::ReadFile {
                path: path.to_owned(),
            })
            .await?;
        let stat = match read_reply(&mut stream).await? {
            Reply::Ok(Some(stat)) => stat,
            other => bail!("unexpected answer {other:?}"),
        };
        let mut content = Vec::new();
        loop {
            match read_frame(&mut stream).await? {
                Some((FrameKind::Data, payload)) => {
                    if content.len() + payload.len() > limit {
                        bail!("{path} is larger than {limit} bytes");
                    }
                    content.extend(payload);
                }
                Some((FrameKind::End, _)) => return Ok((stat, content)),
                other => bail!("unexpected frame while reading {path}: {other:?}"),
            }
        }
    }

    /// Writes a whole file (parents created), owned by `owner` when given.
    pub async fn write_file(
        &self,
        path: &str,
        content: &[u8],
        mode: Option<u32>,
        owner: Option<Owner>,
    ) -> anyhow::Result<Stat> {
        let mut stream = self
            .connect(&Request::WriteFile {
                path: path.to_owned(),
                mode,
                owner,
            })
            .await?;
        for chunk in content.chunks(MAX_FRAME / 4) {
            write_frame(&mut stream, FrameKind::Data, chunk).await?;
        }
        write_frame(&mut stream, FrameKind::End, &[]).await?;
        match read_reply(&mut stream).await? {
            Reply::Ok(Some(stat)) => Ok(stat),
            other => bail!("unexpected answer {other:?}"),
        }
    }

    /// Streams a file's bytes (or, with `Request::TarOut`, a directory's archive): the
    /// answer's [`Stat`] and a channel of chunks that ends after the last one.
    pub async fn download(
        &self,
        request: &Request,
    ) -> anyhow::Result<(Stat, mpsc::Receiver<anyhow::Result<Vec<u8>>>)> {
        let mut stream = self.connect(request).await?;
        let stat = match read_reply(&mut stream).await? {
            Reply::Ok(Some(stat)) => stat,
            other => bail!("unexpected answer {other:?}"),
        };
        let (sender, receiver) = mpsc::channel(8);
        tokio::spawn(async move {
            loop {
                let chunk = match read_frame(&mut stream).await {
                    Ok(Some((FrameKind::Data, payload))) => Ok(payload),
                    Ok(Some((FrameKind::End, _))) => return,
                    Ok(Some((FrameKind::Json, payload))) => {
                        match serde_json::from_slice::<Reply>(&payload) {
                            Ok(Reply::Error(error)) => Err(anyhow::Error::new(Refused(error))),
                            _ => Err(anyhow::anyhow!("unexpected answer in a download")),
                        }
                    }
                    Ok(other) => Err(anyhow::anyhow!("unexpected frame in a download: {other:?}")),
                    Err(error) => Err(error),
                };
                let failed = chunk.is_err();
                if sender.send(chunk).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok((stat, receiver))
    }

    /// Sends an upload (`WriteFile` or `TarIn`) from a stream of chunks; the agent's answer.
    pub async fn upload<E: std::fmt::Display>(
        &self,
        request: &Request,
        mut chunks: impl futures_util::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    ) -> anyhow::Result<Stat> {
        use futures_util::StreamExt;
        let mut stream = self.connect(request).await?;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|error| anyhow::anyhow!("reading the upload: {error}"))?;
            for piece in chunk.chunks(MAX_FRAME / 4) {
                write_frame(&mut stream, FrameKind::Data, piece).await?;
            }
        }
        write_frame(&mut stream, FrameKind::End, &[]).await?;
        match read_reply(&mut stream).await? {
            Reply::Ok(Some(stat)) => Ok(stat),
            other => bail!("unexpected answer {other:?}"),
        }
    }

    pub async fn list(&self, path: &str) -> anyhow::Result<Vec<Entry>> {
        match self
            .simple(&Request::List {
                path: path.to_owned(),
            })
            .await?
        {
            Reply::Listing(entries) => Ok(entries),
            other => bail!("unexpected answer {other:?}"),
        }
    }

    /// Opens a terminal session: (its number, its command's pid).
    pub async fn pty_open(&self, request: PtyRequest) -> anyhow::Result<(u32, u32)> {
        match self.simple(&Request::PtyOpen(request)).await? {
            Reply::PtyOpened { session, pid } => Ok((session, pid)),
            other => bail!("unexpected answer {other:?}"),
        }
    }

    /// Attaches to a terminal session from `since`: the connection (its output frames follow;
    /// `Data` and JSON frames written to it are input and control) and where its output
    /// starts. A holding reader is waited for rather than lagging (the worker's recording).
    pub async fn pty_attach(
        &self,
        session: u32,
        since: u64,
        hold: bool,
    ) -> anyhow::Result<(UnixStream, u64)> {
        let request = Request::PtyAttach {
            session,
            since,
            hold,
        };
        let mut stream = self.connect(&request).await?;
        match read_reply(&mut stream).await? {
            Reply::PtyAttached { offset, .. } => Ok((stream, offset)),
            other => bail!("unexpected answer {other:?}"),
        }
    }

    /// A request answered by one reply (stat, mkdir, remove, rename, ping).
    pub async fn simple(&self, request: &Request) -> anyhow::Result<Reply> {
        let mut stream = self.connect(request).await?;
        read_reply(&mut stream).await
    }
}

/// The open standard input of a running command.
pub struct Stdin {
    writer: tokio::net::unix::OwnedWriteHalf,
}

impl Stdin {
    pub async fn write(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        for chunk in bytes.chunks(MAX_FRAME / 4) {
            write_frame(&mut self.writer, FrameKind::Data, chunk).await?;
        }
        Ok(())
    }

    /// Ends the input: the command reads end of file.
    pub async fn close(mut self) -> anyhow::Result<()> {
        write_frame(&mut self.writer, FrameKind::End, &[]).await
    }
}

/// Connects to the agent's socket without ever following a link in its place.
///
/// The socket's directory is writable by the sandbox's root: a process there could replace
/// the socket with a symbolic link to a host path, which a plain connect would follow on the
/// host. The file is opened with `O_PATH | O_NOFOLLOW`, checked to be a socket, and connected
/// through `/proc/self/fd`, so the inode checked is the inode connected to.
pub async fn connect_without_following(socket: &Path) -> anyhow::Result<UnixStream> {
    use rustix::fs::{FileType, Mode, OFlags};
    let handle = rustix::fs::open(
        socket,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .with_context(|| format!("opening the agent socket {}", socket.display()))?;
    let kind = FileType::from_raw_mode(rustix::fs::fstat(&handle)?.st_mode);
    anyhow::ensure!(
        kind == FileType::Socket,
        "{} is not a socket ({kind:?}): refusing to connect",
        socket.display()
    );
    let via_descriptor = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&handle));
    let stream = UnixStream::connect(&via_descriptor)
        .await
        .with_context(|| format!("connecting to the agent at {}", socket.display()))?;
    drop(handle);
    Ok(stream)
}

/// Reads one JSON reply; an `Error` reply becomes a [`Refused`] error.
async fn read_reply(stream: &mut UnixStream) -> anyhow::Result<Reply> {
    match read_frame(stream).await? {
        Some((FrameKind::Json, payload)) => match serde_json::from_slice(&payload)? {
            Reply::Error(error) => Err(anyhow::Error::new(Refused(error))),
            reply => Ok(reply),
        },
        Some((kind, _)) => bail!("expected an answer, got a {kind:?} frame"),
        None => bail!("the agent closed the connection"),
    }
}

pub(crate) async fn write_frame(
    stream: &mut (impl tokio::io::AsyncWrite + Unpin),
    kind: FrameKind,
    payload: &[u8],
) -> anyhow::Result<()> {
    let length = u32::try_from(payload.len()).context("frame too large")?;
    let mut header = [0u8; 5];
    header[0] = kind as u8;
    header[1..].copy_from_slice(&length.to_be_bytes());
    stream.write_all(&header).await?;
    stream.write_all(payload).await?;
    Ok(())
}

pub(crate) async fn read_frame(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
) -> anyhow::Result<Option<(FrameKind, Vec<u8>)>> {
    let mut header = [0u8; 5];
    match stream.read_exact(&mut header).await {
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error.into()),
    }
    let kind = FrameKind::from_byte(header[0])?;
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    anyhow::ensure!(
        length <= MAX_FRAME,
        "the agent sent a frame larger than {MAX_FRAME} bytes"
    );
    let mut payload = vec![0; length];
    stream.read_exact(&mut payload).await?;
    Ok(Some((kind, payload)))
}
