//! What the surface and the agent both need to run as long-lived services, written once: the
//! credential rule and the writing layer of their logs ([`redact`], [`wants_json`]), the
//! shutdown signals ([`on_signals`]), the wall clock in milliseconds ([`now_ms`]) and the
//! pacing of retries ([`backoff`]). No I/O beyond the process's own signals and clock.

pub mod redact;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backon::ExponentialBuilder;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Whether `LOG_FORMAT` asks for JSON lines (`json`; anything else, or nothing, is text).
pub fn wants_json(format: Option<&str>) -> bool {
    format.is_some_and(|f| f.trim().eq_ignore_ascii_case("json"))
}

/// A token cancelled on the first SIGTERM or SIGINT (which is logged): the start of a
/// graceful shutdown. Fails when the signals cannot be watched. Must run within a Tokio
/// runtime.
pub fn on_signals() -> std::io::Result<CancellationToken> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
        token.cancel();
    });
    Ok(shutdown)
}

/// A log writer that keeps every byte written to it, shared by its clones: what tests of a
/// subscriber read back (`subscriber(…, move || captured.clone())`).
#[derive(Debug, Clone, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    /// Everything written so far, as text.
    pub fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Milliseconds since the Unix epoch (0 for a clock set before it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Waits between retries: from `min`, doubling up to `max`, each with jitter (so peers that
/// failed together do not retry together), without a limit on tries; a caller that has one
/// adds `with_max_times`.
pub fn backoff(min: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(min)
        .with_max_delay(max)
        .without_max_times()
}

#[cfg(test)]
mod tests {
    use backon::BackoffBuilder;

    use super::*;

    #[test]
    fn log_format_json_is_asked_for_by_name() {
        assert!(wants_json(Some(" JSON ")));
        assert!(!wants_json(Some("text")));
        assert!(!wants_json(None));
    }

    #[test]
    fn backoff_stays_within_its_bounds_and_goes_on() {
        let max = Duration::from_secs(2);
        let waits: Vec<Duration> = backoff(Duration::from_millis(100), max)
            .build()
            .take(50)
            .collect();
        assert_eq!(waits.len(), 50, "no limit on tries");
        // Jitter adds at most the delay itself.
        assert!(waits.iter().all(|w| *w <= max * 2), "{waits:?}");
        let limited: Vec<Duration> = backoff(Duration::from_millis(1), max)
            .with_max_times(3)
            .build()
            .collect();
        assert_eq!(limited.len(), 3);
    }

    #[test]
    fn now_is_after_the_epoch_and_moves_on() {
        let a = now_ms();
        assert!(a > 1_600_000_000_000);
        assert!(now_ms() >= a);
    }
}
