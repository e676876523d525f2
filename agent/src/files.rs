//! Files, directories and archives, resolved inside the sandbox's own mount namespace.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;

use crate::protocol::{Entry, FrameKind, Owner, Reply, Stat, read_frame, write_frame};

use crate::reply::{lock, reply, reply_error};

/// Streams a directory as a tar archive (links archived as links, never followed).
pub(crate) fn tar_out(path: &str, writer: &Mutex<UnixStream>) -> io::Result<()> {
    let root = Path::new(path);
    match fs::metadata(root) {
        Ok(metadata) if metadata.is_dir() => {}
        Ok(_) => {
            let error = io::Error::new(io::ErrorKind::NotADirectory, "not a directory");
            return reply_error(writer, &error, path);
        }
        Err(error) => return reply_error(writer, &error, path),
    }
    reply(writer, &Reply::Ok(stat(root).ok()))?;
    let mut frames = DataWriter {
        writer,
        buffer: Vec::with_capacity(DATA_CHUNK),
    };
    let archived = (|| {
        let mut builder = tar::Builder::new(&mut frames);
        builder.follow_symlinks(false);
        builder.mode(tar::HeaderMode::Complete);
        builder.append_dir_all(".", root)?;
        builder.finish()
    })();
    match archived {
        Ok(()) => {
            frames.flush()?;
            write_frame(&mut *lock(writer), FrameKind::End, &[])
        }
        // Mid-stream, an error frame takes the place of the end marker.
        Err(error) => reply_error(writer, &error, path),
    }
}

/// Who owns what an archive unpacks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Owners {
    /// This owner (`None`: the agent's, the sandbox's root).
    Given(Option<Owner>),
    /// The owners the archive names (ids inside the sandbox).
    Archived,
}

/// Unpacks a tar stream into a directory, refusing entries that would land outside it.
pub(crate) fn tar_in(
    path: &str,
    owners: Owners,
    reader: &mut UnixStream,
    writer: &Mutex<UnixStream>,
) -> io::Result<()> {
    let target = Path::new(path);
    let mut frames = DataReader {
        reader,
        buffer: Vec::new(),
        position: 0,
        ended: false,
    };
    let owner = match owners {
        Owners::Given(owner) => owner,
        Owners::Archived => None,
    };
    let result = (|| {
        mkdir(target, owner)?;
        let mut archive = tar::Archive::new(&mut frames);
        archive.set_preserve_permissions(true);
        archive.set_preserve_mtime(true);
        archive.set_preserve_ownerships(matches!(owners, Owners::Archived));
        archive.set_overwrite(true);
        for entry in archive.entries()? {
            let mut entry = entry?;
            let relative = entry.path()?.into_owned();
            if !entry.unpack_in(target)? {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} leaves the target directory", relative.display()),
                ));
            }
            if let Some(owner) = owner {
                std::os::unix::fs::lchown(
                    target.join(&relative),
                    Some(owner.uid),
                    Some(owner.gid),
                )?;
            }
        }
        Ok(())
    })()
    .map_err(as_bad_archive);
    // Whatever happened, read the upload to its end so the answer is read by the sender.
    let drained = frames.drain();
    match (result, drained) {
        (Ok(()), Ok(())) => reply(writer, &Reply::Ok(stat(target).ok())),
        (Err(error), _) | (Ok(()), Err(error)) => reply_error(writer, &error, path),
    }
}

/// What reading an archive that is not one fails with (truncated, a bad header or checksum,
/// a file cut short) is the sender's fault, not the sandbox's: refused as invalid.
fn as_bad_archive(error: io::Error) -> io::Error {
    match error.kind() {
        io::ErrorKind::Other | io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidData => {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not a valid tar archive: {error}"),
            )
        }
        _ => error,
    }
}

/// Size of the `Data` frames the agent sends.
const DATA_CHUNK: usize = 256 * 1024;

/// `Write` as a sequence of `Data` frames.
pub(crate) struct DataWriter<'a> {
    writer: &'a Mutex<UnixStream>,
    buffer: Vec<u8>,
}

impl Write for DataWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let room = DATA_CHUNK - self.buffer.len();
        let taken = bytes.len().min(room);
        self.buffer.extend_from_slice(&bytes[..taken]);
        if self.buffer.len() == DATA_CHUNK {
            self.flush()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buffer.is_empty() {
            write_frame(&mut *lock(self.writer), FrameKind::Data, &self.buffer)?;
            self.buffer.clear();
        }
        Ok(())
    }
}

/// `Read` over `Data` frames up to the `End` frame.
pub(crate) struct DataReader<'a> {
    reader: &'a mut UnixStream,
    buffer: Vec<u8>,
    position: usize,
    ended: bool,
}

impl Read for DataReader<'_> {
    fn read(&mut self, into: &mut [u8]) -> io::Result<usize> {
        while self.position == self.buffer.len() {
            if self.ended {
                return Ok(0);
            }
            match read_frame(self.reader)? {
                Some(frame) if frame.kind == FrameKind::Data => {
                    self.buffer = frame.payload;
                    self.position = 0;
                }
                Some(frame) if frame.kind == FrameKind::End => self.ended = true,
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the upload ended before its end marker",
                    ));
                }
            }
        }
        let count = into.len().min(self.buffer.len() - self.position);
        into[..count].copy_from_slice(&self.buffer[self.position..self.position + count]);
        self.position += count;
        Ok(count)
    }
}

impl DataReader<'_> {
    /// Reads and drops what is left of the upload.
    fn drain(&mut self) -> io::Result<()> {
        let mut sink = [0u8; 64 * 1024];
        while self.read(&mut sink)? > 0 {}
        Ok(())
    }
}

/// Opens a file to be read whole: only a regular file. Opened without blocking (a FIFO
/// with no writer would hold the open forever) and without becoming a controlling terminal;
/// a directory, device (`/dev/zero`, `/dev/urandom`: endless), FIFO or socket is refused.
fn open_regular(path: &str) -> io::Result<fs::File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY).bits() as i32)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    let what = if kind.is_file() {
        return Ok(file);
    } else if kind.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "is a directory",
        ));
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what}: only regular files are read (use exec to read from it)"),
    ))
}

pub(crate) fn read_file(path: &str, writer: &Mutex<UnixStream>) -> io::Result<()> {
    let opened = open_regular(path);
    let mut file = match opened {
        Ok(file) => file,
        Err(error) => return reply_error(writer, &error, path),
    };
    reply(writer, &Reply::Ok(stat(Path::new(path)).ok()))?;
    let mut buffer = vec![0u8; 256 * 1024];
    let mut writer = lock(writer);
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        write_frame(&mut *writer, FrameKind::Data, &buffer[..read])?;
    }
    write_frame(&mut *writer, FrameKind::End, &[])
}

pub(crate) fn write_file(
    path: &str,
    mode: Option<u32>,
    owner: Option<Owner>,
    reader: &mut UnixStream,
    writer: &Mutex<UnixStream>,
) -> io::Result<()> {
    let target = Path::new(path);
    let mut upload = DataReader {
        reader,
        buffer: Vec::new(),
        position: 0,
        ended: false,
    };
    let result = (|| {
        if let Some(parent) = target
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
        {
            mkdir(parent, owner)?;
        }
        // The upload goes to a new file beside the target, which replaces the target only
        // once complete: a failed upload leaves the old content.
        let temporary = temporary_beside(target)?;
        let written = (|| {
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temporary)?;
            file.set_permissions(fs::Permissions::from_mode(mode.unwrap_or(0o644) & 0o7777))?;
            if let Some(owner) = owner {
                std::os::unix::fs::fchown(&file, Some(owner.uid), Some(owner.gid))?;
            }
            io::copy(&mut upload, &mut file)?;
            file.sync_all()?;
            if fs::symlink_metadata(target).is_ok_and(|metadata| metadata.is_dir()) {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    "is a directory",
                ));
            }
            fs::rename(&temporary, target)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temporary);
        }
        written
    })();
    // Read the upload to its end even after a failure, so the sender reads the answer.
    let drained = upload.drain();
    match (result, drained) {
        (Ok(()), Ok(())) => reply(writer, &Reply::Ok(stat(target).ok())),
        (Err(error), _) | (Ok(()), Err(error)) => reply_error(writer, &error, path),
    }
}

/// A name for a new file in `target`'s directory.
pub(crate) fn temporary_beside(target: &Path) -> io::Result<std::path::PathBuf> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = target
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(target.with_file_name(format!(".{}.upload-{count}", name.to_string_lossy())))
}

/// Creates `path` and its missing parents, giving the new ones to `owner`.
pub(crate) fn mkdir(path: &Path, owner: Option<Owner>) -> io::Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        mkdir(parent, owner)?;
    }
    match fs::create_dir(path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {
            return Ok(());
        }
        Err(error) => return Err(error),
    }
    if let Some(owner) = owner {
        std::os::unix::fs::chown(path, Some(owner.uid), Some(owner.gid))?;
    }
    Ok(())
}

pub(crate) fn list(path: &str, writer: &Mutex<UnixStream>) -> io::Result<()> {
    let entries = fs::read_dir(path).and_then(|entries| {
        let mut listing = Vec::new();
        for entry in entries {
            let entry = entry?;
            if let Ok(stat) = stat(&entry.path()) {
                listing.push(Entry {
                    name: entry.file_name().to_string_lossy().into_owned(),
                    stat,
                });
            }
        }
        listing.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(listing)
    });
    match entries {
        Ok(listing) => reply(writer, &Reply::Listing(listing)),
        Err(error) => reply_error(writer, &error, path),
    }
}

/// Describes `path` itself (a symlink is reported as one, with its target).
pub(crate) fn stat(path: &Path) -> io::Result<Stat> {
    let metadata = fs::symlink_metadata(path)?;
    let file_type = metadata.file_type();
    let kind = if file_type.is_symlink() {
        "symlink"
    } else if file_type.is_dir() {
        "dir"
    } else if file_type.is_file() {
        "file"
    } else {
        "other"
    };
    Ok(Stat {
        path: path.to_string_lossy().into_owned(),
        kind: kind.to_owned(),
        size: metadata.size(),
        mode: metadata.mode() & 0o7777,
        uid: metadata.uid(),
        gid: metadata.gid(),
        modified: metadata.mtime(),
        link_target: if file_type.is_symlink() {
            fs::read_link(path)
                .ok()
                .map(|target| target.to_string_lossy().into_owned())
        } else {
            None
        },
    })
}
