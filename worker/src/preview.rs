//! Preview connections: a TCP connection to `127.0.0.1:PORT` made inside a hosted sandbox's
//! own network namespace, for the gateway's preview URLs. The sandbox is never opened to a
//! network — a sandbox without egress has loopback only, and this is how its dev server is
//! reached — and the connection is the worker's, so nothing inside can tell it from a local
//! client. The bytes it carries are metered as the sandbox's egress.

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use uuid::Uuid;

use crate::namespace::connect_inside;
use crate::node::{Node, NodeError};
use crate::pause::Active;

impl Node {
    /// A connection to `port` on the loopback of sandbox `id`, and the sandbox held busy (it
    /// is not paused while a preview connection is open). 502 `port_closed` when nothing
    /// listens there.
    pub async fn open_port(&self, id: Uuid, port: u16) -> Result<(Active, TcpStream), NodeError> {
        if port == 0 {
            return Err(NodeError::Invalid("port 0 is not a port".to_owned()));
        }
        let active = self.active(id).await?;
        let Some(namespace) = active.netns.as_ref() else {
            return Err(NodeError::PortClosed(port));
        };
        match connect_inside(namespace, port).await {
            Ok(stream) => Ok((active, stream)),
            Err(error) => {
                tracing::debug!(%id, port, error = %error, "preview connection refused");
                Err(NodeError::PortClosed(port))
            }
        }
    }

    /// Carries bytes between a preview client and the sandbox until either side closes, then
    /// meters them as the sandbox's egress.
    pub async fn carry_preview<A, B>(&self, id: Uuid, mut client: A, mut sandbox: B)
    where
        A: AsyncRead + AsyncWrite + Unpin,
        B: AsyncRead + AsyncWrite + Unpin,
    {
        match tokio::io::copy_bidirectional(&mut client, &mut sandbox).await {
            Ok((to_sandbox, from_sandbox)) => self.previews.add(id, to_sandbox + from_sandbox),
            Err(error) => tracing::debug!(%id, error = %error, "preview connection ended"),
        }
    }
}
