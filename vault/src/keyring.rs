//! Key-encryption keys: `VERSION:BASE64` entries (32 random bytes each), from the
//! configuration or a key file (one entry a line, `#` comments). The highest version wraps
//! new data keys; older ones only open what they wrapped until `rotate` re-wraps it.

use std::collections::BTreeMap;
use std::fmt;

use aes_gcm::aead::OsRng;
use aes_gcm::aead::rand_core::RngCore;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use zeroize::Zeroizing;

use crate::VaultError;

pub const KEY_BYTES: usize = 32;

pub struct Keyring {
    keys: BTreeMap<i32, Zeroizing<[u8; KEY_BYTES]>>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("versions", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Keyring {
    /// Parses `VERSION:BASE64` entries; at least one, versions positive and distinct.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Keyring, VaultError> {
        let mut keys = BTreeMap::new();
        for entry in entries {
            let entry = entry.trim();
            if entry.is_empty() || entry.starts_with('#') {
                continue;
            }
            let (version, encoded) = entry.split_once(':').ok_or_else(|| {
                VaultError::InvalidKey("an entry is VERSION:BASE64 (32 bytes)".to_owned())
            })?;
            let version: i32 = version
                .trim()
                .parse()
                .ok()
                .filter(|version| *version > 0)
                .ok_or_else(|| {
                    VaultError::InvalidKey(format!("version `{version}` is not a positive integer"))
                })?;
            let bytes = Zeroizing::new(STANDARD.decode(encoded.trim()).map_err(|_| {
                VaultError::InvalidKey(format!("the key of version {version} is not base64"))
            })?);
            let key: [u8; KEY_BYTES] = bytes.as_slice().try_into().map_err(|_| {
                VaultError::InvalidKey(format!(
                    "the key of version {version} has {} bytes, not {KEY_BYTES}",
                    bytes.len()
                ))
            })?;
            if keys.insert(version, Zeroizing::new(key)).is_some() {
                return Err(VaultError::InvalidKey(format!(
                    "version {version} is given twice"
                )));
            }
        }
        if keys.is_empty() {
            return Err(VaultError::InvalidKey("no key given".to_owned()));
        }
        Ok(Keyring { keys })
    }

    /// A new random entry of `version`, for a key file or the configuration.
    pub fn generate_entry(version: i32) -> String {
        let mut key = Zeroizing::new([0u8; KEY_BYTES]);
        OsRng.fill_bytes(key.as_mut_slice());
        format!("{version}:{}", STANDARD.encode(key.as_slice()))
    }

    /// The version that wraps new data keys (the highest).
    pub fn current(&self) -> i32 {
        self.keys.keys().next_back().copied().unwrap_or(0)
    }

    pub fn versions(&self) -> Vec<i32> {
        self.keys.keys().copied().collect()
    }

    pub(crate) fn key(&self, version: i32) -> Result<&[u8; KEY_BYTES], VaultError> {
        self.keys
            .get(&version)
            .map(|key| &**key)
            .ok_or(VaultError::UnknownKeyVersion(version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_and_the_highest_version_is_current() {
        let one = Keyring::generate_entry(1);
        let three = Keyring::generate_entry(3);
        let text = format!("# keys\n{one}\n\n{three}\n");
        let keyring = Keyring::parse(text.lines()).unwrap();
        assert_eq!((keyring.current(), keyring.versions()), (3, vec![1, 3]));
        assert!(!format!("{keyring:?}").contains(&three[2..]));
        for bad in ["", "1:", "0:AAAA", "x:AAAA", "1:not base64!", "1:AAAA"] {
            assert!(Keyring::parse([bad]).is_err(), "{bad}");
        }
        assert!(Keyring::parse([one.as_str(), one.as_str()]).is_err());
    }
}
