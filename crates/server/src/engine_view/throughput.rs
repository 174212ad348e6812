//! Tokens per second and time to first token by priority, counted on the engine thread
//! as tokens go out. Counting is a few integer updates, with no allocation once a
//! priority has been seen; rates and medians are worked out only when a snapshot is.

use std::time::{Duration, Instant};

use serde::Serialize;

/// Time-to-first-token samples kept per priority for the median.
const TTFT_SAMPLES: usize = 64;

/// A rate over the last second or more: two counts a second or more apart.
#[derive(Debug, Clone, Copy)]
struct Rate {
    older: (Instant, u64),
    newer: (Instant, u64),
}

impl Rate {
    fn new(at: Instant) -> Self {
        Self {
            older: (at, 0),
            newer: (at, 0),
        }
    }

    /// Per second since the older count, `count` counted by `now`; the counts move on
    /// once the newer is a second old.
    fn per_second(&mut self, now: Instant, count: u64) -> f64 {
        if now.saturating_duration_since(self.newer.0) >= Duration::from_secs(1) {
            self.older = self.newer;
            self.newer = (now, count);
        }
        let secs = now.saturating_duration_since(self.older.0).as_secs_f64();
        if secs <= 0.0 {
            return 0.0;
        }
        count.saturating_sub(self.older.1) as f64 / secs
    }
}

/// The last [`TTFT_SAMPLES`] times to first token, in milliseconds.
#[derive(Debug, Clone)]
struct Samples {
    ms: [f64; TTFT_SAMPLES],
    len: usize,
    next: usize,
}

impl Samples {
    fn push(&mut self, ms: f64) {
        self.ms[self.next] = ms;
        self.next = (self.next + 1) % TTFT_SAMPLES;
        self.len = (self.len + 1).min(TTFT_SAMPLES);
    }

    fn median(&self) -> Option<f64> {
        if self.len == 0 {
            return None;
        }
        let mut sorted = self.ms;
        let sorted = &mut sorted[..self.len];
        sorted.sort_by(f64::total_cmp);
        let mid = self.len / 2;
        Some(if self.len.is_multiple_of(2) {
            (sorted[mid - 1] + sorted[mid]) / 2.0
        } else {
            sorted[mid]
        })
    }
}

#[derive(Debug, Clone)]
struct ByPriority {
    priority: i32,
    generated: u64,
    finished: u64,
    rate: Rate,
    ttft: Samples,
}

/// Counts by priority, most urgent (lowest) first.
#[derive(Debug, Clone)]
pub(crate) struct Throughput {
    generated: u64,
    rate: Rate,
    started: Instant,
    by_priority: Vec<ByPriority>,
}

/// One priority's figures in a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PriorityThroughput {
    pub priority: i32,
    pub tokens_per_second: f64,
    /// Median over the last 64 requests that got a first token.
    pub ttft_ms_p50: Option<f64>,
    pub finished: u64,
}

/// Every priority's figures, and all of them together.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThroughputReport {
    pub tokens_per_second: f64,
    pub by_priority: Vec<PriorityThroughput>,
}

impl Throughput {
    pub fn new(started: Instant) -> Self {
        Self {
            generated: 0,
            rate: Rate::new(started),
            started,
            by_priority: Vec::new(),
        }
    }

    fn entry(&mut self, priority: i32) -> &mut ByPriority {
        let i = match self
            .by_priority
            .binary_search_by_key(&priority, |p| p.priority)
        {
            Ok(i) => i,
            Err(i) => {
                self.by_priority.insert(
                    i,
                    ByPriority {
                        priority,
                        generated: 0,
                        finished: 0,
                        rate: Rate::new(self.started),
                        ttft: Samples {
                            ms: [0.0; TTFT_SAMPLES],
                            len: 0,
                            next: 0,
                        },
                    },
                );
                i
            }
        };
        &mut self.by_priority[i]
    }

    /// A token went out to a request at `priority`.
    pub fn token(&mut self, priority: i32) {
        self.generated += 1;
        self.entry(priority).generated += 1;
    }

    /// A request at `priority` got its first token `ttft` after it arrived.
    pub fn first_token(&mut self, priority: i32, ttft: Duration) {
        self.entry(priority).ttft.push(ttft.as_secs_f64() * 1e3);
    }

    pub fn finished(&mut self, priority: i32) {
        self.entry(priority).finished += 1;
    }

    /// The figures at `now`.
    pub fn report(&mut self, now: Instant) -> ThroughputReport {
        ThroughputReport {
            tokens_per_second: self.rate.per_second(now, self.generated),
            by_priority: self
                .by_priority
                .iter_mut()
                .map(|p| PriorityThroughput {
                    priority: p.priority,
                    tokens_per_second: p.rate.per_second(now, p.generated),
                    ttft_ms_p50: p.ttft.median(),
                    finished: p.finished,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_cover_the_last_second_or_more_and_decay_when_tokens_stop() {
        let t0 = Instant::now();
        let mut t = Throughput::new(t0);
        for _ in 0..50 {
            t.token(0);
        }
        for _ in 0..10 {
            t.token(5);
        }
        let r = t.report(t0 + Duration::from_millis(500));
        assert_eq!(r.tokens_per_second, 120.0);
        assert_eq!(r.by_priority[0].tokens_per_second, 100.0);
        assert_eq!(r.by_priority[1].tokens_per_second, 20.0);
        // A second on, the counts move on; with no tokens since, the rate falls.
        let r = t.report(t0 + Duration::from_secs(1));
        assert_eq!(r.tokens_per_second, 60.0);
        let r = t.report(t0 + Duration::from_secs(3));
        assert_eq!(r.tokens_per_second, 0.0);
    }

    #[test]
    fn priorities_are_most_urgent_first_with_their_median_ttft_and_finished_count() {
        let t0 = Instant::now();
        let mut t = Throughput::new(t0);
        t.first_token(10, Duration::from_millis(300));
        t.first_token(-1, Duration::from_millis(30));
        t.first_token(-1, Duration::from_millis(50));
        t.first_token(-1, Duration::from_millis(10));
        t.finished(-1);
        t.token(3);
        let r = t.report(t0);
        let priorities: Vec<i32> = r.by_priority.iter().map(|p| p.priority).collect();
        assert_eq!(priorities, [-1, 3, 10]);
        assert_eq!(r.by_priority[0].ttft_ms_p50, Some(30.0));
        assert_eq!(r.by_priority[0].finished, 1);
        assert_eq!(r.by_priority[1].ttft_ms_p50, None);
        assert_eq!(r.by_priority[2].ttft_ms_p50, Some(300.0));
        // Only the latest samples count; an even count takes the middle two's mean.
        let mut s = Samples {
            ms: [0.0; TTFT_SAMPLES],
            len: 0,
            next: 0,
        };
        for ms in 0..(TTFT_SAMPLES + 10) {
            s.push(ms as f64);
        }
        assert_eq!(s.median(), Some((41.0 + 42.0) / 2.0));
    }
}
