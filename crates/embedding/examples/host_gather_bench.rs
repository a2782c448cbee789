//! The store's reads of a GPU cache's misses beside a plain gather of the same rows, on the
//! same threads, in one run: how far the miss path is from what the host can read.
//!
//! One fp16 table of `--gb` GB (keys `0..rows`, synthetic rows: `fixture.rs`) placed as the
//! store places it (`--host-memory mapped`, the default, or `huge_pages`), uniformly random
//! keys (nearly every row on a page of its own). On each thread count, each thread takes an
//! equal share of the keys and reads them three ways:
//! - `plain`: each row's 256 bytes copied into a buffer, the row 16 keys ahead prefetched:
//!   what a plain C gather does, the host's rate;
//! - `store, f32`: `HostTier::get_many`, the rows widened to f32 (the miss path until now);
//! - `store, stored type`: `HostTier::get_many_raw`, the rows as stored (fp16 stays fp16).
//!
//! The three results are checked equal to each other and to the fixture's rows.
//!
//!   cargo run --release -p triton_rust_embedding --example host_gather_bench -- \
//!       [--gb 4] [--dim 128] [--keys 2000000] [--threads 1,2] [--host-memory mapped|huge_pages]
//!       [--dir /tmp/host_gather_table]
use std::path::PathBuf;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use triton_rust_embedding::fixture::{synthetic_row, write_synthetic_table, Progress};
use triton_rust_embedding::host::HostTier;
use triton_rust_embedding::table::{HostRows, TableFiles};

mod common;

/// The option's text (`default` when absent).
fn arg(name: &str, default: &str) -> String {
    common::arg(name, default.to_string())
}

const AHEAD: usize = 16;
const SEED: u64 = 7;

fn plain_gather(bytes: &[u8], width: usize, keys: &[i64], out: &mut [u8]) {
    let at = |k: i64| k as usize * width;
    for &k in keys.iter().take(AHEAD) {
        triton_rust_os::prefetch(&bytes[at(k)..at(k) + width]);
    }
    for (i, (&k, row)) in keys.iter().zip(out.chunks_exact_mut(width)).enumerate() {
        if let Some(&next) = keys.get(i + AHEAD) {
            triton_rust_os::prefetch(&bytes[at(next)..at(next) + width]);
        }
        row.copy_from_slice(&bytes[at(k)..at(k) + width]);
    }
}

/// Seconds for `threads` threads to each run `read` over their share of `keys`, writing their
/// share of `out` (`per_key` elements a key), best of 3.
fn timed<T: Send>(
    threads: usize,
    keys: &[i64],
    out: &mut [T],
    per_key: usize,
    read: &(dyn Fn(&[i64], &mut [T]) + Sync),
) -> f64 {
    let per = keys.len().div_ceil(threads);
    (0..3)
        .map(|_| {
            let t = Instant::now();
            std::thread::scope(|s| {
                for (part, o) in keys.chunks(per).zip(out.chunks_mut(per * per_key)) {
                    s.spawn(move || read(part, o));
                }
            });
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let gb: f64 = arg("--gb", "4").parse().expect("--gb");
    let dim: usize = arg("--dim", "128").parse().expect("--dim");
    let n: usize = arg("--keys", "2000000").parse().expect("--keys");
    let threads: Vec<usize> =
        arg("--threads", "1,2").split(',').map(|t| t.parse().expect("--threads")).collect();
    let how = HostRows::parse(&arg("--host-memory", "mapped")).expect("--host-memory");
    let dir = PathBuf::from(arg("--dir", "/tmp/host_gather_table"));
    let width = dim * 2;
    let rows = (gb * 1e9) as usize / width;

    let t0 = Instant::now();
    let fresh = TableFiles::open_npy(&dir).map_or(true, |f| f.rows != rows || f.dim != dim);
    if fresh {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        write_synthetic_table(&dir, SEED, 0, rows, dim, cores, &Progress::default())
            .expect("table");
    }
    let files = TableFiles::open_npy(&dir).expect("open").place("bench", how);
    let (tier, _) = HostTier::from_files(files).expect("tier");
    let bytes = tier.dense_base().expect("a dense table").0;
    println!(
        "table: {rows} rows of dim {dim}, fp16 ({:.1} GB), {how:?}, {} in {:.1} s; {n} uniform keys a pass",
        (rows * width) as f64 / 1e9,
        if fresh { "written and placed" } else { "placed" },
        t0.elapsed().as_secs_f64()
    );

    let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
    let keys: Vec<i64> = (0..n).map(|_| rng.gen_range(0..rows as i64)).collect();
    // the buffers written once before timing (their pages faulted in)
    let mut plain = vec![1u8; n * width];
    let mut raw = vec![1u8; n * width];
    let mut wide = vec![1f32; n * dim];
    let all_found = std::sync::atomic::AtomicBool::new(true);
    let note = |found: &[bool]| {
        if !found.iter().all(|&f| f) {
            all_found.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    };

    println!("| threads | plain gather (M rows/s) | store, f32 (M rows/s) | store, stored type (M rows/s) | f32 / plain | stored type / plain |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for &t in &threads {
        let p =
            timed(t, &keys, &mut plain, width, &|part, out| plain_gather(bytes, width, part, out));
        let w = timed(t, &keys, &mut wide, dim, &|part, out| {
            let mut found = vec![false; part.len()];
            tier.get_many(part, out, &mut found);
            note(&found);
        });
        let r = timed(t, &keys, &mut raw, width, &|part, out| {
            let mut found = vec![false; part.len()];
            tier.get_many_raw(part, out, &mut found);
            note(&found);
        });
        let rate = |s: f64| n as f64 / s / 1e6;
        println!(
            "| {t} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
            rate(p),
            rate(w),
            rate(r),
            p / w,
            p / r
        );
    }
    assert!(all_found.into_inner(), "a key of the table was not found");
    assert!(plain == raw, "the store's rows as stored differ from the plain gather's");
    let mut want = vec![0u16; dim];
    for (i, &k) in keys.iter().enumerate().step_by(9973) {
        synthetic_row(SEED, 0, k, &mut want);
        let got: Vec<u16> = raw[i * width..(i + 1) * width]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, want, "row of key {k}");
        let widened: Vec<f32> = want.iter().map(|&b| half::f16::from_bits(b).to_f32()).collect();
        assert_eq!(&wide[i * dim..(i + 1) * dim], &widened[..], "f32 row of key {k}");
    }
    println!("rows: the three reads equal, and equal to the fixture's");
}
