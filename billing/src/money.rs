//! Amounts of credits as integers.

use serde::{Deserialize, Serialize};

/// Micro-credits in one credit.
pub const MICRO_PER_CREDIT: i64 = 1_000_000;

/// An amount in micro-credits.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Credits(pub i64);

impl Credits {
    /// Whole credits, refusing amounts that do not fit.
    pub fn from_credits(credits: i64) -> Option<Credits> {
        credits.checked_mul(MICRO_PER_CREDIT).map(Credits)
    }

    /// Parses a decimal amount of credits (`12`, `0.5`, `3.000001`), exactly.
    pub fn parse(text: &str) -> Option<Credits> {
        let text = text.trim();
        let (negative, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
        if whole.is_empty() && fraction.is_empty()
            || fraction.len() > 6
            || !whole.chars().all(|c| c.is_ascii_digit())
            || !fraction.chars().all(|c| c.is_ascii_digit())
        {
            return None;
        }
        let whole: i64 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        let fraction: i64 = format!("{fraction:0<6}").parse().ok()?;
        let micro = whole.checked_mul(MICRO_PER_CREDIT)?.checked_add(fraction)?;
        Some(Credits(if negative { -micro } else { micro }))
    }
}

impl std::fmt::Display for Credits {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let magnitude = self.0.unsigned_abs();
        let whole = magnitude / MICRO_PER_CREDIT as u64;
        let fraction = magnitude % MICRO_PER_CREDIT as u64;
        if fraction == 0 {
            write!(formatter, "{sign}{whole}")
        } else {
            let digits = format!("{fraction:06}");
            write!(formatter, "{sign}{whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_parse_and_print_exactly() {
        for (text, micro) in [
            ("12", 12_000_000),
            ("0.5", 500_000),
            ("3.000001", 3_000_001),
            (".25", 250_000),
            ("-1.5", -1_500_000),
        ] {
            assert_eq!(Credits::parse(text), Some(Credits(micro)), "{text}");
        }
        for bad in ["", ".", "1.0000001", "1e3", "abc", "1.2.3", "--1"] {
            assert_eq!(Credits::parse(bad), None, "{bad}");
        }
        assert_eq!(Credits(12_000_000).to_string(), "12");
        assert_eq!(Credits(3_000_001).to_string(), "3.000001");
        assert_eq!(Credits(-1_500_000).to_string(), "-1.5");
        assert_eq!(Credits::from_credits(i64::MAX), None);
    }
}
