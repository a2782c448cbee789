//! Which CPUs a thread may run on: the reader crew's own CPUs, the rest of the process kept
//! off them (`TRITON_RUST_READER_CPUS`, see [`crate::Crew::global`]).
//!
//! Why: in `SCHED_IDLE` a reader gives its core to any other thread that wakes, and Linux
//! places a waking thread on a core that runs only such readers as readily as on an idle one;
//! the reader taken off, mid-share, waits on that core's queue until the thread sleeps again
//! (a network's wait for the GPU holds its core for milliseconds), while its batch waits for
//! that share. Served (MLPerf DLRM-v2 at a 10% GPU cache, one H200), readers waited runnable
//! for 3-5.5 cores' worth on average while the host had 2.5-3.5 cores idle
//! (`bench/gpu/results/cache-runs/`). With CPUs of their own, no thread of the server wakes on
//! a reader's core.

use std::io;

/// The CPUs a list such as `6-15` or `0,2,8-11` names, in order, each once; `Err` says what
/// is wrong with it.
pub fn parse_cpu_list(list: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim) {
        let num = |s: &str| {
            s.trim().parse::<usize>().map_err(|_| format!("'{s}' in '{list}' is not a CPU number"))
        };
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(part)?, num(part)?),
        };
        if first > last || last >= 4096 {
            return Err(format!("'{part}' in '{list}' is not a range of CPUs"));
        }
        for c in first..=last {
            if !cpus.contains(&c) {
                cpus.push(c);
            }
        }
    }
    Ok(cpus)
}

/// The CPUs the calling thread may run on.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity fills it for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

/// The reader crew's CPUs and the rest of the process's.
#[derive(Debug, PartialEq, Eq)]
pub struct CpuSplit {
    pub readers: Vec<usize>,
    pub rest: Vec<usize>,
}

/// `list`'s CPUs for the readers, the others of `allowed` for everything else; refused unless
/// every listed CPU is allowed and at least one allowed CPU is left.
pub fn plan_split(list: &str, allowed: &[usize]) -> Result<CpuSplit, String> {
    let readers = parse_cpu_list(list)?;
    if readers.is_empty() {
        return Err(format!("'{list}' names no CPU"));
    }
    if let Some(c) = readers.iter().find(|c| !allowed.contains(c)) {
        return Err(format!("CPU {c} of '{list}' is not one this process may run on {allowed:?}"));
    }
    let rest: Vec<usize> = allowed.iter().copied().filter(|c| !readers.contains(c)).collect();
    if rest.is_empty() {
        return Err(format!("'{list}' leaves the rest of the process no CPU of {allowed:?}"));
    }
    Ok(CpuSplit { readers, rest })
}

/// Thread `tid` (0: the calling thread) kept to `cpus`.
pub fn set_affinity(tid: i32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set, filled with CPU numbers below CPU_SETSIZE
    // (parse_cpu_list refuses larger); sched_setaffinity only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Every thread of the process kept to `cpus` (threads started later inherit their starter's
/// CPUs); how many were moved. Twice over the process's threads, so that one started while the
/// first pass ran, by a thread not yet moved, is moved too. A thread that ended meanwhile is
/// passed over.
pub fn keep_process_to(cpus: &[usize]) -> io::Result<usize> {
    let mut moved = std::collections::HashSet::new();
    for _ in 0..2 {
        for entry in std::fs::read_dir("/proc/self/task")? {
            let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            match set_affinity(tid, cpus) {
                Ok(()) => {
                    moved.insert(tid);
                }
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(moved.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_read_as_linux_writes_them() {
        assert_eq!(parse_cpu_list("6-9").unwrap(), vec![6, 7, 8, 9]);
        assert_eq!(parse_cpu_list(" 0, 2 ,8-9,2").unwrap(), vec![0, 2, 8, 9]);
        assert_eq!(parse_cpu_list("3").unwrap(), vec![3]);
        for bad in ["", "a-3", "5-2", "1,,2", "0-5000", "-1"] {
            let why = parse_cpu_list(bad).unwrap_err();
            assert!(why.contains(bad.trim()), "{bad:?}: {why}");
        }
    }

    #[test]
    fn a_split_leaves_the_rest_a_cpu_and_takes_only_allowed_ones() {
        let allowed: Vec<usize> = (0..16).collect();
        let s = plan_split("10-15", &allowed).unwrap();
        assert_eq!(s.readers, vec![10, 11, 12, 13, 14, 15]);
        assert_eq!(s.rest, (0..10).collect::<Vec<_>>());
        assert!(plan_split("0-15", &allowed).unwrap_err().contains("no CPU"));
        assert!(plan_split("14-17", &allowed).unwrap_err().contains("CPU 16"));
        assert!(plan_split("x", &allowed).unwrap_err().contains("not a CPU number"));
    }

    #[test]
    fn a_thread_kept_to_a_cpu_runs_only_there() {
        let allowed = allowed_cpus().unwrap();
        let last = *allowed.last().unwrap();
        let got = std::thread::spawn(move || {
            set_affinity(0, &[last]).unwrap();
            allowed_cpus().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(got, vec![last]);
        // the test's own thread untouched
        assert_eq!(allowed_cpus().unwrap(), allowed);
    }
}
