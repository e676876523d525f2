//! Answers on a connection (one writer, shared by the threads of a request).

use std::io::{self};
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, MutexGuard};

use crate::protocol::{AgentError, Reply, write_json};

pub(crate) fn lock(writer: &Mutex<UnixStream>) -> MutexGuard<'_, UnixStream> {
    writer
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn reply(writer: &Mutex<UnixStream>, message: &Reply) -> io::Result<()> {
    write_json(&mut *lock(writer), message)
}

pub(crate) fn reply_error(
    writer: &Mutex<UnixStream>,
    error: &io::Error,
    context: &str,
) -> io::Result<()> {
    reply(writer, &Reply::Error(AgentError::from_io(error, context)))
}
