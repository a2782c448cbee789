//! The host tier: every row of a table in host memory.
//!
//! Rows loaded from disk stay in the memory-mapped file (no copy); an index maps each
//! key to its row. The index is sharded (64 read-write-locked hash maps) so lookups
//! from many instances do not contend. Online updates never write a row in place:
//! the new vector is appended to an overlay and the key's index entry is switched
//! under the shard's write lock, so a reader sees either the old row or the new one,
//! never a mix. Superseded overlay rows are kept until a compaction (`durable.rs`)
//! replaces the tier with one built from a snapshot; see docs/embedding-store.md.
//!
//! Memory: the mapped vectors and keys, plus about 20-36 bytes of index per key
//! (hashbrown buckets of (i64, u32)), i.e. ≤ 1.1× the raw bytes at dim 128. A table
//! whose keys are exactly `0..rows` in order (Criteo-style ids, the benchmark fixture)
//! needs no index: key k is row k, and only keys updated since load are in the shards
//! (at Criteo scale that saves ~5 GB and a minute of index building per 200 M rows).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::RwLock;

use super::table::{TableFiles, VectorType};
use crate::keys::mix64;
use triton_rust_core::error::{Error, Result};

const SHARDS: usize = 64;
const OVERLAY: u32 = 1 << 31;

/// Hashes an i64 key with the murmur3 finalizer: fast, and good on sequential ids.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix64((self.0 << 8 | b as u64) as i64);
        }
    }
    fn write_i64(&mut self, k: i64) {
        self.0 = mix64(k);
    }
}

type Index = HashMap<i64, u32, BuildHasherDefault<KeyHasher>>;

pub struct HostTier {
    dim: usize,
    base: Option<TableFiles>,
    /// `Some(rows)` when the base's keys are `0..rows` in order: no index for them.
    dense: Option<usize>,
    /// Shard entries for keys of the dense range (updated since load), so `len` counts
    /// each key once.
    shadowed: AtomicUsize,
    shards: Vec<RwLock<Index>>,
    overlay: RwLock<Vec<f32>>,
    /// Whether any shard has ever held an entry. Until then a dense table's reads take
    /// no lock at all (see `get_many`); set before the first entry goes in.
    indexed: AtomicBool,
}

fn shard_of(key: i64) -> usize {
    // The index's own hash uses the low bits; shard on the high ones.
    (mix64(key) >> 58) as usize % SHARDS
}

impl HostTier {
    pub fn empty(dim: usize) -> HostTier {
        HostTier {
            dim,
            base: None,
            dense: None,
            shadowed: AtomicUsize::new(0),
            shards: (0..SHARDS).map(|_| RwLock::new(Index::default())).collect(),
            overlay: RwLock::new(Vec::new()),
            indexed: AtomicBool::new(false),
        }
    }

    /// Indexes a table's mapped rows. Duplicate keys: the last row wins (counted in the result).
    pub fn from_files(files: TableFiles) -> Result<(HostTier, usize)> {
        if files.rows >= OVERLAY as usize {
            return Err(Error::unsupported(format!(
                "a table of {} rows is above the 2^31 rows one host tier indexes",
                files.rows
            )));
        }
        let mut tier = HostTier::empty(files.dim);
        if files.keys().iter().enumerate().all(|(i, &k)| k == i as i64) {
            tier.dense = Some(files.rows);
            tier.base = Some(files);
            return Ok((tier, 0));
        }
        let mut duplicates = 0;
        let mut per_shard = vec![0usize; SHARDS];
        for &k in files.keys() {
            per_shard[shard_of(k)] += 1;
        }
        for (s, n) in tier.shards.iter_mut().zip(per_shard) {
            s.get_mut().reserve(n);
        }
        *tier.indexed.get_mut() = true;
        for (row, &k) in files.keys().iter().enumerate() {
            if tier.shards[shard_of(k)].get_mut().insert(k, row as u32).is_some() {
                duplicates += 1;
            }
        }
        tier.base = Some(files);
        Ok((tier, duplicates))
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn len(&self) -> usize {
        let indexed: usize = self.shards.iter().map(|s| s.read().len()).sum();
        indexed + self.dense.unwrap_or(0) - self.shadowed.load(Ordering::Relaxed)
    }

    fn in_dense(&self, key: i64) -> bool {
        self.dense.is_some_and(|rows| (0..rows as i64).contains(&key))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the row of `key` into `out`; false if the key is not here.
    pub fn get(&self, key: i64, out: &mut [f32]) -> bool {
        let loc = match self.shards[shard_of(key)].read().get(&key) {
            Some(&l) => l,
            None if self.in_dense(key) => key as u32,
            None => return false,
        };
        self.read_loc(loc, out);
        true
    }

    fn read_loc(&self, loc: u32, out: &mut [f32]) {
        if loc & OVERLAY != 0 {
            let i = (loc & !OVERLAY) as usize * self.dim;
            out.copy_from_slice(&self.overlay.read()[i..i + self.dim]);
        } else if let Some(base) = &self.base {
            base.read_row(loc as usize, out);
        }
    }

    /// Looks up many keys; `found[i]` says whether row i of `out` was written.
    ///
    /// A dense table no update has touched (the benchmark's Criteo fixture, ids loaded as
    /// they came) has an empty index: its reads skip the shards' locks (two atomic
    /// operations per key on cache lines every reading thread shares) and hint the CPU to
    /// fetch the rows a few keys ahead, so the cache and TLB misses of rows scattered over
    /// tens of GB overlap. An update racing this read
    /// is seen or not, as with the locks (it sets `indexed` before its first entry).
    pub fn get_many(&self, keys: &[i64], out: &mut [f32], found: &mut [bool]) {
        const AHEAD: usize = 8;
        if let (Some(base), false) = (
            self.base.as_ref().filter(|_| self.dense.is_some()),
            self.indexed.load(Ordering::Acquire),
        ) {
            let hint = |k: i64| {
                if self.in_dense(k) {
                    triton_rust_os::prefetch(base.row_bytes(k as usize));
                }
            };
            keys.iter().take(AHEAD).for_each(|&k| hint(k));
            for (i, ((k, row), f)) in
                keys.iter().zip(out.chunks_exact_mut(self.dim)).zip(found.iter_mut()).enumerate()
            {
                if let Some(&next) = keys.get(i + AHEAD) {
                    hint(next);
                }
                *f = self.in_dense(*k);
                if *f {
                    base.read_row(*k as usize, row);
                }
            }
            return;
        }
        for ((k, row), f) in keys.iter().zip(out.chunks_exact_mut(self.dim)).zip(found.iter_mut()) {
            *f = self.get(*k, row);
        }
    }

    /// Whether the rows this tier read from its table file are the file's as loaded (see
    /// [`TableFiles::check_rows`]); `Err` names the file and what happened to it.
    pub fn check_rows(&self) -> std::result::Result<(), String> {
        self.base.as_ref().map_or(Ok(()), TableFiles::check_rows)
    }

    /// How this tier's rows are stored (its file's type; f32 without a file).
    pub fn stored(&self) -> VectorType {
        self.base.as_ref().map_or(VectorType::F32, |b| b.vector_type)
    }

    /// [`HostTier::get_many`] with the rows as the table stores them ([`HostTier::stored`],
    /// `dim × size` bytes each into `out`): an fp16 table's rows stay fp16, half the bytes
    /// of f32, nothing converted. What a GPU cache's misses need. Rows written by updates
    /// (kept as f32) are rounded to the stored type, as the GPU rounds them into an fp16
    /// cache. A dense table no update touched is read with no lock, its rows fetched
    /// `AHEAD` keys ahead: copying rows scattered over tens of GB waits on memory, and the
    /// hints keep that many reads in flight on each reader.
    pub fn get_many_raw(&self, keys: &[i64], out: &mut [u8], found: &mut [bool]) {
        const AHEAD: usize = 16;
        let stored = self.stored();
        let width = self.dim * stored.size();
        if let (Some(base), false) = (
            self.base.as_ref().filter(|_| self.dense.is_some()),
            self.indexed.load(Ordering::Acquire),
        ) {
            let bytes = base.vector_bytes();
            let hint = |k: i64| {
                if self.in_dense(k) {
                    let at = k as usize * width;
                    triton_rust_os::prefetch(&bytes[at..at + width]);
                }
            };
            keys.iter().take(AHEAD).for_each(|&k| hint(k));
            for (i, ((k, row), f)) in
                keys.iter().zip(out.chunks_exact_mut(width)).zip(found.iter_mut()).enumerate()
            {
                if let Some(&next) = keys.get(i + AHEAD) {
                    hint(next);
                }
                *f = self.in_dense(*k);
                if *f {
                    let at = *k as usize * width;
                    row.copy_from_slice(&bytes[at..at + width]);
                }
            }
            return;
        }
        let mut wide = vec![0f32; self.dim];
        for ((&key, row), f) in keys.iter().zip(out.chunks_exact_mut(width)).zip(found.iter_mut()) {
            let loc = match self.shards[shard_of(key)].read().get(&key) {
                Some(&l) => l,
                None if self.in_dense(key) => key as u32,
                None => {
                    *f = false;
                    continue;
                }
            };
            *f = true;
            match (&self.base, loc & OVERLAY == 0) {
                (Some(base), true) => row.copy_from_slice(base.row_bytes(loc as usize)),
                _ => {
                    self.read_loc(loc, &mut wide);
                    encode_row(stored, &wide, row);
                }
            }
        }
    }

    /// Inserts or overwrites rows. `vectors` holds `keys.len() * dim` values.
    pub fn upsert(&self, keys: &[i64], vectors: &[f32]) -> Result<()> {
        if vectors.len() != keys.len() * self.dim {
            return Err(Error::invalid_arg(format!(
                "{} keys of dim {} need {} values; got {}",
                keys.len(),
                self.dim,
                keys.len() * self.dim,
                vectors.len()
            )));
        }
        let first = {
            let mut ov = self.overlay.write();
            let first = ov.len() / self.dim;
            if first + keys.len() >= OVERLAY as usize {
                return Err(Error::unavailable("the host tier's update overlay is full; lower update_compaction_rows so compactions reclaim it"));
            }
            ov.extend_from_slice(vectors);
            first
        };
        // Rows are complete before any index entry points at them, and lock-free readers
        // (`get_many`) learn that the index is in use before its first entry.
        self.indexed.store(true, Ordering::Release);
        for (i, &k) in keys.iter().enumerate() {
            let fresh =
                self.shards[shard_of(k)].write().insert(k, OVERLAY | (first + i) as u32).is_none();
            if fresh && self.in_dense(k) {
                self.shadowed.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Rows written by updates since the tier was built (superseded ones included).
    pub fn overlay_rows(&self) -> usize {
        self.overlay.read().len() / self.dim
    }

    /// No update has written a row since the tier was built: a dense table's rows are then
    /// exactly its file's.
    pub fn untouched(&self) -> bool {
        !self.indexed.load(Ordering::Acquire)
    }

    /// A dense table no update has touched: its rows as stored (keys `0..rows` in order, row
    /// k at `k × dim` elements of `stored()`) and `rows`, read with no lock, as
    /// `get_many_raw`'s own fast path reads them; `None` for any other table.
    pub fn untouched_rows(&self) -> Option<(&[u8], usize)> {
        if self.indexed.load(Ordering::Acquire) {
            return None;
        }
        Some((self.base.as_ref()?.vector_bytes(), self.dense?))
    }

    /// `Some(rows)` when the table was loaded with keys `0..rows` in order.
    pub fn dense_rows(&self) -> Option<usize> {
        self.dense
    }

    /// A dense table's base rows as its file keeps them (keys `0..rows` in order, `None`
    /// for any other table), and the keys of that range updated since it was loaded, whose
    /// current rows `get` reads: what a copy of the whole table on a GPU is made from.
    pub fn dense_base(&self) -> Option<(&[u8], VectorType, Vec<i64>)> {
        let base = self.base.as_ref().filter(|_| self.dense.is_some())?;
        let mut updated = Vec::new();
        if self.indexed.load(Ordering::Acquire) {
            for shard in &self.shards {
                updated.extend(shard.read().keys().copied().filter(|&k| self.in_dense(k)));
            }
        }
        Some((base.vector_bytes(), base.vector_type, updated))
    }

    /// Every key and its current row (a compaction's snapshot), in no particular order.
    pub fn entries(&self) -> (Vec<i64>, Vec<f32>) {
        let mut keys = Vec::with_capacity(self.len());
        let mut rows = Vec::with_capacity(self.len() * self.dim);
        let mut row = vec![0f32; self.dim];
        for shard in &self.shards {
            let index = shard.read();
            for (&k, &loc) in index.iter() {
                self.read_loc(loc, &mut row);
                keys.push(k);
                rows.extend_from_slice(&row);
            }
        }
        for k in 0..self.dense.unwrap_or(0) as i64 {
            if !self.shards[shard_of(k)].read().contains_key(&k) {
                self.read_loc(k as u32, &mut row);
                keys.push(k);
                rows.extend_from_slice(&row);
            }
        }
        (keys, rows)
    }

    /// Bytes this tier holds beyond the raw rows and keys: index and superseded overlay rows.
    pub fn memory(&self) -> HostMemory {
        let index: usize = self
            .shards
            .iter()
            .map(|s| {
                let cap = s.read().capacity();
                // hashbrown: one control byte plus one (i64, u32) bucket per slot.
                cap * (1 + std::mem::size_of::<(i64, u32)>())
            })
            .sum();
        let rows = self.len();
        let raw = rows * (8 + self.dim * self.base.as_ref().map_or(4, |b| b.vector_type.size()));
        let overlay = self.overlay.read().capacity() * 4;
        let copied = self.base.as_ref().is_some_and(TableFiles::copied);
        HostMemory { raw, index, overlay, copied }
    }
}

/// `row` as the stored type's little-endian bytes (f32 to fp16 rounded to nearest even).
fn encode_row(t: VectorType, row: &[f32], out: &mut [u8]) {
    match t {
        VectorType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(row) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        VectorType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(row) {
                o.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct HostMemory {
    /// Keys and vectors as stored on disk.
    pub raw: usize,
    pub index: usize,
    pub overlay: usize,
    /// The file's rows were copied at load (2 MiB pages) rather than read from its mapping.
    pub copied: bool,
}

impl HostMemory {
    /// (raw + index + overlay) / raw.
    pub fn ratio(&self) -> f64 {
        (self.raw + self.index + self.overlay) as f64 / self.raw.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{write_table, VectorType};

    /// The rows as stored equal the f32 rows narrowed back, bit for bit, on both paths (the
    /// dense table untouched: no lock, rows prefetched; after an update: the index), for fp16
    /// and fp32 tables, read from the file's mapping and from the copy in huge pages; an
    /// updated row comes rounded to fp16 as the GPU rounds it.
    #[test]
    fn rows_as_stored_are_the_rows_of_get_many() {
        use crate::table::HostRows;
        let cases = [VectorType::F16, VectorType::F32]
            .into_iter()
            .flat_map(|t| [(t, HostRows::Mapped), (t, HostRows::HugePages)]);
        for (stored, placed) in cases {
            let d = std::env::temp_dir()
                .join(format!("trt-host-raw-{stored:?}-{placed:?}-{}", std::process::id()));
            let (dim, rows) = (8, 700);
            let keys: Vec<i64> = (0..rows as i64).collect();
            let vals: Vec<f32> = (0..rows * dim).map(|i| (i as f32 * 0.37).sin()).collect();
            let bytes: Vec<u8> = match stored {
                VectorType::F32 => bytemuck::cast_slice(&vals).to_vec(),
                VectorType::F16 => {
                    vals.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect()
                }
            };
            write_table(&d, &keys, &bytes, dim, stored).unwrap();
            let files = TableFiles::open_npy(&d).unwrap().place("t", placed);
            assert_eq!(files.copied(), placed == HostRows::HugePages);
            let (tier, _) = HostTier::from_files(files).unwrap();
            assert_eq!(tier.stored(), stored);
            let width = dim * stored.size();
            let probe: Vec<i64> = (0..100).map(|i| (i * 37) % 760 - 20).collect();
            let check = |tier: &HostTier| {
                let (mut raw, mut found_raw) = (vec![7u8; probe.len() * width], vec![false; 100]);
                tier.get_many_raw(&probe, &mut raw, &mut found_raw);
                let (mut wide, mut found) = (vec![0f32; probe.len() * dim], vec![false; 100]);
                tier.get_many(&probe, &mut wide, &mut found);
                assert_eq!(found_raw, found);
                for (i, _) in probe.iter().enumerate().filter(|&(i, _)| found[i]) {
                    let mut narrowed = vec![0u8; width];
                    encode_row(stored, &wide[i * dim..(i + 1) * dim], &mut narrowed);
                    assert_eq!(&raw[i * width..(i + 1) * width], &narrowed[..], "key {}", probe[i]);
                }
                let missing = probe.iter().position(|&k| k < 0).unwrap();
                assert!(raw[missing * width..(missing + 1) * width].iter().all(|&b| b == 7));
            };
            check(&tier);
            assert!(tier.untouched());
            let new_row: Vec<f32> = (0..dim).map(|j| 0.1 + j as f32 / 3.0).collect();
            tier.upsert(&[37], &new_row).unwrap();
            check(&tier);
            let (mut raw, mut found) = (vec![0u8; width], vec![false]);
            tier.get_many_raw(&[37], &mut raw, &mut found);
            let mut want = vec![0u8; width];
            encode_row(stored, &new_row, &mut want);
            assert!(found[0] && raw == want, "the updated row, rounded to the stored type");
            let _ = std::fs::remove_dir_all(&d);
        }
    }

    #[test]
    fn keys_zero_to_rows_need_no_index_and_still_take_updates() {
        let d = std::env::temp_dir().join(format!("trt-host-dense-{}", std::process::id()));
        let dim = 2;
        let keys: Vec<i64> = (0..500).collect();
        let vecs: Vec<f32> = (0..keys.len() * dim).map(|i| i as f32).collect();
        write_table(&d, &keys, bytemuck::cast_slice(&vecs), dim, VectorType::F32).unwrap();
        let (tier, dups) = HostTier::from_files(TableFiles::open_npy(&d).unwrap()).unwrap();
        assert_eq!((dups, tier.len(), tier.dense), (0, 500, Some(500)));
        assert!(tier.memory().index < 64 * 1024, "no per-key index: {:?}", tier.memory());
        let mut row = vec![0f32; dim];
        assert!(tier.get(499, &mut row));
        assert_eq!(row, [998.0, 999.0]);
        assert!(!tier.get(500, &mut row) && !tier.get(-1, &mut row));
        // many keys at once, before any update: the lock-free path (more keys than it reads ahead)
        let many = |tier: &HostTier, keys: &[i64]| {
            let (mut out, mut found) = (vec![-1f32; keys.len() * dim], vec![false; keys.len()]);
            tier.get_many(keys, &mut out, &mut found);
            (out, found)
        };
        let probe: Vec<i64> = vec![3, 500, 7, -1, 499, 0, 8, 7, 1, 2, 600, 4];
        let (out, found) = many(&tier, &probe);
        assert!(!tier.indexed.load(Ordering::Relaxed));
        assert_eq!(found, probe.iter().map(|&k| (0..500).contains(&k)).collect::<Vec<_>>());
        for (i, &k) in probe.iter().enumerate().filter(|&(i, _)| found[i]) {
            assert_eq!(
                out[i * dim..i * dim + dim],
                [2.0 * k as f32, 2.0 * k as f32 + 1.0],
                "key {k}"
            );
        }
        assert!(
            out[dim..2 * dim].iter().all(|&v| v == -1.0),
            "a key not found leaves its row alone"
        );
        // overwrite a row of the range, twice (counted once), and add a key past it
        tier.upsert(&[7, 7, 600], &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]).unwrap();
        let (out, found) = many(&tier, &probe);
        assert_eq!(
            found,
            probe.iter().map(|&k| (0..500).contains(&k) || k == 600).collect::<Vec<_>>()
        );
        assert_eq!(
            (&out[2 * dim..3 * dim], &out[7 * dim..8 * dim], &out[10 * dim..11 * dim]),
            (&[2.0, 2.0][..], &[2.0, 2.0][..], &[3.0, 3.0][..])
        );
        assert_eq!(out[6 * dim..7 * dim], [16.0, 17.0]);
        assert!(tier.get(7, &mut row));
        assert_eq!(row, [2.0, 2.0]);
        assert!(tier.get(600, &mut row));
        assert_eq!(row, [3.0, 3.0]);
        assert!(tier.get(8, &mut row));
        assert_eq!(row, [16.0, 17.0]);
        assert_eq!(tier.len(), 501);
        // what a resident copy of it is made from: the base rows as stored, and the one key
        // of the range updated since (600 is past it: not resident, read below the GPU)
        let (bytes, stored, updated) = tier.dense_base().expect("a dense table");
        assert_eq!((bytes.len(), stored, updated), (500 * dim * 4, VectorType::F32, vec![7]));
        assert_eq!(tier.dense_rows(), Some(500));
        let (ks, rs) = tier.entries();
        assert_eq!(ks.len(), 501);
        let at = |k: i64| ks.iter().position(|&x| x == k).unwrap();
        assert_eq!(rs[at(7) * dim..at(7) * dim + dim], [2.0, 2.0]);
        assert_eq!(rs[at(499) * dim..at(499) * dim + dim], [998.0, 999.0]);
        // keys in another order are indexed as before
        let shuffled: Vec<i64> = (0..500).rev().collect();
        write_table(&d, &shuffled, bytemuck::cast_slice(&vecs), dim, VectorType::F32).unwrap();
        let (tier, _) = HostTier::from_files(TableFiles::open_npy(&d).unwrap()).unwrap();
        assert_eq!(tier.dense, None);
        assert!(tier.dense_base().is_none(), "keys in another order are never resident");
        assert!(tier.get(499, &mut row));
        assert_eq!(row, [0.0, 1.0]);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn serves_file_rows_and_updates() {
        let d = std::env::temp_dir().join(format!("trt-host-{}", std::process::id()));
        let keys: Vec<i64> = (0..1000).map(|i| i * 7 - 300).collect();
        let dim = 4;
        let vecs: Vec<f32> = (0..keys.len() * dim).map(|i| i as f32).collect();
        write_table(&d, &keys, bytemuck::cast_slice(&vecs), dim, VectorType::F32).unwrap();
        let (tier, dups) = HostTier::from_files(TableFiles::open_npy(&d).unwrap()).unwrap();
        assert_eq!((dups, tier.len()), (0, 1000));
        let mut row = vec![0f32; dim];
        assert!(tier.get(keys[10], &mut row));
        assert_eq!(row, vecs[40..44]);
        assert!(!tier.get(2, &mut row));
        tier.upsert(&[keys[10], 2], &[9.0, 9.0, 9.0, 9.0, 1.0, 1.0, 1.0, 1.0]).unwrap();
        assert!(tier.get(keys[10], &mut row));
        assert_eq!(row, [9.0; 4]);
        assert!(tier.get(2, &mut row));
        assert_eq!(row, [1.0; 4]);
        assert_eq!(tier.len(), 1001);
        assert!(tier.upsert(&[5], &[1.0]).is_err());
        let m = tier.memory();
        assert!(m.ratio() > 1.0, "{m:?}");
        std::fs::remove_dir_all(d).unwrap();
    }
}
