//! Pooling as the lookup goes, against writing every row out and pooling them (issue 66; needs
//! an NVIDIA GPU). MLPerf DLRM-v2's 26 tables of dim 128 at `--scale` of their rows, each
//! behind an LFU GPU cache of fp16 rows holding `--cache` of them, batches of `--batch`
//! samples of its hotness (214 keys a sample, every bag full) with the keys in GPU memory, as
//! a client's CUDA shared memory hands them over; keys Zipf (`--alpha`, ranks spread over each
//! table), misses read by a fetcher here as fp16 rows (as `store_dtype: fp16` tables give
//! them). Two lookups share the caches:
//! - `rows`: `BatchLookup` writes every key's row, then `Pooler::pool_fixed` sums each bag
//!   (the path served before);
//! - `slots`: the same lookup with `set_pooling`, each bag's hits summed from the slots as they
//!   are found and its misses added once they are up; with `--once 1` (the default) each
//!   missed (table, key) of a batch read once (`PoolSpec::once`), `--once 0` every miss.
//!
//! Checked on every timed batch: the two paths' pooled rows agree within one fp16 step (their
//! sums differ only in order), and the first samples' equal sums computed here. With `--index 1`
//! (the default) each cache keeps a key index and the slots path probes through it
//! (`probe_index`); `--index 0`: it reads the sets' tags (`probe_slots`). Then, on 4 more
//! batches, the slots path's probe and the rows path's scan of the tags must miss as many keys. Timed:
//! batches alternate between the paths (a fresh batch each, the same stream of keys), each
//! from the keys to its pooled rows complete, the caches filled after each as served; the
//! fetcher's time is its own line (both paths call it alike). Each path's GPU steps are timed
//! by CUDA events too (`BatchLookup::time_kernels`): the lookup or probe, the fetched rows put in
//! place, the fill, and the rows path's pooling: where a batch's GPU time goes.
//!
//!   cargo build --release -p triton_rust_embedding --features gpu --example pool_slots_check
//!   target/release/examples/pool_slots_check [--scale 0.25] [--cache 0.1] [--batch 16384] [--alpha 1.05] [--iters 20] [--warm 40] [--once 1] [--index 1]
use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use triton_rust_cuda::mem::{Bytes, BytesMut, DeviceOps};
use triton_rust_cuda::Cuda;
use triton_rust_embedding::cache::{CacheGeometry, CachePolicy, CacheTier};
use triton_rust_embedding::gpu::{
    BatchKeys, BatchLookup, FetchedRows, GpuCache, GpuInstance, KeyLayout, PoolSpec, RowFormat,
};
use triton_rust_embedding::{mix64, CacheRows, Zipf};

mod common;
use common::arg;

#[path = "common/dlrm_v2.rs"]
mod dlrm_v2;
use dlrm_v2::{DIM, HOTNESS, ROWS};

/// Rows repeat with this period (the values do not change what is timed).
const PERIOD: usize = 65_536;

/// Element j of row `key` of table `t`: a multiple of 2^-10 in [-1, 1), exact in fp16.
fn value(t: usize, key: i64, j: usize) -> f32 {
    ((((key as usize) % PERIOD) * 31 + t * 7 + j * 5) % 2048) as f32 / 1024.0 - 1.0
}

/// One path's totals over its timed batches.
#[derive(Default)]
struct Totals {
    batches: usize,
    secs: f64,
    fetch_us: u64,
    keys: usize,
    misses: usize,
    /// Rows read below the cache (the misses, or their distinct (table, key) pairs).
    read: usize,
    /// The GPU steps' event times summed (ms): the lookup or probe, the fetched rows put in
    /// place (scatter, or the open bags closed), the fill; the rows path's pooling (wall).
    lookup_ms: f64,
    place_ms: f64,
    fill_ms: f64,
    pool_ms: f64,
}

fn main() {
    let scale: f64 = arg("--scale", 0.25);
    let share: f64 = arg("--cache", 0.1);
    let batch: usize = arg("--batch", 16384);
    let alpha: f64 = arg("--alpha", 1.05);
    let iters: usize = arg("--iters", 20);
    let warm: usize = arg("--warm", 40);
    let rows: Vec<usize> =
        ROWS.iter().map(|&r| ((r as f64 * scale).round() as usize).max(1)).collect();
    let instance = GpuInstance::new(0, CacheRows::F16).expect("a GPU");
    let geos: Vec<CacheGeometry> = rows
        .iter()
        .map(|&n| {
            let geo = CacheGeometry::for_rows(((n as f64 * share).ceil() as usize).max(1), DIM);
            geo.with_policy(CachePolicy::lfu_for(n, geo.capacity()))
        })
        .collect();
    // `--index 1` (the default): each cache keeps a key index, so the slots path probes through
    // it (`probe_index`) while the rows path reads the sets' tags (`batch_lookup`)
    let index = arg("--index", 1u8) != 0;
    let caches: Vec<Arc<dyn CacheTier>> = geos
        .iter()
        .zip(&rows)
        .map(|(&g, &n)| instance.new_cache(g, if index { n } else { 0 }).expect("a cache"))
        .collect();
    let gpu: Vec<Option<&GpuCache>> =
        caches.iter().map(|c| c.as_any().downcast_ref::<GpuCache>()).collect();
    let slots: usize = geos.iter().map(|g| g.capacity()).sum();
    let width: usize = HOTNESS.iter().sum();
    let at: Vec<i32> = std::iter::once(0)
        .chain(HOTNESS.iter().scan(0i32, |a, &h| {
            *a += h as i32;
            Some(*a)
        }))
        .collect();
    let table_of: Vec<usize> =
        HOTNESS.iter().enumerate().flat_map(|(t, &h)| std::iter::repeat_n(t, h)).collect();
    println!(
        "26 tables, {} rows of dim {DIM} (scale {scale}), LFU caches of fp16 rows: {slots} slots ({:.0}% of the rows, {:.2} GB); batches of {batch} samples x {width} keys, Zipf {alpha}",
        rows.iter().sum::<usize>(),
        100.0 * slots as f64 / rows.iter().sum::<usize>() as f64,
        (slots * DIM * 2) as f64 / 1e9
    );
    let zipfs: Vec<Zipf> = rows.iter().map(|&n| Zipf::new(n, alpha)).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(66);
    let mut next_batch = || -> Vec<i64> {
        let mut keys = vec![0i64; batch * width];
        for sample in keys.chunks_exact_mut(width) {
            for (k, &t) in sample.iter_mut().zip(&table_of) {
                *k = (mix64(zipfs[t].rank(rng.gen()) as i64) as u64 % rows[t] as u64) as i64;
            }
        }
        keys
    };
    // the misses' rows, fp16, from a block of PERIOD rows per table (a copy a row)
    let block: Vec<Vec<u16>> = (0..26)
        .map(|t| {
            (0..PERIOD * DIM)
                .map(|e| half::f16::from_f32(value(t, (e / DIM) as i64, e % DIM)).to_bits())
                .collect()
        })
        .collect();
    // how many of a fetch's missed keys are distinct (table, key) pairs: the rows a fetcher
    // that read each once would read
    let distinct = std::cell::Cell::new((0usize, 0usize));
    let mut fetch = |idx: &mut [i32],
                     mkeys: &mut [i64],
                     out: FetchedRows<'_>,
                     found: &mut [u8]|
     -> Result<(), triton_rust_cuda::CudaError> {
        let FetchedRows::F16(out) = out else { panic!("fetched as fp16") };
        let seen: std::collections::HashSet<(usize, i64)> = idx
            .iter()
            .zip(mkeys.iter())
            .map(|(&i, &k)| (table_of[i as usize % width], k))
            .collect();
        let (n, d) = distinct.get();
        distinct.set((n + idx.len(), d + seen.len()));
        for (j, (&i, &key)) in idx.iter().zip(mkeys.iter()).enumerate() {
            let (t, r) = (table_of[i as usize % width], key as usize % PERIOD);
            out[j * DIM..(j + 1) * DIM].copy_from_slice(&block[t][r * DIM..(r + 1) * DIM]);
            found[j] = 1;
        }
        Ok(())
    };
    let new_lookup = || -> BatchLookup {
        let mut l = instance.batch_lookup(&gpu, DIM, RowFormat::F16).expect("batch lookup");
        l.set_fetched(RowFormat::F16);
        l.time_kernels(true).expect("events");
        l
    };
    let (mut rows_path, mut slots_path) = (new_lookup(), new_lookup());
    let spec = PoolSpec { mean: false, format: RowFormat::F16, once: arg("--once", 1u8) != 0 };
    slots_path.set_pooling(Some(spec));
    let mut pooler = instance.pooler().expect("pooler");
    let layout = KeyLayout::Fixed { width, at: &at };
    let mut d_keys = triton_rust_cuda::alloc(0, batch * width * 8).expect("keys");
    // one path's batch: (its pooled rows as fp16 bits, its times); `timed` adds to `tot`
    let mut run = |slots: bool, keys: &[i64], tot: Option<&mut Totals>| -> Vec<u16> {
        let bytes: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
        Cuda.copy(Bytes::Host(&bytes), BytesMut::Device(d_keys.view_mut())).expect("keys up");
        let view = d_keys.view();
        let lookup = if slots { &mut slots_path } else { &mut rows_path };
        let t0 = Instant::now();
        let times = lookup
            .run_keys(BatchKeys::Device(view), layout, instance.next_epoch(), &mut fetch, None)
            .expect("lookup");
        let tp = Instant::now();
        let pooled = match lookup.pooled() {
            Some(p) => p,
            None => {
                assert!(!slots, "the pooling lookup pooled");
                let r = lookup.rows(batch * width * DIM).expect("rows");
                pooler
                    .pool_fixed(&r, RowFormat::F16, DIM, width, &at, batch, false, RowFormat::F16)
                    .expect("pool")
            }
        };
        let pool_ms = tp.elapsed().as_secs_f64() * 1e3;
        let secs = t0.elapsed().as_secs_f64();
        let mut got = vec![0u8; pooled.len()];
        Cuda.copy(Bytes::Device(pooled), BytesMut::Host(&mut got)).expect("rows down");
        lookup.fill_last(instance.next_epoch()).expect("fill");
        if let Some(t) = tot {
            let k = lookup.kernel_times().expect("events").expect("timed");
            t.lookup_ms += k.lookup_ms as f64;
            t.place_ms += k.place_ms.unwrap_or(0.0) as f64;
            t.fill_ms += k.fill_ms.unwrap_or(0.0) as f64;
            t.pool_ms += if slots { 0.0 } else { pool_ms };
            t.batches += 1;
            t.secs += secs;
            t.fetch_us += times.fetch_us - times.keys_down_us;
            t.keys += times.keys;
            t.misses += times.misses;
            t.read += times.read;
        }
        got.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
    };
    // warm the caches to their stationary share, through both paths
    let t0 = Instant::now();
    for i in 0..warm {
        let keys = next_batch();
        run(i % 2 == 1, &keys, None);
    }
    println!("caches warmed by {warm} batches in {:.1} s", t0.elapsed().as_secs_f64());
    let (mut by_rows, mut by_slots) = (Totals::default(), Totals::default());
    let mut worst = (0f32, 0f32);
    for i in 0..2 * iters {
        let keys = next_batch();
        let slots = i % 2 == 1;
        let got = run(slots, &keys, Some(if slots { &mut by_slots } else { &mut by_rows }));
        // the same batch through the other path, untimed: one fp16 step apart at most
        let other = run(!slots, &keys, None);
        for (a, b) in got.iter().zip(&other) {
            let (a, b) = (half::f16::from_bits(*a).to_f32(), half::f16::from_bits(*b).to_f32());
            worst.0 = worst.0.max((a - b).abs() / b.abs().max(1.0));
        }
        // the first samples against sums here (fp32 sums of the fp16 rows, rounded to fp16)
        for b in 0..4 {
            for t in 0..26 {
                for j in 0..DIM {
                    let s: f32 = (at[t]..at[t + 1])
                        .map(|p| {
                            let key = keys[b * width + p as usize];
                            half::f16::from_f32(value(t, key, j)).to_f32()
                        })
                        .sum();
                    let want = half::f16::from_f32(s).to_f32();
                    let g = half::f16::from_bits(got[(b * 26 + t) * DIM + j]).to_f32();
                    worst.1 = worst.1.max((g - want).abs() / want.abs().max(1.0));
                }
            }
        }
    }
    assert!(
        worst.0 <= 2e-3 && worst.1 <= 2e-3,
        "pooled rows off: between the paths {}, against the sums {}",
        worst.0,
        worst.1
    );
    println!(
        "checked: the paths agree within {:.1e} (relative, fp16 out), the sums here within {:.1e}",
        worst.0, worst.1
    );
    // the probe against the sets' tags: the same keys through the slots path, then the rows
    // path, before either fills (a hit's stamp moves no key), so both must miss as many keys
    let probe = if index { "probe_index" } else { "probe_slots" };
    let mut checked_misses = Vec::new();
    for _ in 0..4 {
        let keys = next_batch();
        let bytes: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
        Cuda.copy(Bytes::Host(&bytes), BytesMut::Device(d_keys.view_mut())).expect("keys up");
        let mut misses = [0usize; 2];
        for (m, lookup) in misses.iter_mut().zip([&mut slots_path, &mut rows_path]) {
            let keys = BatchKeys::Device(d_keys.view());
            *m = lookup
                .run_keys(keys, layout, instance.next_epoch(), &mut fetch, None)
                .expect("lookup")
                .misses;
        }
        assert_eq!(misses[0], misses[1], "{probe} and the tags' scan missed different counts");
        checked_misses.push(misses[0]);
        for lookup in [&mut slots_path, &mut rows_path] {
            lookup.fill_last(instance.next_epoch()).expect("fill");
        }
    }
    println!(
        "checked: {probe} (the slots path) and batch_lookup's scan of the tags missed as many keys in each of 4 batches before a fill: {checked_misses:?}"
    );
    for (name, t) in
        [("rows (written out, then pooled)", &by_rows), ("slots (pooled as looked up)", &by_slots)]
    {
        let per = t.secs / t.batches as f64;
        let fetch = t.fetch_us as f64 / t.batches as f64 / 1e3;
        println!(
            "{name:34}: {:7.3} ms a batch, {:7.3} ms without the fetcher's {fetch:.3} ms; hit rate {:.4}; {:.2} M samples/s",
            per * 1e3,
            per * 1e3 - fetch,
            1.0 - t.misses as f64 / t.keys as f64,
            batch as f64 / per / 1e6
        );
        let b = t.batches as f64;
        println!(
            "{:34}  GPU steps a batch (events): lookup {:.3} ms, fetched rows put in place {:.3} ms, fill {:.3} ms; pooling after (wall) {:.3} ms",
            "",
            t.lookup_ms / b,
            t.place_ms / b,
            t.fill_ms / b,
            t.pool_ms / b
        );
    }
    let (r, s) = (by_rows.secs / by_rows.batches as f64, by_slots.secs / by_slots.batches as f64);
    let (fr, fs) = (
        by_rows.fetch_us as f64 / by_rows.batches as f64 / 1e6,
        by_slots.fetch_us as f64 / by_slots.batches as f64 / 1e6,
    );
    // (with --once 1 the slots path fetches distinct keys only: this counts the rows path's too)
    let (n, d) = distinct.get();
    println!(
        "missed keys fetched (both paths): {n}, of them distinct (table, key) pairs within their fetch call: {d} ({:.1}%)",
        100.0 * d as f64 / n.max(1) as f64
    );
    println!(
        "timed batches, slots path (--once {}): {} misses, {} rows read below the cache ({:.1}%)",
        u8::from(spec.once),
        by_slots.misses,
        by_slots.read,
        100.0 * by_slots.read as f64 / by_slots.misses.max(1) as f64
    );
    println!(
        "slots / rows: {:.2}x as fast a batch, {:.2}x without the fetcher",
        r / s,
        (r - fr) / (s - fs)
    );
}
