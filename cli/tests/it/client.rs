use serde_json::Value;

use crate::{Server, stderr, stdout};

#[tokio::test]
async fn signup_whoami_keys_and_audit_from_the_command_line() {
    let server = Server::start(&[]).await;
    let email = format!("cli-{}@example.com", uuid::Uuid::new_v4().simple());

    let output = server.cli(
        &[
            "signup",
            "--email",
            &email,
            "--team",
            "Command Line",
            "--password-stdin",
        ],
        &[],
        Some("a long enough password\n"),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("API key:  sb_"),
        "{}",
        stdout(&output)
    );

    // The key was saved, so whoami works with no further set-up.
    let output = server.cli(&["whoami"], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(
        text.contains("Command Line") && text.contains("owner") && text.contains(&email),
        "{text}"
    );

    let output = server.cli(&["--json", "whoami"], &[], None);
    let me: Value = serde_json::from_slice(&output.stdout).expect("JSON from --json");
    assert_eq!(me["team"]["name"], "Command Line");

    let output = server.cli(
        &[
            "keys",
            "create",
            "ci",
            "--role",
            "member",
            "--expires-in",
            "3600",
            "--json",
        ],
        &[],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let created: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let token = created["token"].as_str().unwrap().to_owned();
    let id = created["id"].as_str().unwrap().to_owned();

    let output = server.cli(&["whoami"], &[("SANDBASE_API_KEY", &token)], None);
    assert!(stdout(&output).contains("member"), "{}", stdout(&output));

    let output = server.cli(&["keys", "ls"], &[], None);
    let listing = stdout(&output);
    assert!(
        listing.lines().next().unwrap().starts_with("ID"),
        "{listing}"
    );
    assert!(
        listing.contains("ci") && !listing.contains(&token),
        "{listing}"
    );

    let output = server.cli(&["keys", "revoke", &id], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));
    let output = server.cli(&["whoami"], &[("SANDBASE_API_KEY", &token)], None);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("api_key_revoked"),
        "{}",
        stderr(&output)
    );

    let output = server.cli(&["--json", "audit", "--action", "api_key.*"], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));
    let events: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let actions: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["api_key.revoke", "api_key.create"]);

    // Login mints and saves a key for this machine.
    let output = server.cli(
        &["login", "--email", &email, "--password-stdin"],
        &[],
        Some("a long enough password\n"),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let output = server.cli(
        &["login", "--email", &email, "--password-stdin"],
        &[],
        Some("wrong password\n"),
    );
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("invalid_credentials"),
        "{}",
        stderr(&output)
    );
}

#[tokio::test]
async fn client_errors_are_readable() {
    let server = Server::start(&[]).await;
    let output = server.cli(&["whoami"], &[], None);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("no credentials"),
        "{}",
        stderr(&output)
    );
    let output = server.cli(&["whoami"], &[("SANDBASE_API_KEY", "sb_nope")], None);
    assert!(
        stderr(&output).contains("invalid_api_key"),
        "{}",
        stderr(&output)
    );
    let output = server.cli(
        &["whoami"],
        &[
            ("SANDBASE_URL", "http://127.0.0.1:1"),
            ("SANDBASE_API_KEY", "x"),
        ],
        None,
    );
    assert!(
        stderr(&output).contains("cannot reach"),
        "{}",
        stderr(&output)
    );
}

/// Operators grant credits and check the ledger; teams read their balance.
#[tokio::test]
async fn credits_granted_by_the_operator_show_in_the_balance() {
    let server = Server::start(&[]).await;
    let email = format!("cli-{}@example.com", uuid::Uuid::new_v4().simple());
    let output = server.cli(
        &[
            "signup",
            "--email",
            &email,
            "--team",
            "Credits",
            "--password-stdin",
        ],
        &[],
        Some("a long enough password\n"),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let me: Value =
        serde_json::from_slice(&server.cli(&["--json", "whoami"], &[], None).stdout).unwrap();
    let team = me["team"]["id"].as_str().unwrap().to_owned();
    let operator = [
        ("DATABASE_URL", server.database_url.as_str()),
        ("REDIS_URL", "redis://127.0.0.1:6379"),
    ];
    for _ in 0..2 {
        // The same key twice: granted once.
        let output = server.cli(
            &[
                "admin",
                "grant",
                "--team",
                &team,
                "--credits",
                "2.5",
                "--key",
                "promo-1",
                "--note",
                "promotion",
            ],
            &operator,
            None,
        );
        assert!(output.status.success(), "{}", stderr(&output));
    }
    let output = server.cli(
        &["admin", "grant", "--team", &team, "--credits", "-1"],
        &operator,
        None,
    );
    assert!(!output.status.success());
    let output = server.cli(&["credits"], &[], None);
    let text = stdout(&output);
    assert!(text.starts_with("available: 12.5 credits"), "{text}");
    assert!(text.contains("starter") && text.contains("admin"), "{text}");
    let output = server.cli(&["usage", "--group-by", "kind"], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("total: 0 credits"),
        "{}",
        stdout(&output)
    );
    // No provider configured: the store says how to add one.
    let output = server.cli(&["store", "models"], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("[store]"), "{}", stdout(&output));
    let output = server.cli(&["store", "apis"], &[], None);
    assert!(
        stdout(&output).contains("[[store.apis]]"),
        "{}",
        stdout(&output)
    );
    let output = server.cli(&["--json", "store", "requests"], &[], None);
    let requests: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(requests["requests"], serde_json::json!([]));
    let output = server.cli(&["admin", "reconcile"], &operator, None);
    assert!(
        output.status.success(),
        "{}{}",
        stdout(&output),
        stderr(&output)
    );
    assert!(stdout(&output).contains("balances"), "{}", stdout(&output));
}

#[tokio::test]
async fn secrets_from_the_command_line_and_a_key_rotation() {
    let keys =
        std::env::temp_dir().join(format!("sandbase-keys-{}", uuid::Uuid::new_v4().simple()));
    let output = server_less_cli(&["vault", "new-key", "--version", "1"]);
    let first = String::from_utf8(output.stdout).unwrap();
    assert!(first.starts_with("1:"), "{first}");
    std::fs::write(&keys, &first).unwrap();
    let server = Server::start(&[(
        "SANDBASE_VAULT__KEY_FILE",
        keys.to_string_lossy().into_owned(),
    )])
    .await;
    let email = format!("cli-{}@example.com", uuid::Uuid::new_v4().simple());
    let output = server.cli(
        &[
            "signup",
            "--email",
            &email,
            "--team",
            "Vault",
            "--password-stdin",
        ],
        &[],
        Some("a long enough password\n"),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let set = [
        "secret",
        "set",
        "github",
        "--host",
        "api.github.com",
        "--header",
        "Authorization",
        "--format",
        "Bearer {value}",
    ];
    let output = server.cli(&set, &[], Some("ghp_commandLineValue123\n"));
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("version 1"), "{}", stdout(&output));
    // Again: a new version.
    let output = server.cli(&set, &[], Some("ghp_commandLineValue456\n"));
    assert!(stdout(&output).contains("version 2"), "{}", stdout(&output));
    let output = server.cli(&["secret", "ls"], &[], None);
    let text = stdout(&output);
    assert!(
        text.contains("github") && text.contains("Bearer {value}") && !text.contains("ghp_"),
        "{text}"
    );
    let output = server.cli(
        &[
            "secret",
            "set",
            "bad",
            "--host",
            "127.0.0.1",
            "--query",
            "key",
        ],
        &[],
        Some("v\n"),
    );
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("IP addresses"),
        "{}",
        stderr(&output)
    );

    let operator = rotate_the_key_encryption_keys(&server, &keys, &first);
    // Set twice, one value is left: the first version's ciphertext is gone.
    let versions = server.query_count("SELECT count(*) FROM secret_versions");
    assert_eq!(versions, 1);
    // The team's data key itself replaced, its value re-encrypted.
    let output = server.cli(&["vault", "rotate-data-keys"], &operator, None);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("replaced 1 data keys; 1 secret values re-encrypted"),
        "{}",
        stdout(&output)
    );
    let output = server.cli(&["secret", "rm", "github"], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));
    let _ = std::fs::remove_file(&keys);
}

fn server_less_cli(args: &[&str]) -> std::process::Output {
    let output = std::process::Command::new(crate::BINARY)
        .args(args)
        .output()
        .expect("run sandbase");
    assert!(output.status.success(), "{}", stderr(&output));
    output
}

/// An operator secret set under the first key-encryption key; then a second key, and
/// `rotate-kek` re-wraps the team's data key and re-seals the operator secret. Returns the
/// operator's environment.
fn rotate_the_key_encryption_keys<'a>(
    server: &'a Server,
    keys: &'a std::path::Path,
    first: &str,
) -> [(&'static str, &'a str); 3] {
    let operator = [
        ("DATABASE_URL", server.database_url.as_str()),
        ("REDIS_URL", "redis://127.0.0.1:6379"),
        ("SANDBASE_VAULT__KEY_FILE", keys.to_str().unwrap()),
    ];
    let output = server.cli(
        &["vault", "secret", "set", "provider-key"],
        &operator,
        Some("pk-operator-value\n"),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let output = server_less_cli(&["vault", "new-key", "--version", "2"]);
    let second = String::from_utf8(output.stdout).unwrap();
    std::fs::write(keys, format!("{first}{second}")).unwrap();
    let output = server.cli(&["vault", "rotate-kek"], &operator, None);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains(
            "re-wrapped 1 data keys and re-sealed 1 operator secrets under key version 2"
        ),
        "{}",
        stdout(&output)
    );
    let output = server.cli(&["vault", "secret", "ls"], &operator, None);
    let listed = stdout(&output);
    assert!(
        listed.starts_with("provider-key\t") && listed.contains("key version 2"),
        "{listed}"
    );
    assert!(!listed.contains("pk-operator-value"));
    operator
}
