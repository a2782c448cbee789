//! Custom metrics on Triton's Prometheus endpoint (`TRITONSERVER_Metric*`).
//!
//! Families are created once per process and live as long as it (Triton requires a
//! family to outlive its metrics, and families are shared by every model). A
//! [`MetricSet`] owns one model's labelled metrics and deletes them when dropped;
//! counters are published as increments from the last value seen.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::ffi::{c_string, check, sys};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::telemetry::{MetricKind, MetricSample, MetricsSource};

struct Family(*mut sys::TRITONSERVER_MetricFamily);
// SAFETY: Triton's metric families are thread-safe handles.
unsafe impl Send for Family {}

static FAMILIES: Mutex<Option<HashMap<&'static str, Family>>> = Mutex::new(None);

fn family(sample: &MetricSample) -> Result<*mut sys::TRITONSERVER_MetricFamily> {
    let mut guard = FAMILIES.lock();
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(f) = map.get(sample.family) {
        return Ok(f.0);
    }
    let kind = match sample.kind {
        MetricKind::Counter => sys::TRITONSERVER_metrickind_enum_TRITONSERVER_METRIC_KIND_COUNTER,
        MetricKind::Gauge => sys::TRITONSERVER_metrickind_enum_TRITONSERVER_METRIC_KIND_GAUGE,
    };
    let (name, help) = (c_string(sample.family), c_string(sample.help));
    let mut raw = std::ptr::null_mut();
    check(unsafe {
        sys::TRITONSERVER_MetricFamilyNew(&mut raw, kind, name.as_ptr(), help.as_ptr())
    })?;
    map.insert(sample.family, Family(raw));
    Ok(raw)
}

struct Metric {
    raw: *mut sys::TRITONSERVER_Metric,
    last: f64,
}

impl Drop for Metric {
    fn drop(&mut self) {
        // SAFETY: we created it and delete it once, before its family.
        let _ = check(unsafe { sys::TRITONSERVER_MetricDelete(self.raw) });
    }
}

/// A metric's family name and its labels.
type MetricKey = (&'static str, Vec<(&'static str, String)>);

/// One model's metrics.
#[derive(Default)]
pub struct MetricSet {
    metrics: HashMap<MetricKey, Metric>,
}

// SAFETY: metric handles are thread-safe in Triton; the set is used by one thread at a time.
unsafe impl Send for MetricSet {}

impl MetricSet {
    pub fn publish(&mut self, samples: &[MetricSample]) -> Result<()> {
        for s in samples {
            let key = (s.family, s.labels.clone());
            if !self.metrics.contains_key(&key) {
                let fam = family(s)?;
                let params: Vec<*mut sys::TRITONSERVER_Parameter> = s
                    .labels
                    .iter()
                    .map(|(k, v)| {
                        let (k, v) = (c_string(k), c_string(v));
                        // SAFETY: Triton copies both strings into the new parameter.
                        unsafe {
                            sys::TRITONSERVER_ParameterNew(
                                k.as_ptr(),
                                sys::TRITONSERVER_parametertype_enum_TRITONSERVER_PARAMETER_STRING,
                                v.as_ptr().cast(),
                            )
                        }
                    })
                    .collect();
                let mut raw = std::ptr::null_mut();
                let made = check(unsafe {
                    sys::TRITONSERVER_MetricNew(
                        &mut raw,
                        fam,
                        params.as_ptr() as *mut *const sys::TRITONSERVER_Parameter,
                        params.len() as u64,
                    )
                });
                for p in params {
                    // SAFETY: MetricNew copied the labels.
                    unsafe { sys::TRITONSERVER_ParameterDelete(p) };
                }
                made?;
                self.metrics.insert(key.clone(), Metric { raw, last: 0.0 });
            }
            let m = self.metrics.get_mut(&key).expect("inserted above");
            match s.kind {
                MetricKind::Counter => {
                    let delta = s.value - m.last;
                    if delta > 0.0 {
                        check(unsafe { sys::TRITONSERVER_MetricIncrement(m.raw, delta) })?;
                        m.last = s.value;
                    }
                }
                MetricKind::Gauge => check(unsafe { sys::TRITONSERVER_MetricSet(m.raw, s.value) })?,
            }
        }
        Ok(())
    }
}

/// Every `METRICS_INTERVAL` pushes a source's samples to Triton's metrics endpoint,
/// labelled with the model's name; stops and deletes its metrics when dropped.
pub struct MetricsPublisher {
    stop: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const METRICS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

impl MetricsPublisher {
    pub fn start(
        model: String,
        source: std::sync::Arc<dyn MetricsSource>,
    ) -> Result<MetricsPublisher> {
        let stop = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("metrics-{model}"))
            .spawn(move || {
                let mut set = MetricSet::default();
                let (lock, cv) = &*flag;
                loop {
                    let mut samples = source.samples();
                    for s in &mut samples {
                        s.labels.insert(0, ("model", model.clone()));
                    }
                    if let Err(e) = set.publish(&samples) {
                        log::error!("model '{model}': cannot publish metrics: {e}");
                    }
                    let stopped = lock
                        .lock()
                        .map(|g| {
                            cv.wait_timeout(g, METRICS_INTERVAL).map(|(g, _)| *g).unwrap_or(true)
                        })
                        .unwrap_or(true);
                    if stopped {
                        break;
                    }
                }
            })
            .map_err(|e| Error::internal(format!("cannot start the metrics thread: {e}")))?;
        Ok(MetricsPublisher { stop, thread: Some(thread) })
    }
}

impl Drop for MetricsPublisher {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        if let Ok(mut g) = lock.lock() {
            *g = true;
        }
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
