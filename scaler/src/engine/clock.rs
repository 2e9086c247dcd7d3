//! Wall-clock helpers. Ticks are on the Unix-time grid so every prescale replica
//! samples at the same instants.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub async fn sleep_until_ms(t: u64) {
    let now = now_ms();
    if t > now {
        tokio::time::sleep(Duration::from_millis(t - now)).await;
    }
}
