//! The cache's two policies (`gpucache_policy`: LRU and LFU) on one table, side by side, on the
//! CPU cache, whose every hit and insert the GPU cache repeats (`gpu_cache_check`'s policy check):
//! batches of Zipf keys looked up, their distinct misses inserted as the store fills them.
//!
//! Two streams of the same law, each in windows of `--window` batches. The steady one keeps
//! the same keys hot throughout; the figure to reach is the hit rate of a cache holding each
//! set's most frequent keys (computed from the law). In the shifted one, halfway through,
//! popularity moves to other keys (rank r becomes a new key): the case LFU's counts, which
//! never decay, are not made for.
//!
//! Then LFU on the steady stream with its hits stamped as `gpucache_hit_stamp_every` has the GPU's
//! pooled probes stamp them (`HitStamps`): every hit, one in 8 (LFU adding 8), one in 8 with the
//! counts exact below a threshold, none: each one's hit rate over the last windows and the stamps
//! it wrote a hit (what the GPU's stamps cost is in their number).
//!
//! ```text
//! cargo build --release -p triton_rust_embedding --example cache_policy_sim
//! target/release/examples/cache_policy_sim [--rows 1000000] [--cache 0.05] [--alpha 1.05]
//!     [--batches 2000] [--batch 4096] [--window 200]
//! ```
use rand::{Rng, SeedableRng};
use triton_rust_embedding::cache::{
    CacheGeometry, CachePolicy, CacheTier, HitStamps, HostCache, WAYS,
};
use triton_rust_embedding::{mix64, Zipf};

mod common;
use common::arg;

/// The key of rank `r` in popularity era `era`: ranks spread over the key space, each era its own.
fn key(r: usize, era: u64) -> i64 {
    (mix64((r as i64).wrapping_mul(7).wrapping_add(1 + (era as i64) * 1_000_003)) >> 1) as i64
}

fn main() {
    let rows: usize = arg("--rows", 1_000_000);
    let share: f64 = arg("--cache", 0.05);
    let alpha: f64 = arg("--alpha", 1.05);
    let batches: usize = arg("--batches", 2000);
    let batch: usize = arg("--batch", 4096);
    let window: usize = arg("--window", 200).max(1);
    let geo = CacheGeometry::for_rows((rows as f64 * share).ceil() as usize, 1);
    let zipf = Zipf::new(rows, alpha);
    // the law's probabilities, and the best a set-associative cache can do: each set's most
    // frequent keys (ranks come in order of probability)
    let z: f64 = (1..=rows).map(|r| (r as f64).powf(-alpha)).sum();
    let mut per_set = vec![0usize; geo.sets];
    let mut best = 0.0;
    for r in 0..rows {
        let s = geo.set_of(key(r, 0));
        if per_set[s] < WAYS {
            per_set[s] += 1;
            best += ((r + 1) as f64).powf(-alpha) / z;
        }
    }
    let top: f64 = (0..geo.capacity().min(rows)).map(|r| ((r + 1) as f64).powf(-alpha) / z).sum();
    println!(
        "one table of {rows} rows, Zipf({alpha}), a cache of {} slots ({:.1}%, {} sets of {WAYS}); batches of {batch} keys, \
         their distinct misses inserted; windows of {window} batches ({:.1} lookups per row each)",
        geo.capacity(),
        100.0 * geo.capacity() as f64 / rows as f64,
        geo.sets,
        (window * batch) as f64 / rows as f64
    );
    println!(
        "the hottest keys' rate (stationary): {top:.4}; each set's most frequent keys (the best a set-associative cache can do): {best:.4}"
    );
    // the stream's batches through `cache`, its distinct misses inserted: the hit rate per window
    let run = |cache: &HostCache, shift_at: usize| -> Vec<f64> {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(46);
        let mut out = vec![0f32; batch];
        let (mut hits, mut looked, mut windows) = (0usize, 0usize, Vec::new());
        for b in 0..batches {
            let era = u64::from(b >= shift_at);
            let keys: Vec<i64> = (0..batch).map(|_| key(zipf.rank(rng.gen()), era)).collect();
            let missed = cache.lookup(&keys, &mut out).expect("lookup");
            hits += keys.len() - missed.len();
            looked += keys.len();
            let mut seen = std::collections::HashSet::new();
            let fill: Vec<i64> =
                missed.iter().map(|&i| keys[i]).filter(|k| seen.insert(*k)).collect();
            cache.insert(&fill, &vec![0.0; fill.len()]).expect("insert");
            if (b + 1) % window == 0 {
                windows.push(hits as f64 / looked as f64);
                (hits, looked) = (0, 0);
            }
        }
        windows
    };
    for (stream, shift_at) in [("steady", usize::MAX), ("shifted", batches / 2)] {
        let mut rates: Vec<Vec<f64>> = Vec::new();
        for policy in [CachePolicy::Lru, CachePolicy::lfu_for(rows, geo.capacity())] {
            let cache = HostCache::new(geo.with_policy(policy));
            rates.push(run(&cache, shift_at));
        }
        println!(
            "\n{stream} stream{}: hit rate per window",
            if shift_at < batches {
                format!(" (popularity moves to other keys after batch {shift_at})")
            } else {
                String::new()
            }
        );
        println!("{:>8} {:>8} {:>8} {:>8}", "batches", "lru", "lfu", "lfu-lru");
        for (w, (lru, lfu)) in rates[0].iter().zip(&rates[1]).enumerate() {
            println!("{:>8} {lru:>8.4} {lfu:>8.4} {:>+8.4}", (w + 1) * window, lfu - lru);
        }
    }
    // LFU's hits stamped as the GPU's pooled probes may stamp them, on the steady stream
    println!("\nsteady stream, LFU, hits stamped as gpucache_hit_stamp_every has them (the last quarter's windows)");
    println!("{:>32} {:>9} {:>9} {:>17}", "hits stamped", "hit rate", "vs every", "stamps a hit");
    let last = |w: &[f64]| {
        let q = &w[w.len() - (w.len() / 4).max(1)..];
        q.iter().sum::<f64>() / q.len() as f64
    };
    let mut every_rate = None;
    for (name, every, exact_below) in [
        ("every hit", 1, 0),
        ("one in 8 (GPU's)", 8, 0),
        ("one in 8, exact below 16", 8, 16),
        ("one in 8, exact below 64", 8, 64),
        ("one in 8, exact below 256", 8, 256),
        ("none", 0, 0),
    ] {
        let policy = CachePolicy::lfu_for(rows, geo.capacity());
        let cache = HostCache::new(geo.with_policy(policy))
            .with_hit_stamps(HitStamps { every, exact_below });
        let rate = last(&run(&cache, usize::MAX));
        let hits = cache.counters().hits.max(1);
        let base = *every_rate.get_or_insert(rate);
        println!(
            "{name:>32} {rate:>9.4} {:>+9.4} {:>17.3}",
            rate - base,
            cache.stamps_written() as f64 / hits as f64
        );
    }
}
