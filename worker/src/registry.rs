//! Pulling images from an OCI registry (distribution API v2): the manifest (an index picks
//! linux/amd64), then each layer, verified against its digest, into a directory laid out
//! like an OCI image layout, which `images` then unpacks. Anonymous bearer tokens are
//! fetched when the registry asks for them. Plain HTTP only for loopback hosts and hosts
//! listed as insecure.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use futures_util::StreamExt;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// `registry/repository[:tag|@digest]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub registry: String,
    pub repository: String,
    pub reference: String,
}

impl Reference {
    pub fn parse(text: &str) -> anyhow::Result<Reference> {
        let (registry, rest) = text
            .split_once('/')
            .filter(|(host, _)| host.contains('.') || host.contains(':') || *host == "localhost")
            .with_context(|| {
                format!("`{text}` needs a registry host, e.g. registry.example.com/name:tag")
            })?;
        let (repository, reference) = if let Some((repository, digest)) = rest.split_once('@') {
            (repository, digest.to_owned())
        } else {
            match rest.rsplit_once(':') {
                Some((repository, tag)) if !tag.contains('/') => (repository, tag.to_owned()),
                _ => (rest, "latest".to_owned()),
            }
        };
        let valid = |part: &str| {
            !part.is_empty()
                && part.chars().all(|c| {
                    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | ':' | '@')
                })
        };
        anyhow::ensure!(
            valid(repository) && valid(&reference) && !repository.contains(".."),
            "`{text}` is not an image reference"
        );
        Ok(Reference {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            reference,
        })
    }
}

/// A progress report of a pull: a JSON object (`{"layer","layers","bytes","total"}`, or
/// `{"progress": text}`).
pub type Progress<'a> = &'a mut (dyn FnMut(Value) + Send);

pub struct Puller {
    http: reqwest::Client,
    insecure: Vec<String>,
}

impl Puller {
    pub fn new(insecure: Vec<String>) -> anyhow::Result<Puller> {
        Ok(Puller {
            http: reqwest::Client::builder()
                .connect_timeout(std::time::Duration::from_secs(10))
                .build()?,
            insecure,
        })
    }

    fn base(&self, reference: &Reference) -> String {
        let host = reference.registry.split(':').next().unwrap_or_default();
        let plain = matches!(host, "localhost" | "127.0.0.1" | "[::1]")
            || self.insecure.contains(&reference.registry);
        let scheme = if plain { "http" } else { "https" };
        format!(
            "{scheme}://{}/v2/{}",
            reference.registry, reference.repository
        )
    }

    /// GET with the registry's anonymous token dance when it asks for one.
    async fn get(
        &self,
        url: &str,
        accept: Option<&str>,
        token: &mut Option<String>,
    ) -> anyhow::Result<reqwest::Response> {
        for _ in 0..2 {
            let mut request = self.http.get(url);
            if let Some(accept) = accept {
                request = request.header("accept", accept);
            }
            if let Some(token) = token.as_ref() {
                request = request.bearer_auth(token);
            }
            let answer = request
                .send()
                .await
                .with_context(|| format!("requesting {url}"))?;
            if answer.status() == reqwest::StatusCode::UNAUTHORIZED && token.is_none() {
                let challenge = answer
                    .headers()
                    .get("www-authenticate")
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                *token = Some(self.anonymous_token(&challenge).await?);
                continue;
            }
            anyhow::ensure!(
                answer.status().is_success(),
                "{url}: HTTP {}",
                answer.status()
            );
            return Ok(answer);
        }
        bail!("{url}: the registry refused the token")
    }

    async fn anonymous_token(&self, challenge: &str) -> anyhow::Result<String> {
        let parameters = challenge
            .strip_prefix("Bearer ")
            .context("the registry wants credentials SandBase does not have")?;
        let mut realm = None;
        let mut query = Vec::new();
        for part in parameters.split(',') {
            if let Some((key, value)) = part.trim().split_once('=') {
                let value = value.trim_matches('"').to_owned();
                if key == "realm" {
                    realm = Some(value);
                } else {
                    query.push((key.to_owned(), value));
                }
            }
        }
        let realm = realm.context("a bearer challenge without a realm")?;
        let answer: Value = self
            .http
            .get(&realm)
            .query(&query)
            .send()
            .await?
            .json()
            .await?;
        answer["token"]
            .as_str()
            .or_else(|| answer["access_token"].as_str())
            .map(str::to_owned)
            .context("the token service answered without a token")
    }

    /// Downloads the image into `layout` (an OCI image layout directory) and returns its
    /// layer files, bottom first.
    pub async fn pull(
        &self,
        reference: &Reference,
        layout: &Path,
        progress: Progress<'_>,
    ) -> anyhow::Result<Vec<PathBuf>> {
        let base = self.base(reference);
        let mut token = None;
        let mut manifest: Value = self
            .get(
                &format!("{base}/manifests/{}", reference.reference),
                Some(MANIFEST_TYPES),
                &mut token,
            )
            .await?
            .json()
            .await?;
        if let Some(list) = manifest["manifests"].as_array() {
            let chosen = list
                .iter()
                .find(|entry| {
                    entry["platform"]["os"] == "linux"
                        && entry["platform"]["architecture"] == "amd64"
                })
                .or_else(|| list.first())
                .context("an empty image index")?;
            let digest = chosen["digest"]
                .as_str()
                .context("an index entry without a digest")?;
            manifest = self
                .get(
                    &format!("{base}/manifests/{digest}"),
                    Some(MANIFEST_TYPES),
                    &mut token,
                )
                .await?
                .json()
                .await?;
        }
        let layers = manifest["layers"]
            .as_array()
            .context("the manifest has no layers")?
            .clone();
        let blobs = layout.join("blobs").join("sha256");
        tokio::fs::create_dir_all(&blobs).await?;
        let mut paths = Vec::new();
        for (index, layer) in layers.iter().enumerate() {
            let digest = layer["digest"]
                .as_str()
                .context("a layer without a digest")?;
            let hex = digest
                .strip_prefix("sha256:")
                .context("only sha256 digests are supported")?;
            anyhow::ensure!(
                hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()),
                "malformed digest {digest}"
            );
            let size = layer["size"].as_u64().unwrap_or(0);
            let path = blobs.join(hex);
            let answer = self
                .get(&format!("{base}/blobs/{digest}"), None, &mut token)
                .await?;
            let mut file = tokio::fs::File::create(&path).await?;
            let mut hasher = Sha256::new();
            let mut received = 0u64;
            let mut last_report = 0u64;
            let mut body = answer.bytes_stream();
            while let Some(chunk) = body.next().await {
                let chunk = chunk.context("downloading a layer")?;
                hasher.update(&chunk);
                file.write_all(&chunk).await?;
                received += chunk.len() as u64;
                if received - last_report >= 1024 * 1024 || received == size {
                    last_report = received;
                    progress(serde_json::json!({
                        "layer": index + 1, "layers": layers.len(), "bytes": received, "total": size,
                    }));
                }
            }
            file.sync_all().await?;
            let actual = hex::encode(hasher.finalize());
            anyhow::ensure!(
                actual == hex,
                "layer {digest} arrived with digest sha256:{actual}"
            );
            progress(serde_json::json!({
                "progress": format!("layer {}/{}: {received} bytes, digest verified", index + 1, layers.len()),
            }));
            paths.push(path);
        }
        Ok(paths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse() {
        let parsed = Reference::parse("localhost:5000/tools/python:3.12").unwrap();
        assert_eq!(
            (
                parsed.registry.as_str(),
                parsed.repository.as_str(),
                parsed.reference.as_str()
            ),
            ("localhost:5000", "tools/python", "3.12")
        );
        assert_eq!(
            Reference::parse("registry.example.com/app")
                .unwrap()
                .reference,
            "latest"
        );
        let pinned = Reference::parse("r.example.com/app@sha256:abc").unwrap();
        assert_eq!(pinned.reference, "sha256:abc");
        assert!(Reference::parse("python:3.12").is_err());
        assert!(Reference::parse("r.example.com/../etc").is_err());
    }
}
