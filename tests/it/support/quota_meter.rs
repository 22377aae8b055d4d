//! How the BigQuery stand-ins count calls against a quota: a rate quota as a bucket of its
//! window's calls refilled continuously ([`RateMeter`]), a concurrency quota as calls in flight
//! ([`ConcurrencyMeter`]). A call beyond either is refused (and counted); each meter reports the
//! highest fraction of its quota in use at any moment ([`RateMeter::max_use`]), which a caller
//! within the quota keeps at or below 1.0.

use tokio::time::Instant;

/// A rate quota: `burst` calls at once, refilled at `per_second`.
#[derive(Debug, Clone)]
pub struct RateMeter {
    pub name: String,
    burst: f64,
    per_second: f64,
    tokens: f64,
    updated: Instant,
    /// The fewest tokens left after a call (`burst` until the first).
    lowest: f64,
    pub calls: usize,
    pub refused: usize,
}

impl RateMeter {
    pub fn new(name: impl Into<String>, burst: f64, per_second: f64) -> Self {
        RateMeter {
            name: name.into(),
            burst,
            per_second,
            tokens: burst,
            updated: Instant::now(),
            lowest: burst,
            calls: 0,
            refused: 0,
        }
    }

    /// A per-second quota: one second's calls at once.
    pub fn per_second(name: impl Into<String>, per_second: f64) -> Self {
        Self::new(name, per_second, per_second)
    }

    /// Counts a call: `false` (refused) when the quota has no room for it.
    pub fn admit(&mut self) -> bool {
        let now = Instant::now();
        let elapsed = now.duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.updated = now;
        if self.tokens < 1.0 {
            self.refused += 1;
            return false;
        }
        self.tokens -= 1.0;
        self.calls += 1;
        self.lowest = self.lowest.min(self.tokens);
        true
    }

    /// The highest fraction of the quota used at any moment (1.0: the bucket ran dry).
    pub fn max_use(&self) -> f64 {
        if self.refused > 0 { 1.0 } else { 1.0 - self.lowest / self.burst }
    }
}

/// A concurrency quota: at most `limit` calls in flight.
#[derive(Debug, Clone)]
pub struct ConcurrencyMeter {
    pub name: String,
    limit: usize,
    in_flight: usize,
    highest: usize,
    pub refused: usize,
}

impl ConcurrencyMeter {
    pub fn new(name: impl Into<String>, limit: usize) -> Self {
        ConcurrencyMeter { name: name.into(), limit, in_flight: 0, highest: 0, refused: 0 }
    }

    /// Counts a call's start: `false` (refused) when `limit` are in flight.
    pub fn enter(&mut self) -> bool {
        if self.in_flight >= self.limit {
            self.refused += 1;
            return false;
        }
        self.in_flight += 1;
        self.highest = self.highest.max(self.in_flight);
        true
    }

    /// Counts a call's end (one that [`ConcurrencyMeter::enter`] admitted).
    pub fn leave(&mut self) {
        self.in_flight -= 1;
    }

    pub fn max_use(&self) -> f64 {
        if self.refused > 0 { 1.0 } else { self.highest as f64 / self.limit as f64 }
    }
}

/// One quota's figures for a report.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaUse {
    pub name: String,
    pub max_use: f64,
    pub refused: usize,
}

impl From<&RateMeter> for QuotaUse {
    fn from(meter: &RateMeter) -> Self {
        QuotaUse { name: meter.name.clone(), max_use: meter.max_use(), refused: meter.refused }
    }
}

impl From<&ConcurrencyMeter> for QuotaUse {
    fn from(meter: &ConcurrencyMeter) -> Self {
        QuotaUse { name: meter.name.clone(), max_use: meter.max_use(), refused: meter.refused }
    }
}
