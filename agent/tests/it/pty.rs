//! Terminal sessions on the real agent: a controlling terminal, its size, interrupts, exit
//! codes, and re-attaching with `since` for exactly the bytes missed.

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use sandbase_agent::protocol::{
    ExitInfo, FrameKind, PtyControl, PtyRequest, Reply, Request, read_frame, read_json,
    write_frame, write_json,
};

use super::Agent;

fn open(agent: &Agent, argv: &[&str]) -> u32 {
    let mut stream = agent.connect(&Request::PtyOpen(PtyRequest {
        argv: argv.iter().map(|arg| (*arg).to_owned()).collect(),
        cols: 80,
        rows: 24,
        ..Default::default()
    }));
    match read_json::<Reply>(&mut stream).unwrap() {
        Reply::PtyOpened { session, .. } => session,
        other => panic!("opening: {other:?}"),
    }
}

/// An attached connection and what it has read so far.
struct Attached {
    stream: UnixStream,
    offset: u64,
    output: Vec<u8>,
    exit: Option<ExitInfo>,
    lagged: bool,
}

impl Attached {
    fn new(agent: &Agent, session: u32, since: u64) -> Attached {
        Attached::with(agent, session, since, false)
    }

    fn with(agent: &Agent, session: u32, since: u64, hold: bool) -> Attached {
        let mut stream = agent.connect(&Request::PtyAttach {
            session,
            since,
            hold,
        });
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let offset = match read_json::<Reply>(&mut stream).unwrap() {
            Reply::PtyAttached { offset, .. } => offset,
            other => panic!("attaching: {other:?}"),
        };
        Attached {
            stream,
            offset,
            output: Vec::new(),
            exit: None,
            lagged: false,
        }
    }

    fn send(&mut self, input: &str) {
        write_frame(&mut self.stream, FrameKind::Data, input.as_bytes()).unwrap();
    }

    fn resize(&mut self, cols: u16, rows: u16) {
        write_json(&mut self.stream, &PtyControl::Resize { cols, rows }).unwrap();
    }

    /// Reads one frame into the output (or the exit); `false` once the session ended.
    fn read_one(&mut self) -> bool {
        match read_frame(&mut self.stream).unwrap() {
            Some(frame) if frame.kind == FrameKind::Data => {
                self.output.extend_from_slice(&frame.payload);
                true
            }
            Some(frame) if frame.kind == FrameKind::Json => {
                match serde_json::from_slice(&frame.payload) {
                    Ok(Reply::Exit(exit)) => self.exit = Some(exit),
                    Ok(Reply::PtyLag { .. }) => self.lagged = true,
                    _ => {}
                }
                true
            }
            _ => false,
        }
    }

    /// Reads until `needle` has appeared in the output.
    fn until(&mut self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut from = 0;
        while !self.output[from..]
            .windows(needle.len())
            .any(|window| window == needle.as_bytes())
        {
            from = self.output.len().saturating_sub(needle.len());
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in {:?}",
                self.text()
            );
            assert!(
                self.read_one(),
                "ended without {needle:?}: {:?}",
                self.text()
            );
        }
    }

    /// Reads to the end of the session.
    fn until_end(&mut self) {
        while self.read_one() {}
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }
}

#[test]
fn a_terminal_session_is_a_real_terminal() {
    let agent = Agent::start();
    let session = open(&agent, &["/bin/sh"]);
    let mut attached = Attached::new(&agent, session, 0);
    attached.send("tty; [ -t 0 ] && echo IS-A-TTY; stty size\n");
    attached.until("24 80");
    let text = attached.text();
    assert!(text.contains("/dev/pts/"), "{text}");
    assert!(text.contains("IS-A-TTY"), "{text}");
    // The size follows a resize.
    attached.resize(100, 40);
    attached.send("stty size\n");
    attached.until("40 100");
    // Ctrl-C interrupts the foreground command and the shell goes on.
    attached.send("sleep 100\n");
    std::thread::sleep(Duration::from_millis(300));
    attached.send("\u{3}");
    // The interrupt flushes what is typed before it is handled.
    std::thread::sleep(Duration::from_millis(300));
    attached.send("echo BACK-$((1+1))\n");
    attached.until("BACK-2");
    // Its exit code is the session's.
    attached.send("exit 3\n");
    attached.until_end();
    assert_eq!(attached.exit.map(|exit| exit.code), Some(3));
}

#[test]
fn re_attaching_with_since_gets_exactly_the_missed_bytes() {
    let agent = Agent::start();
    let session = open(&agent, &["/bin/sh"]);
    let mut first = Attached::new(&agent, session, 0);
    first.send("echo READY\n");
    first.until("READY\r\n");
    // Output made while nobody is attached: the command starts after the detach.
    first.send(
        "sleep 1; i=0; while [ $i -lt 2000 ]; do echo line-$i; i=$((i+1)); done; echo DO''NE\n",
    );
    first.until("DO''NE\r\n");
    let seen = first.offset + first.output.len() as u64;
    drop(first);
    std::thread::sleep(Duration::from_secs(3));
    let mut again = Attached::new(&agent, session, seen);
    assert_eq!(again.offset, seen);
    again.until("DONE\r\n");
    let text = again.text();
    let first_line = text.find("line-0\r\n").expect("the first line");
    assert!(
        text[first_line..].starts_with("line-0\r\nline-1\r\n"),
        "{text:.80}"
    );
    assert!(text.contains("line-1999\r\nDONE\r\n"));
    // From offset 0 the whole output is still kept (it is under the ring's size), and the
    // bytes from `seen` on are the same as the re-attached reader's.
    let mut whole = Attached::new(&agent, session, 0);
    whole.until("DONE\r\n");
    let through_done = |bytes: &[u8]| {
        let text = String::from_utf8_lossy(bytes).into_owned();
        text[..text.find("DONE\r\n").expect("DONE") + 6].to_owned()
    };
    assert_eq!(
        through_done(&whole.output[seen as usize..]),
        through_done(&again.output)
    );
    // Two attached readers see the same bytes.
    let end = again.offset + again.output.len() as u64;
    let mut one = Attached::new(&agent, session, end);
    let mut two = Attached::new(&agent, session, end);
    one.send("echo SAME-$((6*7))\n");
    one.until("SAME-42\r\n");
    two.until("SAME-42\r\n");
    assert_eq!(one.output, two.output);
}

/// A holding reader (the worker's, which records) gets every byte, however far behind it
/// reads: the program waits on a full terminal meanwhile, while a plain reader as slow
/// lags past the kept output.
#[test]
fn a_holding_reader_misses_nothing_and_the_program_waits_for_it() {
    let agent = Agent::start();
    let session = open(&agent, &["/bin/sh"]);
    let mut holder = Attached::with(&agent, session, 0, true);
    let mut plain = Attached::new(&agent, session, 0);
    holder.send("echo READY\n");
    holder.until("READY\r\n");
    plain.until("READY\r\n");
    // 4 MiB, four times the kept output, while neither reads.
    holder.send("head -c 4194304 /dev/zero | tr '\\0' x; echo; echo DO''NE\n");
    std::thread::sleep(Duration::from_secs(2));
    let later = Attached::new(&agent, session, 0);
    assert!(
        later.offset > 0 && later.offset < 1 << 20,
        "the program went on without the holder: output from {}",
        later.offset
    );
    drop(later);
    holder.until("DONE\r\n");
    plain.until("DONE\r\n");
    let written = |bytes: &[u8]| bytes.iter().filter(|byte| **byte == b'x').count();
    assert!(!holder.lagged);
    assert_eq!(written(&holder.output), 4_194_304 + 1);
    assert!(plain.lagged, "the plain reader should have lagged");
    assert!(written(&plain.output) < 4_194_304);
    holder.send("exit 4\n");
    holder.until_end();
    assert_eq!(holder.exit.map(|exit| exit.code), Some(4));
}
