//! [`Secret`]: the bearer token both sides hold (and any other secret setting), usable by the
//! code and never printed.

use std::fmt;

/// A secret string: `Debug` shows `[redacted]`, there is no `Display`, and the value is reached
/// only through [`Secret::expose`], for comparing or sending, never for logging.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

/// How the public defaults in compose.yaml and .env.example begin.
pub const PUBLIC_DEFAULT_PREFIX: &str = "dev-only-";

impl Secret {
    /// Wraps a secret value.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The secret itself, for comparing or sending; never for logging.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it is one of the public defaults of `compose.yaml` and `.env.example`
    /// (`dev-only-…`): fine for a try-out on one machine, said loudly at start.
    pub fn is_public_default(&self) -> bool {
        self.0.starts_with(PUBLIC_DEFAULT_PREFIX)
    }

    /// Whether an `Authorization` header value is `Bearer <this secret>`, compared in constant
    /// time (both sides hashed first, so the length does not show either).
    pub fn matches_bearer(&self, authorization: Option<&str>) -> bool {
        use sha2::{Digest, Sha256};
        use subtle::ConstantTimeEq;
        let Some(given) = authorization.and_then(|v| v.strip_prefix("Bearer ")) else {
            return false;
        };
        let given = Sha256::digest(given.trim().as_bytes());
        let expected = Sha256::digest(self.0.as_bytes());
        given.as_slice().ct_eq(expected.as_slice()).into()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::new("syt_very_secret");
        assert_eq!(format!("{s:?}"), "[redacted]");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some([redacted])");
        assert_eq!(s.expose(), "syt_very_secret");
    }

    #[test]
    fn public_defaults_are_recognized() {
        assert!(Secret::new("dev-only-agent-token-change-me").is_public_default());
        assert!(!Secret::new("4f1c2e9a0b7d6c5e4f3a2b1c0d9e8f7a").is_public_default());
    }

    #[test]
    fn bearer_headers() {
        let s = Secret::new("tok-1234567890abcdef");
        for (header, ok) in [
            (Some("Bearer tok-1234567890abcdef"), true),
            (Some("Bearer tok-1234567890abcdef "), true),
            (Some("Bearer tok-1234567890abcdeF"), false),
            (Some("bearer tok-1234567890abcdef"), false),
            (Some("tok-1234567890abcdef"), false),
            (Some("Bearer "), false),
            (None, false),
        ] {
            assert_eq!(s.matches_bearer(header), ok, "{header:?}");
        }
    }
}
