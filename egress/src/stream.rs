//! A sandbox's side of a proxied connection: bytes already read (a request head, a TLS
//! ClientHello) are replayed before the socket's, and bytes each way are counted for the
//! flow log and metering.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

#[derive(Debug, Default)]
pub struct Counters {
    /// From the sandbox.
    pub up: AtomicU64,
    /// To the sandbox.
    pub down: AtomicU64,
}

pub struct Tap<S> {
    inner: S,
    prefix: Vec<u8>,
    offset: usize,
    pub counters: Arc<Counters>,
    /// The sandbox's running total, both ways, added to as bytes move.
    meter: Arc<AtomicU64>,
}

impl<S> Tap<S> {
    pub fn new(inner: S, prefix: Vec<u8>, meter: Arc<AtomicU64>) -> Tap<S> {
        Tap {
            inner,
            prefix,
            offset: 0,
            counters: Arc::default(),
            meter,
        }
    }

    fn count_up(&self, bytes: usize) {
        self.counters.up.fetch_add(bytes as u64, Ordering::Relaxed);
        self.meter.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tap<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.offset < self.prefix.len() {
            let take = (self.prefix.len() - self.offset).min(buf.remaining());
            let start = self.offset;
            buf.put_slice(&self.prefix[start..start + take]);
            self.offset += take;
            self.count_up(take);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        self.count_up(read);
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tap<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = &result {
            self.counters
                .down
                .fetch_add(*written as u64, Ordering::Relaxed);
            self.meter.fetch_add(*written as u64, Ordering::Relaxed);
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
