//! A batch's misses read straight from the tables' rows, as a plain gather reads them: when
//! every table is dense and untouched by updates (keys `0..rows`, the file's rows as
//! stored), and the rows go up as stored, the miss list is cut into shares in the lookup's
//! order, read by the calling thread and the reader crew (`triton_rust_os::Crew`) at once;
//! each share finds each key's row (its table by its place in the batch), then copies the
//! rows in a loop as tight as a plain gather's, 16 rows ahead prefetched. No grouping by
//! table, no per-table calls: the grouped path (`below.rs`) first sorted the misses by table
//! on the lookup's own thread, about a third of the time below the cache (MLPerf DLRM-v2 at
//! a 10% cache on an H200: 5.6 of 13.0 ms a batch, `bench/gpu/results/cache-runs/`). Finding
//! each row inside the copy loop instead read 0.52-0.63x as many rows a second on one thread
//! as the plain gather beside it, finding them first 0.71-1.06x
//! (`crates/embedding/examples/served_reads_bench.rs`, 2-core CI machine). Shares on the
//! process's worker pool (rayon) instead waited served about 1 ms for the pool's threads to
//! wake and 1.5 ms for the caller to run again after the last share, against 0.3 ms of
//! reading in the longest share (`GatherTimes`, the `timing:` line's reads).

use super::reads::{copy_rows, find_rows, DenseTable, GatherTimes};
use super::*;

/// Whether the readers store each row into the batch's page-locked buffer past the CPU's
/// caches (`triton_rust_os::copy_streaming`, streaming stores) or through them (plain
/// stores): `TRITON_RUST_MISS_STORES=streaming` in the server's environment for the first,
/// read once; through the caches otherwise. Streaming stores were the rule until
/// 2026-11-30, meant to spare each row's line a trip into the cache; measured on the GPU
/// machine's host they read fewer rows a second instead, the plain gather's threads
/// 145-161 M rows/s against 246-256 M with plain stores (16 threads), the store's own reads
/// 78-79 M against 109-111 M, and served MLPerf DLRM-v2 at a 10% cache 6.66 against 6.96 M
/// pairs/s, its readers busy 9.5 cores against 7.6 (one H200, one call,
/// `bench/gpu/results/cache-runs/`).
fn streaming_stores() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TRITON_RUST_MISS_STORES").is_ok_and(|v| v == "streaming"))
}

/// How many shares a call's misses are cut into for each reader: 2, or
/// `TRITON_RUST_READ_SHARES` (1 to 64) in the server's environment, read once (an experiment's
/// knob: more shares even out the readers' ends, each share costs its own start).
fn shares_a_reader() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("TRITON_RUST_READ_SHARES")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| (1..=64).contains(n))
            .unwrap_or(2)
    })
}

impl EmbeddingStore {
    /// Reads the rows of `keys` (key j is batch key `missed[j]`, of table `table_of(missed[j])`)
    /// into `rows` (`width` bytes each, as the tables store them) and sets `found[j]`; a key
    /// past its table's rows gets the table's default value and is not found. Adds each
    /// table's keys read to `per_table`. `Ok(false)`, nothing read, unless every table is
    /// dense, untouched and stores rows of `width` bytes. `times`, when given, gets this
    /// call's readers' times added.
    #[allow(clippy::too_many_arguments)]
    pub fn gather_dense(
        &self,
        table_of: &(dyn Fn(usize) -> usize + Sync),
        missed: &[i32],
        keys: &[i64],
        rows: &mut [u8],
        found: &mut [u8],
        per_table: &mut [usize],
        times: Option<&mut GatherTimes>,
    ) -> Result<bool> {
        let streaming = streaming_stores();
        self.gather_dense_as(streaming, table_of, missed, keys, rows, found, per_table, times)
    }

    /// [`Self::gather_dense`] with its rows stored past the CPU's caches or through them.
    #[allow(clippy::too_many_arguments)]
    fn gather_dense_as(
        &self,
        streaming: bool,
        table_of: &(dyn Fn(usize) -> usize + Sync),
        missed: &[i32],
        keys: &[i64],
        rows: &mut [u8],
        found: &mut [u8],
        per_table: &mut [usize],
        times: Option<&mut GatherTimes>,
    ) -> Result<bool> {
        let n = keys.len();
        if self.remote.is_some() {
            return Ok(false); // keys past the host tier are Redis's to answer
        }
        let tiers: Vec<Arc<HostTier>> = (0..self.tables.len()).map(|t| self.host(t)).collect();
        let width = rows.len() / n.max(1);
        let mut tables: Vec<DenseTable> = Vec::with_capacity(tiers.len());
        for (t, tier) in tiers.iter().enumerate() {
            let stored = tier.stored();
            match tier.untouched_rows() {
                Some((bytes, count)) if tier.dim() * stored.size() == width => {
                    let default = table::encode_value(stored, self.tables[t].config.default_value);
                    tables.push((bytes, count, default));
                }
                _ => return Ok(false),
            }
        }
        let t0 = Instant::now();
        let crew = triton_rust_os::Crew::global();
        let readers = (crew.members() + 1).clamp(1, 16);
        let (counts, mut share) =
            read_in_shares(&tables, table_of, missed, keys, rows, found, readers, streaming, t0)?;
        let ns = ns_since(t0);
        if let Some(times) = times {
            share.calls = 1;
            share.wall_ns = ns;
            times.add(&share);
        }
        let k = tables.len();
        for t in 0..k {
            let (read, defaults) = (counts[t], counts[k + t]);
            if read + defaults == 0 {
                continue;
            }
            let c = &self.tables[t].counters;
            c.host_hits.fetch_add(read as u64, Ordering::Relaxed);
            c.defaults.fetch_add(defaults as u64, Ordering::Relaxed);
            c.host_ns.fetch_add(ns * (read + defaults) as u64 / n.max(1) as u64, Ordering::Relaxed);
            per_table[t] += read + defaults;
            self.check_rows(t)?;
        }
        Ok(true)
    }
}

/// A call's misses cut into fixed shares of at least 1,024 rows, about two a reader, each read
/// whole by whoever takes it: each table's rows read, then each table's defaults
/// (`2 * tables.len()` counts), and the readers' times.
#[allow(clippy::too_many_arguments)]
pub(super) fn read_in_shares(
    tables: &[DenseTable<'_>],
    table_of: &(dyn Fn(usize) -> usize + Sync),
    missed: &[i32],
    keys: &[i64],
    rows: &mut [u8],
    found: &mut [u8],
    readers: usize,
    streaming: bool,
    t0: Instant,
) -> Result<(Vec<usize>, GatherTimes)> {
    let n = keys.len();
    let width = rows.len() / n.max(1);
    // shares of at least 1,024 rows, about two a reader (the crew and the caller)
    let crew = triton_rust_os::Crew::global();
    let per = n.div_ceil(shares_a_reader() * readers).max(1024);
    // a share's rows and flags, its counts, and when it started and how long it took (ns)
    type Share<'a> = (&'a mut [u8], &'a mut [u8], Vec<usize>, (u64, u64));
    let shares: Vec<std::sync::Mutex<Share>> = rows
        .chunks_mut(per * width)
        .zip(found.chunks_mut(per))
        .map(|(out, found)| std::sync::Mutex::new((out, found, Vec::new(), (0, 0))))
        .collect();
    let read_share = |c: usize| {
        let started = ns_since(t0);
        let mut share = shares[c].lock().unwrap_or_else(|e| e.into_inner());
        let (out, found, counts, times) = &mut *share;
        let first = c * per;
        let (missed, keys) =
            (&missed[first..first + found.len()], &keys[first..first + found.len()]);
        // read and default counts per table
        *counts = vec![0usize; 2 * tables.len()];
        let mut srcs = Vec::with_capacity(keys.len());
        find_rows(tables, table_of, missed, keys, width, &mut srcs, counts);
        copy_rows(tables, &srcs, out, found, width, streaming);
        if streaming {
            triton_rust_os::store_fence(); // the rows seen by whoever sees this share done
        }
        *times = (started, ns_since(t0) - started);
    };
    crew.run(shares.len(), &read_share)
        .map_err(|why| Error::internal(format!("reading a batch's misses: {why}")))?;
    let mut counts = vec![0usize; 2 * tables.len()];
    let mut share = GatherTimes::default();
    for s in shares {
        let (_, _, c, (started, took)) = s.into_inner().unwrap_or_else(|e| e.into_inner());
        counts.iter_mut().zip(c).for_each(|(a, b)| *a += b);
        share.add_share(started, took);
    }
    Ok((counts, share))
}

/// Which table each key of a batch lookup belongs to, as the kernels find it from the layout
/// (`table_of` in cache.cu), and how many keys each table has.
#[cfg(feature = "gpu")]
pub(super) struct KeyTables<'a> {
    layout: gpu::KeyLayout<'a>,
    tables: usize,
    /// Each table's keys in the batch.
    pub(super) counts: Vec<usize>,
    /// Where each table starts: in the batch (blocked), or in a sample (fixed).
    starts: Vec<usize>,
    /// A fixed layout's table at each place of a sample.
    place: Vec<u16>,
}

#[cfg(feature = "gpu")]
impl<'a> KeyTables<'a> {
    pub(super) fn new(layout: gpu::KeyLayout<'a>, keys: usize, tables: usize) -> KeyTables<'a> {
        // a fixed layout's table of each place in a sample, read per miss by the readers
        let place = match layout {
            gpu::KeyLayout::Fixed { width, at } => (0..width)
                .map(|p| at.partition_point(|&s| s as usize <= p).saturating_sub(1) as u16)
                .collect(),
            _ => Vec::new(),
        };
        let (counts, starts): (Vec<usize>, Vec<usize>) = match layout {
            gpu::KeyLayout::Interleaved => (vec![keys / tables.max(1); tables], Vec::new()),
            gpu::KeyLayout::Blocked(c) => {
                let starts = c
                    .iter()
                    .scan(0, |at, &n| {
                        let s = *at;
                        *at += n;
                        Some(s)
                    })
                    .collect();
                (c.to_vec(), starts)
            }
            gpu::KeyLayout::Fixed { width, at } => {
                let samples = keys / width.max(1);
                let counts =
                    at.windows(2).map(|w| (w[1] - w[0]).max(0) as usize * samples).collect();
                (counts, at.iter().take(tables).map(|&a| a.max(0) as usize).collect())
            }
        };
        KeyTables { layout, tables, counts, starts, place }
    }

    /// The table of key `i` of the batch.
    pub(super) fn table_of(&self, i: usize) -> usize {
        match self.layout {
            gpu::KeyLayout::Interleaved => i % self.tables.max(1),
            gpu::KeyLayout::Blocked(_) => {
                self.starts.partition_point(|&s| s <= i).saturating_sub(1)
            }
            gpu::KeyLayout::Fixed { width, .. } => self.place[i % width.max(1)] as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{write_table, VectorType};
    use rand::{Rng, SeedableRng};

    /// Two fp16 tables of 900 and 700 rows (dim 8), dense, their default values 0.5 and -2.
    fn store(dir: &std::path::Path) -> Arc<EmbeddingStore> {
        let dim = 8;
        let tables = [("a", 900usize, 0.5f32), ("b", 700, -2.0)];
        for (i, (name, rows, _)) in tables.iter().enumerate() {
            let keys: Vec<i64> = (0..*rows as i64).collect();
            let vals: Vec<u8> = (0..rows * dim)
                .flat_map(|e| half::f16::from_f32((e * (i + 3)) as f32 * 0.01).to_le_bytes())
                .collect();
            write_table(&dir.join(name), &keys, &vals, dim, VectorType::F16).unwrap();
        }
        let cfg = StoreConfig {
            update_log_dir: Some(dir.join("log")),
            ..StoreConfig::with_tables(
                tables
                    .iter()
                    .map(|(name, _, default)| TableConfig {
                        name: name.to_string(),
                        dim,
                        path: Some(dir.join(name)),
                        format: None,
                        default_value: *default,
                    })
                    .collect(),
            )
        };
        EmbeddingStore::open(cfg, None).unwrap()
    }

    /// The plain gather reads what the grouped reads read, row for row, defaults and flags
    /// alike, in the lookup's order; and steps aside once an update touched a table.
    #[test]
    fn the_plain_gather_reads_what_the_grouped_reads_read() {
        let dir = std::env::temp_dir().join(format!("trt-gather-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let s = store(&dir);
        let (dim, width) = (8, 16);
        // a batch of samples of 3 keys of "a" then 2 of "b"; the misses in no order
        let table_of = |i: usize| usize::from(i % 5 >= 3);
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let n = 20_000;
        let missed: Vec<i32> = (0..n).map(|_| rng.gen_range(0..50_000)).collect();
        let keys: Vec<i64> = missed
            .iter()
            .map(|&i| rng.gen_range(-3..[910i64, 705][table_of(i as usize)]))
            .collect();
        let (mut rows, mut found, mut per) = (vec![7u8; n * width], vec![9u8; n], vec![0usize; 2]);
        // streaming stores first, then plain ones over the same buffer
        let mut streamed = vec![7u8; n * width];
        assert!(s
            .gather_dense_as(
                true,
                &table_of,
                &missed,
                &keys,
                &mut streamed,
                &mut found,
                &mut per,
                None
            )
            .unwrap());
        assert!(s
            .gather_dense_as(
                false, &table_of, &missed, &keys, &mut rows, &mut found, &mut per, None
            )
            .unwrap());
        assert!(streamed == rows, "streaming and plain stores put the same rows");
        assert_eq!(per.iter().sum::<usize>(), 2 * n);
        for (j, &i) in missed.iter().enumerate() {
            let t = table_of(i as usize);
            let mut want = vec![0u16; dim];
            let f = s.read_below_cache_f16(t, &keys[j..j + 1], &mut want);
            assert_eq!(found[j] == 1, f[0], "miss {j} (key {} of table {t})", keys[j]);
            assert_eq!(
                &rows[j * width..(j + 1) * width],
                bytemuck::cast_slice::<u16, u8>(&want),
                "miss {j}"
            );
        }
        assert!(found.contains(&0) && found.contains(&1), "keys past the rows read as defaults");
        // rows of another width, or a table written since it was loaded: the grouped path's
        let mut wide = vec![0u8; n * 32];
        assert!(!s
            .gather_dense(&table_of, &missed, &keys, &mut wide, &mut found, &mut per, None)
            .unwrap());
        s.update(1, &[5], &[1.0; 8]).unwrap();
        assert!(!s
            .gather_dense(&table_of, &missed, &keys, &mut rows, &mut found, &mut per, None)
            .unwrap());
        drop(s);
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[cfg(all(test, feature = "gpu"))]
mod key_tables_tests {
    use super::KeyTables;
    use crate::gpu::KeyLayout;

    #[test]
    fn each_layout_names_the_table_the_kernels_do() {
        // [batch 2, tables 3] interleaved
        let t = KeyTables::new(KeyLayout::Interleaved, 6, 3);
        assert_eq!(t.counts, vec![2, 2, 2]);
        assert_eq!((0..6).map(|i| t.table_of(i)).collect::<Vec<_>>(), vec![0, 1, 2, 0, 1, 2]);
        // blocked: 2, 0 and 3 keys, table after table
        let t = KeyTables::new(KeyLayout::Blocked(&[2, 0, 3]), 5, 3);
        assert_eq!(t.counts, vec![2, 0, 3]);
        assert_eq!((0..5).map(|i| t.table_of(i)).collect::<Vec<_>>(), vec![0, 0, 2, 2, 2]);
        // fixed hotness 2, 0, 3 (a sample of 5 keys), two samples as sent
        let at = [0, 2, 2, 5];
        let t = KeyTables::new(KeyLayout::Fixed { width: 5, at: &at }, 10, 3);
        assert_eq!(t.counts, vec![4, 0, 6]);
        let of: Vec<usize> = (0..10).map(|i| t.table_of(i)).collect();
        assert_eq!(of, vec![0, 0, 2, 2, 2, 0, 0, 2, 2, 2], "a table of hotness 0 holds no key");
    }
}
