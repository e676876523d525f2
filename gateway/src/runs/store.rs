//! Where artifacts (and the inputs of queued runs) are kept.

use std::sync::Arc;

use anyhow::Context;
use futures_util::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use uuid::Uuid;

/// Where artifacts (and the inputs of queued runs) are kept: a local directory, or an
/// S3-compatible bucket when `runs.s3` is configured (every gateway then sees every run's
/// inputs and artifacts).
pub struct ArtifactStore {
    store: Arc<dyn ObjectStore>,
}

impl ArtifactStore {
    pub fn from_settings(settings: &crate::config::RunSettings) -> anyhow::Result<ArtifactStore> {
        let store: Arc<dyn ObjectStore> = match &settings.s3 {
            Some(s3) => {
                use secrecy::ExposeSecret;
                let mut builder = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(&s3.bucket)
                    .with_region(&s3.region)
                    .with_allow_http(s3.allow_http);
                if let Some(endpoint) = &s3.endpoint {
                    builder = builder
                        .with_endpoint(endpoint)
                        .with_virtual_hosted_style_request(false);
                }
                if let (Some(key), Some(secret)) = (&s3.access_key_id, &s3.secret_access_key) {
                    builder = builder
                        .with_access_key_id(key.expose_secret())
                        .with_secret_access_key(secret.expose_secret());
                }
                let bucket = builder.build().context("configuring runs.s3")?;
                Arc::new(object_store::prefix::PrefixStore::new(
                    bucket,
                    s3.prefix.as_str(),
                ))
            }
            None => {
                std::fs::create_dir_all(&settings.artifacts_dir).with_context(|| {
                    format!(
                        "creating runs.artifacts_dir {}",
                        settings.artifacts_dir.display()
                    )
                })?;
                Arc::new(
                    object_store::local::LocalFileSystem::new_with_prefix(&settings.artifacts_dir)
                        .context("opening runs.artifacts_dir")?,
                )
            }
        };
        Ok(ArtifactStore { store })
    }

    pub fn artifact(&self, team: Uuid, run: Uuid) -> StorePath {
        StorePath::from(format!("artifacts/{team}/{run}.tar"))
    }

    pub fn inputs(&self, team: Uuid, run: Uuid) -> StorePath {
        StorePath::from(format!("inputs/{team}/{run}.tar"))
    }

    /// Where part `part` (`work`, `tmp`) of a snapshot is kept.
    pub fn snapshot(&self, team: Uuid, snapshot: Uuid, part: &str) -> StorePath {
        StorePath::from(format!("snapshots/{team}/{snapshot}/{part}.tar"))
    }

    /// Where chunk `chunk` of a terminal recording is kept.
    pub fn recording(&self, team: Uuid, recording: Uuid, chunk: u32) -> StorePath {
        StorePath::from(format!("recordings/{team}/{recording}/{chunk:08}.cast"))
    }

    /// Stores a worker's streamed answer as it arrives (the object appears only once
    /// complete); returns its size.
    pub async fn put_stream(
        &self,
        key: StorePath,
        answer: reqwest::Response,
    ) -> anyhow::Result<u64> {
        use tokio::io::AsyncWriteExt;
        let mut writer = self.writer(key);
        let mut size = 0u64;
        let mut body = answer.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(error) => {
                    let _ = writer.abort().await;
                    return Err(anyhow::Error::new(error).context("reading the archive"));
                }
            };
            size += chunk.len() as u64;
            writer.write_all(&chunk).await?;
        }
        writer.shutdown().await.context("storing the archive")?;
        Ok(size)
    }

    pub async fn put(&self, key: &StorePath, bytes: impl Into<PutPayload>) -> anyhow::Result<()> {
        self.store
            .put(key, bytes.into())
            .await
            .with_context(|| format!("storing {key}"))?;
        Ok(())
    }

    /// A writer that uploads in parts as it goes (multipart on S3).
    pub fn writer(&self, key: StorePath) -> object_store::buffered::BufWriter {
        object_store::buffered::BufWriter::new(Arc::clone(&self.store), key)
    }

    /// The object's size and bytes, or `None` when there is none.
    pub async fn get(
        &self,
        key: &StorePath,
    ) -> anyhow::Result<
        Option<(
            u64,
            futures_util::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>,
        )>,
    > {
        match self.store.get(key).await {
            Ok(result) => Ok(Some((result.meta.size, result.into_stream()))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(anyhow::Error::new(error).context(format!("reading {key}"))),
        }
    }

    pub async fn read(&self, key: &StorePath) -> anyhow::Result<Option<Vec<u8>>> {
        let Some((size, mut stream)) = self.get(key).await? else {
            return Ok(None);
        };
        let mut bytes = Vec::with_capacity(size as usize);
        while let Some(chunk) = stream.next().await {
            bytes.extend_from_slice(&chunk?);
        }
        Ok(Some(bytes))
    }

    pub async fn delete(&self, key: &StorePath) {
        if let Err(error) = self.store.delete(key).await
            && !matches!(error, object_store::Error::NotFound { .. })
        {
            tracing::warn!(%key, error = %error, "removing a stored object failed");
        }
    }
}
