//! [`Secret`]: the bearer token both sides hold (and any other secret setting), usable by the
//! code and never printed.

use std::fmt;

/// A secret string: `Debug` shows `[redacted]`, there is no `Display`, and the value is reached
/// only through [`Secret::expose`], for comparing or sending, never for logging.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The secret itself, for comparing or sending; never for logging.
    pub fn expose(&self) -> &str {
        &self.0
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
}
