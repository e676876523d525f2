//! Templates from images: an OCI layout archive imported, the same image pulled from a real
//! registry (Debian's `docker-registry`), whiteouts applied, a hostile image refused.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::helpers::TestApp;
use crate::testbed::{TestWorker, create, sandbox_app, sh, wait_until, worker_config};

const OPERATOR: &str = sandbase_gateway::testing::OPERATOR_TOKEN;

enum Item<'a> {
    File(&'a str, &'a str),
    Link(&'a str, &'a str),
}

/// A layer tar of `items` (a `.wh.` name is a whiteout).
fn layer(items: &[Item]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for item in items {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        match item {
            Item::File(path, content) => {
                header.set_size(content.len() as u64);
                header.set_entry_type(tar::EntryType::Regular);
                builder
                    .append_data(&mut header, path, content.as_bytes())
                    .unwrap();
            }
            Item::Link(path, target) => {
                header.set_size(0);
                header.set_entry_type(tar::EntryType::Symlink);
                builder.append_link(&mut header, path, target).unwrap();
            }
        }
    }
    builder.into_inner().unwrap()
}

/// A busybox root file system as a layer.
fn busybox_layer() -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!("sandbase-image-src-{}", Uuid::new_v4().simple()));
    sandbase_worker::templates::busybox(&dir, 0).unwrap();
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    builder.append_dir_all(".", &dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    builder.into_inner().unwrap()
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// (config, manifest) of an image with these layers.
fn image(layers: &[Vec<u8>]) -> (Vec<u8>, Vec<u8>) {
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": { "type": "layers", "diff_ids": layers.iter().map(|layer| digest(layer)).collect::<Vec<_>>() },
        "config": {}
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(&config), "size": config.len() },
        "layers": layers.iter().map(|layer| json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest(layer), "size": layer.len()
        })).collect::<Vec<_>>(),
    }))
    .unwrap();
    (config, manifest)
}

/// A `docker save` archive of an image with these layers.
fn docker_archive(layers: &[Vec<u8>]) -> Vec<u8> {
    let (config, _) = image(layers);
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: String, bytes: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, path, bytes).unwrap();
    };
    let names: Vec<String> = layers
        .iter()
        .map(|layer| format!("{}/layer.tar", &digest(layer)[7..]))
        .collect();
    let manifest = serde_json::to_vec(
        &json!([{ "Config": "config.json", "RepoTags": ["box:v1"], "Layers": names }]),
    )
    .unwrap();
    add("manifest.json".to_owned(), &manifest);
    add("config.json".to_owned(), &config);
    for (name, layer) in names.iter().zip(layers) {
        add(name.clone(), layer);
    }
    builder.into_inner().unwrap()
}

/// An OCI image layout, as a tar archive.
fn oci_archive(layers: &[Vec<u8>]) -> Vec<u8> {
    let (config, manifest) = image(layers);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "manifests": [{ "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(&manifest), "size": manifest.len() }]
    }))
    .unwrap();
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: String, bytes: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, path, bytes).unwrap();
    };
    add(
        "oci-layout".to_owned(),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    );
    add("index.json".to_owned(), &index);
    for blob in layers.iter().chain([&config, &manifest]) {
        add(format!("blobs/sha256/{}", &digest(blob)[7..]), blob);
    }
    builder.into_inner().unwrap()
}

async fn operator(
    app: &TestApp,
    method: Method,
    path: &str,
    body: Vec<u8>,
    token: &str,
) -> (StatusCode, Vec<Value>) {
    let response = app
        .internal_http
        .request(method, format!("{}{path}", app.internal))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    let lines = text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    (status, lines)
}

fn done(lines: &[Value]) -> bool {
    lines.iter().any(|line| line["done"] == true)
        && !lines.iter().any(|line| line.get("error").is_some())
}

struct Registry {
    child: Child,
    dir: std::path::PathBuf,
    address: String,
}

impl Registry {
    async fn start() -> Registry {
        let dir =
            std::env::temp_dir().join(format!("sandbase-registry-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = format!("127.0.0.1:{port}");
        std::fs::write(
            dir.join("config.yml"),
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {address}\n",
                dir.join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry (scripts/setup --test installs it)");
        let registry = Registry {
            child,
            dir,
            address,
        };
        let http = reqwest::Client::new();
        wait_until("the registry", Duration::from_secs(20), || {
            let url = format!("http://{}/v2/", registry.address);
            let http = http.clone();
            async move {
                http.get(url)
                    .send()
                    .await
                    .is_ok_and(|answer| answer.status() == 200)
            }
        })
        .await;
        registry
    }

    async fn push(&self, repository: &str, tag: &str, layers: &[Vec<u8>]) {
        let http = reqwest::Client::new();
        let (config, manifest) = image(layers);
        for blob in layers.iter().chain([&config]) {
            let started = http
                .post(format!(
                    "http://{}/v2/{repository}/blobs/uploads/",
                    self.address
                ))
                .send()
                .await
                .unwrap();
            assert_eq!(started.status(), StatusCode::ACCEPTED);
            let location = started.headers()["location"].to_str().unwrap().to_owned();
            let location = if location.starts_with("http") {
                location
            } else {
                format!("http://{}{location}", self.address)
            };
            let separator = if location.contains('?') { '&' } else { '?' };
            let put = http
                .put(format!("{location}{separator}digest={}", digest(blob)))
                .header("content-type", "application/octet-stream")
                .body(blob.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(
                put.status(),
                StatusCode::CREATED,
                "{}",
                put.text().await.unwrap()
            );
        }
        let put = http
            .put(format!(
                "http://{}/v2/{repository}/manifests/{tag}",
                self.address
            ))
            .header("content-type", "application/vnd.oci.image.manifest.v1+json")
            .body(manifest)
            .send()
            .await
            .unwrap();
        assert_eq!(
            put.status(),
            StatusCode::CREATED,
            "{}",
            put.text().await.unwrap()
        );
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn wait_for_template(app: &TestApp, token: &str, name: &str, present: bool) {
    wait_until("the template list", Duration::from_secs(10), || async {
        let list = app.get("/v1/templates", token).await.body;
        let listed = list["templates"]
            .as_array()
            .unwrap()
            .iter()
            .any(|template| template["name"] == name);
        listed == present
    })
    .await;
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
#[tokio::test(flavor = "multi_thread")]
async fn images_become_templates_by_import_and_pull_and_hostile_ones_are_refused() {
    let app = sandbox_app().await;
    let worker = TestWorker::start(worker_config(&app, "w", 4, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();
    wait_for_template(&app, token, "busybox", true).await;

    let layers = vec![
        busybox_layer(),
        layer(&[
            Item::File("etc/motd", "layer two\n"),
            Item::File("bin/.wh.vi", ""),
        ]),
    ];
    // Import an OCI layout archive.
    let (status, lines) = operator(
        &app,
        Method::PUT,
        "/internal/v1/templates/imported",
        oci_archive(&layers),
        OPERATOR,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(done(&lines), "{lines:?}");
    wait_for_template(&app, token, "imported", true).await;
    let answer = create(&app, token, json!({ "template": "imported" })).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    let id = answer.body["id"].as_str().unwrap().to_owned();
    let result = sh(
        &app,
        token,
        &id,
        "cat /etc/motd; test -e /bin/vi && echo vi-present; id -u",
    )
    .await;
    assert_eq!(result["stdout"], "layer two\n1000\n", "{result}");
    assert_eq!(
        app.delete(&format!("/v1/sandboxes/{id}"), token)
            .await
            .status,
        StatusCode::NO_CONTENT
    );

    // The same image as a `docker save` archive.
    let (_, lines) = operator(
        &app,
        Method::PUT,
        "/internal/v1/templates/saved",
        docker_archive(&layers),
        OPERATOR,
    )
    .await;
    assert!(done(&lines), "{lines:?}");
    wait_for_template(&app, token, "saved", true).await;
    let answer = create(&app, token, json!({ "template": "saved" })).await;
    let id = answer.body["id"].as_str().unwrap().to_owned();
    assert_eq!(
        sh(&app, token, &id, "cat /etc/motd").await["stdout"],
        "layer two\n"
    );
    assert_eq!(
        app.delete(&format!("/v1/sandboxes/{id}"), token)
            .await
            .status,
        StatusCode::NO_CONTENT
    );

    // Pull the same image from a registry.
    let registry = Registry::start().await;
    registry.push("tools/box", "v1", &layers).await;
    let body =
        serde_json::to_vec(&json!({ "reference": format!("{}/tools/box:v1", registry.address) }))
            .unwrap();
    let (status, lines) = operator(
        &app,
        Method::POST,
        "/internal/v1/templates/pulled/pull",
        body.clone(),
        OPERATOR,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(done(&lines), "{lines:?}");
    assert!(
        lines.iter().any(|line| line["progress"]
            .as_str()
            .is_some_and(|text| text.contains("verified"))),
        "{lines:?}"
    );
    wait_for_template(&app, token, "pulled", true).await;
    let answer = create(&app, token, json!({ "template": "pulled" })).await;
    let id = answer.body["id"].as_str().unwrap().to_owned();
    assert_eq!(
        sh(&app, token, &id, "cat /etc/motd").await["stdout"],
        "layer two\n"
    );
    assert_eq!(
        app.delete(&format!("/v1/sandboxes/{id}"), token)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    // Pulling into an existing name, or a missing image, fails and says so.
    let (_, lines) = operator(
        &app,
        Method::POST,
        "/internal/v1/templates/pulled/pull",
        body,
        OPERATOR,
    )
    .await;
    assert!(
        lines
            .iter()
            .any(|line| line["error"]["code"] == "template_exists"),
        "{lines:?}"
    );
    let missing =
        serde_json::to_vec(&json!({ "reference": format!("{}/tools/none:v1", registry.address) }))
            .unwrap();
    let (_, lines) = operator(
        &app,
        Method::POST,
        "/internal/v1/templates/none/pull",
        missing,
        OPERATOR,
    )
    .await;
    assert!(
        lines
            .iter()
            .any(|line| line["error"]["code"] == "pull_failed"),
        "{lines:?}"
    );

    // A hostile image: a link to a host directory, then a whiteout and a file through it.
    let host = std::env::temp_dir().join(format!("sandbase-host-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("victim"), "keep me").unwrap();
    let hostile = vec![
        busybox_layer(),
        layer(&[Item::Link("escape", host.to_str().unwrap())]),
        layer(&[
            Item::File("escape/.wh.victim", ""),
            Item::File("escape/planted", "x"),
        ]),
    ];
    let (_, lines) = operator(
        &app,
        Method::PUT,
        "/internal/v1/templates/hostile",
        oci_archive(&hostile),
        OPERATOR,
    )
    .await;
    assert!(!done(&lines), "{lines:?}");
    assert_eq!(
        std::fs::read_to_string(host.join("victim")).unwrap(),
        "keep me"
    );
    assert!(!host.join("planted").exists());
    let hostile = vec![
        busybox_layer(),
        layer(&[Item::File("escape/x", ""), Item::Link("etc", "/etc")]),
    ];
    let (_, lines) = operator(
        &app,
        Method::PUT,
        "/internal/v1/templates/hostile",
        oci_archive(&hostile),
        OPERATOR,
    )
    .await;
    assert!(!done(&lines), "{lines:?}");
    std::fs::remove_dir_all(&host).unwrap();
    // Not an image at all.
    let (_, lines) = operator(
        &app,
        Method::PUT,
        "/internal/v1/templates/garbage",
        b"not a tar".to_vec(),
        OPERATOR,
    )
    .await;
    assert!(!done(&lines), "{lines:?}");

    // Only the operator: a team's API key or no token is refused; names are checked.
    let (status, _) = operator(
        &app,
        Method::PUT,
        "/internal/v1/templates/x",
        Vec::new(),
        token,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A worker's node token is not the operator's.
    let (status, _) = operator(
        &app,
        Method::PUT,
        "/internal/v1/templates/x",
        Vec::new(),
        crate::testbed::NODE_TOKEN,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // The internal plane is not on the public listener.
    let public = app
        .http
        .put(format!("{}/internal/v1/templates/x", app.address))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap();
    assert_eq!(public.status(), StatusCode::NOT_FOUND);
    let (status, _) = operator(
        &app,
        Method::PUT,
        "/internal/v1/templates/Bad..Name",
        Vec::new(),
        OPERATOR,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // Removal.
    for name in ["imported", "saved", "pulled"] {
        let (status, lines) = operator(
            &app,
            Method::DELETE,
            &format!("/internal/v1/templates/{name}"),
            Vec::new(),
            OPERATOR,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert!(done(&lines), "{lines:?}");
        wait_for_template(&app, token, name, false).await;
    }
    app.post("/v1/sandboxes", token, json!({ "template": "pulled" }))
        .await
        .assert_error(422, "template_not_found");
    worker.clean_up().await;
}
