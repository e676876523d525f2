//! Paths a client names that SandBase passes on under a base of its own (a paid API's base
//! URL, the store host's routes). Each segment is percent-decoded exactly once and refused
//! when it could climb out of the base or be read differently by the next parser.

/// The decoded segments of a raw (still percent-encoded) path, without its leading `/`.
/// A segment is refused when it is `.` or `..`; when it holds a `\` (a `/` to some
/// parsers) or an encoded `/` (which a careless upstream decodes), a control character (a tab or newline, which URL parsers drop: `.%09.` is
/// `..` to them) or a `%` (an encoding of an encoding: `%252e%252e`); or when it is not
/// UTF-8. Empty segments are kept (`a//b`).
pub fn decoded(raw: &str) -> Result<Vec<String>, String> {
    let raw = raw.strip_prefix('/').unwrap_or(raw);
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    raw.split('/')
        .map(|segment| {
            let decoded = percent_decode(segment)
                .ok_or_else(|| format!("the path segment `{segment}` is not valid UTF-8"))?;
            if decoded == "." || decoded == ".." {
                return Err("the path may not hold `.` or `..` segments".to_owned());
            }
            if let Some(bad) = decoded
                .chars()
                .find(|c| matches!(c, '\\' | '/' | '%') || c.is_control())
            {
                return Err(format!(
                    "the path segment `{segment}` holds {}, which is refused",
                    match bad {
                        '\\' => "a backslash".to_owned(),
                        '/' => "an encoded `/`".to_owned(),
                        '%' => "an encoded `%`".to_owned(),
                        other => format!("the control character U+{:04X}", u32::from(other)),
                    }
                ));
            }
            Ok(decoded)
        })
        .collect()
}

/// `%XX` sequences decoded once (a `%` not followed by two hex digits stays as it is, and
/// is then refused by the caller); `None` when the bytes are not UTF-8.
fn percent_decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = |at: usize| bytes.get(at).and_then(|byte| (*byte as char).to_digit(16));
        match (bytes[index], hex(index + 1), hex(index + 2)) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                index += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::decoded;

    #[test]
    fn plain_paths_decode_once() {
        assert_eq!(decoded("/v1/a%20b/c").unwrap(), vec!["v1", "a b", "c"]);
        assert_eq!(decoded("").unwrap(), Vec::<String>::new());
        assert_eq!(decoded("a//b").unwrap(), vec!["a", "", "b"]);
        assert_eq!(decoded("%C3%A9t%C3%A9").unwrap(), vec!["été"]);
    }

    #[test]
    fn every_way_out_of_the_base_is_refused() {
        for attack in [
            "..",
            "a/../admin",
            "%2e%2e/admin",
            "%2E./admin",
            "%252e%252e/admin",
            "..%5Cadmin",
            "..%5cadmin",
            "a\\..\\admin",
            ".%09./admin",
            "%0a../admin",
            ".",
            "%2e",
            "a%00b",
            "%ff",
            "x%2F..%2Fadmin",
            "100%",
        ] {
            assert!(decoded(attack).is_err(), "{attack} was accepted");
        }
    }
}
