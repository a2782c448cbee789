//! A GPU cache's misses read from host memory, timed alone on an idle GPU (needs an NVIDIA
//! GPU), beside what the host itself can read, in one run: a batch lookup over one table
//! with no cache, so every key misses, its rows fp16 in a table of `--gb` GB (the fixture's
//! synthetic rows, written to `--dir`, placed as `--host-memory` says: `huge_pages`, the
//! default, or `mapped`). Uniform keys, so nearly every read lands on a page of its own.
//!
//! - `plain gather`: the host alone, no GPU: each of `--threads` threads copies its share of the
//!   rows (256 bytes each) into a buffer, the row 16 keys ahead prefetched, what a plain C
//!   gather does: the host's rate, the reference;
//! - `store, fp16`: the store's reads (`HostTier::get_many_raw`, the rows as stored) on the same
//!   threads into the lookup's page-locked buffer, one copy up, the scatter on the GPU;
//! - `store, fp32`: the same reads widened to fp32 on the host (`HostTier::get_many`, the miss
//!   path before rows went up as stored): twice the bytes up;
//! - `gpu`: the lookup's kernel reads them in place over the bus (`gpucache_miss_reads: gpu`);
//! - `both`: the two at once (`gpucache_miss_reads: both`): the GPU's share in place while the
//!   host threads read the rest, the share set by each side's rate over the last batches (the
//!   rates it settled on are printed). Whether they add: `both` against `store, fp16` and `gpu`.
//!
//! Every path's rows are compared with the others and with the fixture's. Then the GPU's
//! in-place reads alone at each `--grid` size (blocks of 256 threads, 0: a warp for every four
//! misses; the served default is 16, `TRITON_RUST_GPU_READ_BLOCKS`).
//!
//!   cargo build --release -p triton_rust_embedding --features gpu --example miss_reads_bench
//!   target/release/examples/miss_reads_bench [--gb 16] [--dim 128] [--iters 10] [--threads 16]
//!       [--dir /dev/shm/miss_reads] [--host-memory huge_pages|mapped] [--grid 4,8,16,32,64,0]
//!       [--grid-only 1]
use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use triton_rust_cuda::cache::{FetchedRows, HostRows};
use triton_rust_cuda::mem::{Bytes, BytesMut, DeviceOps};
use triton_rust_cuda::Cuda;
use triton_rust_embedding::fixture::{synthetic_row, write_synthetic_table, Progress};
use triton_rust_embedding::gpu::{GpuCache, GpuInstance, KeyLayout, RowFormat};
use triton_rust_embedding::host::HostTier;
use triton_rust_embedding::table::{HostRows as Placement, TableFiles};
use triton_rust_embedding::CacheRows;

mod common;
use common::arg;

const AHEAD: usize = 16;
const SEED: u64 = 11;

/// The host's rate: `keys`' rows copied into `out` on `threads` threads, prefetched ahead.
fn plain_gather(bytes: &[u8], width: usize, keys: &[i64], out: &mut [u8], threads: usize) {
    let per = keys.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (k, o) in keys.chunks(per).zip(out.chunks_mut(per * width)) {
            s.spawn(move || {
                let at = |key: i64| key as usize * width;
                for &key in k.iter().take(AHEAD) {
                    triton_rust_os::prefetch(&bytes[at(key)..at(key) + width]);
                }
                for (i, (&key, row)) in k.iter().zip(o.chunks_exact_mut(width)).enumerate() {
                    if let Some(&next) = k.get(i + AHEAD) {
                        triton_rust_os::prefetch(&bytes[at(next)..at(next) + width]);
                    }
                    row.copy_from_slice(&bytes[at(key)..at(key) + width]);
                }
            });
        }
    });
}

/// The store's reads of `keys` on `threads` threads into `rows` (as stored, or widened).
fn store_reads(
    tier: &HostTier,
    keys: &[i64],
    rows: FetchedRows<'_>,
    found: &mut [u8],
    threads: usize,
) {
    let dim = tier.dim();
    let per = keys.len().div_ceil(threads).max(1);
    std::thread::scope(|s| match rows {
        FetchedRows::F16(rows) => {
            let rows: &mut [u8] = bytemuck::cast_slice_mut(rows);
            for ((k, o), f) in
                keys.chunks(per).zip(rows.chunks_mut(per * dim * 2)).zip(found.chunks_mut(per))
            {
                s.spawn(move || {
                    let mut got = vec![false; k.len()];
                    tier.get_many_raw(k, o, &mut got);
                    f.iter_mut().zip(got).for_each(|(f, g)| *f = g as u8);
                });
            }
        }
        FetchedRows::F32(rows) => {
            for ((k, o), f) in
                keys.chunks(per).zip(rows.chunks_mut(per * dim)).zip(found.chunks_mut(per))
            {
                s.spawn(move || {
                    let mut got = vec![false; k.len()];
                    tier.get_many(k, o, &mut got);
                    f.iter_mut().zip(got).for_each(|(f, g)| *f = g as u8);
                });
            }
        }
    });
}

fn main() {
    let (gb, dim, iters, threads) = (
        arg("--gb", 16.0f64),
        arg("--dim", 128usize),
        arg("--iters", 10usize),
        arg("--threads", 16usize),
    );
    let dir = std::path::PathBuf::from(arg("--dir", "/dev/shm/miss_reads".to_string()));
    let placement =
        Placement::parse(&arg("--host-memory", "huge_pages".to_string())).expect("--host-memory");
    let width = dim * 2;
    let rows = (gb * (1u64 << 30) as f64) as usize / width;
    let t0 = Instant::now();
    if TableFiles::open_npy(&dir).map_or(true, |f| f.rows != rows || f.dim != dim) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        write_synthetic_table(&dir, SEED, 0, rows, dim, cores, &Progress::default())
            .expect("the table");
    }
    let files = TableFiles::open_npy(&dir).expect("open").place("miss_reads", placement);
    let tier = Arc::new(HostTier::from_files(files).expect("the host tier").0);
    println!(
        "host rows: {rows} rows of dim {dim}, fp16 ({:.1} GB), {placement:?}, ready in {:.1} s; {threads} host threads",
        (rows * width) as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    let t0 = Instant::now();
    let mapped = Arc::new(
        HostRows::register(
            0,
            tier.clone(),
            |t: &HostTier| t.dense_base().map_or(&[][..], |b| b.0),
            rows,
            2,
        )
        .expect("the rows page-locked and mapped for the GPU"),
    );
    println!("  page-locked and mapped for the GPU in {:.1} s", t0.elapsed().as_secs_f64());
    let bytes = tier.dense_base().expect("a dense table").0;

    let instance = GpuInstance::new(0, CacheRows::F16).expect("a GPU");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
    if arg("--grid-only", 0u32) == 0 {
        compare_paths(&instance, &tier, &mapped, bytes, (width, rows), (iters, threads), &mut rng);
    }
    gpu_grids(&instance, &mapped, bytes, width, rows, iters, &mut rng);
}

/// The paths side by side at three batch sizes, rows compared (the first table).
fn compare_paths(
    instance: &GpuInstance,
    tier: &Arc<HostTier>,
    mapped: &Arc<HostRows>,
    bytes: &[u8],
    (width, rows): (usize, usize),
    (iters, threads): (usize, usize),
    rng: &mut rand::rngs::SmallRng,
) {
    let dim = width / 2;
    let none: [Option<&GpuCache>; 1] = [None];
    println!("| misses a batch | plain gather, host only (M rows/s) | store, fp16 up (M rows/s) | store, fp32 up | gpu in place | both | store fp16 / plain | both / plain | host reads of store fp16 alone (M rows/s) | both's rates, gpu + host (M rows/s) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in [16_384usize, 131_072, 1 << 20] {
        let keys: Vec<i64> = (0..n).map(|_| rng.gen_range(0..rows as i64)).collect();
        // the host alone
        let mut plain = vec![1u8; n * width];
        let mut best_plain = f64::MAX;
        for _ in 0..iters.max(3) {
            let t = Instant::now();
            plain_gather(bytes, width, &keys, &mut plain, threads);
            best_plain = best_plain.min(t.elapsed().as_secs_f64());
        }
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut rates = Vec::new();
        let mut fetch_alone = 0.0;
        let mut learned = (0.0, 0.0);
        for path in ["store, fp16", "store, fp32", "gpu", "both"] {
            let mut lookup = instance.batch_lookup(&none, dim, RowFormat::F16).expect("lookup");
            lookup.set_fetched(if path == "store, fp32" { RowFormat::F32 } else { RowFormat::F16 });
            if path == "gpu" || path == "both" {
                lookup.set_host_rows(&[(mapped.clone(), 0.0)]).expect("host rows");
                lookup.read_misses_on_gpu(|| true);
                lookup.share_misses(path == "both");
            }
            // the shared reads learn their rates over the first runs
            let warm = if path == "both" { 12 } else { 2 };
            let mut fetch = |_idx: &mut [i32],
                             mkeys: &mut [i64],
                             out: FetchedRows<'_>,
                             found: &mut [u8]|
             -> Result<(), triton_rust_cuda::CudaError> {
                store_reads(tier, mkeys, out, found, threads);
                Ok(())
            };
            let mut best = f64::MAX;
            let mut best_fetch = f64::MAX;
            for i in 0..iters + warm {
                let t = Instant::now();
                let times = lookup
                    .run(&keys, KeyLayout::Interleaved, instance.next_epoch(), &mut fetch)
                    .expect("run");
                assert_eq!(times.misses, n, "no cache: every key misses");
                if i >= warm {
                    best = best.min(t.elapsed().as_secs_f64());
                    best_fetch = best_fetch.min(times.fetch_us as f64 / 1e6);
                }
            }
            if path == "store, fp16" {
                fetch_alone = best_fetch;
            }
            if let Some(r) = lookup.share_rates() {
                learned = r;
            }
            let rows_view = lookup.rows(n * dim).expect("rows");
            let mut back = vec![0u8; n * dim * 2];
            Cuda.copy(Bytes::Device(rows_view), BytesMut::Host(&mut back)).expect("rows back");
            got.push(back);
            rates.push(n as f64 / best / 1e6);
        }
        let plain_rate = n as f64 / best_plain / 1e6;
        println!(
            "| {n} | {plain_rate:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.1} | {:.1} + {:.1} |",
            rates[0],
            rates[1],
            rates[2],
            rates[3],
            rates[0] / plain_rate,
            rates[3] / plain_rate,
            n as f64 / fetch_alone / 1e6,
            learned.0 / 1e6,
            learned.1 / 1e6
        );
        assert!(got.iter().all(|g| g == &got[0]), "the paths' rows differ");
        assert!(got[0] == plain, "the lookup's rows differ from the plain gather's");
        let mut want = vec![0u16; dim];
        for (i, &k) in keys.iter().enumerate().step_by(997) {
            synthetic_row(SEED, 0, k, &mut want);
            assert_eq!(&got[0][i * width..(i + 1) * width], bytemuck::cast_slice::<u16, u8>(&want));
        }
    }
    println!("rows: every path's equal, and equal to the plain gather's and the fixture's");
}

/// The GPU's in-place reads alone at each `--grid` size (blocks of 256 threads; 0: a warp for
/// every four misses), rows compared with a plain gather's: how few SMs keep its rate.
fn gpu_grids(
    instance: &GpuInstance,
    mapped: &Arc<HostRows>,
    bytes: &[u8],
    width: usize,
    rows: usize,
    iters: usize,
    rng: &mut rand::rngs::SmallRng,
) {
    let grids: Vec<u32> = arg("--grid", "4,8,16,32,64,0".to_string())
        .split(',')
        .filter_map(|g| g.parse().ok())
        .collect();
    let dim = width / 2;
    let none: [Option<&GpuCache>; 1] = [None];
    print!("\n| misses a batch |");
    grids.iter().for_each(|g| print!(" gpu, {g} blocks (M rows/s) |"));
    println!("\n|---:|{}", "---:|".repeat(grids.len()));
    for n in [131_072usize, 1 << 20] {
        let keys: Vec<i64> = (0..n).map(|_| rng.gen_range(0..rows as i64)).collect();
        let mut plain = vec![0u8; n * width];
        plain_gather(bytes, width, &keys, &mut plain, 4);
        print!("| {n} |");
        for &g in &grids {
            let mut lookup = instance.batch_lookup(&none, dim, RowFormat::F16).expect("lookup");
            lookup.set_fetched(RowFormat::F16);
            lookup.set_host_rows(&[(mapped.clone(), 0.0)]).expect("host rows");
            lookup.read_misses_on_gpu(|| true);
            lookup.set_gpu_read_blocks(g);
            let mut fetch = |_: &mut [i32],
                             _: &mut [i64],
                             _: FetchedRows<'_>,
                             _: &mut [u8]|
             -> Result<(), triton_rust_cuda::CudaError> {
                unreachable!("the GPU reads every miss")
            };
            let mut best = f64::MAX;
            for i in 0..iters + 2 {
                let t = Instant::now();
                lookup
                    .run(&keys, KeyLayout::Interleaved, instance.next_epoch(), &mut fetch)
                    .expect("run");
                if i >= 2 {
                    best = best.min(t.elapsed().as_secs_f64());
                }
            }
            let view = lookup.rows(n * dim).expect("rows");
            let mut back = vec![0u8; n * width];
            Cuda.copy(Bytes::Device(view), BytesMut::Host(&mut back)).expect("rows back");
            assert!(back == plain, "{g} blocks: rows differ from the plain gather's");
            print!(" {:.1} |", n as f64 / best / 1e6);
        }
        println!();
    }
    println!("rows: every grid's equal to the plain gather's");
}
