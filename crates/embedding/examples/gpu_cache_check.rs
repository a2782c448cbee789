//! GPU embedding cache check and microbenchmark (needs an NVIDIA GPU).
//!
//! 1. Policy equivalence: the same sequence of lookups and inserts (Zipf keys, a cache
//!    smaller than the key space) is applied to the CPU cache and the GPU cache; the
//!    hit/miss pattern of every lookup, every row returned, and the final insertion and
//!    eviction counts must be identical. Under each policy: LRU and LFU.
//! 2. Shared caches under concurrency: several threads, each with its own lookup buffers
//!    on the caches' one queue (as the instances of a model sharing one GPU cache), look
//!    up and fill the same slots at once, with a cache far smaller than the keys so sets
//!    are rewritten all the time; every row every lookup returns must be its key's row.
//!    Three times: slots of fp32 rows looked up as fp32, slots of fp16 rows looked up as
//!    fp16, whose rows must be the fp32 rows rounded to nearest even, bit for bit, and fp16
//!    rows under LFU (the fill admits and evicts by count).
//! 3. Hit path speed: a table several times the GPU's cache, keys on the device, the
//!    one table's warp-per-key lookup kernel (`cache_lookup`; the batch lookup's kernel is
//!    checked by part 2 and timed by the served runs) timed alone, over fp32 and over fp16
//!    rows; prints rows/s and GB/s moved.
//!
//!   cargo build --release -p triton_rust_embedding --features gpu --example gpu_cache_check
//!   target/release/examples/gpu_cache_check [--rows N] [--dim D] [--batch B]
use std::time::Instant;

use rand::{Rng, SeedableRng};
use triton_rust_cuda::cache::{
    BatchLookup, CacheSlots, DeviceKeys, DeviceRows, KeyLayout, Queue, RowFormat,
};
use triton_rust_cuda::{Bytes, BytesMut, Cuda, CudaError, DeviceOps};
use triton_rust_embedding::cache::{CacheGeometry, CachePolicy, CacheTier, HostCache, EMPTY_KEY};
use triton_rust_embedding::gpu::{FetchedRows, GpuCache};
use triton_rust_embedding::Zipf;

mod common;
use common::arg;

fn row(key: i64, dim: usize) -> Vec<f32> {
    (0..dim).map(|j| (key as f32) * 0.001 + j as f32).collect()
}

fn main() {
    let dim = arg("--dim", 128);
    let keyspace = arg("--keys", 200_000);
    let cache_rows = arg("--cache-rows", 20_000);
    let geo = CacheGeometry::for_rows(cache_rows, dim);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    for policy in [CachePolicy::Lru, CachePolicy::lfu_for(keyspace, geo.capacity())] {
        policy_check(geo.with_policy(policy), keyspace, &mut rng);
    }
    for (stored, policy) in [(RowFormat::F32, 0), (RowFormat::F16, 0), (RowFormat::F16, 1 << 17)] {
        shared_under_concurrency(dim, arg("--threads", 4), arg("--rounds", 300), stored, policy);
    }
    for stored in [RowFormat::F32, RowFormat::F16] {
        hit_path(dim, &mut rng, stored);
    }
    batched_copies(&mut rng);
    let gpus = triton_rust_cuda::gpu_count().unwrap_or(1);
    if gpus > 1 {
        across_gpus(&mut rng, gpus);
    } else {
        println!("copies across GPUs: not checked (one GPU)");
    }
}

/// Part 1 under `geo`'s policy: the same lookups and fills on the CPU cache and the GPU cache.
fn policy_check(geo: CacheGeometry, keyspace: usize, rng: &mut rand::rngs::SmallRng) {
    let dim = geo.dim;
    let cpu = HostCache::new(geo);
    let gpu = GpuCache::new(0, geo, RowFormat::F32).expect("GPU cache");
    let zipf = Zipf::new(keyspace, 1.05);
    let (mut lookups, mut compared_rows) = (0usize, 0usize);
    for _ in 0..200 {
        let keys: Vec<i64> = (0..4096).map(|_| zipf.rank(rng.gen()) as i64).collect();
        let mut out_c = vec![0f32; keys.len() * dim];
        let mut out_g = vec![0f32; keys.len() * dim];
        let miss_c = cpu.lookup(&keys, &mut out_c).unwrap();
        let miss_g = gpu.lookup(&keys, &mut out_g).unwrap();
        assert_eq!(miss_c, miss_g, "hit/miss pattern differs");
        for i in 0..keys.len() {
            if miss_c.binary_search(&i).is_err() {
                assert_eq!(
                    out_c[i * dim..(i + 1) * dim],
                    out_g[i * dim..(i + 1) * dim],
                    "row of key {}",
                    keys[i]
                );
                compared_rows += 1;
            }
        }
        // fill the misses the way the store does (distinct keys, in order)
        let mut seen = std::collections::HashSet::new();
        let fill: Vec<i64> = miss_c.iter().map(|&i| keys[i]).filter(|k| seen.insert(*k)).collect();
        let vals: Vec<f32> = fill.iter().flat_map(|&k| row(k, dim)).collect();
        cpu.insert(&fill, &vals).unwrap();
        gpu.insert(&fill, &vals).unwrap();
        lookups += keys.len();
    }
    let (c, g) = (cpu.counters(), gpu.counters());
    assert_eq!(
        (c.insertions, c.evictions, c.occupied),
        (g.insertions, g.evictions, g.occupied),
        "counters differ"
    );
    println!(
        "policy check ({}): {lookups} lookups, {compared_rows} hit rows compared, identical on CPU and GPU; \
         hit rate {:.3}, insertions {}, evictions {}",
        geo.policy.name(),
        c.hits as f64 / (c.hits + c.misses) as f64,
        c.insertions,
        c.evictions
    );
}

/// A batch's inputs in other GPUs' memory (a client's CUDA shared memory on GPU 0 for an
/// instance on GPU 1): gathered onto the last GPU from parts on every GPU, and copied from
/// each GPU to it, against the same bytes on the host.
fn across_gpus(rng: &mut rand::rngs::SmallRng, gpus: i32) {
    let home = gpus - 1;
    let lens: Vec<usize> = (0..40)
        .map(|i| if i % 2 == 0 { 8 * rng.gen_range(1..60_000) } else { rng.gen_range(1..5000) })
        .collect();
    let total: usize = lens.iter().sum();
    let host: Vec<u8> = (0..total).map(|_| rng.gen()).collect();
    let mut bufs = Vec::new();
    for g in 0..gpus {
        let mut b = Cuda.alloc(g, total).expect("alloc");
        Cuda.copy(Bytes::Host(&host), BytesMut::Device(b.view_mut())).expect("upload");
        bufs.push(b);
    }
    // part k from GPU k % gpus, at its own offset
    let (mut views, mut at) = (Vec::new(), 0usize);
    for (k, &len) in lens.iter().enumerate() {
        views.push(bufs[k % gpus as usize].view().slice(at..at + len).expect("inside"));
        at += len;
    }
    let gathered = Cuda.gather(home, &views).expect("gather across GPUs");
    assert_eq!(gathered.device(), home);
    let mut back = vec![0u8; total];
    Cuda.copy(Bytes::Device(gathered.view()), BytesMut::Host(&mut back)).expect("download");
    assert!(
        back == host,
        "a gather from {gpus} GPUs onto GPU {home} differs from the host's bytes"
    );
    for g in 0..gpus - 1 {
        let mut dst = Cuda.alloc(home, total).expect("alloc");
        Cuda.copy(Bytes::Device(bufs[g as usize].view()), BytesMut::Device(dst.view_mut()))
            .expect("peer copy");
        let mut back = vec![0u8; total];
        Cuda.copy(Bytes::Device(dst.view()), BytesMut::Host(&mut back)).expect("download");
        assert!(back == host, "a copy from GPU {g} to GPU {home} differs");
    }
    println!("copies across GPUs: a gather of 40 parts from {gpus} GPUs onto GPU {home}, and whole copies from each GPU to it, equal the host's bytes");
}

/// The serving path's copies of many parts (a batch's inputs gathered from its requests'
/// buffers; its outputs queued into each response's buffer, made at `finish_copies`):
/// parts of every length and alignment, empty ones, more than one launch holds, against
/// the same bytes moved on the host.
fn batched_copies(rng: &mut rand::rngs::SmallRng) {
    for count in [1usize, 2, 37, 300] {
        let lens: Vec<usize> = (0..count)
            .map(|i| match i % 5 {
                0 => rng.gen_range(0..4),
                1 => rng.gen_range(1..100),
                2 => 8 * rng.gen_range(1..4000),
                3 => 16 * rng.gen_range(1..40_000),
                _ => 4 * rng.gen_range(1..5000) + 1,
            })
            .collect();
        let total: usize = lens.iter().sum();
        // the sources lie at odd offsets of one buffer, one byte apart
        let src_host: Vec<u8> = (0..total + count).map(|_| rng.gen()).collect();
        let mut src = Cuda.alloc(0, src_host.len()).expect("alloc");
        Cuda.copy(Bytes::Host(&src_host), BytesMut::Device(src.view_mut())).expect("upload");
        let (mut views, mut expect, mut at) = (Vec::new(), Vec::new(), 1usize);
        for &len in &lens {
            views.push(src.view().slice(at..at + len).expect("inside"));
            expect.extend_from_slice(&src_host[at..at + len]);
            at += len;
        }
        let gathered = Cuda.gather(0, &views).expect("gather");
        let mut back = vec![0u8; total];
        Cuda.copy(Bytes::Device(gathered.view()), BytesMut::Host(&mut back)).expect("download");
        assert!(back == expect, "gather of {count} parts differs from the host's");
        // the same parts queued into their own places of another buffer, at other offsets
        let mut dst = Cuda.alloc(0, total + 3 * count).expect("alloc");
        let mut rest = dst.view_mut();
        let mut places = Vec::new();
        for (k, &len) in lens.iter().enumerate() {
            let (_gap, tail) = rest.split_at(k % 3);
            let (place, tail) = tail.split_at(len);
            places.push(place);
            rest = tail;
        }
        for (v, place) in views.iter().zip(places) {
            Cuda.copy_queued(Bytes::Device(*v), BytesMut::Device(place)).expect("queued");
        }
        Cuda.finish_copies().expect("finish");
        let mut back = vec![0u8; total + 3 * count];
        Cuda.copy(Bytes::Device(dst.view()), BytesMut::Host(&mut back)).expect("download");
        let (mut at, mut from) = (0usize, 0usize);
        for (k, &len) in lens.iter().enumerate() {
            at += k % 3;
            assert!(back[at..at + len] == expect[from..from + len], "queued part {k} of {count}");
            at += len;
            from += len;
        }
    }
    println!("batched copies: gathers and queued copies of 1, 2, 37 and 300 parts (odd offsets and lengths, empty parts) equal the host's bytes");
}

/// Part 3: the hit path's speed over a big cache whose rows are kept as `stored`.
fn hit_path(dim: usize, rng: &mut rand::rngs::SmallRng, stored: RowFormat) {
    let rows = arg("--rows", 8_000_000);
    let batch = arg("--batch", 1_700_000);
    let geo = CacheGeometry::for_rows(rows, dim);
    let big = GpuCache::new(0, geo, stored).expect("GPU cache");
    let chunk = 1 << 16;
    // coldest first, so the hottest Zipf ranks are the ones resident at the end
    let all: Vec<i64> = (0..rows as i64).rev().collect();
    let mut filled = 0;
    for part in all.chunks(chunk) {
        let vals: Vec<f32> = part.iter().flat_map(|&k| row(k, dim)).collect();
        big.insert(part, &vals).unwrap();
        filled += part.len();
    }
    let resident = big.counters().occupied;
    let zipf = Zipf::new(rows, 1.05);
    let keys: Vec<i64> = (0..batch).map(|_| zipf.rank(rng.gen()) as i64).collect();
    let mut d_keys = DeviceKeys::new(0, &keys).unwrap();
    let mut d_out = DeviceRows::new(0, batch * dim).unwrap();
    let slots = big.slots();
    slots.launch_resident(&mut d_keys, big.next_epoch(), &mut d_out, dim).unwrap(); // warm-up
    slots.synchronize().unwrap();
    let iters = 20;
    let t = Instant::now();
    for _ in 0..iters {
        slots.launch_resident(&mut d_keys, big.next_epoch(), &mut d_out, dim).unwrap();
    }
    slots.synchronize().unwrap();
    let secs = t.elapsed().as_secs_f64() / iters as f64;
    let hit = d_keys.hits().unwrap();
    let hits = hit.iter().filter(|&&h| h == 1).count();
    let bytes =
        batch as f64 * (dim as f64 * (stored.size() as f64 + 4.0) + 8.0 + 32.0 * 16.0 / 32.0);
    println!(
        "hit path, {} rows: {filled} rows inserted, {resident} resident (cache {} rows, dim {dim}); batch {batch} Zipf keys, \
         {:.1}% hits; {:.3} ms per lookup = {:.2} B rows/s, {:.0} GB/s (row read+write, keys and slot tags)",
        if stored == RowFormat::F16 { "fp16" } else { "fp32" },
        geo.capacity(),
        100.0 * hits as f64 / batch as f64,
        secs * 1e3,
        batch as f64 / secs / 1e9,
        bytes / secs / 1e9
    );
}

/// `row(key)` as a lookup written as `format` answers it: fp32, or fp16 rounded to nearest even.
fn row_bytes(key: i64, dim: usize, format: RowFormat) -> Vec<u8> {
    let r = row(key, dim);
    match format {
        RowFormat::F32 => r.iter().flat_map(|v| v.to_le_bytes()).collect(),
        RowFormat::F16 => r.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
    }
}

/// Part 2: `threads` lookups over one set of slots (rows kept as `stored`, LRU or, with a
/// `sketch` width, LFU) and its queue, each looking up batches of Zipf keys written as
/// `stored` (rows read below the cache are `row(key)`), filling its misses and checking
/// every row.
fn shared_under_concurrency(
    dim: usize,
    threads: usize,
    rounds: usize,
    stored: RowFormat,
    sketch: usize,
) {
    let sets = 64; // 2,048 slots for 100,000 keys: most lookups of cold keys evict
    let first = Queue::new(0).expect("queue");
    let slots = CacheSlots::new(&first, sets, dim, EMPTY_KEY, stored, sketch, 0).expect("slots");
    let clock = std::sync::atomic::AtomicU64::new(1);
    let zipf = Zipf::new(100_000, 0.9);
    let (hits, checked, torn) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|w| {
                let (slots, clock, zipf, queue) = (&slots, &clock, &zipf, first.clone());
                scope.spawn(move || {
                    let mut lookup =
                        BatchLookup::new(&queue, &[Some(slots)], dim, stored).expect("lookup");
                    let bytes = dim * stored.size();
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(7 + w as u64);
                    let (mut hits, mut checked, mut wrong) = (0usize, 0usize, 0usize);
                    let mut host = vec![0u8; 4096 * bytes];
                    for _ in 0..rounds {
                        let keys: Vec<i64> =
                            (0..4096).map(|_| zipf.rank(rng.gen()) as i64).collect();
                        let epoch = clock.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let mut fetch = |_: &mut [i32],
                                         mk: &mut [i64],
                                         rows: FetchedRows<'_>,
                                         found: &mut [u8]| {
                            let rows = rows.f32().expect("fetched as fp32");
                            for (j, &k) in mk.iter().enumerate() {
                                rows[j * dim..(j + 1) * dim].copy_from_slice(&row(k, dim));
                                found[j] = 1;
                            }
                            Ok::<(), CudaError>(())
                        };
                        let times = lookup
                            .run(&keys, KeyLayout::Interleaved, epoch, &mut fetch)
                            .expect("run");
                        hits += keys.len() - times.misses;
                        let view = lookup.rows(keys.len() * dim).expect("rows");
                        Cuda.copy(
                            Bytes::Device(view),
                            BytesMut::Host(&mut host[..keys.len() * bytes]),
                        )
                        .expect("copy");
                        for (i, &k) in keys.iter().enumerate() {
                            if host[i * bytes..(i + 1) * bytes] != row_bytes(k, dim, stored)[..] {
                                wrong += 1;
                            }
                            checked += 1;
                        }
                        lookup
                            .fill_last(clock.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                            .expect("fill");
                    }
                    (hits, checked, wrong)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|h| h.join().expect("worker"))
            .fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2))
    });
    let (inserted, evicted) = slots.counters().expect("counters");
    assert_eq!(torn, 0, "{torn} of {checked} rows were not their key's row");
    assert!(hits > 0 && evicted > 0, "the check must hit and evict to mean anything");
    println!(
        "shared slots, {} rows, {}: {threads} threads x {rounds} batches of 4096 keys over {} slots, {checked} rows checked, \
         all their key's rows; hit rate {:.3}, {inserted} insertions, {evicted} evictions",
        if stored == RowFormat::F16 { "fp16" } else { "fp32" },
        if sketch == 0 { "LRU" } else { "LFU" },
        sets * 32,
        hits as f64 / checked as f64
    );
}
