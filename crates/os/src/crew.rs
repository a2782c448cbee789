//! A crew of reader threads for short jobs on a request's path: a job is split into shares,
//! the calling thread takes shares itself beside the crew, and an idle member may watch a while
//! for the next job before it sleeps (the process's crew does not unless told: [`Crew::global`]).
//!
//! Why not the process's worker pool (rayon): a thread outside that pool hands it a job and
//! sleeps until it is done. Served (MLPerf DLRM-v2 at a 10% GPU cache, one H200, six model
//! instances), a miss read of 65 K rows spent about 1 ms before its last share started (the
//! pool's threads woken one after another) and 1.5 ms after its shares were done before its
//! caller ran again, against 0.3 ms of reading in its longest share
//! (`bench/gpu/results/cache-runs/`). Here the caller never sleeps: it reads until no share is
//! left, then waits only for shares already being read.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The caller's function behind a pointer whose lifetime `Crew::run` erases: it is only
/// called for a share claimed (`next < shares`), and `run` returns only after every share
/// is done, so no call outlives the borrow.
type Share = dyn Fn(usize) + Sync + 'static;

struct Job {
    run: *const Share,
    shares: usize,
    /// The next share to claim (past `shares`: none left).
    next: AtomicUsize,
    /// Shares done.
    done: AtomicUsize,
    panicked: AtomicBool,
    /// Set by whoever finishes the last share, for a caller that sleeps.
    finished: Mutex<bool>,
    finish: Condvar,
}

// SAFETY: `run` points to a `Sync` function that `Crew::run` keeps alive while any share
// can still be claimed; everything else is atomic.
unsafe impl Send for Job {}
unsafe impl Sync for Job {}

impl Job {
    /// Claims and runs shares until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            if i >= self.shares {
                return;
            }
            // SAFETY: share `i` was claimed, so `Crew::run` is still waiting for it and its
            // function is alive (see `Share`).
            let f = unsafe { &*self.run };
            if catch_unwind(AssertUnwindSafe(|| f(i))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.shares {
                *self.finished.lock().unwrap_or_else(|e| e.into_inner()) = true;
                self.finish.notify_all();
            }
        }
    }
    fn open(&self) -> bool {
        self.next.load(Ordering::Acquire) < self.shares
    }
}

#[derive(Default)]
struct State {
    jobs: Vec<Arc<Job>>,
    sleeping: usize,
}

#[derive(Default)]
struct Shared {
    /// How long an idle member watches before it sleeps.
    spin: Duration,
    state: Mutex<State>,
    wake: Condvar,
    /// Bumped at every job posted: what a spinning member watches.
    posted: AtomicU64,
}

impl Shared {
    /// The oldest job with a share left (jobs with none are dropped from the list).
    fn next_job(state: &mut State) -> Option<Arc<Job>> {
        state.jobs.retain(|j| j.open());
        state.jobs.first().cloned()
    }

    fn member(&self) {
        loop {
            let job = Shared::next_job(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
            if let Some(job) = job {
                job.work();
                continue;
            }
            let seen = self.posted.load(Ordering::Acquire);
            let since = Instant::now();
            // watching, but giving the core to any other thread that wants it
            while self.posted.load(Ordering::Acquire) == seen && since.elapsed() < self.spin {
                std::thread::yield_now();
            }
            if self.posted.load(Ordering::Acquire) != seen {
                continue;
            }
            // asleep until a job is posted: checked under the lock a poster takes; woken, the
            // job is taken under the same lock (one lock a wake-up, not two)
            let job = {
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if let Some(job) = Shared::next_job(&mut state) {
                        break job;
                    }
                    state.sleeping += 1;
                    state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                    state.sleeping -= 1;
                }
            };
            job.work();
        }
    }
}

/// Where a member stands with the scheduler (`TRITON_RUST_READER_NICE`). By default, and with
/// `idle`, Linux's `SCHED_IDLE` class: it runs on a core no other thread wants, and any other
/// thread that wakes takes the core from it at once, so the threads that feed the GPU (a model
/// instance's, the network's) never wait for a reader. The callers (the instances' own threads,
/// at their own priority) read their jobs' shares beside the crew, but a share a member holds
/// waits for a core nothing else wants: on a host whose cores other work keeps busy, set `0`.
/// Served (MLPerf DLRM-v2 at a 10% GPU cache, one H200), with the members at the callers'
/// priority the threads that feed the GPU waited runnable for a core 1.7 cores' worth on
/// average and the readers 2.7, while the host had 3.5 cores idle; with the members in
/// `SCHED_IDLE` the feeders waited 0.2-0.3, and the model served 1.13x, 1.11x (one call) and
/// 1.01x (another) the members at the callers' priority (`bench/gpu/results/cache-runs/`,
/// section `idle`). Nor do the members do better on CPUs of their own, every other thread of
/// the server kept to the rest: 10 of the 16 CPUs served 0.86x this (commit 8dea119's
/// `TRITON_RUST_READER_CPUS`, section `split`): no reader waited for a core, but the rest's
/// threads did, and a batch's reads took 10-12 ms against 6-8. `0`: the callers' priority, as
/// before; 1 to 19: that niceness; anything else: the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Standing {
    AsCaller,
    Nice(i32),
    Idle,
}

fn member_standing(set: Option<&str>) -> Standing {
    match set.map(str::trim).map(str::parse::<i32>) {
        Some(Ok(0)) => Standing::AsCaller,
        Some(Ok(n)) if (1..=19).contains(&n) => Standing::Nice(n),
        _ => Standing::Idle,
    }
}

/// Puts the calling thread where `standing` says; a refusal only logs.
fn take_standing(standing: Standing) {
    // SAFETY: plain system calls on the calling thread (Linux: a thread id names one thread,
    // and `sched_setscheduler(0, ..)` is the calling thread's).
    let done = unsafe {
        match standing {
            Standing::AsCaller => return,
            Standing::Nice(nice) => {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::setpriority(libc::PRIO_PROCESS, tid, nice)
            }
            Standing::Idle => {
                let param = libc::sched_param { sched_priority: 0 };
                libc::sched_setscheduler(0, libc::SCHED_IDLE, &param)
            }
        }
    };
    if done != 0 {
        log::warn!(
            "a reader thread kept its priority ({standing:?} refused): {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Threads that take shares of their callers' jobs (see the module's note).
pub struct Crew {
    shared: Arc<Shared>,
    members: usize,
}

/// The readers of a call, the caller among them: `set` (`TRITON_RUST_READERS`) when it is a
/// positive number, else one a core.
fn readers(set: Option<&str>) -> usize {
    set.and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

impl Crew {
    /// A crew of `members` threads (none: every job runs on its caller alone) whose idle
    /// members watch for `spin` before they sleep (zero: callers waiting for their last shares
    /// sleep too), standing with the scheduler as `standing` says.
    fn standing(members: usize, spin: Duration, standing: Standing) -> Crew {
        let shared = Arc::new(Shared { spin, ..Shared::default() });
        let mut started = 0;
        for i in 0..members {
            let s = shared.clone();
            let spawned =
                std::thread::Builder::new().name(format!("reader-{i}")).spawn(move || {
                    take_standing(standing);
                    s.member()
                });
            match spawned {
                Ok(_) => started += 1,
                Err(e) => {
                    log::warn!(
                        "a reader thread did not start ({e}); {started} read beside callers"
                    );
                    break;
                }
            }
        }
        Crew { shared, members: started }
    }

    /// The process's crew: one member a core less one (the caller reads too), or
    /// `TRITON_RUST_READERS` less one (the readers of a call, the caller among them, read
    /// once), its members standing as `TRITON_RUST_READER_NICE` says (`idle`, or a niceness),
    /// watching for `TRITON_RUST_READER_SPIN_US` (none unless set: members and callers sleep
    /// at once, so the cores go to whoever has work: DLRM-v2 at a 10% cache on 8 instances
    /// served 1.20x with nothing spinning against 300 us of watching, the default before
    /// 2026-12-02, `bench/gpu/results/cache-runs/`, section `defaults`), started on first use.
    pub fn global() -> &'static Crew {
        static CREW: OnceLock<Crew> = OnceLock::new();
        CREW.get_or_init(|| {
            let cores = readers(std::env::var("TRITON_RUST_READERS").ok().as_deref());
            let spin = std::env::var("TRITON_RUST_READER_SPIN_US")
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map_or(Duration::ZERO, Duration::from_micros);
            let standing =
                member_standing(std::env::var("TRITON_RUST_READER_NICE").ok().as_deref());
            Crew::standing(cores.saturating_sub(1), spin, standing)
        })
    }

    /// Threads that read beside a caller.
    pub fn members(&self) -> usize {
        self.members
    }

    /// Runs `f(i)` for every share `i` in `0..shares`, on the calling thread and the crew,
    /// and returns once all have run; `Err` when a share panicked (the others still ran).
    pub fn run(
        &self,
        shares: usize,
        f: &(dyn Fn(usize) + Sync),
    ) -> std::result::Result<(), String> {
        if shares == 0 {
            return Ok(());
        }
        // SAFETY: only the lifetime is erased; `run` does not return while a share can be
        // claimed or is running (see `Share`).
        let run: *const Share =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Share>(f) };
        let job = Arc::new(Job {
            run,
            shares,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            finished: Mutex::new(false),
            finish: Condvar::new(),
        });
        if self.members > 0 && shares > 1 {
            let asleep = {
                let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
                state.jobs.push(job.clone());
                self.shared.posted.fetch_add(1, Ordering::Release);
                state.sleeping > 0
            };
            // woken after the lock is let go: woken while it was held, every sleeper queued on
            // it and took it one after another, each hand-over a sleep and a wake-up (a member
            // counted asleep above is already waiting, so it cannot miss this)
            if asleep {
                self.shared.wake.notify_all();
            }
        }
        job.work();
        // the shares members took: each a short read, so a spin, then a yield while members
        // watch too (what was measured served); with no watching at all (`spin` zero), asleep
        // until the member that finishes the last share says so
        let since = Instant::now();
        while job.done.load(Ordering::Acquire) < shares && !self.shared.spin.is_zero() {
            if since.elapsed() < Duration::from_micros(200) {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let mut finished = job.finished.lock().unwrap_or_else(|e| e.into_inner());
        while job.done.load(Ordering::Acquire) < shares && !*finished {
            finished = job.finish.wait(finished).unwrap_or_else(|e| e.into_inner());
        }
        drop(finished);
        if job.panicked.load(Ordering::Relaxed) {
            return Err("a share of the job panicked".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch longer than the gap between a served batch's reads (the process's crew's
    /// default before 2026-12-02).
    const SPIN: Duration = Duration::from_micros(300);

    impl Crew {
        fn new(members: usize) -> Crew {
            Crew::watching(members, SPIN)
        }
        fn watching(members: usize, spin: Duration) -> Crew {
            Crew::standing(members, spin, Standing::AsCaller)
        }
    }

    #[test]
    fn a_member_takes_the_standing_asked_and_nothing_else() {
        assert_eq!(member_standing(Some("5")), Standing::Nice(5));
        assert_eq!(member_standing(Some(" 19 ")), Standing::Nice(19));
        assert_eq!(member_standing(Some(" 0")), Standing::AsCaller);
        for v in [None, Some("idle"), Some("20"), Some("-3"), Some("low"), Some("")] {
            assert_eq!(member_standing(v), Standing::Idle, "{v:?}");
        }
        // a thread lowered to 7 reads 7 back (raising it again needs a privilege), one put in
        // SCHED_IDLE reads that class back
        let got = std::thread::spawn(|| {
            take_standing(Standing::Nice(7));
            // SAFETY: a plain query of the calling thread's priority.
            unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::getpriority(libc::PRIO_PROCESS, tid)
            }
        })
        .join()
        .expect("the thread");
        assert_eq!(got, 7);
        let class = std::thread::spawn(|| {
            take_standing(Standing::Idle);
            // SAFETY: a plain query of the calling thread's scheduling class.
            unsafe { libc::sched_getscheduler(0) }
        })
        .join()
        .expect("the thread");
        assert_eq!(class, libc::SCHED_IDLE);
    }

    #[test]
    fn a_crew_standing_idle_still_runs_every_share() {
        every_share_runs_once(Crew::standing(3, SPIN, Standing::Idle));
    }

    #[test]
    fn every_share_runs_once_whoever_calls() {
        every_share_runs_once(Crew::new(3));
    }

    #[test]
    fn every_share_runs_once_when_members_and_callers_sleep_at_once() {
        every_share_runs_once(Crew::watching(3, Duration::ZERO));
    }

    fn every_share_runs_once(crew: Crew) {
        let crew = Arc::new(crew);
        std::thread::scope(|s| {
            for caller in 0..4 {
                let crew = crew.clone();
                s.spawn(move || {
                    for round in 0..200 {
                        let shares = 1 + (caller * 7 + round) % 40;
                        let hits: Vec<AtomicUsize> =
                            (0..shares).map(|_| AtomicUsize::new(0)).collect();
                        crew.run(shares, &|i| {
                            hits[i].fetch_add(1, Ordering::Relaxed);
                        })
                        .unwrap();
                        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                    }
                });
            }
        });
    }

    #[test]
    fn readers_are_one_a_core_unless_set() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(readers(Some("8")), 8);
        assert_eq!(readers(Some(" 3 ")), 3);
        for unset in [None, Some("0"), Some("many"), Some("")] {
            assert_eq!(readers(unset), cores, "{unset:?}");
        }
    }

    #[test]
    fn a_crew_that_slept_wakes_for_the_next_job() {
        let crew = Crew::new(2);
        let n = AtomicUsize::new(0);
        crew.run(8, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        std::thread::sleep(SPIN * 10); // every member asleep
        crew.run(8, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!(n.load(Ordering::Relaxed), 16);
    }

    #[test]
    fn a_panicking_share_is_an_error_and_the_rest_still_run() {
        let crew = Crew::new(2);
        let n = AtomicUsize::new(0);
        let got = crew.run(10, &|i| {
            if i == 3 {
                panic!("share 3");
            }
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert!(got.is_err());
        assert_eq!(n.load(Ordering::Relaxed), 9);
    }

    #[test]
    fn no_members_runs_on_the_caller() {
        let crew = Crew::new(0);
        let n = AtomicUsize::new(0);
        crew.run(5, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!((crew.members(), n.load(Ordering::Relaxed)), (0, 5));
    }
}
