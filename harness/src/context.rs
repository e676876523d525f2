//! Keeping a conversation within the model's context window: when its estimated size nears
//! the window, the oldest tool outputs are replaced by a line saying they were left out
//! (the journal keeps them whole; only what is sent is shortened), newest kept longest.

use sandbase_api::conversation::{Message, Part};

/// Bytes per token assumed for the estimate (a conservative average for code and English).
const BYTES_PER_TOKEN: u64 = 4;

/// The conversation's estimated size in tokens.
pub fn estimate(system: &str, conversation: &[Message]) -> u64 {
    let bytes: usize = conversation
        .iter()
        .flat_map(|message| &message.content)
        .map(|part| match part {
            Part::Text { text } => text.len(),
            Part::Thinking { thinking, .. } => thinking.len(),
            Part::ToolCall(call) => call.name.len() + call.arguments.to_string().len(),
            Part::ToolResult(result) => result.content.len(),
            Part::Image { .. } => 4 * 1024,
        })
        .sum();
    (bytes + system.len()) as u64 / BYTES_PER_TOKEN
}

/// The conversation to send within `context_window` tokens, leaving room for `max_output`
/// and a tenth for the estimate's error, and the ids of the calls whose outputs were left
/// out (oldest first; the last message's never).
pub fn fit(
    system: &str,
    conversation: &[Message],
    context_window: u64,
    max_output: u64,
) -> (Vec<Message>, Vec<String>) {
    let budget = (context_window * 9 / 10).saturating_sub(max_output);
    let mut sent = conversation.to_vec();
    let mut elided = Vec::new();
    let mut size = estimate(system, &sent);
    let last = sent.len().saturating_sub(1);
    for message in sent.iter_mut().take(last) {
        for part in &mut message.content {
            if size <= budget {
                return (sent, elided);
            }
            if let Part::ToolResult(result) = part {
                let note = format!(
                    "[this output ({} bytes) was left out to fit the model's context]",
                    result.content.len()
                );
                size = size.saturating_sub(
                    (result.content.len().saturating_sub(note.len()) as u64) / BYTES_PER_TOKEN,
                );
                result.content = note;
                elided.push(result.call_id.clone());
            }
        }
    }
    (sent, elided)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbase_api::conversation::{Role, ToolResult};

    fn result(id: &str, bytes: usize) -> Message {
        Message {
            role: Role::User,
            content: vec![Part::ToolResult(ToolResult {
                call_id: id.to_owned(),
                content: "x".repeat(bytes),
                is_error: false,
            })],
        }
    }

    #[test]
    fn the_oldest_outputs_go_first_and_a_small_conversation_is_untouched() {
        let conversation = vec![result("a", 8000), result("b", 8000), result("c", 8000)];
        let (same, none) = fit("", &conversation, 100_000, 1000);
        assert!(none.is_empty() && same == conversation);
        let (sent, elided) = fit("", &conversation, 3000, 100);
        assert_eq!(elided, ["a", "b"]);
        let Part::ToolResult(kept) = &sent[2].content[0] else {
            panic!()
        };
        assert_eq!(kept.content.len(), 8000);
        assert!(estimate("", &sent) <= 3000);
    }
}
