//! A batch lookup's GPU steps timed by CUDA events, when asked ([`BatchLookup::time_kernels`]):
//! the lookup on the caches' queue (the keys' copies and the lookup or probe kernels), the
//! fetched rows put in place (the scatter, or the open bags closed) on the lookup's own stream,
//! and the fill of the caches. For the benchmarks: where a batch's GPU time goes; and, served,
//! how long the caches' queue (shared by every instance of the GPU) was held a batch
//! ([`BatchLookup::queue_times`]).

use std::sync::Arc;

use cudarc::driver::{sys::CUevent_flags, CudaEvent, CudaStream};

use super::BatchLookup;
use crate::context::cuda_err;
use crate::error::Result;

/// The GPU time of the last run's steps, in milliseconds (`None`: the step did not run).
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelTimes {
    pub lookup_ms: f32,
    pub place_ms: Option<f32>,
    pub fill_ms: Option<f32>,
}

/// The steps a clock times, in the order they run.
#[derive(Debug, Clone, Copy)]
pub(super) enum Step {
    Lookup = 0,
    Place = 1,
    Fill = 2,
}

/// A pair of timing events a step (and one more for the run before's fill), and which steps
/// the last run recorded.
pub(super) struct KernelClock {
    events: Vec<(CudaEvent, CudaEvent)>,
    recorded: [bool; 3],
    /// Whether `events[PREVIOUS_FILL]` holds the run before's fill.
    previous_fill: bool,
}

/// Where a new run's lookup moves the last run's fill events, so they can still be read once
/// the new lookup (queued after that fill on the same queue) is done, without a wait.
const PREVIOUS_FILL: usize = 3;

impl KernelClock {
    pub(super) fn new(stream: &Arc<CudaStream>) -> Result<KernelClock> {
        let ctx = stream.context();
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let mut events = Vec::with_capacity(PREVIOUS_FILL + 1);
        for _ in 0..=PREVIOUS_FILL {
            let pair = (
                ctx.new_event(timing).map_err(cuda_err)?,
                ctx.new_event(timing).map_err(cuda_err)?,
            );
            events.push(pair);
        }
        Ok(KernelClock { events, recorded: [false; 3], previous_fill: false })
    }

    /// The start of `step` on `stream` (a new run's lookup forgets the last run's steps).
    pub(super) fn start(&mut self, step: Step, stream: &Arc<CudaStream>) -> Result<()> {
        if matches!(step, Step::Lookup) {
            self.previous_fill = self.recorded[Step::Fill as usize];
            if self.previous_fill {
                self.events.swap(Step::Fill as usize, PREVIOUS_FILL);
            }
            self.recorded = [false; 3];
        }
        self.events[step as usize].0.record(stream).map_err(cuda_err)
    }

    pub(super) fn end(&mut self, step: Step, stream: &Arc<CudaStream>) -> Result<()> {
        self.events[step as usize].1.record(stream).map_err(cuda_err)?;
        self.recorded[step as usize] = true;
        Ok(())
    }

    /// Each recorded step's time, waiting for its end.
    fn times(&self) -> Result<Option<KernelTimes>> {
        let time = |s: usize| -> Result<Option<f32>> {
            if !self.recorded[s] {
                return Ok(None);
            }
            let (e0, e1) = &self.events[s];
            e1.synchronize().map_err(cuda_err)?;
            Ok(Some(e0.elapsed_ms(e1).map_err(cuda_err)?))
        };
        let Some(lookup_ms) = time(Step::Lookup as usize)? else { return Ok(None) };
        Ok(Some(KernelTimes {
            lookup_ms,
            place_ms: time(Step::Place as usize)?,
            fill_ms: time(Step::Fill as usize)?,
        }))
    }

    /// This run's lookup on the caches' queue, and the run before's fill on it, in ms. Read
    /// after the lookup was waited for: both are done then (the fill came first on the queue).
    fn queue_times(&self) -> Result<Option<(f32, Option<f32>)>> {
        if !self.recorded[Step::Lookup as usize] {
            return Ok(None);
        }
        let span = |(e0, e1): &(CudaEvent, CudaEvent)| -> Result<f32> {
            e1.synchronize().map_err(cuda_err)?;
            e0.elapsed_ms(e1).map_err(cuda_err)
        };
        let fill = match self.previous_fill {
            true => Some(span(&self.events[PREVIOUS_FILL])?),
            false => None,
        };
        Ok(Some((span(&self.events[Step::Lookup as usize])?, fill)))
    }
}

impl BatchLookup {
    /// Whether the next runs time their GPU steps by events ([`BatchLookup::kernel_times`]).
    /// Off by default: the events cost little, but the product never reads them.
    pub fn time_kernels(&mut self, on: bool) -> Result<()> {
        self.clock = if on { Some(Box::new(KernelClock::new(&self.queue.stream)?)) } else { None };
        Ok(())
    }

    /// The last run's GPU steps, timed (waits for them, the fill too when it was queued);
    /// `None` unless [`BatchLookup::time_kernels`] is on and a run has looked up.
    pub fn kernel_times(&self) -> Result<Option<KernelTimes>> {
        self.clock.as_ref().map_or(Ok(None), |c| c.times())
    }

    /// Served: how long this run's lookup held the caches' queue and the run before's fill
    /// did (ms), once the run has looked up; `None` unless [`BatchLookup::time_kernels`] is on.
    /// No wait: both are done by the time the lookup's misses were counted. Every instance on
    /// the GPU shares that queue, so their sum times the batches a second is how busy it was.
    pub fn queue_times(&self) -> Result<Option<(f32, Option<f32>)>> {
        self.clock.as_ref().map_or(Ok(None), |c| c.queue_times())
    }

    /// Marks `step`'s start (`start`) or end on `stream`, when timing.
    pub(super) fn mark(&mut self, step: Step, start: bool, stream: &Arc<CudaStream>) -> Result<()> {
        match self.clock.as_mut() {
            Some(c) if start => c.start(step, stream),
            Some(c) => c.end(step, stream),
            None => Ok(()),
        }
    }
}
