//! Whether the homeserver offers delayed events (MSC4140), from its `/capabilities`: the
//! "I was interrupted" notice needs them.

use std::time::Duration;

/// The longest delay in a `/capabilities` answer (`None`: no delayed events offered).
pub fn max_delay(capabilities: &serde_json::Value) -> Option<Duration> {
    let ms = capabilities["capabilities"]["org.matrix.msc4140.delayed_events"]["max_delay_ms"]
        .as_u64()?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_capability_is_read() {
        let offered = json!({"capabilities": {"org.matrix.msc4140.delayed_events":
            {"max_delay_ms": 86_400_000, "max_scheduled": 100}}});
        assert_eq!(max_delay(&offered), Some(Duration::from_secs(86_400)));
        let zero = json!({"capabilities": {"org.matrix.msc4140.delayed_events":
            {"max_delay_ms": 0}}});
        assert_eq!(max_delay(&zero), None);
        assert_eq!(max_delay(&json!({"capabilities": {}})), None);
    }
}
