//! A piece of something that streams — a model's answer, a command's output — as the
//! harness passes it on: what it adds to, and its text.

/// What a piece of a streamed answer adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaKind {
    Text,
    Thinking,
    /// A tool call's arguments (JSON text, in pieces).
    Arguments,
}

impl DeltaKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeltaKind::Text => "text",
            DeltaKind::Thinking => "thinking",
            DeltaKind::Arguments => "arguments",
        }
    }
}

/// A piece of a streamed answer: what it adds to the part numbered `part` of the answer's
/// message (as `model.completed` gives it). A tool call's first piece names the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    pub part: usize,
    pub kind: DeltaKind,
    pub text: String,
    /// The call's id and tool, on its first piece.
    pub call: Option<(String, String)>,
}
