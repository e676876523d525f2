//! Tests of the `sandbase` binary itself: the server process, its configuration errors,
//! signals and telemetry, and the client verbs against it.

#![allow(clippy::unwrap_used)] // Tests panic on purpose when an expectation fails.

mod client;
mod preview;
mod sandbox;
mod server;

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use uuid::Uuid;

pub const BINARY: &str = env!("CARGO_BIN_EXE_sandbase");

/// The operator token of the test servers.
pub const OPERATOR_TOKEN: &str = "cli-test-operator-token-0123456789";

/// A `sandbase server` child process with its own database and Redis prefix.
pub struct Server {
    pub child: Child,
    pub url: String,
    /// The internal listener: workers and the operator's template commands.
    pub internal: String,
    pub config_home: PathBuf,
    pub database_url: String,
}

impl Server {
    pub async fn start(extra_env: &[(&str, String)]) -> Server {
        install_crypto_provider();
        let database_url = sandbase_gateway::testing::fresh_database().await;
        // A port found free can be taken by another test's connection before the server
        // binds it: the server then exits at once, and is started again on other ports.
        for _ in 0..3 {
            let mut server = Self::spawn(&database_url, extra_env);
            if server.wait_ready().await {
                return server;
            }
            let mut stderr_text = String::new();
            if let Some(mut pipe) = server.child.stderr.take() {
                use std::io::Read as _;
                let _ = pipe.read_to_string(&mut stderr_text);
            }
            assert!(
                stderr_text.contains("in use"),
                "the server did not become ready: {stderr_text}"
            );
        }
        panic!("the server found no free port in three tries");
    }

    fn spawn(database_url: &str, extra_env: &[(&str, String)]) -> Server {
        let port = free_port();
        let internal_port = free_port();
        let config_home =
            std::env::temp_dir().join(format!("sandbase-cli-{}", Uuid::new_v4().simple()));
        let mut command = Command::new(BINARY);
        command
            .args(["server", "--listen", &format!("127.0.0.1:{port}")])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATABASE_URL", database_url)
            .env("REDIS_URL", sandbase_gateway::testing::redis_url())
            .env(
                "SANDBASE_REDIS__KEY_PREFIX",
                format!("sandbase-cli-test:{}:", Uuid::new_v4().simple()),
            )
            .env(
                "SANDBASE_AUTH__JWT_SECRET",
                format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple()),
            )
            .env("SANDBASE_SERVER__SHUTDOWN_GRACE_SECS", "10")
            .env("SANDBASE_SERVER__DRAIN_SECS", "0")
            .env(
                "SANDBASE_SERVER__INTERNAL_LISTEN",
                format!("127.0.0.1:{internal_port}"),
            )
            .env("SANDBASE_AUTH__OPERATOR_TOKEN", OPERATOR_TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (key, value) in extra_env {
            command.env(key, value);
        }
        let child = command.spawn().expect("start sandbase server");
        Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
            internal: format!("http://127.0.0.1:{internal_port}"),
            config_home,
            database_url: database_url.to_owned(),
        }
    }

    /// A count from this server's database (through `psql`, which `scripts/setup` installs
    /// with PostgreSQL).
    pub fn query_count(&self, sql: &str) -> i64 {
        // psql knows nothing of the pool's own URL parameters.
        let url = self.database_url.split('?').next().unwrap_or_default();
        let output = Command::new("psql")
            .args([url, "-qAt", "-c", sql])
            .output()
            .expect("run psql");
        assert!(output.status.success(), "{}", stderr(&output));
        stdout(&output).trim().parse().expect("a count")
    }

    /// Until its `/readyz` answers 200 (`true`), or the process exited (`false`).
    async fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = reqwest::Client::new();
        loop {
            if let Ok(response) = client.get(format!("{}/readyz", self.url)).send().await
                && response.status() == 200
            {
                return true;
            }
            if self.child.try_wait().ok().flatten().is_some() {
                return false;
            }
            assert!(Instant::now() < deadline, "the server did not become ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs a client verb against this server, with its own credentials file.
    pub fn cli(&self, args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Output {
        let mut command = Command::new(BINARY);
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &self.config_home)
            .env("XDG_CONFIG_HOME", &self.config_home)
            .env("SANDBASE_URL", &self.url)
            .env("SANDBASE_INTERNAL_URL", &self.internal)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("run the CLI");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(input.as_bytes())
                .expect("write stdin");
        }
        drop(child.stdin.take());
        child.wait_with_output().expect("CLI output")
    }

    /// Sends SIGTERM and waits (at most `limit`) for the exit status.
    pub fn terminate(&mut self, limit: Duration) -> std::process::ExitStatus {
        self.signal_terminate();
        self.wait_exit(limit)
    }

    pub fn signal_terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not stop after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.config_home);
    }
}

/// reqwest is built without a default TLS provider (the binary installs ring at start).
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
