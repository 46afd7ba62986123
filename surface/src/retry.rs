//! The one retry decision for requests to the homeserver: what a failure looked like
//! ([`Observed`]) and whether waiting can fix it ([`verdict`]). Used by [`crate::send`] for room
//! events (retried until they work) and by [`crate::media`] for transfers (a few tries).

use std::time::Duration;

/// What went wrong with a request, reduced to what the retry decision needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// No HTTP answer: connection refused or reset, timeout, name resolution.
    Network,
    /// The homeserver answered with an error status.
    Status {
        /// The HTTP status.
        status: u16,
        /// The Matrix `errcode`, e.g. `M_FORBIDDEN`.
        errcode: Option<String>,
        /// How long the server asked us to wait.
        retry_after: Option<Duration>,
    },
    /// The event cannot be sent as it is (it does not serialize, the bot left the room).
    Invalid,
    /// A local failure (store, encryption) that may clear up.
    Local,
}

/// What to do about a failed post.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Rate limited: wait as asked (or back off if the server did not say), then retry.
    RateLimited(Option<Duration>),
    /// Passing trouble: back off with jitter, then retry.
    Transient,
    /// Retrying cannot help: park it and report it.
    Permanent,
}

/// The retry decision (pure).
pub fn verdict(observed: &Observed) -> Verdict {
    match observed {
        Observed::Network | Observed::Local => Verdict::Transient,
        Observed::Invalid => Verdict::Permanent,
        Observed::Status {
            status,
            errcode,
            retry_after,
        } => {
            let code = errcode.as_deref();
            if *status == 429 || code == Some("M_LIMIT_EXCEEDED") {
                Verdict::RateLimited(*retry_after)
            } else if *status >= 500 || *status == 408 {
                Verdict::Transient
            } else if *status == 401
                || matches!(
                    code,
                    Some("M_UNKNOWN_TOKEN" | "M_MISSING_TOKEN" | "M_RESOURCE_LIMIT_EXCEEDED")
                )
            {
                // A revoked token or a server over its resource limits: an operator can fix
                // these, and the answer must still be there when they do.
                Verdict::Transient
            } else {
                Verdict::Permanent
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, errcode: Option<&str>, retry_ms: Option<u64>) -> Observed {
        Observed::Status {
            status,
            errcode: errcode.map(str::to_owned),
            retry_after: retry_ms.map(Duration::from_millis),
        }
    }

    #[test]
    fn verdicts() {
        use Verdict::*;
        let table = [
            (Observed::Network, Transient),
            (Observed::Local, Transient),
            (Observed::Invalid, Permanent),
            (
                status(429, Some("M_LIMIT_EXCEEDED"), Some(1500)),
                RateLimited(Some(Duration::from_millis(1500))),
            ),
            (status(429, None, None), RateLimited(None)),
            (
                status(400, Some("M_LIMIT_EXCEEDED"), Some(20)),
                RateLimited(Some(Duration::from_millis(20))),
            ),
            (status(500, Some("M_UNKNOWN"), None), Transient),
            (status(502, None, None), Transient),
            (status(503, None, None), Transient),
            (status(408, None, None), Transient),
            (status(401, Some("M_UNKNOWN_TOKEN"), None), Transient),
            (
                status(403, Some("M_RESOURCE_LIMIT_EXCEEDED"), None),
                Transient,
            ),
            (status(403, Some("M_FORBIDDEN"), None), Permanent),
            (status(413, Some("M_TOO_LARGE"), None), Permanent),
            (status(400, Some("M_BAD_JSON"), None), Permanent),
            (status(404, Some("M_NOT_FOUND"), None), Permanent),
            (status(404, None, None), Permanent),
        ];
        for (observed, expected) in table {
            assert_eq!(verdict(&observed), expected, "{observed:?}");
        }
    }
}
