//! Who should read a GPU cache's misses from host memory (`gpucache_miss_reads`), timed
//! alone on an idle GPU (needs an NVIDIA GPU): a batch lookup over one table with no cache,
//! so every key misses, its rows (fp16) in a host buffer of `--gb` GB. `cpu`: the fetcher
//! reads the rows on `--threads` host threads into page-locked memory and they go up in one
//! copy (the store's path); `gpu`: the lookup's kernel reads them in place, the buffer
//! page-locked and mapped for the GPU (`HostRows`). Uniform keys, so nearly every read lands
//! on a page of its own. The two paths' rows are compared.
//!
//!   cargo build --release --example miss_reads_bench
//!   target/release/examples/miss_reads_bench [--gb 16] [--dim 128] [--iters 10] [--threads 16]
use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use triton_rust_cuda::cache::HostRows;
use triton_rust_cuda::mem::{Bytes, BytesMut, DeviceOps};
use triton_rust_cuda::Cuda;
use triton_rust_embedding::gpu::{GpuCache, GpuInstance, KeyLayout, RowFormat};
use triton_rust_embedding::CacheRows;

mod common;
use common::arg;

fn main() {
    let (gb, dim, iters, threads) =
        (arg("--gb", 16), arg("--dim", 128), arg("--iters", 10), arg("--threads", 16));
    let row_bytes = dim * 2;
    let rows = gb * (1 << 30) / row_bytes;
    let t0 = Instant::now();
    // row r, element j: a value exact in fp16 that differs from row to row
    let mut host = vec![0u8; rows * row_bytes];
    std::thread::scope(|s| {
        let per = rows.div_ceil(threads) * row_bytes;
        for (p, part) in host.chunks_mut(per).enumerate() {
            s.spawn(move || {
                for (i, row) in part.chunks_exact_mut(row_bytes).enumerate() {
                    let r = p * per / row_bytes + i;
                    for (j, h) in row.chunks_exact_mut(2).enumerate() {
                        let v = ((r * 31 + j) % 2048) as f32 / 1024.0 - 1.0;
                        h.copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
                    }
                }
            });
        }
    });
    let host = Arc::new(host);
    println!(
        "host rows: {rows} rows of dim {dim}, fp16 ({:.1} GB), written in {:.1} s",
        (rows * row_bytes) as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    let t0 = Instant::now();
    let mapped = Arc::new(
        HostRows::register(0, host.clone(), |v: &Vec<u8>| &v[..], rows, 2)
            .expect("the rows page-locked and mapped for the GPU"),
    );
    println!("  page-locked and mapped for the GPU in {:.1} s", t0.elapsed().as_secs_f64());

    let instance = GpuInstance::new(0, CacheRows::F16).expect("a GPU");
    let none: [Option<&GpuCache>; 1] = [None];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
    for n in [16_384usize, 131_072, 1 << 20] {
        let keys: Vec<i64> = (0..n).map(|_| rng.gen_range(0..rows as i64)).collect();
        let mut got: Vec<Vec<u8>> = Vec::new();
        for on_gpu in [false, true] {
            let mut lookup = instance.batch_lookup(&none, dim, RowFormat::F16).expect("lookup");
            if on_gpu {
                lookup.set_host_rows(&[(mapped.clone(), 0.0)]).expect("host rows");
                lookup.read_misses_on_gpu(|| true);
            }
            let mut fetch = |_idx: &mut [i32],
                             mkeys: &mut [i64],
                             out: &mut [f32],
                             found: &mut [u8]|
             -> Result<(), triton_rust_cuda::CudaError> {
                // the store's way: parts of the misses on host threads, fp16 read as fp32
                let per = mkeys.len().div_ceil(threads).max(1);
                std::thread::scope(|s| {
                    for ((k, o), f) in
                        mkeys.chunks(per).zip(out.chunks_mut(per * dim)).zip(found.chunks_mut(per))
                    {
                        let host = &host;
                        s.spawn(move || {
                            for ((&key, row), fl) in k.iter().zip(o.chunks_exact_mut(dim)).zip(f) {
                                let at = key as usize * row_bytes;
                                for (v, h) in
                                    row.iter_mut().zip(host[at..at + row_bytes].chunks_exact(2))
                                {
                                    *v = half::f16::from_le_bytes([h[0], h[1]]).to_f32();
                                }
                                *fl = 1;
                            }
                        });
                    }
                });
                Ok(())
            };
            let mut best = f64::MAX;
            let mut below_us = 0u64;
            for i in 0..iters + 2 {
                let t = Instant::now();
                let times = lookup
                    .run(&keys, KeyLayout::Interleaved, instance.next_epoch(), &mut fetch)
                    .expect("run");
                assert_eq!(times.misses, n, "no cache: every key misses");
                if i >= 2 {
                    best = best.min(t.elapsed().as_secs_f64());
                    below_us += times.fetch_us + times.scatter_us;
                }
            }
            let rows_view = lookup.rows(n * dim).expect("rows");
            let mut back = vec![0u8; n * dim * 2];
            Cuda.copy(Bytes::Device(rows_view), BytesMut::Host(&mut back)).expect("rows back");
            got.push(back);
            println!(
                "  {n:>8} misses read by the {}: {:.3} ms a batch at best ({:.1} M rows/s, {:.1} GB/s of rows), the reads and the scatter {:.3} ms on average",
                if on_gpu { "gpu (in place, over the bus)" } else { "cpu (host threads, then one copy)" },
                best * 1e3,
                n as f64 / best / 1e6,
                (n * row_bytes) as f64 / best / 1e9,
                below_us as f64 / iters as f64 / 1e3
            );
        }
        assert!(got[0] == got[1], "the two paths' rows differ");
        // and the rows are the buffer's
        for (i, &k) in keys.iter().enumerate().step_by(997) {
            let at = k as usize * row_bytes;
            assert_eq!(&got[1][i * row_bytes..(i + 1) * row_bytes], &host[at..at + row_bytes]);
        }
        println!("  {n:>8} misses: both paths' rows equal, and equal to the host buffer's");
    }
}
