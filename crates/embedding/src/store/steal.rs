//! A call's misses read in shares whose unread ends others take: each share is cut into blocks
//! of `BLOCK` rows; its reader takes blocks from the front, and a reader with nothing of its own
//! left takes them from the back of the share with the most left. So a reader the system takes
//! off its core holds up one block, not the rest of its share, while the others keep the long
//! runs of a fixed share (one claim a block, on that share's own word, not one cursor for all).
//!
//! Why: with the crew's members in `SCHED_IDLE` (`triton_rust_os::Crew`), any other thread that
//! wakes takes a member's core at once; served, a call's longest share then took 2.7-3.1 ms
//! against 1.0-1.4 ms, and a batch's reads 4.6-5.3 ms against 3.6-4.4
//! (`bench/gpu/results/cache-runs/`, section `idle`). Claims of 512 rows off one cursor for all
//! (commit eb2b923) had read fewer rows a busy core than fixed shares before.
//! `TRITON_RUST_READ_STEAL=1` in the server's environment turns it on (read once); off, each
//! share is read whole by whoever takes it. Measured served (one H200, section `eight`), it did
//! not pay: a batch's reads 7.73 ms against 5.77 with fixed shares, its longest share 6.48 ms
//! against 3.30, the model 0.85x (6.77 against 7.95 M pairs/s); it stays off.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::ns_since;
use super::reads::{copy_rows, find_rows, DenseTable, GatherTimes, Src};

/// Rows a block: a claim's cost (one compare-and-swap, one uncontended lock) is under 0.1% of
/// reading them, and the prefetch pipeline refills once a block.
const BLOCK: usize = 512;

/// Whether a call's shares are read with their ends taken by others (`TRITON_RUST_READ_STEAL=1`).
pub(super) fn stealing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TRITON_RUST_READ_STEAL").is_ok_and(|v| v.trim() == "1"))
}

/// A share's unread blocks `[front, back)`, in one word: front in the low half, back in the high.
struct Ends(AtomicU64);

impl Ends {
    fn new(front: usize, back: usize) -> Ends {
        Ends(AtomicU64::new(((back as u64) << 32) | front as u64))
    }
    fn split(v: u64) -> (usize, usize) {
        ((v & 0xffff_ffff) as usize, (v >> 32) as usize)
    }
    fn left(&self) -> usize {
        let (front, back) = Ends::split(self.0.load(Ordering::Acquire));
        back.saturating_sub(front)
    }
    /// The next block from the front, or from the back (`from_back`); None when none is left.
    fn take(&self, from_back: bool) -> Option<usize> {
        let mut v = self.0.load(Ordering::Acquire);
        loop {
            let (front, back) = Ends::split(v);
            if front >= back {
                return None;
            }
            let (next, got) = if from_back {
                ((((back - 1) as u64) << 32) | front as u64, back - 1)
            } else {
                (((back as u64) << 32) | (front + 1) as u64, front)
            };
            match self.0.compare_exchange_weak(v, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(got),
                Err(now) => v = now,
            }
        }
    }
}

/// Reads the rows of `keys` (key j is batch key `missed[j]`, of table `table_of(missed[j])`)
/// into `rows` and sets `found`, on the crew and the caller, in `shares` shares whose unread
/// ends others take (see the module's note), each row stored past the CPU's caches with
/// `streaming`. Returns each table's rows read, then each table's defaults (`2 * tables.len()`
/// counts), and the readers' times.
#[allow(clippy::too_many_arguments)]
pub(super) fn read<'t>(
    tables: &[DenseTable<'t>],
    table_of: &(dyn Fn(usize) -> usize + Sync),
    missed: &[i32],
    keys: &[i64],
    rows: &mut [u8],
    found: &mut [u8],
    shares: usize,
    streaming: bool,
    t0: Instant,
) -> Result<(Vec<usize>, GatherTimes), String> {
    let n = keys.len();
    let width = rows.len() / n.max(1);
    let blocks: Vec<Mutex<(&mut [u8], &mut [u8])>> =
        rows.chunks_mut(BLOCK * width).zip(found.chunks_mut(BLOCK)).map(Mutex::new).collect();
    let per = blocks.len().div_ceil(shares.max(1)).max(1);
    let ends: Vec<Ends> = (0..blocks.len().div_ceil(per))
        .map(|s| Ends::new(s * per, ((s + 1) * per).min(blocks.len())))
        .collect();
    let counts = Mutex::new(vec![0usize; 2 * tables.len()]);
    let times = Mutex::new(GatherTimes::default());
    let read_block = |b: usize, srcs: &mut Vec<Src<'t>>, mine: &mut [usize]| {
        let (first, last) = (b * BLOCK, ((b + 1) * BLOCK).min(n));
        find_rows(tables, table_of, &missed[first..last], &keys[first..last], width, srcs, mine);
        let mut block = blocks[b].lock().unwrap_or_else(|e| e.into_inner());
        let (out, found) = &mut *block;
        copy_rows(tables, srcs, out, found, width, streaming);
    };
    let read_share = |s: usize| {
        let started = ns_since(t0);
        let (mut srcs, mut mine) = (Vec::with_capacity(BLOCK), vec![0usize; 2 * tables.len()]);
        // its own blocks from the front, then others' from the back of the share with most left
        while let Some(b) = ends[s].take(false) {
            read_block(b, &mut srcs, &mut mine);
        }
        loop {
            let most =
                (0..ends.len()).max_by_key(|&o| ends[o].left()).filter(|&o| ends[o].left() > 0);
            let Some(o) = most else { break };
            if let Some(b) = ends[o].take(true) {
                read_block(b, &mut srcs, &mut mine);
            }
        }
        if streaming {
            triton_rust_os::store_fence(); // the rows seen by whoever sees this share done
        }
        let took = ns_since(t0) - started;
        counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter_mut()
            .zip(&mine)
            .for_each(|(a, b)| *a += b);
        times.lock().unwrap_or_else(|e| e.into_inner()).add_share(started, took);
    };
    triton_rust_os::Crew::global().run(ends.len(), &read_share)?;
    Ok((
        counts.into_inner().unwrap_or_else(|e| e.into_inner()),
        times.into_inner().unwrap_or_else(|e| e.into_inner()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_is_taken_once_from_either_end() {
        let ends = Ends::new(3, 9);
        let mut got = std::collections::BTreeSet::new();
        std::thread::scope(|s| {
            let takers: Vec<_> = (0..4)
                .map(|i| {
                    let ends = &ends;
                    s.spawn(move || {
                        let mut mine = Vec::new();
                        while let Some(b) = ends.take(i % 2 == 1) {
                            mine.push(b);
                        }
                        mine
                    })
                })
                .collect();
            for t in takers {
                for b in t.join().unwrap() {
                    assert!(got.insert(b), "block {b} taken twice");
                }
            }
        });
        assert_eq!(got.into_iter().collect::<Vec<_>>(), (3..9).collect::<Vec<_>>());
        assert_eq!((ends.left(), ends.take(false), ends.take(true)), (0, None, None));
        let ends = Ends::new(0, 4);
        assert_eq!((ends.take(true), ends.take(false), ends.left()), (Some(3), Some(0), 2));
    }
}
