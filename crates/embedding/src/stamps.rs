//! Which of a lookup's hits stamp their slot (`gpucache_hit_stamp_every`): the rule the GPU's
//! pooled probes follow (`stamp_hit` in `crates/cuda/src/kernels/probe.cu`), which the CPU cache
//! can follow too, to measure what it does to the policy (`cache_policy_sim`).

use crate::keys::mix64;

/// Which hits a lookup stamps: every hit (the default, `every` 1), or one in `every` (a power
/// of two), chosen by a hash of the key's place in the lookup and the epoch as the GPU's pooled
/// probes choose them (`gpucache_hit_stamp_every`), LFU counting `every` uses at once; an LFU
/// count below `exact_below` counts each hit (a variant for the simulation only: the GPU's,
/// [`HitStamps::gpu`], samples every count).
#[derive(Clone, Copy, Debug)]
pub struct HitStamps {
    pub every: u64,
    pub exact_below: u64,
}

impl HitStamps {
    /// The rule the GPU's pooled probes follow for `gpucache_hit_stamp_every: every`: every
    /// count sampled. Keeping LFU's counts exact below `2 × every` held every hit's rate in the
    /// CPU cache's simulation, but served on an H200 it neither held the 10% cache's hit rate
    /// (0.9506 against 0.9502 sampling all) nor kept the stamps' saving with 99% cached (9.00
    /// against 9.86 M pairs/s), so the GPU does not follow it (docs/embedding-store.md).
    pub fn gpu(every: u64) -> HitStamps {
        HitStamps { every, exact_below: 0 }
    }

    /// The stamp a hit of the key at place `i` of a lookup at `epoch` leaves on a slot stamped
    /// `old` (LFU's count, or LRU's epoch: `lfu` false) (the GPU's `stamp_hit`), and whether it wrote one.
    pub fn stamp(self, lfu: bool, old: u64, i: usize, epoch: u64) -> (u64, bool) {
        if lfu && (self.every == 1 || old < self.exact_below) {
            return (old.saturating_add(1), true);
        }
        let pick = (i as u64).wrapping_add(epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        if self.every == 0 || mix64(pick as i64) & (self.every - 1) != 0 {
            return (old, false);
        }
        match lfu {
            true => (old.saturating_add(self.every), true),
            false => (old.max(epoch), true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HitStamps;

    #[test]
    fn every_hit_counts_one_and_lru_takes_the_newest_epoch() {
        let every = HitStamps::gpu(1);
        for i in 0..100 {
            assert_eq!(every.stamp(true, 40, i, 7), (41, true));
            assert_eq!(every.stamp(false, 3, i, 7), (7, true));
        }
    }

    #[test]
    fn one_in_eight_counts_eight_at_a_time_the_low_counts_too_on_the_gpu() {
        // the simulation's variant: below 16 each hit counts one, whichever place it has
        let exact = HitStamps { every: 8, exact_below: 16 };
        for i in 0..100 {
            assert_eq!(exact.stamp(true, 15, i, 3), (16, true));
        }
        // the GPU's samples every count: a count of 3 moves by 8 or not at all
        let s = HitStamps::gpu(8);
        assert_eq!(s.exact_below, 0);
        let low: Vec<u64> = (0..800).map(|i| s.stamp(true, 3, i, 3).0).collect();
        assert!(low.iter().all(|&c| c == 3 || c == 11));
        assert!(low.iter().filter(|&&c| c == 11).count().abs_diff(100) < 40);
        // from 16 on, both: one place in 8 (by the hash, epoch by epoch) counts 8, one a hit on
        // average
        for s in [s, exact] {
            one_in_eight_above_sixteen(s);
        }
    }

    fn one_in_eight_above_sixteen(s: HitStamps) {
        let (mut added, mut wrote, n) = (0u64, 0u64, 80_000usize);
        for i in 0..n {
            let (c, w) = s.stamp(true, 16, i, 1 + (i / 1000) as u64);
            added += c - 16;
            wrote += u64::from(w);
            assert!(c == 16 || c == 24, "{c}");
        }
        let per_hit = added as f64 / n as f64;
        assert!((per_hit - 1.0).abs() < 0.03, "{per_hit}");
        assert!((wrote as f64 / n as f64 - 0.125).abs() < 0.005);
        // LRU: the chosen eighth write the epoch, the rest leave the stamp
        let lru: Vec<u64> = (0..800).map(|i| s.stamp(false, 2, i, 9).0).collect();
        assert!(lru.iter().all(|&t| t == 2 || t == 9));
        assert!(lru.iter().filter(|&&t| t == 9).count().abs_diff(100) < 40);
    }

    #[test]
    fn none_stamps_nothing() {
        let s = HitStamps::gpu(0);
        for i in 0..100 {
            assert_eq!(s.stamp(true, 0, i, 5), (0, false));
            assert_eq!(s.stamp(false, 1, i, 5), (1, false));
        }
    }
}
