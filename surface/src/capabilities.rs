//! What the homeserver offers, read from its `/capabilities` answer (pure): the one reading
//! the surface's delayed notice and the doctor share.

use std::time::Duration;

/// MSC4140's capability: delayed events, and their longest delay.
pub const DELAYED_EVENTS: &str = "org.matrix.msc4140.delayed_events";

/// The longest delay of a delayed event, from the capability's own object (`None`: no delayed
/// events offered).
pub fn max_delay_of(capability: &serde_json::Value) -> Option<Duration> {
    let ms = capability["max_delay_ms"].as_u64()?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// The longest delay in a whole `/capabilities` answer.
pub fn max_delay(capabilities: &serde_json::Value) -> Option<Duration> {
    max_delay_of(&capabilities["capabilities"][DELAYED_EVENTS])
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
