//! The response scrub: what an upstream sends back on a connection that carried credentials
//! is searched for their values — literal, percent-encoded, base64 and base64url (at each
//! of the three alignments the value can take inside a longer encoded text) — and each is
//! replaced by the same form of the credential's placeholder, so an endpoint that echoes
//! its input (an error message quoting a header, a stored gist, a redirect reflecting the
//! query, TRACE) hands the sandbox the stand-in, never the secret.

use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use zeroize::Zeroizing;

use crate::credentials::{Credential, encode, placeholder_for};

/// Encoded forms shorter than this are not searched for: too likely to occur by chance.
const SHORTEST_ENCODED_FORM: usize = 8;

/// The values to look for in one connection's responses and what replaces each.
pub struct ScrubRules {
    automaton: AhoCorasick,
    /// The forms searched for (the automaton holds them too): a stream's end that begins
    /// one of them is held until the rest arrives.
    patterns: Vec<Zeroizing<Vec<u8>>>,
    replacements: Vec<Vec<u8>>,
    keeps_length: bool,
}

impl std::fmt::Debug for ScrubRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrubRules")
            .field("patterns", &self.replacements.len())
            .finish_non_exhaustive()
    }
}

impl ScrubRules {
    /// The rules for responses from `host:port`: every credential bound there (the only
    /// values this connection can have sent). `None` when there is none.
    pub fn for_host(credentials: &[Credential], host: &str, port: u16) -> Option<Arc<ScrubRules>> {
        let mut patterns: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        let mut replacements = Vec::new();
        for credential in credentials.iter().filter(|c| c.binds(host, port)) {
            let value = credential.value();
            // A placeholder credential's own stand-in; for the others one drawn now (the
            // sandbox never had one).
            let stand_in = credential
                .placeholder()
                .map_or_else(|| placeholder_for(value), str::to_owned);
            for (form, replacement) in forms(value.as_bytes(), stand_in.as_bytes()) {
                if !patterns.iter().any(|known| **known == *form) {
                    // As long as what it replaces: a scrubbed body keeps its length, so its
                    // `Content-Length` stands and the client sees no change of framing.
                    replacements.push(fit(replacement, form.len()));
                    patterns.push(form);
                }
            }
        }
        if patterns.is_empty() {
            return None;
        }
        let keeps_length = patterns
            .iter()
            .zip(&replacements)
            .all(|(pattern, replacement)| pattern.len() == replacement.len());
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(patterns.iter().map(|p| p.as_slice()))
            .ok()?;
        Some(Arc::new(ScrubRules {
            automaton,
            patterns,
            replacements,
            keeps_length,
        }))
    }

    /// Whether scrubbing keeps a text's length (every stand-in as long as its value).
    pub fn keeps_length(&self) -> bool {
        self.keeps_length
    }

    /// A whole text scrubbed (a header value), or `None` when it holds no value.
    pub fn scrub(&self, text: &[u8]) -> Option<Vec<u8>> {
        self.automaton.is_match(text).then(|| self.replace(text))
    }

    /// Every value of `headers` scrubbed (a response's head, or its trailers).
    pub fn scrub_headers(&self, headers: &mut http::HeaderMap) {
        for value in headers.values_mut() {
            if let Some(scrubbed) = self.scrub(value.as_bytes()) {
                *value = http::HeaderValue::from_bytes(&scrubbed)
                    .unwrap_or_else(|_| http::HeaderValue::from_static("(scrubbed)"));
            }
        }
    }

    fn replace(&self, text: &[u8]) -> Vec<u8> {
        self.automaton.replace_all_bytes(text, &self.replacements)
    }

    /// The length of the longest end of `text` that begins a form (and may be completed
    /// by what comes next): all that must be held back. Everything before it can go.
    fn pending(&self, text: &[u8]) -> usize {
        let mut longest = 0;
        for pattern in &self.patterns {
            let most = (pattern.len() - 1).min(text.len());
            if let Some(length) = (longest + 1..=most)
                .rev()
                .find(|&length| text.ends_with(&pattern[..length]))
            {
                longest = length;
            }
        }
        longest
    }
}

/// One response body's scrub as it streams: the last bytes of each chunk are held back until
/// the next one (or the end), so a value split across chunks is seen whole and no part of
/// one leaves.
pub struct Scrub {
    rules: Arc<ScrubRules>,
    held: Vec<u8>,
}

impl Scrub {
    pub fn new(rules: Arc<ScrubRules>) -> Scrub {
        Scrub {
            rules,
            held: Vec::new(),
        }
    }

    /// A body's trailers, scrubbed like its head.
    pub fn trailers(&self, trailers: &mut http::HeaderMap) {
        self.rules.scrub_headers(trailers);
    }

    /// The next chunk: what may be passed on now. Only an end that could be the start of a
    /// value is held, so a stream (server-sent events, an upgraded connection) is not
    /// delayed by the scrub unless its last bytes might be a value's first.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(chunk);
        if self.rules.automaton.is_match(&self.held) {
            self.held = self.rules.replace(&self.held);
        }
        let ready = self.held.len() - self.rules.pending(&self.held);
        self.held.drain(..ready).collect()
    }

    /// What was held back, at the end of the body.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

/// How long an upgraded stream's end that could begin a value waits for the rest before
/// it is passed on as it is: an interactive protocol (a WebSocket) must not stall on it,
/// and an upstream writes what it echoes in one go, not a value in pieces this far apart.
const HOLD_AT_MOST: std::time::Duration = std::time::Duration::from_millis(50);

/// Copies `from` to `to` through a [`Scrub`] until `from` ends (an upgraded connection's
/// answers), then passes on what was held and closes `to`.
pub async fn copy_scrubbed<R, W>(
    from: &mut R,
    to: &mut W,
    rules: Arc<ScrubRules>,
) -> std::io::Result<u64>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut scrub = Scrub::new(rules);
    let mut buffer = vec![0u8; 16 * 1024];
    let mut copied = 0;
    loop {
        let read = if scrub.held.is_empty() {
            Some(from.read(&mut buffer).await?)
        } else {
            tokio::time::timeout(HOLD_AT_MOST, from.read(&mut buffer))
                .await
                .ok()
                .transpose()?
        };
        let ready = match read {
            Some(0) | None => scrub.finish(),
            Some(read) => scrub.push(&buffer[..read]),
        };
        to.write_all(&ready).await?;
        to.flush().await?;
        copied += ready.len() as u64;
        if read == Some(0) {
            to.shutdown().await?;
            return Ok(copied);
        }
    }
}

/// The forms of `value` an echo may carry, each with the same form of `stand_in`.
fn forms(value: &[u8], stand_in: &[u8]) -> Vec<(Zeroizing<Vec<u8>>, Vec<u8>)> {
    let mut forms = vec![(Zeroizing::new(value.to_vec()), stand_in.to_vec())];
    if let (Ok(text), Ok(stand_in_text)) =
        (std::str::from_utf8(value), std::str::from_utf8(stand_in))
    {
        let encoded = Zeroizing::new(encode(text).into_bytes());
        if *encoded != value {
            forms.push((encoded.clone(), encode(stand_in_text).into_bytes()));
            let lower = Zeroizing::new(lower_hex(&encoded));
            if *lower != *encoded {
                forms.push((lower, lower_hex(encode(stand_in_text).as_bytes())));
            }
        }
    }
    for engine in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
        for offset in 0..3 {
            let form = aligned_base64(&engine, value, offset);
            if form.len() >= SHORTEST_ENCODED_FORM {
                forms.push((form, aligned_base64(&engine, stand_in, offset).to_vec()));
            }
        }
    }
    forms
}

/// The characters of any base64 text that encode `value` when it starts `offset` bytes
/// (mod 3) into the encoded data: those that depend on its bytes alone.
fn aligned_base64(
    engine: &base64::engine::GeneralPurpose,
    value: &[u8],
    offset: usize,
) -> Zeroizing<Vec<u8>> {
    let mut padded = Zeroizing::new(vec![0u8; offset]);
    padded.extend_from_slice(value);
    let encoded = Zeroizing::new(engine.encode(&*padded).into_bytes());
    let start = (offset * 8).div_ceil(6);
    let end = (padded.len() * 8) / 6;
    Zeroizing::new(encoded.get(start..end).unwrap_or_default().to_vec())
}

/// `replacement` cut or padded (with `X`) to `length` bytes.
fn fit(mut replacement: Vec<u8>, length: usize) -> Vec<u8> {
    replacement.resize(length, b'X');
    replacement
}

/// Percent escapes with lowercase hexadecimal digits.
fn lower_hex(encoded: &[u8]) -> Vec<u8> {
    let mut lowered = encoded.to_vec();
    let mut index = 0;
    while index < lowered.len() {
        if lowered[index] == b'%' && index + 2 < lowered.len() {
            lowered[index + 1] = lowered[index + 1].to_ascii_lowercase();
            lowered[index + 2] = lowered[index + 2].to_ascii_lowercase();
            index += 3;
        } else {
            index += 1;
        }
    }
    lowered
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::Injection;
    use crate::policy::HostPattern;

    const VALUE: &str = "sk-live/s3cr3t+VALUE=0123456789";

    fn rules(injection: Injection) -> Arc<ScrubRules> {
        let credential = Credential::new(
            "api".to_owned(),
            vec![HostPattern::parse("api.example.com").unwrap()],
            injection,
            Zeroizing::new(VALUE.to_owned()),
        );
        assert!(
            ScrubRules::for_host(std::slice::from_ref(&credential), "other.example.com", 443)
                .is_none()
        );
        ScrubRules::for_host(&[credential], "api.example.com", 443).unwrap()
    }

    /// Every form an echo can take, each inside a longer text.
    fn echoes() -> Vec<Vec<u8>> {
        let mut echoes = vec![
            format!("{{\"error\": \"model `{VALUE}` does not exist\"}}").into_bytes(),
            format!("Location: /login?key={}&x=1", encode(VALUE)).into_bytes(),
            format!(
                "?key={}",
                String::from_utf8(lower_hex(encode(VALUE).as_bytes())).unwrap()
            )
            .into_bytes(),
        ];
        for prefix in ["", "u", "us", "user:"] {
            let pair = format!("{prefix}{VALUE} and more");
            echoes.push(format!("Basic {}", STANDARD_NO_PAD.encode(&pair)).into_bytes());
            echoes.push(
                format!("{{\"content\": \"{}\"}}", URL_SAFE_NO_PAD.encode(&pair)).into_bytes(),
            );
        }
        echoes
    }

    fn leaks(text: &[u8]) -> bool {
        let text = String::from_utf8_lossy(text);
        text.contains(VALUE)
            || text.contains(&encode(VALUE))
            || text
                .to_ascii_lowercase()
                .contains(&encode(VALUE).to_ascii_lowercase())
            || (0..3).any(|offset| {
                [STANDARD_NO_PAD, URL_SAFE_NO_PAD].iter().any(|engine| {
                    let form = aligned_base64(engine, VALUE.as_bytes(), offset);
                    text.contains(std::str::from_utf8(&form).unwrap())
                })
            })
    }

    #[test]
    fn every_form_of_the_value_is_scrubbed_whole_and_across_chunks() {
        let rules = rules(Injection::Basic {
            username: "user".to_owned(),
        });
        for echo in echoes() {
            assert!(leaks(&echo), "the test echo must carry the value: {echo:?}");
            let whole = rules.scrub(&echo).expect("found");
            assert!(!leaks(&whole), "{}", String::from_utf8_lossy(&whole));
            for cut in 0..echo.len() {
                let mut scrub = Scrub::new(Arc::clone(&rules));
                let mut out = scrub.push(&echo[..cut]);
                out.extend(scrub.push(&echo[cut..]));
                out.extend(scrub.finish());
                assert_eq!(out, whole, "cut at {cut}");
            }
            // Byte by byte too.
            let mut scrub = Scrub::new(Arc::clone(&rules));
            let mut out = Vec::new();
            for byte in &echo {
                out.extend(scrub.push(std::slice::from_ref(byte)));
            }
            out.extend(scrub.finish());
            assert_eq!(out, whole);
        }
        assert_eq!(rules.scrub(b"nothing to see"), None);
    }

    #[test]
    fn a_stream_is_held_back_only_where_a_value_may_begin() {
        let rules = rules(Injection::Header {
            name: http::HeaderName::from_static("x-key"),
            format: "{value}".to_owned(),
        });
        let mut scrub = Scrub::new(Arc::clone(&rules));
        // Nothing that could start a value: all of it goes at once (an event stream's
        // line is not delayed until the next).
        assert_eq!(scrub.push(b"data: token\n\n"), b"data: token\n\n");
        // The value's first bytes at the end: those wait, the rest goes.
        let head = &VALUE.as_bytes()[..5];
        let mut chunk = b"data: ".to_vec();
        chunk.extend_from_slice(head);
        assert_eq!(scrub.push(&chunk), b"data: ");
        // The rest of the value arrives: it leaves as the stand-in, never the value.
        let mut out = scrub.push(&VALUE.as_bytes()[5..]);
        out.extend(scrub.finish());
        assert!(!leaks(&out), "{}", String::from_utf8_lossy(&out));
        assert_eq!(out.len(), VALUE.len());
    }

    #[test]
    fn a_placeholder_credential_is_replaced_by_its_own_placeholder() {
        let placeholder = placeholder_for(VALUE);
        let rules = rules(Injection::Placeholder {
            env: "KEY".to_owned(),
            placeholder: placeholder.clone(),
            in_body: false,
            in_url: false,
            paths: Vec::new(),
            headers: crate::credentials::default_placeholder_headers(),
        });
        assert!(rules.keeps_length());
        let scrubbed = rules.scrub(format!("echo: {VALUE}").as_bytes()).unwrap();
        assert_eq!(
            String::from_utf8(scrubbed).unwrap(),
            format!("echo: {placeholder}")
        );
    }
}
