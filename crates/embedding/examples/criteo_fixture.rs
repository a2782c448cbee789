//! Writes the Criteo-scale benchmark store (issue 8): the 26 tables of the MLPerf DLRMv2
//! Criteo-1TB layout (the row counts `examples/make_tables.py` uses), scaled by `--scale`,
//! keys `0..rows`, fp16 rows of `--dim` computed from `--seed` (see
//! `triton_rust_embedding::fixture`), in the store's table format under `<out>/t0..t25`.
//! Prints the plan, progress every two seconds (rows, GB, GB/s, time left) and the
//! per-table cache capacities for a GPU cache holding `--cache-share` of the rows.
//!
//!   cargo run --release -p triton_rust_embedding --example criteo_fixture -- --out /data/criteo [--scale 0.8]
//!       [--dim 128] [--seed 1] [--threads N] [--cache-share 0.1]
//!
//! At --scale 0.8 and dim 128: 163 M rows, 20.9 B parameters, 43 GB of files.
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use triton_rust_embedding::fixture::{write_synthetic_table, Progress};

/// MLPerf DLRMv2 (Criteo 1TB, multi-hot) table sizes.
const CRITEO_1TB_ROWS: [usize; 26] = [
    40_000_000, 39_060, 17_295, 7_424, 20_265, 3, 7_122, 1_543, 63, 40_000_000, 3_067_956, 405_282,
    10, 2_209, 11_938, 155, 4, 976, 14, 40_000_000, 40_000_000, 40_000_000, 590_152, 12_973, 108,
    36,
];

struct Args {
    out: PathBuf,
    scale: f64,
    dim: usize,
    seed: u64,
    threads: usize,
    cache_share: f64,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        out: PathBuf::new(),
        scale: 0.8,
        dim: 128,
        seed: 1,
        threads: std::thread::available_parallelism().map_or(4, |n| n.get()),
        cache_share: 0.1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--out" => a.out = PathBuf::from(&value),
            "--scale" => a.scale = value.parse().map_err(|e| bad(&e))?,
            "--dim" => a.dim = value.parse().map_err(|e| bad(&e))?,
            "--seed" => a.seed = value.parse().map_err(|e| bad(&e))?,
            "--threads" => a.threads = value.parse().map_err(|e| bad(&e))?,
            "--cache-share" => a.cache_share = value.parse().map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.out.as_os_str().is_empty() {
        return Err("--out DIR is required".into());
    }
    if a.scale.is_nan()
        || a.scale <= 0.0
        || a.dim == 0
        || a.threads == 0
        || !(0.0..=1.0).contains(&a.cache_share)
    {
        return Err("--scale > 0, --dim > 0, --threads > 0 and 0 <= --cache-share <= 1".into());
    }
    Ok(a)
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\nusage: criteo_fixture --out DIR [--scale 0.8] [--dim 128] [--seed 1] [--threads N] [--cache-share 0.1]");
            std::process::exit(2);
        }
    };
    let rows: Vec<usize> =
        CRITEO_1TB_ROWS.iter().map(|&r| ((r as f64 * a.scale) as usize).max(1)).collect();
    let total_rows: usize = rows.iter().sum();
    let total_bytes = total_rows as u64 * (8 + 2 * a.dim as u64);
    println!(
        "26 tables, {} rows, {:.2} B parameters (dim {}), fp16: {:.1} GB to write with {} threads into {}",
        total_rows,
        (total_rows * a.dim) as f64 / 1e9,
        a.dim,
        total_bytes as f64 / 1e9,
        a.threads,
        a.out.display()
    );
    let progress = Progress::default();
    let started = Instant::now();
    let done = std::sync::atomic::AtomicBool::new(false);
    let result = std::thread::scope(|s| {
        s.spawn(|| {
            let mut last = Instant::now();
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                if last.elapsed() < Duration::from_secs(2) {
                    continue;
                }
                last = Instant::now();
                let b = progress.bytes.load(Ordering::Relaxed);
                let secs = started.elapsed().as_secs_f64();
                let rate = b as f64 / secs;
                let left = (total_bytes.saturating_sub(b)) as f64 / rate.max(1.0);
                println!(
                    "  {:>5.1}%  {:>6.1} GB written  {:>5.2} GB/s  {:>5.0} s left",
                    100.0 * b as f64 / total_bytes as f64,
                    b as f64 / 1e9,
                    rate / 1e9,
                    left
                );
            }
        });
        let mut result = Ok(());
        for (t, &n) in rows.iter().enumerate() {
            if let Err(e) = write_synthetic_table(
                &a.out.join(format!("t{t}")),
                a.seed,
                t as u32,
                n,
                a.dim,
                a.threads,
                &progress,
            ) {
                result = Err(e);
                break;
            }
        }
        done.store(true, Ordering::Relaxed);
        result
    });
    if let Err(e) = result {
        eprintln!("writing the fixture failed: {e}");
        std::process::exit(1);
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "wrote {:.1} GB in {:.1} s ({:.2} GB/s)",
        progress.bytes.load(Ordering::Relaxed) as f64 / 1e9,
        secs,
        progress.bytes.load(Ordering::Relaxed) as f64 / 1e9 / secs
    );
    let cached: Vec<usize> =
        rows.iter().map(|&r| ((r as f64 * a.cache_share).ceil() as usize).max(1)).collect();
    println!(
        "GPU cache at {:.0}% of the rows: {} rows ({:.1} GB fp16); per table: {}",
        a.cache_share * 100.0,
        cached.iter().sum::<usize>(),
        (cached.iter().sum::<usize>() * a.dim * 2) as f64 / 1e9,
        cached.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
    );
}
