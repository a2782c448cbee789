//! Benchmark fixtures: tables of any size with rows computed from (seed, table, key), so
//! a Criteo-scale store (26 tables, ~200 M rows, tens of GB) is written in minutes on
//! the machine that serves it instead of being shipped there, and any row can be
//! recomputed to check what the server returned.
//!
//! Keys are `0..rows`; vectors are fp16, each element a value of magnitude 2^-7 to
//! 2^-4 with a random sign and mantissa (finite, never zero), from a counter-based hash,
//! so rows are independent of how the writing is split over threads. Files are the
//! store's own format (`keys.npy`, `vectors.npy`), loaded like any other table.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::table::npy_header;
use crate::keys::mix64;
use triton_rust_core::error::{Error, Result};

/// The fp16 bit patterns of row `key` of table `table` (dim elements into `out`).
pub fn synthetic_row(seed: u64, table: u32, key: i64, out: &mut [u16]) {
    let base = mix64(seed as i64 ^ ((table as i64) << 40))
        ^ (key as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for (i, quad) in out.chunks_mut(4).enumerate() {
        let mut r = mix64((base ^ i as u64) as i64);
        for v in quad {
            let bits = r as u16;
            r >>= 16;
            let sign = (bits >> 15) << 15;
            let exponent = 8 + ((bits >> 10) & 3); // 2^-7 .. 2^-4
            *v = sign | (exponent << 10) | (bits & 0x3ff);
        }
    }
}

/// Bytes written so far across threads, for progress reports.
#[derive(Default)]
pub struct Progress {
    pub bytes: AtomicU64,
}

/// Writes table `table` (keys `0..rows`, fp16 vectors of `dim`) into `dir`, splitting
/// the rows over `threads` writers. Returns the bytes written.
pub fn write_synthetic_table(
    dir: &Path,
    seed: u64,
    table: u32,
    rows: usize,
    dim: usize,
    threads: usize,
    progress: &Progress,
) -> Result<u64> {
    let io = |what: &str, path: &Path, e: std::io::Error| {
        Error::internal(format!("cannot {what} '{}': {e}", path.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| io("create", dir, e))?;
    let keys_path = dir.join("keys.npy");
    let vectors_path = dir.join("vectors.npy");
    let keys_header = npy_header("<i8", &[rows]);
    let vectors_header = npy_header("<f2", &[rows, dim]);
    let keys = File::create(&keys_path).map_err(|e| io("create", &keys_path, e))?;
    let vectors = File::create(&vectors_path).map_err(|e| io("create", &vectors_path, e))?;
    keys.write_all_at(&keys_header, 0).map_err(|e| io("write", &keys_path, e))?;
    vectors.write_all_at(&vectors_header, 0).map_err(|e| io("write", &vectors_path, e))?;
    let row_bytes = dim * 2;
    // rows per write: ~4 MB of vectors
    let block = ((4usize << 20) / row_bytes).max(1);
    let blocks = rows.div_ceil(block);
    let next = AtomicU64::new(0);
    let threads = threads.clamp(1, blocks.max(1));
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    let mut vbuf = vec![0u16; block * dim];
                    let mut kbuf = vec![0i64; block];
                    loop {
                        let b = next.fetch_add(1, Ordering::Relaxed) as usize;
                        if b >= blocks {
                            return Ok(());
                        }
                        let start = b * block;
                        let n = block.min(rows - start);
                        for (i, (k, row)) in
                            kbuf[..n].iter_mut().zip(vbuf.chunks_mut(dim)).enumerate()
                        {
                            *k = (start + i) as i64;
                            synthetic_row(seed, table, *k, row);
                        }
                        let vbytes: &[u8] = bytemuck::cast_slice(&vbuf[..n * dim]);
                        let kbytes: &[u8] = bytemuck::cast_slice(&kbuf[..n]);
                        vectors
                            .write_all_at(vbytes, (vectors_header.len() + start * row_bytes) as u64)
                            .map_err(|e| io("write", &vectors_path, e))?;
                        keys.write_all_at(kbytes, (keys_header.len() + start * 8) as u64)
                            .map_err(|e| io("write", &keys_path, e))?;
                        progress
                            .bytes
                            .fetch_add((vbytes.len() + kbytes.len()) as u64, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err(Error::internal("a table writer panicked"))))
            .collect()
    });
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok((keys_header.len() + rows * 8 + vectors_header.len() + rows * row_bytes) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::TableFiles;

    #[test]
    fn rows_are_finite_small_and_reproducible() {
        let mut a = vec![0u16; 128];
        let mut b = vec![0u16; 128];
        synthetic_row(7, 3, 12345, &mut a);
        synthetic_row(7, 3, 12345, &mut b);
        assert_eq!(a, b);
        synthetic_row(7, 4, 12345, &mut b);
        assert_ne!(a, b, "another table gives another row");
        for &h in &a {
            let v = half::f16::from_bits(h).to_f32();
            assert!(v.is_finite() && v.abs() >= 2f32.powi(-7) && v.abs() < 2f32.powi(-3), "{v}");
        }
        let negative = a.iter().filter(|&&h| h >> 15 == 1).count();
        assert!((32..=96).contains(&negative), "signs are mixed: {negative} of 128 negative");
    }

    #[test]
    fn written_tables_load_as_store_tables_whatever_the_thread_count() {
        let dir = std::env::temp_dir().join(format!("fixture-test-{}", std::process::id()));
        let progress = Progress::default();
        // rows not a multiple of the block, dim not a multiple of 4
        let rows = 40_000;
        let total = write_synthetic_table(&dir.join("one"), 11, 2, rows, 30, 1, &progress).unwrap();
        write_synthetic_table(&dir.join("four"), 11, 2, rows, 30, 4, &progress).unwrap();
        assert_eq!(progress.bytes.load(Ordering::Relaxed), 2 * (rows * 8 + rows * 60) as u64);
        let one = std::fs::read(dir.join("one/vectors.npy")).unwrap();
        assert_eq!(one, std::fs::read(dir.join("four/vectors.npy")).unwrap());
        let t = TableFiles::open_npy(&dir.join("one")).unwrap();
        assert_eq!((t.rows, t.dim), (rows, 30));
        assert_eq!(
            total as usize,
            std::fs::metadata(dir.join("one/keys.npy")).unwrap().len() as usize + one.len()
        );
        let mut want = vec![0u16; 30];
        for key in [0usize, 1, 12_345, rows - 1] {
            assert_eq!(t.keys()[key], key as i64);
            synthetic_row(11, 2, key as i64, &mut want);
            assert_eq!(t.row_bytes(key), bytemuck::cast_slice::<u16, u8>(&want));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
