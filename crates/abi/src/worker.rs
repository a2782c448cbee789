//! Long-lived threads that run GPU models.
//!
//! Triton gives every model instance a new thread at each load. libtorch keeps much of
//! its CUDA state per thread: cuDNN's execution-plan caches are thread-local, and cuBLAS
//! and cuDNN hand out handles per thread. On a new thread all of that is built again,
//! and what the old thread built does not all come back: reloading a ResNet50 on a GPU
//! grew the server's RSS by about 1.3 MiB a cycle (none with cuDNN disabled, none on the
//! CPU; `bench/gpu/reload_cycles.py`). So GPU instances run on these workers instead: a
//! load takes an idle worker (or starts one), an unload gives it back, and the next
//! model on it finds libtorch's per-thread state already built. There are as many
//! workers as GPU instances were ever loaded at once.
//!
//! Handing a run to a worker and its answer back costs two thread wake-ups when each side
//! sleeps. Both sides spin first: the worker for a while after each job (the next batch
//! usually comes sooner), the caller for as long as a run usually takes (its thread has
//! nothing else to do, and the worker is spinning in the CUDA wait anyway); each falls
//! back to blocking after that. A model whose own threads need the host's cores while its
//! network runs (a recommender reading its GPU cache's misses from host memory) asks for
//! [`HandOver::Asleep`]: neither side spins, and those cores go to the reads (DLRM-v2 at a
//! 10% cache on 8 instances served 1.20x with nothing spinning; every row in HBM the same
//! 11.4 M pairs/s on half the cores: `bench/gpu/results/cache-runs/`, sections `defaults`
//! and `quiet`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, TryRecvError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How a GPU instance's thread and its worker wait for each other (the model's
/// `gpu_hand_over`, through [`crate::LoadOptions::hand_over`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandOver {
    /// The worker spins up to 2 ms for its next job, the caller up to 25 ms for the answer.
    Spin,
    /// Both sleep at once.
    Asleep,
}

impl HandOver {
    /// From the ABI's value ([`crate::HAND_OVER_SPIN`], [`crate::HAND_OVER_ASLEEP`]; anything
    /// else, the default: spinning).
    pub fn from_abi(v: i32) -> HandOver {
        if v == crate::HAND_OVER_ASLEEP {
            HandOver::Asleep
        } else {
            HandOver::Spin
        }
    }

    /// The ABI's value for a model that asked `asked` (None: the plugin's default).
    pub fn to_abi(asked: Option<HandOver>) -> i32 {
        match asked {
            None => crate::HAND_OVER_DEFAULT,
            Some(HandOver::Spin) => crate::HAND_OVER_SPIN,
            Some(HandOver::Asleep) => crate::HAND_OVER_ASLEEP,
        }
    }
}

/// How long an idle worker spins for its next job, and a caller for its answer (longer
/// than most runs), before blocking, for a model that asked `asked`.
/// `TRITON_RUST_TORCH_SPIN` in the server's environment (read once) overrides every model:
/// `both` (spinning), `answer` (the caller only) or `none`.
fn spins(asked: HandOver) -> (Duration, Duration) {
    static SET: std::sync::OnceLock<Option<(Duration, Duration)>> = std::sync::OnceLock::new();
    let (job, answer) = (Duration::from_millis(2), Duration::from_millis(25));
    let set = SET.get_or_init(|| match std::env::var("TRITON_RUST_TORCH_SPIN").as_deref() {
        Ok("none") => Some((Duration::ZERO, Duration::ZERO)),
        Ok("answer") => Some((Duration::ZERO, answer)),
        Ok("both") => Some((job, answer)),
        _ => None,
    });
    set.unwrap_or(match asked {
        HandOver::Spin => (job, answer),
        HandOver::Asleep => (Duration::ZERO, Duration::ZERO),
    })
}

/// Receives from `rx`, spinning up to `spin` before blocking.
fn recv_spinning<T>(rx: &mpsc::Receiver<T>, spin: Duration) -> Result<T, mpsc::RecvError> {
    let start = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(v) => return Ok(v),
            Err(TryRecvError::Disconnected) => return Err(mpsc::RecvError),
            Err(TryRecvError::Empty) if start.elapsed() < spin => std::hint::spin_loop(),
            Err(TryRecvError::Empty) => return rx.recv(),
        }
    }
}

/// A run, and how long the worker spins for the next one after it.
type Job = (Box<dyn FnOnce() + Send + 'static>, Duration);

pub struct Worker {
    jobs: mpsc::Sender<Job>,
    hand_over: HandOver,
}

static IDLE: Mutex<Vec<Worker>> = Mutex::new(Vec::new());
static STARTED: Mutex<usize> = Mutex::new(0);

impl Worker {
    /// An idle worker, or a new one, handing over as `hand_over` says.
    pub fn take(hand_over: HandOver) -> Result<Worker, String> {
        if let Some(w) = IDLE.lock().map_err(|_| "worker pool lock poisoned")?.pop() {
            return Ok(Worker { hand_over, ..w });
        }
        let mut started = STARTED.lock().map_err(|_| "worker pool lock poisoned")?;
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(format!("torch-gpu-{}", *started))
            .spawn(move || {
                // after each job, as long as that job's model asked
                let mut idle = Duration::ZERO;
                while let Ok((job, next)) = recv_spinning(&rx, idle) {
                    job();
                    idle = next;
                }
            })
            .map_err(|e| format!("cannot start a torch worker thread: {e}"))?;
        *started += 1;
        Ok(Worker { jobs: tx, hand_over })
    }

    /// Back to the pool, for the next GPU instance.
    pub fn give_back(self) {
        if let Ok(mut idle) = IDLE.lock() {
            idle.push(self);
        }
    }

    /// Runs `f` on the worker and waits for it; a panic in `f` comes back as an error.
    pub fn run<R, F: FnOnce() -> R>(&self, f: F) -> Result<R, String> {
        let (done_tx, done_rx) = mpsc::sync_channel::<std::thread::Result<R>>(1);
        let job: Box<dyn FnOnce() + '_> = Box::new(move || {
            let _ = done_tx.send(catch_unwind(AssertUnwindSafe(f)));
        });
        // SAFETY: only the lifetime and Send are asserted. We wait below until the job
        // has run or been dropped (the reply channel's sender lives inside it), so what it
        // borrows stays valid while the worker can touch it, and only one thread uses it
        // at a time (the caller is blocked).
        let job = unsafe {
            std::mem::transmute::<Box<dyn FnOnce() + '_>, Box<dyn FnOnce() + Send + 'static>>(job)
        };
        let (idle, answer) = spins(self.hand_over);
        self.jobs.send((job, idle)).map_err(|_| "the torch worker thread is gone".to_string())?;
        match recv_spinning(&done_rx, answer) {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(p)) => Err(format!("libtorch panicked: {}", panic_text(p))),
            Err(_) => Err("the torch worker thread is gone".into()),
        }
    }
}

/// The text of a caught panic (what a plugin reports instead of unwinding into C).
pub fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinning_receive_spins_then_blocks_and_sees_a_hang_up() {
        let (tx, rx) = mpsc::channel::<u32>();
        tx.send(1).unwrap();
        assert_eq!(recv_spinning(&rx, Duration::ZERO).unwrap(), 1, "a value already there");
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            tx.send(2).unwrap();
        });
        let start = Instant::now();
        // spins 1 ms, then blocks until the value comes 30 ms later
        assert_eq!(recv_spinning(&rx, Duration::from_millis(1)).unwrap(), 2);
        assert!(start.elapsed() >= Duration::from_millis(25));
        late.join().unwrap();
        assert!(recv_spinning(&rx, Duration::from_millis(1)).is_err(), "the sender is gone");
    }

    #[test]
    fn a_model_asleep_spins_for_nothing_unless_the_server_says() {
        // the environment is read once; a test process has no TRITON_RUST_TORCH_SPIN unless
        // its runner set one
        if std::env::var_os("TRITON_RUST_TORCH_SPIN").is_some() {
            return;
        }
        assert_eq!(spins(HandOver::Asleep), (Duration::ZERO, Duration::ZERO));
        assert_eq!(spins(HandOver::Spin), (Duration::from_millis(2), Duration::from_millis(25)));
        assert_eq!(HandOver::from_abi(crate::HAND_OVER_ASLEEP), HandOver::Asleep);
        assert_eq!(HandOver::from_abi(crate::HAND_OVER_SPIN), HandOver::Spin);
        assert_eq!(HandOver::from_abi(-1), HandOver::Spin);
        for h in [None, Some(HandOver::Spin), Some(HandOver::Asleep)] {
            assert_eq!(h.map(|_| HandOver::from_abi(HandOver::to_abi(h))), h, "there and back");
        }
    }

    #[test]
    fn runs_borrowed_work_elsewhere_and_reuses_threads() {
        let w = Worker::take(HandOver::Spin).unwrap();
        let mut v = vec![1, 2, 3];
        let here = std::thread::current().id();
        let there = w.run(|| {
            v.push(4);
            std::thread::current().id()
        });
        assert_eq!(v, [1, 2, 3, 4]);
        let there = there.unwrap();
        assert_ne!(here, there);
        assert!(w.run(|| panic!("boom")).unwrap_err().contains("boom"));
        w.give_back();
        let again = Worker::take(HandOver::Asleep).unwrap();
        assert_eq!(
            again.run(|| std::thread::current().id()).unwrap(),
            there,
            "an idle worker is reused, handing over as its new model asks"
        );
        again.give_back();
    }
}
