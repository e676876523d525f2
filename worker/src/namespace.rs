//! Network namespaces of hosted sandboxes: the namespace file kept from when a sandbox
//! started (so a reused pid cannot send a connection elsewhere), its loopback brought up when
//! runsc left it down, and TCP connections made inside it.
//!
//! A network namespace is a thread's: a connection is made on a short-lived thread of its
//! own that enters the sandbox's namespace, connects and ends. The socket stays in the
//! namespace it was made in.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::time::Duration;

use tokio::net::TcpStream;

/// How long connecting to a port inside a sandbox may take (loopback: refused at once when
/// nothing listens; this bounds a listener whose backlog is full).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The stack of a connecting thread: it only calls setns and connect.
const CONNECTOR_STACK: usize = 64 * 1024;

/// A sandbox's network namespace, opened when it started.
pub fn open(pid: u32) -> Option<File> {
    File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|error| tracing::warn!(pid, error = %error, "no network namespace: no previews"))
        .ok()
}

/// Brings the loopback of the network namespace of `pid` up. runc does it for every
/// sandbox; runsc with host networking leaves it down, and previews connect through it.
pub(crate) async fn loopback_up(pid: u32) {
    let pid = pid.to_string();
    let done = tokio::process::Command::new("nsenter")
        .args(["-t", &pid, "-n", "ip", "link", "set", "lo", "up"])
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    match done {
        Ok(output) if output.status.success() => {}
        Ok(output) => tracing::warn!(
            pid,
            error = %String::from_utf8_lossy(&output.stderr).trim(),
            "could not bring the sandbox's loopback up: no previews"
        ),
        Err(error) => tracing::warn!(pid, error = %error, "nsenter: no previews"),
    }
}

/// Connects to `127.0.0.1:port` inside the namespace `namespace`.
pub async fn connect_inside(namespace: &File, port: u16) -> io::Result<TcpStream> {
    let namespace = namespace.try_clone()?;
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("preview-connect".to_owned())
        .stack_size(CONNECTOR_STACK)
        .spawn(move || {
            let connected = rustix::thread::move_into_link_name_space(
                namespace.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .map_err(io::Error::from)
            .and_then(|()| {
                let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                std::net::TcpStream::connect_timeout(&address, CONNECT_TIMEOUT)
            });
            let _ = sender.send(connected);
        })?;
    let stream = receiver
        .await
        .map_err(|_| io::Error::other("the connecting thread ended without an answer"))??;
    stream.set_nonblocking(true)?;
    stream.set_nodelay(true)?;
    TcpStream::from_std(stream)
}
