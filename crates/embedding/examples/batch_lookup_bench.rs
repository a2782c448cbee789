//! Where a whole-batch GPU lookup's time goes (needs an NVIDIA GPU). Every table's cache is
//! filled, then a batch of `[batch, tables]` Zipf keys from ordinary (pageable) host memory,
//! as a client's shared-memory region is, goes through `BatchLookup::run`: timed with fp32
//! and fp16 rows out and with several ways of sending the keys (piece size, copying tasks),
//! beside what bounds it: copying the keys between host buffers on 1 to 16 threads. The
//! served rows are checked against the rows inserted.
//!
//!   cargo build --release -p triton_rust_embedding --features gpu --example batch_lookup_bench
//!   target/release/examples/batch_lookup_bench [--batch 65536] [--tables 26] [--rows 600000] [--dim 128] [--iters 20]
use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use triton_rust_cuda::mem::{Bytes, BytesMut, DeviceOps};
use triton_rust_cuda::Cuda;
use triton_rust_embedding::cache::{CacheGeometry, CacheTier};
use triton_rust_embedding::gpu::{
    BatchKeys, FetchedRows, GpuCache, GpuInstance, KeyLayout, KeyUpload, RowFormat,
};
use triton_rust_embedding::{CacheRows, Zipf};

mod common;
use common::arg;

/// Row `key` of table `t`: values exact in fp16, so fp16 rows compare exactly too.
fn value(t: usize, key: i64, j: usize) -> f32 {
    ((key as usize * 31 + t * 7 + j) % 2048) as f32 / 1024.0 - 1.0
}

fn main() {
    let (batch, tables, rows, dim, iters) = (
        arg("--batch", 65536),
        arg("--tables", 26),
        arg("--rows", 600_000),
        arg("--dim", 128),
        arg("--iters", 20),
    );
    // --fp16-cache 1: the caches keep their rows as fp16 (`gpucache_row_type: fp16`)
    let cache_rows = if arg("--fp16-cache", 0) == 1 { CacheRows::F16 } else { CacheRows::F32 };
    let instance = GpuInstance::new(0, cache_rows).expect("a GPU");
    let geo = CacheGeometry::for_rows(rows, dim);
    let t0 = Instant::now();
    let caches: Vec<Arc<dyn CacheTier>> =
        (0..tables).map(|_| instance.new_cache(geo, 0).expect("a cache")).collect();
    for (t, cache) in caches.iter().enumerate() {
        for part in (0..rows as i64).collect::<Vec<_>>().chunks(1 << 16) {
            let vals: Vec<f32> =
                part.iter().flat_map(|&k| (0..dim).map(move |j| value(t, k, j))).collect();
            cache.insert(part, &vals).expect("insert");
        }
    }
    println!(
        "{tables} caches of {} slots, {rows} rows each inserted (dim {dim}, {:.1} GB of fp32 rows) in {:.1} s",
        geo.capacity(),
        (tables * geo.capacity() * dim * 4) as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    let gpu_caches: Vec<Option<&GpuCache>> =
        caches.iter().map(|c| c.as_any().downcast_ref::<GpuCache>()).collect();
    let zipf = Zipf::new(rows, 1.2);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let keys: Vec<i64> = (0..batch * tables).map(|_| zipf.rank(rng.gen()) as i64).collect();
    let n = keys.len();
    println!(
        "batch {batch} × {tables} tables = {n} keys ({:.1} MB of int64), Zipf α 1.2",
        (n * 8) as f64 / 1e6
    );

    // the bound on the keys' copy out of pageable memory: one part per thread, host to host
    let mut dst = vec![0i64; n];
    for threads in [1, 2, 4, 8, 16] {
        let per = n.div_ceil(threads);
        let t = Instant::now();
        for _ in 0..iters {
            std::thread::scope(|s| {
                for (from, to) in keys.chunks(per).zip(dst.chunks_mut(per)) {
                    s.spawn(move || to.copy_from_slice(from));
                }
            });
        }
        let secs = t.elapsed().as_secs_f64() / iters as f64;
        println!("  keys copied host to host on {threads:2} threads: {:.3} ms ({:.1} GB/s, thread starts included)", secs * 1e3, (n * 8) as f64 / secs / 1e9);
    }

    let ways = [
        KeyUpload::default(),
        KeyUpload { piece_keys: 128 << 10, threads: 8 },
        KeyUpload { piece_keys: 64 << 10, threads: 16 },
        KeyUpload { piece_keys: 512 << 10, threads: 2 },
        KeyUpload { piece_keys: usize::MAX / 4, threads: 1 },
    ];
    for format in [RowFormat::F32, RowFormat::F16] {
        let mut lookup = instance.batch_lookup(&gpu_caches, dim, format).expect("batch lookup");
        for how in ways {
            lookup.set_key_upload(how);
            let mut missed = 0usize;
            let mut fetch = |idx: &mut [i32],
                             mkeys: &mut [i64],
                             out: FetchedRows<'_>,
                             found: &mut [u8]|
             -> Result<(), triton_rust_cuda::CudaError> {
                let out = out.f32().expect("fetched as fp32");
                missed += idx.len();
                for (j, (&i, &key)) in idx.iter().zip(mkeys.iter()).enumerate() {
                    assert_eq!(key, keys[i as usize], "the missed keys come with their indices");
                    let t = i as usize % tables;
                    for (d, v) in out[j * dim..(j + 1) * dim].iter_mut().enumerate() {
                        *v = value(t, key, d);
                    }
                    found[j] = 1;
                }
                Ok(())
            };
            for _ in 0..3 {
                lookup
                    .run(&keys, KeyLayout::Interleaved, instance.next_epoch(), &mut fetch)
                    .expect("warm-up");
                lookup.fill_last(instance.next_epoch()).expect("fill");
            }
            let (mut lookup_us, mut misses) = (0u64, 0usize);
            let t = Instant::now();
            for _ in 0..iters {
                let times = lookup
                    .run(&keys, KeyLayout::Interleaved, instance.next_epoch(), &mut fetch)
                    .expect("run");
                lookup_us += times.lookup_us;
                misses += times.misses;
                lookup.fill_last(instance.next_epoch()).expect("fill");
            }
            let secs = t.elapsed().as_secs_f64() / iters as f64;
            let pieces = n.div_ceil(how.piece_keys.max(1));
            println!(
                "  {:?} rows, pieces of {:>7} keys ({pieces:2}), up to {:2} tasks: {:.3} ms a batch (keys up + kernel {:.3} ms), {:.0} misses a batch",
                format,
                how.piece_keys.min(n),
                how.threads,
                secs * 1e3,
                lookup_us as f64 / iters as f64 / 1e3,
                misses as f64 / iters as f64
            );
        }
        // the keys already in GPU memory (a client's CUDA shared memory): no trip from the host
        let mut d_keys = Cuda.alloc(0, n * 8).expect("device keys");
        let key_bytes: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
        Cuda.copy(Bytes::Host(&key_bytes), BytesMut::Device(d_keys.view_mut())).expect("keys up");
        let mut fetch = |idx: &mut [i32],
                         mkeys: &mut [i64],
                         out: FetchedRows<'_>,
                         found: &mut [u8]|
         -> Result<(), triton_rust_cuda::CudaError> {
            let out = out.f32().expect("fetched as fp32");
            for (j, (&i, &key)) in idx.iter().zip(mkeys.iter()).enumerate() {
                assert_eq!(key, keys[i as usize], "the missed keys gathered on the GPU");
                for (d, v) in out[j * dim..(j + 1) * dim].iter_mut().enumerate() {
                    *v = value(i as usize % tables, key, d);
                }
                found[j] = 1;
            }
            Ok(())
        };
        for _ in 0..3 {
            lookup
                .run_keys(
                    BatchKeys::Device(d_keys.view()),
                    KeyLayout::Interleaved,
                    instance.next_epoch(),
                    &mut fetch,
                    None,
                )
                .expect("warm-up");
        }
        let t = Instant::now();
        let mut lookup_us = 0u64;
        for _ in 0..iters {
            lookup_us += lookup
                .run_keys(
                    BatchKeys::Device(d_keys.view()),
                    KeyLayout::Interleaved,
                    instance.next_epoch(),
                    &mut fetch,
                    None,
                )
                .expect("run")
                .lookup_us;
        }
        let secs = t.elapsed().as_secs_f64() / iters as f64;
        println!(
            "  {format:?} rows, keys already on the GPU: {:.3} ms a batch (copy + kernel {:.3} ms)",
            secs * 1e3,
            lookup_us as f64 / iters as f64 / 1e3
        );
        // the rows served, against the rows inserted
        let check = 4096.min(batch) * tables;
        let esize = format.size();
        let view =
            lookup.rows(n * dim).expect("rows").slice(0..check * dim * esize).expect("a part");
        let mut host = vec![0u8; check * dim * esize];
        Cuda.copy(Bytes::Device(view), BytesMut::Host(&mut host)).expect("rows back");
        let mut worst = 0f32;
        // the last run looked the keys up from GPU memory: this checks that path's rows
        for (i, &key) in keys.iter().enumerate().take(check) {
            for d in 0..dim {
                let at = (i * dim + d) * esize;
                let got = match format {
                    RowFormat::F32 => f32::from_le_bytes(host[at..at + 4].try_into().unwrap()),
                    RowFormat::F16 => half::f16::from_le_bytes([host[at], host[at + 1]]).to_f32(),
                };
                worst = worst.max((got - value(i % tables, key, d)).abs());
            }
        }
        println!("  {format:?} rows of the first {check} keys against the rows inserted: max abs diff {worst}");
        assert_eq!(worst, 0.0, "served rows differ");
    }
}
