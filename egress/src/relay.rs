//! Relaying a tunnelled connection: bytes move socket → pipe → socket with splice(2), so
//! they never enter the proxy's memory, and a connection silent both ways for the idle
//! timeout is closed.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::net::Shutdown;
use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// A direction starts with the kernel's default pipe (64 KiB); one that has moved
/// `GROW_AFTER` bytes is a bulk transfer and gets a pipe of `BULK_PIPE` (some 1 000 splices
/// per GiB instead of 16 000). Pipe pages count against the proxy user's limit, so only
/// bulk transfers take large ones; when the kernel refuses, the pipe stays as it is.
const BULK_PIPE: usize = 1 << 20;
const GROW_AFTER: u64 = 4 << 20;

/// Bytes relayed each way and why the relay ended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Relayed {
    /// From `a` to `b`.
    pub forward: u64,
    /// From `b` to `a`.
    pub backward: u64,
    /// Closed because neither side sent anything for the idle timeout.
    pub idle: bool,
}

/// Relays between two connected sockets until both directions end (each side's end of
/// stream is passed on as a half close), one fails, or nothing moves either way for `idle`.
pub async fn relay(a: &TcpStream, b: &TcpStream, idle: Duration) -> Relayed {
    relay_metered(a, b, idle, &AtomicU64::new(0)).await
}

/// [`relay`], adding every byte moved either way to `meter` as it moves (a long tunnel is
/// metered as it goes, not at its end).
pub async fn relay_metered(
    a: &TcpStream,
    b: &TcpStream,
    idle: Duration,
    meter: &AtomicU64,
) -> Relayed {
    let epoch = Instant::now();
    let activity = AtomicU64::new(0);
    let forward = AtomicU64::new(0);
    let backward = AtomicU64::new(0);
    let both = async {
        tokio::try_join!(
            direction(a, b, [&forward, meter], &activity, epoch),
            direction(b, a, [&backward, meter], &activity, epoch)
        )
    };
    let idle_out = async {
        loop {
            let last = Duration::from_millis(activity.load(Ordering::Relaxed));
            let quiet = epoch.elapsed().saturating_sub(last);
            if quiet >= idle {
                return;
            }
            tokio::time::sleep(idle - quiet).await;
        }
    };
    let idle = tokio::select! {
        _ = both => false,
        () = idle_out => true,
    };
    Relayed {
        forward: forward.load(Ordering::Relaxed),
        backward: backward.load(Ordering::Relaxed),
        idle,
    }
}

/// One direction: `from`'s bytes into a pipe, the pipe into `to`; at `from`'s end of
/// stream, `to` is shut down for writing.
async fn direction(
    from: &TcpStream,
    to: &TcpStream,
    moved: [&AtomicU64; 2],
    activity: &AtomicU64,
    epoch: Instant,
) -> io::Result<()> {
    let (reader, writer) = pipe()?;
    let mut capacity = rustix::pipe::fcntl_getpipe_size(&writer)?;
    let mut total = 0u64;
    let mut grown = false;
    loop {
        // The pipe is empty here, which is when its size may change; it is tried once.
        if !grown && total >= GROW_AFTER {
            grown = true;
            let _ = rustix::pipe::fcntl_setpipe_size(&writer, BULK_PIPE);
            capacity = rustix::pipe::fcntl_getpipe_size(&writer)?;
        }
        let taken = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || {
                splice(from, &writer, capacity).map_err(io::Error::from)
            }) {
                Ok(taken) => break taken,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => return Err(error),
            }
        };
        if taken == 0 {
            let _ = rustix::net::shutdown(to, Shutdown::Write);
            return Ok(());
        }
        activity.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        total += taken as u64;
        let mut pending = taken;
        while pending > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                splice(&reader, to, pending).map_err(io::Error::from)
            }) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(sent) => {
                    pending -= sent;
                    for counter in moved {
                        counter.fetch_add(sent as u64, Ordering::Relaxed);
                    }
                    activity.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => return Err(error),
            }
        }
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(
        PipeFlags::CLOEXEC | PipeFlags::NONBLOCK,
    )?)
}

fn splice(
    from: impl std::os::fd::AsFd,
    to: impl std::os::fd::AsFd,
    len: usize,
) -> rustix::io::Result<usize> {
    rustix::pipe::splice(
        from,
        None,
        to,
        None,
        len,
        SpliceFlags::MOVE | SpliceFlags::NONBLOCK,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A connected pair of sockets: (the end the relay gets, the end the test drives).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (connected, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
        (accepted.expect("accept").0, connected.expect("connect"))
    }

    #[tokio::test]
    async fn relays_both_ways_passes_half_closes_on_and_counts() {
        let (a, mut client) = pair().await;
        let (b, mut server) = pair().await;
        let relay = tokio::spawn(async move { relay(&a, &b, Duration::from_secs(30)).await });
        let big: Vec<u8> = (0..6_000_000u32).map(|i| (i % 251) as u8).collect();
        let upload = big.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&upload).await.expect("write");
            client.shutdown().await.expect("half close");
            let mut answer = Vec::new();
            client.read_to_end(&mut answer).await.expect("read answer");
            answer
        });
        let mut received = Vec::new();
        server.read_to_end(&mut received).await.expect("read");
        assert!(received == big, "the upload arrived whole and in order");
        server.write_all(b"thanks").await.expect("answer");
        server.shutdown().await.expect("close");
        assert_eq!(writer.await.expect("client"), b"thanks");
        let relayed = relay.await.expect("relay");
        assert_eq!(
            relayed,
            Relayed {
                forward: big.len() as u64,
                backward: 6,
                idle: false
            }
        );
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_after_the_idle_timeout() {
        let (a, mut client) = pair().await;
        let (b, mut server) = pair().await;
        let started = Instant::now();
        let relay = tokio::spawn(async move {
            let relayed = relay(&a, &b, Duration::from_millis(300)).await;
            drop((a, b));
            relayed
        });
        client.write_all(b"hello").await.expect("write");
        let mut hello = [0u8; 5];
        server.read_exact(&mut hello).await.expect("read");
        let relayed = relay.await.expect("relay");
        assert!(relayed.idle, "ended by the idle timeout");
        assert!(started.elapsed() >= Duration::from_millis(300));
        // Both sides see the connection closed.
        assert_eq!(client.read(&mut [0u8; 1]).await.expect("client eof"), 0);
        assert_eq!(server.read(&mut [0u8; 1]).await.expect("server eof"), 0);
    }
}
