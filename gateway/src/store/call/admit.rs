//! Admission: the request read, the model found (of the endpoint's family, or — for chat
//! completions and messages — of the other family, answered through translation), its worst
//! case reserved against the caller's credits and caps, and the upstream request made.

use serde_json::Value;

use super::{Endpoint, ModelCall};
use crate::config::TokenPrices;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::meter::{self, Call};
use crate::store::translate::{Direction, Translated};
use crate::store::usage::Shape;
use crate::store::{Caller, Model, Provider};

/// An admitted call and what to send upstream.
pub(super) struct Admitted {
    pub call: Call,
    pub upstream: reqwest::RequestBuilder,
    pub prices: TokenPrices,
    pub stream: bool,
    /// The gateway asked for a stream's usage: hide that chunk from the client.
    pub hide_usage: bool,
    /// How the upstream's answer reads (the endpoint's, or the other family's when
    /// translated).
    pub shape: Shape,
    /// The call is answered by a model of the other family.
    pub translated: Option<Translated>,
}

/// The request as JSON and the model it names.
pub(super) fn parse(body: &[u8]) -> Result<(Value, String), ApiError> {
    let json: Value = serde_json::from_slice(body)
        .map_err(|error| ApiError::InvalidJson(format!("the request body: {error}")))?;
    if !json.is_object() {
        return Err(ApiError::InvalidJson(
            "the request body must be a JSON object".to_owned(),
        ));
    }
    let model = json
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::InvalidRequest("`model` is required".to_owned()))?
        .to_owned();
    Ok((json, model))
}

pub(super) async fn admit(
    state: &AppState,
    caller: &Caller,
    request: &ModelCall,
) -> Result<Admitted, ApiError> {
    let endpoint = request.endpoint;
    let (mut json, model_id) = parse(&request.body)?;
    let (model, provider, translated) = find_model(state, endpoint, &json, &model_id)?;
    let stream = json.get("stream").and_then(Value::as_bool) == Some(true);
    let max_output = if endpoint.max_output().is_empty() {
        Some(0)
    } else {
        endpoint
            .max_output()
            .iter()
            .find_map(|field| json.get(*field).and_then(Value::as_u64))
    };
    let vetted = super::vet::vet(endpoint, &json, &request.headers)?;
    // Tokens the body does not show (images, files, a stored conversation): the whole window.
    let input_bound = if vetted.full_window {
        usize::MAX
    } else {
        request.body.len()
    };
    let worst = meter::worst_case(model, input_bound, max_output, vetted.choices);
    // Translated before anything is reserved: a request with no counterpart is refused free.
    let sent = match &translated {
        Some(translated) => Some(translated.request(&json, model)?),
        None => None,
    };
    let asked = meter::Asked {
        kind: meter::Kind::Model,
        name: &model.settings.id,
        listed_as: model.settings.id.clone(),
        endpoint: endpoint.path().to_owned(),
        streamed: stream,
        hold_for: std::time::Duration::from_secs(provider.settings.timeout_secs),
        sandbox: caller.sandbox,
    };
    let call = meter::admit(state, &caller.principal, asked, worst).await?;
    if let (Some(translated), Some(sent)) = (translated, sent) {
        let (upstream_endpoint, shape) = match translated.direction {
            Direction::ChatToMessages => (Endpoint::Messages, Shape::Anthropic),
            Direction::MessagesToChat => (Endpoint::Chat, Shape::OpenaiChat),
        };
        let family = translated.direction.upstream_family();
        let upstream = provider.post(
            upstream_endpoint.path(),
            sent.to_string().into_bytes(),
            &request.headers.for_family(family),
        );
        return Ok(Admitted {
            call,
            upstream,
            prices: model.prices,
            stream,
            hide_usage: false,
            shape,
            translated: Some(translated),
        });
    }
    json["model"] = Value::String(model.settings.upstream.clone());
    let hide_usage = stream && endpoint == Endpoint::Chat && ask_for_usage(&mut json);
    let upstream = provider.post(
        endpoint.path(),
        json.to_string().into_bytes(),
        &request.headers.for_family(endpoint.family()),
    );
    Ok(Admitted {
        call,
        upstream,
        prices: model.prices,
        stream,
        hide_usage,
        shape: endpoint.shape(),
        translated: None,
    })
}

/// The model a call names: of the endpoint's family, or — for chat completions and
/// messages — of the other family, answered through translation.
fn find_model<'a>(
    state: &'a AppState,
    endpoint: Endpoint,
    json: &Value,
    model_id: &str,
) -> Result<(&'a Model, &'a Provider, Option<Translated>), ApiError> {
    if let Some((model, provider)) = state.store.model(endpoint.family().name(), model_id) {
        return Ok((model, provider, None));
    }
    let direction = match endpoint {
        Endpoint::Chat => Some(Direction::ChatToMessages),
        Endpoint::Messages => Some(Direction::MessagesToChat),
        Endpoint::Responses | Endpoint::Embeddings => None,
    };
    if let Some(direction) = direction
        && let Some((model, provider)) = state
            .store
            .model(direction.upstream_family().name(), model_id)
    {
        let include_usage = json
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        let translated = Translated {
            model: model.settings.id.clone(),
            direction,
            include_usage,
        };
        return Ok((model, provider, Some(translated)));
    }
    Err(ApiError::ModelNotFound(model_id.to_owned()))
}

/// Asks a chat stream for its usage when the client did not; whether it had to (the usage
/// chunk is then held back from the client).
fn ask_for_usage(json: &mut Value) -> bool {
    let asked = json
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool);
    if asked == Some(true) {
        return false;
    }
    match json
        .get_mut("stream_options")
        .and_then(Value::as_object_mut)
    {
        Some(options) => {
            options.insert("include_usage".to_owned(), Value::Bool(true));
        }
        None => json["stream_options"] = serde_json::json!({ "include_usage": true }),
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_stream_is_asked_for_its_usage_once() {
        let mut json = serde_json::json!({ "stream": true });
        assert!(ask_for_usage(&mut json));
        assert_eq!(json["stream_options"]["include_usage"], true);
        assert!(!ask_for_usage(&mut json));
        let mut with_options = serde_json::json!({ "stream_options": { "other": 1 } });
        assert!(ask_for_usage(&mut with_options));
        assert_eq!(with_options["stream_options"]["other"], 1);
    }

    #[test]
    fn only_json_objects_naming_a_model_are_calls() {
        assert!(matches!(parse(b"[]"), Err(ApiError::InvalidJson(_))));
        assert!(matches!(parse(b"{"), Err(ApiError::InvalidJson(_))));
        assert!(matches!(parse(b"{}"), Err(ApiError::InvalidRequest(_))));
        assert_eq!(
            parse(br#"{"model":"m"}"#).ok().map(|(_, model)| model),
            Some("m".to_owned())
        );
    }
}
