//! Metrics vocabulary shared by engines and the Triton layer: an engine (or the store
//! behind it) describes its cumulative counters and current gauges as samples; the
//! Triton crate publishes them on Triton's Prometheus endpoint. Neither side knows
//! the other.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricKind {
    /// Cumulative, never decreasing: published as increments.
    Counter,
    /// A current value: published as is.
    Gauge,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MetricSample {
    pub family: &'static str,
    pub help: &'static str,
    pub kind: MetricKind,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

/// Something with metrics to publish (e.g. an embedding store).
pub trait MetricsSource: Send + Sync {
    fn samples(&self) -> Vec<MetricSample>;
}
