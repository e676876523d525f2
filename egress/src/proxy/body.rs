//! Bodies passed through a filter as they stream: a request body scanned for placeholders
//! ([`BodyScan`]), a response body scrubbed of credential values ([`Scrub`]).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Frame, Incoming};

use crate::body_scan::BodyScan;
use crate::scrub::Scrub;

/// A filter over a body's data: what may be passed on now, or why the body must stop.
pub(super) trait ChunkFilter: Send + Unpin + 'static {
    fn push(&mut self, chunk: &[u8]) -> Result<Vec<u8>, String>;
    /// What was held back, at the end of the body.
    fn finish(&mut self) -> Vec<u8>;
    /// The body's trailers, filtered like its head; `Err` stops the body.
    fn trailers(&mut self, trailers: &mut http::HeaderMap) -> Result<(), String>;
}

impl ChunkFilter for BodyScan {
    fn push(&mut self, chunk: &[u8]) -> Result<Vec<u8>, String> {
        BodyScan::push(self, chunk)
    }

    fn finish(&mut self) -> Vec<u8> {
        BodyScan::finish(self)
    }

    /// A placeholder that must not leave does not leave in a trailer either (none is
    /// swapped there).
    fn trailers(&mut self, trailers: &mut http::HeaderMap) -> Result<(), String> {
        match trailers
            .values()
            .find_map(|value| self.stopped_by(value.as_bytes()))
        {
            Some(name) => Err(name),
            None => Ok(()),
        }
    }
}

impl ChunkFilter for Scrub {
    fn push(&mut self, chunk: &[u8]) -> Result<Vec<u8>, String> {
        Ok(Scrub::push(self, chunk))
    }

    fn finish(&mut self) -> Vec<u8> {
        Scrub::finish(self)
    }

    fn trailers(&mut self, trailers: &mut http::HeaderMap) -> Result<(), String> {
        Scrub::trailers(self, trailers);
        Ok(())
    }
}

/// A body through a [`ChunkFilter`]. When the filter stops it, the body ends with an error
/// (the peer having received nothing of what stopped it) and the reason is kept in `stopped`.
pub(super) struct Filtered<F> {
    inner: Incoming,
    filter: F,
    keeps_length: bool,
    finished: bool,
    trailers: Option<http::HeaderMap>,
    stopped: Arc<Mutex<Option<String>>>,
}

impl<F: ChunkFilter> Filtered<F> {
    pub(super) fn new(
        inner: Incoming,
        filter: F,
        keeps_length: bool,
        stopped: Arc<Mutex<Option<String>>>,
    ) -> Filtered<F> {
        Filtered {
            inner,
            filter,
            keeps_length,
            finished: false,
            trailers: None,
            stopped,
        }
    }

    fn end(&mut self) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<F: ChunkFilter> hyper::body::Body for Filtered<F> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.finished {
            return this.end();
        }
        loop {
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(frame) => frame,
            };
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => match this.filter.push(&data) {
                        Ok(ready) if ready.is_empty() => continue,
                        Ok(ready) => return Poll::Ready(Some(Ok(Frame::data(Bytes::from(ready))))),
                        Err(why) => {
                            *this.stopped.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(why.clone());
                            this.finished = true;
                            return Poll::Ready(Some(Err(why.into())));
                        }
                    },
                    Err(frame) => {
                        let mut trailers = frame.into_trailers().ok();
                        if let Some(trailers) = trailers.as_mut()
                            && let Err(why) = this.filter.trailers(trailers)
                        {
                            *this.stopped.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(why.clone());
                            this.finished = true;
                            return Poll::Ready(Some(Err(why.into())));
                        }
                        this.trailers = trailers;
                        this.finished = true;
                    }
                },
                Some(Err(error)) => return Poll::Ready(Some(Err(error.into()))),
                None => this.finished = true,
            }
            let rest = this.filter.finish();
            if !rest.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
            }
            return this.end();
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        if self.keeps_length {
            self.inner.size_hint()
        } else {
            hyper::body::SizeHint::default()
        }
    }
}
