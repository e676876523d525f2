//! Logging and tracing: `tracing` to stderr (text or JSON) and, when an OTLP endpoint is
//! configured, spans exported over OTLP/HTTP.

use anyhow::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use sandbase_gateway::config::{LogFormat, TelemetrySettings};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Flushes and stops trace export when dropped.
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(error) = provider.shutdown()
        {
            eprintln!("warning: flushing traces failed: {error}");
        }
    }
}

/// Sets up the global subscriber. Call before the async runtime starts: the OTLP
/// exporter's blocking HTTP client must not be created or dropped on a runtime thread.
pub fn init(settings: &TelemetrySettings) -> anyhow::Result<TelemetryGuard> {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&settings.log_level))
        .with_context(|| {
            format!(
                "key `telemetry.log_level` is not a valid filter: {}",
                settings.log_level
            )
        })?;
    let fmt_layer = match settings.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let (otel_layer, provider) = match &settings.otlp_endpoint {
        Some(endpoint) => {
            let endpoint = endpoint.trim_end_matches('/');
            let traces_endpoint = if endpoint.ends_with("/v1/traces") {
                endpoint.to_owned()
            } else {
                format!("{endpoint}/v1/traces")
            };
            let exporter = SpanExporter::builder()
                .with_http()
                .with_endpoint(traces_endpoint)
                .build()
                .context("building the OTLP span exporter (telemetry.otlp_endpoint)")?;
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    Resource::builder()
                        .with_service_name(settings.service_name.clone())
                        .build(),
                )
                .build();
            let tracer = provider.tracer("sandbase");
            (
                Some(tracing_opentelemetry::layer().with_tracer(tracer)),
                Some(provider),
            )
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt_layer)
        .with(otel_layer)
        .try_init()
        .context("installing the tracing subscriber")?;
    Ok(TelemetryGuard { provider })
}

/// Client verbs log only warnings, to stderr.
pub fn init_client() {
    init_with_level("warn");
}

/// The egress proxy's log: plain lines on standard error, level first, for the worker that
/// runs it to read and log as its own (with its time, format and export).
pub fn init_proxy() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .without_time()
        .with_writer(std::io::stderr)
        .try_init();
}

/// Logs to standard error at `level` unless `RUST_LOG` says otherwise.
pub fn init_with_level(level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
