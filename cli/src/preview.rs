//! `sandbase sandbox preview`: a port of a sandbox at its own URL.

use sandbase_api::previews::{CreatedPreview, NewPreview};
use uuid::Uuid;

use crate::client::Client;
use crate::output::{emit, time};

/// Opens `port` of sandbox `id`; prints the URL to open in a browser (the signed one unless
/// the preview is public) and, on stderr, the plain URL and its token for programs.
pub async fn open(
    client: &Client,
    json: bool,
    id: Uuid,
    port: u16,
    public: bool,
    ttl: Option<u64>,
) -> anyhow::Result<()> {
    let request = NewPreview {
        port,
        public,
        signed_url_ttl_secs: ttl,
    };
    let created: CreatedPreview = client
        .post(&format!("/v1/sandboxes/{id}/previews"), &request)
        .await?;
    emit(json, &created, |created| {
        if created.preview.public {
            println!("{}", created.preview.url);
            eprintln!("public: anyone with the URL reaches port {port}");
        } else {
            println!("{}", created.signed_url);
            eprintln!(
                "the link above works in a browser until {}; programs use {} with header x-sandbase-preview-token: {}",
                time(&created.signed_url_expires_at),
                created.preview.url,
                created.token
            );
        }
    })
}
