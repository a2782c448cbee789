//! How fast the host tier reads rows scattered over a large table (the misses of a GPU
//! lookup): one table of a fixture (`criteo_fixture`), uniformly random keys, rows
//! decoded into f32 by `HostTier::get_many` as a lookup does, on 1 and more threads, each
//! pass twice (a first pass over pages not yet mapped pays their page faults).
//! `--host-memory` places the rows as the store's parameter of that name does: `mapped`
//! (every page mapped ahead, as the store does at load), `huge_pages` (copied into memory
//! backed by 2 MiB pages), or `lazy` (the bare mapping, pages mapped on first read).
//!
//!   cargo build --release -p triton_rust_embedding --example host_read_bench
//!   target/release/examples/host_read_bench --table /dev/shm/criteo/t0 [--keys 50000]
//!       [--threads 1,4,16] [--host-memory lazy|mapped|huge_pages]
use std::time::Instant;

use rand::{Rng, SeedableRng};
use triton_rust_embedding::host::HostTier;
use triton_rust_embedding::table::{HostRows, TableFiles};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn main() {
    let dir = arg("--table").expect("--table DIR (a table of keys.npy and vectors.npy)");
    let n: usize = arg("--keys").map_or(50_000, |v| v.parse().expect("--keys N"));
    let threads: Vec<usize> = arg("--threads")
        .unwrap_or_else(|| "1,4,16".into())
        .split(',')
        .map(|t| t.parse().expect("--threads"))
        .collect();
    let how = arg("--host-memory").unwrap_or_else(|| "mapped".into());
    let t0 = Instant::now();
    let mut files = TableFiles::open_npy(std::path::Path::new(&dir)).expect("open table");
    if how != "lazy" {
        files = files.place(&dir, HostRows::parse(&how).expect("--host-memory"));
    }
    let (tier, _) = HostTier::from_files(files).expect("index");
    let (rows, dim) = (tier.len(), tier.dim());
    println!(
        "{dir}: {rows} rows of dim {dim}, {how}, ready in {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let mut out = vec![0f32; n * dim];
    let mut found = vec![false; n];
    out.fill(1.0); // the output's pages are mapped before any pass, as a lookup's pinned buffer is
    for &th in &threads {
        let keys: Vec<i64> = (0..n).map(|_| rng.gen_range(0..rows as i64)).collect();
        for pass in ["first", "second"] {
            let per = n.div_ceil(th);
            let t = Instant::now();
            std::thread::scope(|s| {
                for ((k, o), f) in
                    keys.chunks(per).zip(out.chunks_mut(per * dim)).zip(found.chunks_mut(per))
                {
                    let tier = &tier;
                    s.spawn(move || tier.get_many(k, o, f));
                }
            });
            let us = t.elapsed().as_secs_f64() * 1e6;
            assert!(found.iter().all(|&f| f));
            println!(
                "  {how:10} {th:2} threads, {pass:6} pass: {n} rows in {us:8.0} us = {:6.1} ns per row per thread, {:5.2} GB/s of rows",
                us * 1e3 * th as f64 / n as f64,
                (n * dim * 2) as f64 / us / 1e3
            );
        }
    }
}
