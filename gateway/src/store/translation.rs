//! A model call answered by a model of the other family: which way it is translated, the
//! request the provider takes, its answer and errors in the caller's family's shape, and the
//! translation of a stream as it comes.

use bytes::Bytes;
use serde_json::Value;

use crate::error::ApiError;

/// A call answered by a model of the other family: its public id, which way it is
/// translated, and whether the client asked a chat stream for its usage.
#[derive(Clone)]
pub struct Translated {
    pub model: String,
    pub to_messages: bool,
    pub include_usage: bool,
}

impl Translated {
    /// The request the other family's provider takes.
    pub fn request(&self, json: &Value, model: &super::Model) -> Result<Value, ApiError> {
        let upstream = &model.settings.upstream;
        if self.to_messages {
            super::translate::chat_to_messages(json, upstream, model.settings.max_output)
        } else {
            super::messages_to_chat::messages_to_chat(json, upstream)
        }
        .map_err(ApiError::InvalidRequest)
    }

    /// An error body of the provider, in the caller's family's shape.
    pub fn error(&self, status: u16, body: &[u8]) -> Bytes {
        Bytes::from(if self.to_messages {
            super::translate::error_to_chat(body)
        } else {
            super::messages_to_chat::error_to_message(status, body)
        })
    }

    /// A whole answer, in the caller's family's shape.
    pub fn answer(&self, body: &Value) -> Bytes {
        Bytes::from(
            if self.to_messages {
                super::translate::message_to_chat(body, &self.model)
            } else {
                super::messages_to_chat::chat_to_message(body, &self.model)
            }
            .to_string(),
        )
    }

    pub fn stream(&self) -> Translator {
        if self.to_messages {
            Translator::ToChat(super::translate_stream::ChatStream::new(
                &self.model,
                self.include_usage,
            ))
        } else {
            Translator::ToMessages(super::messages_stream::MessagesStream::new(&self.model))
        }
    }
}

/// A stream's translation, either way.
pub enum Translator {
    ToChat(super::translate_stream::ChatStream),
    ToMessages(super::messages_stream::MessagesStream),
}

impl Translator {
    pub fn feed(&mut self, bytes: &[u8]) -> Bytes {
        match self {
            Translator::ToChat(stream) => stream.feed(bytes),
            Translator::ToMessages(stream) => stream.feed(bytes),
        }
    }

    pub fn finish(&mut self) -> Bytes {
        match self {
            Translator::ToChat(stream) => stream.finish(),
            Translator::ToMessages(stream) => stream.finish(),
        }
    }
}
