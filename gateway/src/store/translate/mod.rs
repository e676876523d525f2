//! A model call answered by a model of the other family: which way it is translated
//! ([`Direction`]), the request the provider takes, its answer and errors in the caller's
//! family's shape, and the translation of a stream as it comes. Each direction has its
//! request and whole answers in one module (`chat_to_messages`, `messages_to_chat`) and its
//! streams in another (`chat_stream`, `messages_stream`); tool calls cross in both
//! directions through one typed form (`sandbase_api::conversation::ToolCall`).

pub mod chat_stream;
pub mod chat_to_messages;
pub mod messages_stream;
pub mod messages_to_chat;

use bytes::Bytes;
use serde_json::Value;

use super::Family;
use crate::error::ApiError;

/// Which way a call is translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// An OpenAI chat completion answered by an Anthropic model.
    ChatToMessages,
    /// An Anthropic message answered by an OpenAI model.
    MessagesToChat,
}

impl Direction {
    /// The family of the provider that answers.
    pub fn upstream_family(self) -> Family {
        match self {
            Direction::ChatToMessages => Family::Anthropic,
            Direction::MessagesToChat => Family::Openai,
        }
    }
}

/// A call answered by a model of the other family: its public id, which way it is
/// translated, and whether the client asked a chat stream for its usage.
#[derive(Clone)]
pub struct Translated {
    pub model: String,
    pub direction: Direction,
    pub include_usage: bool,
}

impl Translated {
    /// The request the other family's provider takes.
    pub fn request(&self, json: &Value, model: &super::Model) -> Result<Value, ApiError> {
        let upstream = &model.settings.upstream;
        match self.direction {
            Direction::ChatToMessages => {
                chat_to_messages::chat_to_messages(json, upstream, model.settings.max_output)
            }
            Direction::MessagesToChat => messages_to_chat::messages_to_chat(json, upstream),
        }
        .map_err(ApiError::InvalidRequest)
    }

    /// An error body of the provider, in the caller's family's shape.
    pub fn error(&self, status: u16, body: &[u8]) -> Bytes {
        Bytes::from(match self.direction {
            Direction::ChatToMessages => chat_to_messages::error_to_chat(body),
            Direction::MessagesToChat => messages_to_chat::error_to_message(status, body),
        })
    }

    /// A whole answer, in the caller's family's shape.
    pub fn answer(&self, body: &Value) -> Bytes {
        Bytes::from(
            match self.direction {
                Direction::ChatToMessages => chat_to_messages::message_to_chat(body, &self.model),
                Direction::MessagesToChat => messages_to_chat::chat_to_message(body, &self.model),
            }
            .to_string(),
        )
    }

    pub fn stream(&self) -> Translator {
        match self.direction {
            Direction::ChatToMessages => Translator::ToChat(chat_stream::ChatStream::new(
                &self.model,
                self.include_usage,
            )),
            Direction::MessagesToChat => {
                Translator::ToMessages(messages_stream::MessagesStream::new(&self.model))
            }
        }
    }
}

/// A stream's translation, either way.
pub enum Translator {
    ToChat(chat_stream::ChatStream),
    ToMessages(messages_stream::MessagesStream),
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
