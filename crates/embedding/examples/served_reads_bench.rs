//! The host side of a served GPU cache's misses, without Triton or a GPU: several "instances"
//! (threads, as Triton's model instances are) each reading their batches' misses through the
//! store's reads (`EmbeddingStore::gather_dense`, the worker pool shared by all), at once,
//! beside a plain gather of the same rows. Served, six instances' reads together reached
//! about 40 M rows a second where a plain gather on the same 16-core host read 120 M
//! (`bench/gpu/results/cache-runs/README.md`); this tells whether the store's concurrent reads
//! fall short on the host alone, and which way of sharing the cores does better.
//!
//! One fp16 table of `--gb` GB (keys `0..rows`, the fixture's synthetic rows, placed as
//! `--host-memory` says), uniformly random keys. Each batch has `--misses` misses, read in
//! `--parts` parts one after the other (as the lookup reads them, each part going up while the
//! next is read). Rates in M rows/s:
//! - `plain, whole host`: one batch's rows at a time copied by every core at once (scoped threads
//!   started for each batch, each an equal share, 16 rows prefetched ahead, from rows placed as
//!   the store placed its own). Starting the threads costs it most of its time: on the GPU
//!   machine's hosts it read 0.27-0.45x the steady gather below, which is the host's rate;
//! - `store, one instance`: one instance alone, its parts through `gather_dense`;
//! - `store, N instances`: N threads each reading their own batches through `gather_dense`
//!   at once (all rows over the wall time, and the median time of a batch);
//! - `plain, N instances`: the same N threads each running a plain gather on its share of the
//!   cores (cores / N scoped threads each), no shared pool;
//! - `plain, steady threads`: 4, 8, half and all the cores' threads gathering for a second
//!   without a pause (no thread started per batch, no batch boundary), prefetching 4, 8 or 16
//!   rows ahead, plain stores (and 16 ahead with streaming stores, as the store's readers store
//!   with `TRITON_RUST_MISS_STORES=streaming`): the host's steady rate, as the plain C
//!   program measured it. Each thread writes one batch's share over and over, a buffer the
//!   CPU's caches hold (`misses` rows between the threads); the last two columns write as many
//!   batches' buffers in turn as there are instances, as the served instances' page-locked
//!   staging is written, which the caches cannot hold.
//!
//! The store's rows are checked equal to the plain gather's and the fixture's.
//!
//!   cargo run --release -p triton_rust_embedding --example served_reads_bench -- \
//!       [--gb 4] [--dim 128] [--misses 170000] [--parts 3] [--instances 6] [--batches 20]
//!       [--host-memory auto|mapped|huge_pages] [--dir /tmp/served_reads_table] [--threads N]
//!
//! `--threads`: the plain gathers' threads (default: the store's worker pool's, which
//! `RAYON_NUM_THREADS` sets), so both read on as many threads. `--steady-only 1`: only the
//! steady plain gathers (the table placed as the store places it), for a run beside another
//! load (`bench/gpu/bus_load.py`: the GPU's copies reading host memory as served).
use std::path::PathBuf;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use triton_rust_embedding::fixture::{synthetic_row, write_synthetic_table, Progress};
use triton_rust_embedding::store::GatherTimes;
use triton_rust_embedding::table::{HostRows, TableFiles};
use triton_rust_embedding::{EmbeddingStore, StoreConfig, TableConfig};

mod common;
use common::arg;

const AHEAD: usize = 16;
const SEED: u64 = 9;

/// `keys`' rows copied into `out` on `threads` scoped threads, each prefetching ahead.
fn plain_gather(bytes: &[u8], width: usize, keys: &[i64], out: &mut [u8], threads: usize) {
    let per = keys.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (k, o) in keys.chunks(per).zip(out.chunks_mut(per * width)) {
            s.spawn(move || {
                let row = |key: i64| &bytes[key as usize * width..(key as usize + 1) * width];
                k.iter().take(AHEAD).for_each(|&key| triton_rust_os::prefetch(row(key)));
                for (i, (&key, to)) in k.iter().zip(o.chunks_exact_mut(width)).enumerate() {
                    if let Some(&next) = k.get(i + AHEAD) {
                        triton_rust_os::prefetch(row(next));
                    }
                    to.copy_from_slice(row(key));
                }
            });
        }
    });
}

/// One batch's misses read through the store in `parts` parts; every key is table 0's. The
/// readers' times of each part added to `times`.
fn store_batch(
    store: &EmbeddingStore,
    keys: &[i64],
    out: &mut [u8],
    found: &mut [u8],
    parts: usize,
    times: &mut GatherTimes,
) {
    let (width, per) = (out.len() / keys.len(), keys.len().div_ceil(parts.max(1)));
    let missed: Vec<i32> = (0..keys.len() as i32).collect();
    let mut per_table = [0usize];
    for (((k, o), f), m) in keys
        .chunks(per)
        .zip(out.chunks_mut(per * width))
        .zip(found.chunks_mut(per))
        .zip(missed.chunks(per))
    {
        let read = store
            .gather_dense(&|_| 0, m, k, o, f, &mut per_table, Some(&mut *times))
            .expect("the reads");
        assert!(read, "a dense, untouched fp16 table is read by the plain gather");
    }
}

/// Rows a second when `threads` threads gather without a pause for `secs` seconds, each its
/// own uniformly random keys (drawn beforehand, as many as the table has rows between them)
/// into its own share of a batch's staging buffer, `ahead` rows prefetched: no thread started
/// per batch and no batch boundary to wait at, the steady rate of the plain C program.
/// `streaming`: each row stored past the CPU's caches, as the store's readers do with
/// `TRITON_RUST_MISS_STORES=streaming`. `span`: each thread writes its share of `span` batches'
/// staging one after the other (1: one batch's, `misses` rows between the threads, which the
/// CPU's caches can hold; the instances' count: as many batches' buffers as the served
/// instances write in turn, which they cannot).
fn plain_steady(
    bytes: &[u8],
    width: usize,
    threads: usize,
    ahead: usize,
    misses: usize,
    streaming: bool,
    span: usize,
) -> f64 {
    const SECS: f64 = 1.0;
    let rows = bytes.len() / width;
    // a power of two of keys a thread, at least the table's rows between the threads, so the
    // next key's place is a mask, not a division
    let per_thread = rows.div_ceil(threads).next_power_of_two();
    let share = misses.div_ceil(threads).max(1);
    let done: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|th| {
                s.spawn(move || {
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(100 + th as u64);
                    let keys: Vec<usize> =
                        (0..per_thread).map(|_| rng.gen_range(0..rows)).collect();
                    let mut out = vec![0u8; share * span.max(1) * width];
                    let row = |key: usize| &bytes[key * width..(key + 1) * width];
                    let (mut next, mut done) = (0usize, 0usize);
                    let begun = Instant::now();
                    while begun.elapsed().as_secs_f64() < SECS {
                        for to in out.chunks_exact_mut(width) {
                            triton_rust_os::prefetch(row(keys[(next + ahead) & (per_thread - 1)]));
                            let from = row(keys[next & (per_thread - 1)]);
                            if streaming {
                                triton_rust_os::copy_streaming(to, from);
                            } else {
                                to.copy_from_slice(from);
                            }
                            next += 1;
                        }
                        done += share * span.max(1);
                    }
                    triton_rust_os::store_fence();
                    std::hint::black_box(&out);
                    (done, begun.elapsed().as_secs_f64())
                })
            })
            .collect();
        // the rate while every thread ran: each thread's rows over its own time, summed
        handles
            .into_iter()
            .map(|h| {
                let (done, secs) = h.join().expect("a thread");
                (done as f64 / secs) as usize
            })
            .sum()
    });
    done as f64 / 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let gb: f64 = arg("--gb", 4.0);
    let dim: usize = arg("--dim", 128);
    let misses: usize = arg("--misses", 170_000);
    let parts: usize = arg("--parts", 3);
    let instances: usize = arg("--instances", 6);
    let batches: usize = arg("--batches", 20);
    let dir = PathBuf::from(arg("--dir", "/tmp/served_reads_table".to_string()));
    let placement =
        HostRows::parse(&arg("--host-memory", "auto".to_string())).expect("--host-memory");
    // the plain gathers' threads: as many as the store's worker pool (RAYON_NUM_THREADS)
    let cores: usize = arg("--threads", rayon::current_num_threads());
    let steady_only = arg("--steady-only", 0usize) == 1;
    let width = dim * 2;
    let rows = (gb * 1e9) as usize / width;
    let t0 = Instant::now();
    if TableFiles::open_npy(&dir).map_or(true, |f| f.rows != rows || f.dim != dim) {
        write_synthetic_table(&dir, SEED, 0, rows, dim, cores, &Progress::default())
            .expect("the table");
    }
    let store = EmbeddingStore::open(
        StoreConfig {
            cache_ratio: 0.0,
            update_log_dir: Some(std::env::temp_dir().join("served_reads_bench_log")),
            host_memory: placement,
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
    .expect("the store");
    let copied = store.host_memory(0).copied;
    println!(
        "table: {rows} rows of dim {dim}, fp16 ({:.1} GB), {}, ready in {:.1} s; {cores} cores, \
         the worker pool {} threads, the plain gathers {cores}; batches of {misses} misses in {parts} parts; \
         the store's stores {}",
        (rows * width) as f64 / 1e9,
        if copied { "copied into 2 MiB pages" } else { "read from the file's mapping" },
        t0.elapsed().as_secs_f64(),
        rayon::current_num_threads(),
        std::env::var("TRITON_RUST_MISS_STORES").unwrap_or_else(|_| "cached (unset)".into())
    );
    // the plain gather reads the same rows placed alike: the file's mapping, or a copy in
    // 2 MiB pages where the store copied them
    let file = triton_rust_os::MappedFile::open(&dir.join("vectors.npy")).expect("the file");
    let data = file.bytes();
    let mapped = &data[data.len() - rows * width..];
    let copy = copied.then(|| triton_rust_os::HugeCopy::new(mapped, cores).expect("a copy"));
    let table = copy.as_ref().map_or(mapped, |c| c.bytes());
    if !steady_only {
        store_phases(&store, table, width, dim, misses, parts, instances, batches, cores);
    }
    steady_table(table, width, misses, instances, cores);
}

/// The store's reads and the plain gathers started per batch: one batch at a time, then
/// `instances` at once; the rows checked against each other and the fixture.
#[allow(clippy::too_many_arguments)]
fn store_phases(
    store: &EmbeddingStore,
    table: &[u8],
    width: usize,
    dim: usize,
    misses: usize,
    parts: usize,
    instances: usize,
    batches: usize,
    cores: usize,
) {
    let rows = table.len() / width;

    // every phase reads keys of its own: rows an earlier phase read may still sit in the CPU's
    // caches (a batch of 170 K rows is 43 MB)
    let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
    let mut draw = || -> Vec<i64> { (0..misses).map(|_| rng.gen_range(0..rows as i64)).collect() };
    let (mut plain, mut got, mut found) =
        (vec![0u8; misses * width], vec![1u8; misses * width], vec![0u8; misses]);
    // the rows: one batch read both ways, against each other and the fixture
    let check = draw();
    plain_gather(table, width, &check, &mut plain, cores);
    store_batch(store, &check, &mut got, &mut found, parts, &mut GatherTimes::default());
    assert!(
        found.iter().all(|&f| f == 1) && got == plain,
        "the store's rows differ from the plain gather's"
    );
    let mut want = vec![0u16; dim];
    for (i, &k) in check.iter().enumerate().step_by(997) {
        synthetic_row(SEED, 0, k, &mut want);
        assert_eq!(&got[i * width..(i + 1) * width], bytemuck::cast_slice::<u16, u8>(&want));
    }
    // one batch at a time: every core on a plain gather (the host's rate), then the store
    let mut alone_times = GatherTimes::default();
    let mut one_at_a_time = |through_store: bool| -> f64 {
        let times: Vec<f64> = (0..batches)
            .map(|_| {
                let keys = draw();
                let t = Instant::now();
                if through_store {
                    store_batch(store, &keys, &mut got, &mut found, parts, &mut alone_times);
                } else {
                    plain_gather(table, width, &keys, &mut plain, cores);
                }
                t.elapsed().as_secs_f64()
            })
            .collect();
        misses as f64 / median(times) / 1e6
    };
    let whole = one_at_a_time(false);
    let alone = one_at_a_time(true);
    let store_keys: Vec<Vec<Vec<i64>>> =
        (0..instances).map(|_| (0..batches).map(|_| draw()).collect()).collect();
    let plain_keys: Vec<Vec<Vec<i64>>> =
        (0..instances).map(|_| (0..batches).map(|_| draw()).collect()).collect();
    // N instances at once: through the store's shared pool, then each its share of the cores
    let concurrent_times = std::sync::Mutex::new(GatherTimes::default());
    let concurrent = |through_store: bool, batch_keys: &[Vec<Vec<i64>>]| -> (f64, f64) {
        let t = Instant::now();
        let per_batch: Vec<f64> = std::thread::scope(|s| {
            let handles: Vec<_> = batch_keys
                .iter()
                .map(|mine| {
                    let (store, concurrent_times) = (store, &concurrent_times);
                    s.spawn(move || {
                        let (mut out, mut found) = (vec![0u8; misses * width], vec![0u8; misses]);
                        let (mut times, mut reads) = (Vec::new(), GatherTimes::default());
                        for keys in mine {
                            let t = Instant::now();
                            if through_store {
                                store_batch(store, keys, &mut out, &mut found, parts, &mut reads);
                            } else {
                                plain_gather(
                                    table,
                                    width,
                                    keys,
                                    &mut out,
                                    (cores / instances).max(1),
                                );
                            }
                            times.push(t.elapsed().as_secs_f64());
                        }
                        concurrent_times.lock().expect("the times").absorb(Some(reads));
                        times
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().expect("an instance")).collect()
        });
        let all = (instances * batches * misses) as f64;
        (all / t.elapsed().as_secs_f64() / 1e6, median(per_batch) * 1e3)
    };
    let (store_n, store_ms) = concurrent(true, &store_keys);
    let (plain_n, plain_ms) = concurrent(false, &plain_keys);
    println!("| plain, whole host | store, one instance | store, {instances} instances (batch ms) | plain, {instances} instances (batch ms) | store {instances} / plain whole |");
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {whole:.1} | {alone:.1} | {store_n:.1} ({store_ms:.1}) | {plain_n:.1} ({plain_ms:.1}) | {:.2} |",
        store_n / whole
    );
    println!("rows: the store's equal to the plain gather's and the fixture's");
    let readers = triton_rust_os::Crew::global().members() + 1;
    for (who, t) in [
        ("one instance", alone_times),
        (&*format!("{instances} instances"), concurrent_times.into_inner().expect("the times")),
    ] {
        let per = |ns: u64| ns as f64 / t.calls.max(1) as f64 / 1e3;
        println!(
            "the store's reads, {who}: a call (a part) {:.0} us, its last share started at {:.0} us, \
             its longest share {:.0} us, {:.1} shares; its shares' time over its wall time {:.1} \
             (readers {readers}, the caller among them)",
            per(t.wall_ns),
            per(t.last_start_ns),
            per(t.longest_ns),
            t.shares as f64 / t.calls.max(1) as f64,
            t.busy_ns as f64 / t.wall_ns.max(1) as f64,
        );
    }
}

/// The host's steady plain gathers, printed as a table.
fn steady_table(table: &[u8], width: usize, misses: usize, instances: usize, cores: usize) {
    // the host's steady rate: threads that never stop, at several counts and prefetch depths
    let mut counts: Vec<usize> = vec![4, 8, cores / 2, cores];
    counts.sort_unstable();
    counts.dedup();
    counts.retain(|&n| n >= 1 && n <= cores);
    let big = instances * misses * width;
    println!("| plain, steady threads (M rows/s): threads | prefetch 4 rows ahead | 8 ahead | 16 ahead | 16 ahead, streaming stores | 16 ahead, into {instances} batches' buffers ({:.0} MB) | the same, streaming stores |", big as f64 / 1e6);
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for n in counts {
        let r: Vec<f64> = [(4, false, 1), (8, false, 1), (16, false, 1), (16, true, 1)]
            .into_iter()
            .chain([(16, false, instances), (16, true, instances)])
            .map(|(a, streaming, span)| plain_steady(table, width, n, a, misses, streaming, span))
            .collect();
        println!(
            "| {n} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            r[0], r[1], r[2], r[3], r[4], r[5]
        );
    }
}
