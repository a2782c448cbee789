//! Mappings of files that may be cut under us. A table file truncated while it is mapped (a
//! deploy script copying a new table over the old one does exactly that) leaves pages past its
//! new end, and the first read of one raises SIGBUS, which ends tritonserver and every model it
//! serves. A guarded mapping's range is listed here; on SIGBUS inside it, the handler maps a
//! page of zeros over the faulting page, marks the mapping cut and returns, so the read
//! completes (with zeros) and its reader learns afterwards, from [`Guard::cut`], that what it
//! read is not the file it loaded. A SIGBUS anywhere else goes to the action that was there
//! before (the default one ends the process, as without us).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// How many mappings can be guarded at once; past that a mapping is left unguarded (logged).
const SLOTS: usize = 4096;

static CLAIMED: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
/// 0: the slot guards nothing (set last when a slot is taken, first when it is freed).
static ENDS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static CUT: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();
/// The SIGBUS action before ours, written once before ours is installed.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// One guarded range; unguarded when dropped (drop it before the mapping is unmapped).
pub struct Guard {
    slot: Option<usize>,
}

impl Guard {
    /// Guards `len` bytes from `start` (a mapping this process holds).
    pub fn new(start: *const u8, len: usize) -> Guard {
        if len == 0 || !install() {
            return Guard { slot: None };
        }
        let slot = (0..SLOTS).find(|&i| {
            CLAIMED[i].compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        });
        match slot {
            Some(i) => {
                CUT[i].store(false, Ordering::Relaxed);
                STARTS[i].store(start as usize, Ordering::Relaxed);
                ENDS[i].store(start as usize + len, Ordering::Release);
            }
            None => log::warn!(
                "more than {SLOTS} file mappings at once: a file cut while mapped past that may end the process"
            ),
        }
        Guard { slot }
    }

    /// Whether a read of the range met a page that is no longer in its file (the file was
    /// cut) and read zeros in its place.
    pub fn cut(&self) -> bool {
        self.slot.is_some_and(|i| CUT[i].load(Ordering::Acquire))
    }

    /// Whether the range is guarded (false where no handler could be installed).
    pub fn active(&self) -> bool {
        self.slot.is_some()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            ENDS[i].store(0, Ordering::Release);
            STARTS[i].store(0, Ordering::Relaxed);
            CLAIMED[i].store(false, Ordering::Release);
        }
    }
}

/// Installs the handler once; false where the system refused it.
fn install() -> bool {
    INSTALL.call_once(|| {
        // SAFETY: sysconf only reads a system constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: sigaction with a zeroed (empty) action struct only reads the current action
        // into `old`; then ours is set, a plain function of the SA_SIGINFO signature.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                log::warn!("cannot read the SIGBUS action: a table file cut while mapped will end the process");
                return;
            }
            let _ = PREVIOUS.set(old);
            let mut ours: libc::sigaction = std::mem::zeroed();
            ours.sa_sigaction = on_sigbus as *const () as usize;
            ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut ours.sa_mask);
            if libc::sigaction(libc::SIGBUS, &ours, std::ptr::null_mut()) != 0 {
                log::warn!("cannot install a SIGBUS handler: a table file cut while mapped will end the process");
                return;
            }
        }
        INSTALLED.store(true, Ordering::Release);
    });
    INSTALLED.load(Ordering::Acquire)
}

/// The handler: only atomics, `mmap` and `sigaction` (system calls), no allocation, no lock.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel hands a valid siginfo for a SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = PAGE.load(Ordering::Relaxed);
    for i in 0..SLOTS {
        let end = ENDS[i].load(Ordering::Acquire);
        if end == 0 || addr >= end || addr < STARTS[i].load(Ordering::Relaxed) {
            continue;
        }
        let at = addr & !(page - 1);
        // SAFETY: the page lies inside a mapping this process holds and guards; a private
        // anonymous page of zeros replaces it (MAP_FIXED), read-only as the mapping was.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            CUT[i].store(true, Ordering::Release);
            return;
        }
        break;
    }
    // not ours: what was there before
    match PREVIOUS.get() {
        Some(prev)
            if prev.sa_sigaction != libc::SIG_DFL
                && prev.sa_sigaction != libc::SIG_IGN
                && prev.sa_flags & libc::SA_SIGINFO != 0 =>
        {
            // SAFETY: the previous handler was installed with SA_SIGINFO: this signature.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(prev.sa_sigaction) };
            f(sig, info, ctx)
        }
        Some(prev) if prev.sa_sigaction != libc::SIG_DFL && prev.sa_sigaction != libc::SIG_IGN => {
            // SAFETY: a handler installed without SA_SIGINFO takes the signal number only.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev.sa_sigaction) };
            f(sig)
        }
        prev => {
            // the default action: put it back and return; the read faults again and ends the
            // process as it would have without us
            let dfl = prev.copied().unwrap_or_else(|| {
                // SAFETY: an all-zero sigaction is SIG_DFL with an empty mask.
                unsafe { std::mem::zeroed() }
            });
            // SAFETY: sigaction is async-signal-safe.
            unsafe { libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut()) };
        }
    }
}
