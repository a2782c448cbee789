//! What a model's instances ran on each device, published on Triton's metrics endpoint
//! beside the engine's own metrics.

use std::sync::{Arc, Mutex};

use crate::engine::Device;
use crate::telemetry::MetricsSource;

/// Executions and rows run per device by one model's instances.
#[derive(Default)]
pub(super) struct DeviceCounts {
    counts: Mutex<Vec<(Device, Arc<RunCounts>)>>,
}

/// One device's executions and rows (shared by the model's instances there).
#[derive(Default)]
pub(super) struct RunCounts {
    pub(super) executions: std::sync::atomic::AtomicU64,
    pub(super) rows: std::sync::atomic::AtomicU64,
}

impl DeviceCounts {
    /// The counts of `device` (made on first use).
    pub(super) fn of(&self, device: Device) -> Arc<RunCounts> {
        let Ok(mut counts) = self.counts.lock() else { return Arc::default() };
        if let Some((_, c)) = counts.iter().find(|(d, _)| *d == device) {
            return c.clone();
        }
        let c = Arc::new(RunCounts::default());
        counts.push((device, c.clone()));
        c
    }
}

impl MetricsSource for DeviceCounts {
    fn samples(&self) -> Vec<crate::telemetry::MetricSample> {
        use crate::telemetry::{MetricKind, MetricSample};
        use std::sync::atomic::Ordering::Relaxed;
        let Ok(counts) = self.counts.lock() else { return Vec::new() };
        let mut out = Vec::new();
        for (device, c) in counts.iter() {
            let label = match device {
                Device::Gpu(id) => format!("GPU {id}"),
                Device::Cpu => "CPU".to_string(),
            };
            out.push(MetricSample {
                family: "rust_device_executions_total",
                help: "Executions (batches) run by the model's instances on each device",
                kind: MetricKind::Counter,
                labels: vec![("device", label.clone())],
                value: c.executions.load(Relaxed) as f64,
            });
            out.push(MetricSample {
                family: "rust_device_inferences_total",
                help: "Inferences (batch rows) run by the model's instances on each device",
                kind: MetricKind::Counter,
                labels: vec![("device", label)],
                value: c.rows.load(Relaxed) as f64,
            });
        }
        out
    }
}

/// The engine's metrics and the per-device counts, published together.
pub(super) struct ModelMetrics {
    pub(super) engine: Option<Arc<dyn MetricsSource>>,
    pub(super) devices: Arc<DeviceCounts>,
}

impl MetricsSource for ModelMetrics {
    fn samples(&self) -> Vec<crate::telemetry::MetricSample> {
        let mut out = self.engine.as_ref().map(|e| e.samples()).unwrap_or_default();
        out.extend(self.devices.samples());
        out
    }
}
