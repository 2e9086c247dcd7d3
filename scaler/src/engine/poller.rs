//! One shared poll: a source read on wall-clock-aligned ticks, with a timeout and
//! jittered retries, keeping the last good reading and the last error.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::sources::{Reading, Source, SourceError};

use super::clock::{now_ms, sleep_until_ms};

#[derive(Debug, Clone, Default)]
pub struct PollState {
    /// Unix ms of the last successful read, and what it read.
    pub last_good: Option<(u64, Reading)>,
    /// Unix ms and message of the last failed read (cleared by nothing: kept for display).
    pub last_error: Option<(u64, String)>,
    /// Consecutive failures since the last success.
    pub failures: u32,
}

pub struct Poller {
    pub kind: &'static str,
    pub label: String,
    sample_ms: u64,
    state: Mutex<PollState>,
    /// The last tick (unix ms) whose poll finished, successfully or not.
    done: watch::Sender<u64>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Poller {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
    }
}

impl Poller {
    pub fn spawn(
        kind: &'static str,
        label: String,
        source: Arc<dyn Source>,
        sample: Duration,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let (done, _) = watch::channel(0);
        let p = Arc::new(Self {
            kind,
            label,
            sample_ms: sample.as_millis().max(1) as u64,
            state: Mutex::new(PollState::default()),
            done,
            task: Mutex::new(None),
        });
        let weak = Arc::downgrade(&p);
        let handle = tokio::spawn(run(weak, source, timeout, metrics));
        *p.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        p
    }

    pub fn state(&self) -> PollState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.done.subscribe()
    }

    pub fn sample_ms(&self) -> u64 {
        self.sample_ms
    }
}

/// The tick at or after `now` on the grid of `period` (unix ms).
pub fn next_tick(now: u64, period: u64) -> u64 {
    now.div_ceil(period) * period
}

async fn run(weak: Weak<Poller>, source: Arc<dyn Source>, timeout: Duration, metrics: Arc<Metrics>) {
    // First read at once (a new ScaledObject gets an answer quickly), then aligned.
    let mut tick = now_ms();
    loop {
        let Some(p) = weak.upgrade() else { return };
        let (kind, label, period) = (p.kind, p.label.clone(), p.sample_ms);
        drop(p);
        let result = read_with_retries(&*source, timeout, tick, period, &label).await;
        let Some(p) = weak.upgrade() else { return };
        let labels: crate::metrics::Labels = vec![("kind", kind.to_string()), ("source", label.clone())].into();
        metrics.source_polls.get_or_create(&labels).inc();
        let done_at = now_ms();
        {
            let mut st = p.state.lock().unwrap_or_else(|e| e.into_inner());
            match result {
                Ok((reading, took)) => {
                    metrics
                        .source_latency
                        .get_or_create(&vec![("kind", kind.to_string())].into())
                        .observe(took.as_secs_f64());
                    st.last_good = Some((done_at, reading));
                    st.failures = 0;
                }
                Err(e) => {
                    metrics.source_errors.get_or_create(&labels).inc();
                    tracing::warn!(source = %label, error = %e, "source read failed");
                    st.last_error = Some((done_at, e.to_string()));
                    st.failures = st.failures.saturating_add(1);
                }
            }
        }
        p.done.send_replace(tick);
        drop(p);
        tick = next_tick(now_ms() + 1, period);
        sleep_until_ms(tick).await;
    }
}

/// Read once, retrying with jittered exponential backoff until half the period is used.
async fn read_with_retries(
    source: &dyn Source,
    timeout: Duration,
    tick: u64,
    period: u64,
    label: &str,
) -> Result<(Reading, Duration), SourceError> {
    let budget_end = tick + (period / 2).max(timeout.as_millis() as u64);
    let mut attempt: u32 = 0;
    loop {
        let started = std::time::Instant::now();
        let res = match tokio::time::timeout(timeout, source.read()).await {
            Ok(r) => r,
            Err(_) => Err(SourceError::Timeout(timeout.as_secs_f64())),
        };
        match res {
            Ok(r) => return Ok((r, started.elapsed())),
            Err(e) => {
                attempt += 1;
                let backoff = backoff_ms(attempt, label);
                if now_ms() + backoff + timeout.as_millis() as u64 > budget_end || attempt >= 4 {
                    return Err(e);
                }
                tokio::time::sleep(Duration::from_millis(backoff)).await;
            }
        }
    }
}

/// 100 ms · 2^attempt, ±50 % jitter derived from the source and the clock (no RNG
/// dependency; only spreading retries of many pollers matters).
fn backoff_ms(attempt: u32, label: &str) -> u64 {
    let base = 100u64 << attempt.min(6);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (label, attempt, now_ms()).hash(&mut h);
    base / 2 + h.finish() % base
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_align_to_the_wall_clock_grid() {
        assert_eq!(next_tick(10_000, 5_000), 10_000);
        assert_eq!(next_tick(10_001, 5_000), 15_000);
        assert_eq!(next_tick(1, 1_000), 1_000);
    }

    #[test]
    fn backoff_grows_and_is_jittered_within_bounds() {
        for a in 1..5 {
            let b = backoff_ms(a, "x");
            let base = 100u64 << a;
            assert!(b >= base / 2 && b < base / 2 + base, "{a}: {b}");
        }
    }
}
