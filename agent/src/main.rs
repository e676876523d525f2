//! `sandbase-agent --socket PATH`: serve until killed.

use std::process::ExitCode;

fn main() -> ExitCode {
    // A terminal session's command: `--pty-helper PROGRAM ARGV0 [ARGS…]`.
    let all: Vec<String> = std::env::args().collect();
    if all.get(1).map(String::as_str) == Some("--pty-helper") && all.len() >= 3 {
        let error = sandbase_agent::pty::helper(&all[2], &all[3..]);
        eprintln!("sandbase-agent: starting {}: {error}", all[2]);
        return ExitCode::from(if error.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        });
    }
    let mut args = std::env::args().skip(1);
    let mut socket = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--socket" => socket = args.next(),
            "--version" => {
                println!("sandbase-agent {}", env!("CARGO_PKG_VERSION"));
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!(
                    "sandbase-agent: unknown argument {other:?} (usage: sandbase-agent --socket PATH)"
                );
                return ExitCode::from(2);
            }
        }
    }
    let Some(socket) = socket else {
        eprintln!("sandbase-agent: --socket PATH is required");
        return ExitCode::from(2);
    };
    match sandbase_agent::server::run(std::path::Path::new(&socket)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sandbase-agent: {error}");
            ExitCode::FAILURE
        }
    }
}
