//! Embedding store throughput on the CPU: the host tier alone, and the full lookup path
//! (CPU cache in front of the host tier) at several cache hit rates. Every figure is
//! printed next to the host-tier figure from the same run, as a ratio.
//!
//!   cargo bench --bench embedding_store [-- --rows N --dim D --seconds S]
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use triton_rust_embedding::cache::{CacheTier, HostCache};
use triton_rust_embedding::table::{write_table, VectorType};
use triton_rust_embedding::{EmbeddingStore, StoreConfig, TableConfig};

fn arg(name: &str, default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `f` on batches for about `secs` on `threads` threads; returns keys per second.
fn rate(
    threads: usize,
    secs: f64,
    batch: usize,
    f: impl Fn(&mut rand::rngs::SmallRng, &mut [i64], &mut [f32]) + Sync,
    dim: usize,
) -> f64 {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let done: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                s.spawn(move || {
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64 + 1);
                    let mut keys = vec![0i64; batch];
                    let mut out = vec![0f32; batch * dim];
                    let mut n = 0;
                    while Instant::now() < deadline {
                        f(&mut rng, &mut keys, &mut out);
                        n += batch;
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    done as f64 / secs
}

fn main() {
    let rows = arg("--rows", 2_000_000.0) as usize;
    let dim = arg("--dim", 128.0) as usize;
    let secs = arg("--seconds", 2.0);
    let batch = 4096;
    let dir = std::env::temp_dir().join(format!("trt-bench-store-{}", std::process::id()));
    let keys: Vec<i64> = (0..rows as i64).collect();
    let vecs: Vec<f32> = (0..rows * dim).map(|i| (i % 1000) as f32 * 1e-3).collect();
    write_table(&dir, &keys, bytemuck::cast_slice(&vecs), dim, VectorType::F32).unwrap();
    drop(vecs);
    let cache_ratio = 0.05;
    let store = EmbeddingStore::open(
        StoreConfig {
            cache_ratio,
            replicate_share: 0.0,
            ..StoreConfig::with_tables(vec![TableConfig {
                name: "t".into(),
                dim,
                path: Some(dir.clone()),
                format: None,
                default_value: 0.0,
            }])
        },
        None,
    )
    .unwrap();
    let mem = store.host_memory(0);
    println!(
        "table: {rows} rows x dim {dim} (fp32) = {:.2} GB; host tier holds {:.3}x the raw bytes (index {:.1} MB)",
        mem.raw as f64 / 1e9,
        mem.ratio(),
        mem.index as f64 / 1e6
    );
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let no_cache = store.attach_caches_none();
    let host_rate = rate(
        threads,
        secs,
        batch,
        |rng, k, out| {
            for x in k.iter_mut() {
                *x = rng.gen_range(0..rows as i64);
            }
            no_cache.lookup(0, k, out).unwrap();
        },
        dim,
    );
    println!("{threads} threads, batches of {batch} keys, {secs} s per figure");
    println!("{:<38} {:>14} {:>10} {:>9}", "path", "keys/s", "GB/s", "vs host");
    let gbs = |r: f64| r * dim as f64 * 4.0 / 1e9;
    println!(
        "{:<38} {:>14.0} {:>10.2} {:>9}",
        "host tier only (uniform keys)",
        host_rate,
        gbs(host_rate),
        "1.00x"
    );

    // Cache in front of the host tier: a key is hot (from the cache's worth of keys) with
    // probability p, else uniform over the table.
    let inst = store
        .attach_caches(&|geo| Ok(Arc::new(HostCache::new(geo)) as Arc<dyn CacheTier>))
        .unwrap();
    let hot = (rows as f64 * cache_ratio * 0.8) as i64; // fits the cache with room for set conflicts
    let warm: Vec<i64> = (0..hot).collect();
    for part in warm.chunks(batch) {
        let mut out = vec![0f32; part.len() * dim];
        inst.lookup(0, part, &mut out).unwrap();
    }
    for p in [0.5, 0.8, 0.95, 0.99, 1.0] {
        let before = store.counters(0);
        let (h0, k0) = (
            before.cache_hits.load(std::sync::atomic::Ordering::Relaxed),
            before.keys.load(std::sync::atomic::Ordering::Relaxed),
        );
        let r = rate(
            threads,
            secs,
            batch,
            |rng, k, out| {
                for x in k.iter_mut() {
                    *x = if rng.gen::<f64>() < p {
                        rng.gen_range(0..hot)
                    } else {
                        rng.gen_range(0..rows as i64)
                    };
                }
                inst.lookup(0, k, out).unwrap();
            },
            dim,
        );
        let c = store.counters(0);
        let hits = c.cache_hits.load(std::sync::atomic::Ordering::Relaxed) - h0;
        let ks = c.keys.load(std::sync::atomic::Ordering::Relaxed) - k0;
        println!(
            "{:<38} {:>14.0} {:>10.2} {:>8.2}x",
            format!("cpu cache + host, hit rate {:.3}", hits as f64 / ks as f64),
            r,
            gbs(r),
            r / host_rate
        );
    }
    // Zipf keys (recommender traffic: hot keys repeat within a batch), without a cache
    // and with one; the key generation (a search of the Zipf table) is part of the figure
    let zipf = triton_rust_embedding::Zipf::new(rows, 1.05);
    for (label, with_cache) in
        [("host only, Zipf 1.05 keys", false), ("cpu cache + host, Zipf 1.05 keys", true)]
    {
        let r = rate(
            threads,
            secs,
            batch,
            |rng, k, out| {
                for x in k.iter_mut() {
                    // spread the hot ranks over the table (a coprime multiplier)
                    *x = (zipf.rank(rng.gen::<f64>()) as i64 * 2_654_435_761) % rows as i64;
                }
                if with_cache { inst.lookup(0, k, out) } else { no_cache.lookup(0, k, out) }
                    .unwrap();
            },
            dim,
        );
        println!("{:<38} {:>14.0} {:>10.2} {:>8.2}x", label, r, gbs(r), r / host_rate);
    }
    drop(inst);
    drop(no_cache);
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}
