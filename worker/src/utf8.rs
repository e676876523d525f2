//! Text out of chunks of bytes, never splitting a UTF-8 character across chunks (command
//! output streamed as JSON, terminal recordings).

/// Turns chunks of bytes into text without splitting a UTF-8 character across chunks.
#[derive(Default)]
pub struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    /// The text of `bytes` and what was carried, less an incomplete character at the end
    /// (which waits for the next chunk); invalid bytes become U+FFFD.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let complete = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            // An incomplete character at the end waits for the next chunk.
            Err(error) if error.error_len().is_none() => error.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let ready: Vec<u8> = self.pending.drain(..complete).collect();
        String::from_utf8_lossy(&ready).into_owned()
    }

    /// What is still carried, as text.
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&rest).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_are_never_split_across_chunks() {
        let text = "héllo wörld ✓";
        let bytes = text.as_bytes();
        for split in 0..bytes.len() {
            let mut carry = Utf8Carry::default();
            let mut out = carry.push(&bytes[..split]);
            out.push_str(&carry.push(&bytes[split..]));
            out.push_str(&carry.finish());
            assert_eq!(out, text, "split at {split}");
        }
        let mut carry = Utf8Carry::default();
        assert_eq!(carry.push(&[0xff, b'a']), "\u{fffd}a");
    }
}
