//! Pieces of a stream gathered into journal rows: at most one row per part every
//! [`EVERY`], each at most [`MOST`] bytes — a model streaming a token every few
//! milliseconds writes ten rows a second, not hundreds, and a reader following the journal
//! sees the same rows live and replayed.

use std::time::{Duration, Instant};

use crate::delta::Delta;

/// A part's rows are this far apart at least (but for a full one).
pub const EVERY: Duration = Duration::from_millis(100);
/// A row holds this many bytes at most.
pub const MOST: usize = 4096;

/// What is held back, and when each part last had a row.
#[derive(Debug, Default)]
pub struct Coalescer {
    pending: Option<Delta>,
    /// The part the last row was of, and when it was written.
    last_row: Option<(usize, Instant)>,
}

impl Coalescer {
    /// The rows to write now that `delta` came at `now`. A piece of another part first
    /// writes what was held of the part before (providers stream parts one after another).
    pub fn push(&mut self, delta: Delta, now: Instant) -> Vec<Delta> {
        let mut rows = Vec::new();
        match &mut self.pending {
            Some(pending) if pending.part == delta.part && pending.kind == delta.kind => {
                pending.text.push_str(&delta.text);
            }
            _ => {
                rows.extend(self.pending.take());
                self.pending = Some(delta);
            }
        }
        rows.extend(self.full());
        if let Some(pending) = self.pending.take() {
            let quiet = self.last_row.is_none_or(|(part, last)| {
                part != pending.part || now.duration_since(last) >= EVERY
            });
            if quiet {
                rows.push(pending);
            } else {
                self.pending = Some(pending);
            }
        }
        if let Some(row) = rows.last() {
            self.last_row = Some((row.part, now));
        }
        rows
    }

    /// When what is held back is due, if anything is.
    pub fn due(&self) -> Option<Instant> {
        let pending = self.pending.as_ref()?;
        Some(match self.last_row {
            Some((part, last)) if part == pending.part => last + EVERY,
            _ => Instant::now(),
        })
    }

    /// What is held back, to write now (it is due, or the stream ended).
    pub fn flush(&mut self, now: Instant) -> Vec<Delta> {
        let rows: Vec<Delta> = self.pending.take().into_iter().collect();
        if let Some(row) = rows.last() {
            self.last_row = Some((row.part, now));
        }
        rows
    }

    /// Full rows cut from the front of what is held (at a character's boundary).
    fn full(&mut self) -> Vec<Delta> {
        let mut rows = Vec::new();
        while let Some(pending) = self.pending.as_mut().filter(|p| p.text.len() >= MOST) {
            let mut cut = MOST;
            while !pending.text.is_char_boundary(cut) {
                cut -= 1;
            }
            let rest = pending.text.split_off(cut);
            let row = Delta {
                text: std::mem::replace(&mut pending.text, rest),
                call: pending.call.take(),
                ..pending.clone()
            };
            rows.push(row);
            if pending.text.is_empty() {
                self.pending = None;
            }
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::DeltaKind;

    fn piece(part: usize, text: &str) -> Delta {
        Delta {
            part,
            kind: DeltaKind::Text,
            text: text.into(),
            call: None,
        }
    }

    #[test]
    fn a_fast_stream_is_written_ten_rows_a_second_and_nothing_is_lost() {
        let start = Instant::now();
        let mut coalescer = Coalescer::default();
        let mut rows = Vec::new();
        // 200 tokens, 5 ms apart: a second of streaming.
        for number in 0..200u64 {
            let now = start + Duration::from_millis(5 * number);
            if coalescer.due().is_some_and(|due| due <= now) {
                rows.extend(coalescer.flush(now));
            }
            rows.extend(coalescer.push(piece(0, "word "), now));
        }
        rows.extend(coalescer.flush(start + Duration::from_secs(1)));
        let text: String = rows.iter().map(|row| row.text.as_str()).collect();
        assert_eq!(text, "word ".repeat(200));
        assert!((10..=12).contains(&rows.len()), "{} rows", rows.len());
    }

    #[test]
    fn the_first_piece_goes_at_once_a_full_row_at_once_and_parts_keep_their_order() {
        let now = Instant::now();
        let mut coalescer = Coalescer::default();
        assert_eq!(coalescer.push(piece(0, "a"), now).len(), 1);
        assert!(coalescer.push(piece(0, "b"), now).is_empty());
        assert_eq!(coalescer.due(), Some(now + EVERY));
        let big = "é".repeat(3000);
        let rows = coalescer.push(piece(0, &big), now);
        assert_eq!(rows.len(), 1);
        assert!(rows[0].text.len() <= MOST && rows[0].text.starts_with('b'));
        let rows = coalescer.push(piece(1, "c"), now);
        let parts: Vec<usize> = rows.iter().map(|row| row.part).collect();
        assert_eq!(parts, [0, 1]);
        assert!(coalescer.flush(now).is_empty());
    }
}
