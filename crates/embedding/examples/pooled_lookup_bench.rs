//! The pooled lookup alone over resident tables (issue 46; needs an NVIDIA GPU): MLPerf
//! DLRM-v2's 26 tables of dim 128 at `--scale` of its rows (1.0: 204 M rows, 52 GB of fp16)
//! kept whole on one GPU, and batches of `--batches` samples of its hotness (214 keys a
//! sample, every bag full) pooled by one kernel (`ResidentPool`) from keys already in GPU
//! memory, as a client's CUDA shared memory hands them over. Timed per batch from launch to
//! the miss count back on the host (what a served batch waits for), in lookups/s and GB/s of
//! rows read; keys uniform over each table, or Zipf (`--alpha`, ranks spread over the rows).
//! Checked first: a batch's pooled rows against sums computed here.
//!
//!   cargo build --release -p triton_rust_embedding --features gpu --example pooled_lookup_bench
//!   target/release/examples/pooled_lookup_bench [--scale 1.0] [--batches 1024,4096,16384] [--alpha 1.05] [--iters 30]
use std::time::Instant;

use rand::{Rng, SeedableRng};
use triton_rust_cuda::cache::{BagLayout, BatchKeys, CacheSlots, Queue, ResidentPool, RowFormat};
use triton_rust_cuda::mem::{Bytes, BytesMut, DeviceOps};
use triton_rust_cuda::Cuda;
use triton_rust_embedding::{mix64, Zipf};

#[path = "common/dlrm_v2.rs"]
mod dlrm_v2;
use dlrm_v2::{DIM, HOTNESS, ROWS};

/// Rows repeat with this period (the values do not change what is timed).
const PERIOD: usize = 65_536;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

/// Element j of row `key`: a multiple of 2^-10 in [-1, 1), exact in fp16.
fn value(key: usize, j: usize) -> f32 {
    (((key % PERIOD) * 31 + j * 7) % 2048) as f32 / 1024.0 - 1.0
}

fn main() {
    let scale: f64 = arg("--scale").map_or(1.0, |v| v.parse().expect("--scale"));
    let batches: Vec<usize> = arg("--batches")
        .unwrap_or_else(|| "1024,4096,16384".into())
        .split(',')
        .map(|v| v.parse().expect("--batches"))
        .collect();
    let alpha: f64 = arg("--alpha").map_or(1.05, |v| v.parse().expect("--alpha"));
    let iters: usize = arg("--iters").map_or(30, |v| v.parse().expect("--iters"));
    let rows: Vec<usize> =
        ROWS.iter().map(|&r| ((r as f64 * scale).round() as usize).max(1)).collect();
    let total: usize = rows.iter().sum();
    let queue = Queue::new(0).expect("a GPU");
    // the repeating block of rows, fp16, uploaded into every table
    let block: Vec<u8> = (0..PERIOD)
        .flat_map(|k| (0..DIM).map(move |j| half::f16::from_f32(value(k, j)).to_bits()))
        .flat_map(|h| h.to_le_bytes())
        .collect();
    let t0 = Instant::now();
    let tables: Vec<CacheSlots> = rows
        .iter()
        .map(|&n| {
            let slots = CacheSlots::resident(&queue, n, DIM, RowFormat::F16).expect("room");
            let row = DIM * 2;
            let mut at = 0;
            while at < n {
                let k = (n - at).min(PERIOD);
                slots.upload_rows(at, &block[..k * row]).expect("upload");
                at += k;
            }
            slots
        })
        .collect();
    println!(
        "26 resident tables, {total} rows of dim {DIM} fp16 ({:.1} GB) on the GPU in {:.1} s; {} keys a sample",
        (total * DIM * 2) as f64 / 1e9,
        t0.elapsed().as_secs_f64(),
        HOTNESS.iter().sum::<usize>()
    );
    let refs: Vec<&CacheSlots> = tables.iter().collect();
    let mut pool =
        ResidentPool::new(&queue, &refs, RowFormat::F16).expect("pool").expect("resident");
    let width: usize = HOTNESS.iter().sum();
    let at: Vec<i32> = std::iter::once(0)
        .chain(HOTNESS.iter().scan(0i32, |a, &h| {
            *a += h as i32;
            Some(*a)
        }))
        .collect();
    let zipfs: Vec<Option<Zipf>> =
        rows.iter().map(|&n| (alpha > 0.0 && n > 1).then(|| Zipf::new(n, alpha))).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(46);
    for &batch in &batches {
        for skew in ["uniform", "zipf"] {
            if skew == "zipf" && alpha <= 0.0 {
                continue;
            }
            // keys [batch, 214], table by table within a sample
            let mut keys = vec![0i64; batch * width];
            for sample in keys.chunks_exact_mut(width) {
                let mut i = 0;
                for (t, &h) in HOTNESS.iter().enumerate() {
                    for _ in 0..h {
                        let n = rows[t];
                        sample[i] = match (&zipfs[t], skew) {
                            (Some(z), "zipf") => {
                                (mix64(z.rank(rng.gen()) as i64) as u64 % n as u64) as i64
                            }
                            _ => rng.gen_range(0..n as i64),
                        };
                        i += 1;
                    }
                }
            }
            let mut d_keys = triton_rust_cuda::alloc(0, keys.len() * 8).expect("keys");
            let key_bytes: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
            Cuda.copy(Bytes::Host(&key_bytes), BytesMut::Device(d_keys.view_mut()))
                .expect("keys up");
            let view = d_keys.view();
            let layout = BagLayout::Fixed { width, at: &at };
            let misses =
                pool.run(BatchKeys::Device(view), layout, batch, false, None).expect("run");
            assert_eq!(misses, 0, "every key is a resident row");
            // the first samples' pooled rows against sums of the rows (fp32 sums of fp16 rows,
            // then rounded to fp16 as the kernel writes them)
            let rows_out = pool.rows(batch).expect("rows");
            let mut got = vec![0u8; rows_out.len()];
            Cuda.copy(Bytes::Device(rows_out), BytesMut::Host(&mut got)).expect("rows down");
            let got: Vec<u16> =
                got.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
            let mut worst = 0f32;
            for b in 0..batch.min(8) {
                for t in 0..26 {
                    for j in 0..DIM {
                        let s: f32 = (at[t]..at[t + 1])
                            .map(|i| {
                                half::f16::from_f32(value(keys[b * width + i as usize] as usize, j))
                                    .to_f32()
                            })
                            .sum();
                        let want = half::f16::from_f32(s).to_f32();
                        let g = half::f16::from_bits(got[(b * 26 + t) * DIM + j]).to_f32();
                        worst = worst.max((g - want).abs() / want.abs().max(1.0));
                    }
                }
            }
            assert!(worst <= 1e-3, "pooled rows off by {worst}");
            let t = Instant::now();
            for _ in 0..iters {
                pool.run(BatchKeys::Device(view), layout, batch, false, None).expect("run");
            }
            let secs = t.elapsed().as_secs_f64() / iters as f64;
            let lookups = (batch * width) as f64 / secs;
            println!(
                "batch {batch:6} ({skew:7}): {:8.1} us a batch, {:6.2} G lookups/s, {:7.1} GB/s of rows, {:6.2} M samples/s (checked: max rel diff {worst:.1e})",
                secs * 1e6,
                lookups / 1e9,
                lookups * (DIM * 2) as f64 / 1e9,
                batch as f64 / secs / 1e6
            );
        }
    }
}
