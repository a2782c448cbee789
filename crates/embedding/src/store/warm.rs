//! Warm restarts: which keys a store's caches hold, saved to a file (at unload, and on a
//! period) and inserted again when caches of the same store are made, so a restarted
//! server starts at the hit rate it had instead of warming for minutes. Only the keys
//! are saved: their rows are read again from the tables, as they are now.
//!
//! The file, `<cache_state_dir>/<store>.<where>.cache_keys` (`where`: `gpu<N>` or `cpu`):
//! a text header (a first line naming the format, the store, one line per table with its
//! name, rows, dim and the count of keys saved, a checksum of the keys, `end`), then the
//! keys as little-endian i64, table after table, least recently used first. A file that is
//! missing, cut short, damaged or written for other tables is a warning: the caches start
//! empty and the model is served.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use super::*;
use crate::keys::mix64;

const MAGIC: &str = "triton_rust cache state 1";

/// One table's line of the header: (name, rows, dim, keys saved).
type TableLine = (String, usize, usize, usize);

/// A checksum of the keys of every list, in order (as the file holds them, table after table).
fn checksum<'a>(lists: impl IntoIterator<Item = &'a [i64]>) -> u64 {
    lists.into_iter().flatten().fold(0x9e37_79b9_7f4a_7c15u64, |h, &k| mix64((h ^ k as u64) as i64))
}

/// The header lines of `store`'s tables with `counts` keys each.
fn table_lines(store: &EmbeddingStore, counts: &[usize]) -> Vec<TableLine> {
    store
        .tables
        .iter()
        .zip(counts)
        .map(|(t, &c)| (t.config.name.clone(), t.host.read().len(), t.config.dim, c))
        .collect()
}

/// Writes the keys `caches` hold (one cache per table) for `store` into `path`, whole or
/// not at all (a temporary file renamed). Returns the keys written.
pub(crate) fn save(
    store: &EmbeddingStore,
    name: &str,
    caches: &[Arc<dyn CacheTier>],
    path: &Path,
) -> Result<usize> {
    let t0 = Instant::now();
    let held: Vec<Vec<i64>> = caches.iter().map(|c| c.held_keys()).collect::<Result<_>>()?;
    let counts: Vec<usize> = held.iter().map(Vec::len).collect();
    let total: usize = counts.iter().sum();
    let mut head = format!("{MAGIC}\nstore {name}\n");
    for (t, rows, dim, n) in table_lines(store, &counts) {
        head += &format!("table {t} {rows} {dim} {n}\n");
    }
    head += &format!("checksum {:016x}\nend\n", checksum(held.iter().map(Vec::as_slice)));
    let fail =
        |e: std::io::Error| Error::internal(format!("cache state '{}': {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(fail)?);
    f.write_all(head.as_bytes()).map_err(fail)?;
    for keys in &held {
        f.write_all(bytemuck::cast_slice(keys)).map_err(fail)?;
    }
    f.into_inner().map_err(|e| fail(e.into_error()))?.sync_all().map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)?;
    log::info!(
        "store '{name}': saved the {total} keys its caches hold to '{}' in {:.2} s",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(total)
}

/// The keys saved in `path` for `store` (one list per table), or why they are not used.
pub(crate) fn read(
    store: &EmbeddingStore,
    name: &str,
    path: &Path,
) -> std::result::Result<Vec<Vec<i64>>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read it ({e})"))?;
    let end = bytes
        .windows(5)
        .position(|w| w == b"\nend\n")
        .ok_or("no header (not a cache state file, or cut short)")?
        + 5;
    let head = std::str::from_utf8(&bytes[..end]).map_err(|_| "a header that is not text")?;
    let mut lines = head.lines();
    if lines.next() != Some(MAGIC) {
        return Err(format!("not a cache state file (its first line is not '{MAGIC}')"));
    }
    let saved_name = lines.next().and_then(|l| l.strip_prefix("store ")).unwrap_or("");
    let mut tables: Vec<TableLine> = Vec::new();
    let mut sum = None;
    for l in lines {
        let f: Vec<&str> = l.split(' ').collect();
        match f.as_slice() {
            ["table", t, rows, dim, n] => {
                let num =
                    |s: &str| s.parse::<usize>().map_err(|_| format!("a bad table line '{l}'"));
                tables.push((t.to_string(), num(rows)?, num(dim)?, num(n)?));
            }
            ["checksum", c] => sum = u64::from_str_radix(c, 16).ok(),
            ["end"] => {}
            _ => return Err(format!("a bad header line '{l}'")),
        }
    }
    let ours = table_lines(store, &vec![0; store.tables.len()]);
    let same = tables.len() == ours.len()
        && tables.iter().zip(&ours).all(|(a, b)| (&a.0, a.1, a.2) == (&b.0, b.1, b.2));
    if (!name.is_empty() && saved_name != name) || !same {
        let what = |v: &[TableLine]| {
            v.iter()
                .map(|(t, r, d, _)| format!("{t} ({r} rows of {d})"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(format!(
            "written for store '{saved_name}' with tables {}, not for store '{name}' with tables {}",
            what(&tables),
            what(&ours)
        ));
    }
    let total: usize = tables.iter().map(|t| t.3).sum();
    let body = &bytes[end..];
    if body.len() != total * 8 {
        return Err(format!(
            "cut short or grown: {} bytes of keys where its header says {}",
            body.len(),
            total * 8
        ));
    }
    let all: Vec<i64> =
        body.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
    if sum != Some(checksum([all.as_slice()])) {
        return Err("damaged: its keys do not match its checksum".into());
    }
    let mut at = 0;
    Ok(tables
        .iter()
        .map(|t| {
            at += t.3;
            all[at - t.3..at].to_vec()
        })
        .collect())
}

/// Inserts the keys saved in `path` into `caches` (one per table), their rows read from
/// the tables now, least recently used first. `name`: the store whose file it must be
/// (`None`: any store's with the same tables, as pinned keys are). A file that cannot be
/// used is a warning and nothing is inserted. Returns the rows inserted.
pub(crate) fn load(
    store: &EmbeddingStore,
    name: Option<&str>,
    caches: &[Arc<dyn CacheTier>],
    path: &Path,
) -> usize {
    let t0 = Instant::now();
    // whose file the lines name: the store's saved state, or the pinned keys of any store
    let who = name.map_or("gpucache_pinned_keys".to_string(), |n| format!("store '{n}'"));
    if !path.exists() {
        log::warn!("{who}: no cache state at '{}' yet: its caches start empty", path.display());
        return 0;
    }
    let keys = match read(store, name.unwrap_or(""), path) {
        Ok(k) => k,
        Err(why) => {
            log::warn!(
                "{who}: the cache state '{}' is not used: {why}; its caches start empty",
                path.display()
            );
            return 0;
        }
    };
    let mut inserted = 0;
    for ((t, keys), cache) in keys.iter().enumerate().zip(caches) {
        if cache.keeps_every_row() {
            continue;
        }
        match warm_table(store, t, keys, cache.as_ref()) {
            Ok(n) => inserted += n,
            Err(e) => {
                log::warn!(
                    "{who}: table '{}' not warmed from '{}': {e}",
                    store.tables[t].config.name,
                    path.display()
                );
            }
        }
    }
    log::info!(
        "{who}: warmed its caches with {inserted} rows from '{}' in {:.2} s",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    inserted
}

/// `keys` of `table` read from below the cache, in parts read in parallel, and inserted
/// in their order; keys the table no longer has are left out.
fn warm_table(
    store: &EmbeddingStore,
    table: usize,
    keys: &[i64],
    cache: &dyn CacheTier,
) -> Result<usize> {
    use rayon::prelude::*;
    const PART: usize = 1 << 18;
    const PIECE: usize = 4096;
    let dim = store.tables[table].config.dim;
    let mut inserted = 0;
    for part in keys.chunks(PART) {
        let mut rows = vec![0f32; part.len() * dim];
        let found: Vec<bool> = rows
            .par_chunks_mut(PIECE * dim)
            .zip(part.par_chunks(PIECE))
            .flat_map_iter(|(r, k)| store.read_below_cache(table, k, r))
            .collect();
        store.check_rows(table)?;
        let (mut ks, mut vs) = (Vec::with_capacity(part.len()), Vec::with_capacity(rows.len()));
        for (j, &k) in part.iter().enumerate().filter(|&(j, _)| found[j]) {
            ks.push(k);
            vs.extend_from_slice(&rows[j * dim..(j + 1) * dim]);
        }
        cache.insert(&ks, &vs)?;
        inserted += ks.len();
    }
    Ok(inserted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::HostCache;
    use crate::table::{write_table, VectorType};
    use std::path::PathBuf;

    const DIM: usize = 4;

    /// A store of one table of `rows` rows (row k: k, k + 0.25, ...) and one without files,
    /// its caches 10% of the rows, saving their keys under `dir` as store `name`.
    fn store(name: &str, dir: &Path, rows: usize, period_s: f64) -> Arc<EmbeddingStore> {
        let files = dir.join(format!("rows{rows}"));
        if !files.exists() {
            let keys: Vec<i64> = (0..rows as i64).collect();
            let vals: Vec<f32> = keys
                .iter()
                .flat_map(|&k| (0..DIM).map(move |j| k as f32 + j as f32 * 0.25))
                .collect();
            write_table(&files, &keys, bytemuck::cast_slice(&vals), DIM, VectorType::F32).unwrap();
        }
        let table = |name: &str, path| TableConfig {
            name: name.into(),
            dim: DIM,
            path,
            format: None,
            default_value: 0.0,
        };
        let cfg = StoreConfig {
            hit_rate_threshold: 1.1, // every fill before the lookup returns
            cache_state: Some(CacheState { store: name.into(), dir: dir.join("state"), period_s }),
            ..StoreConfig::with_tables(vec![table("t0", Some(files)), table("none", None)])
        };
        EmbeddingStore::open(cfg, None).unwrap()
    }

    fn cpu(geo: CacheGeometry) -> Result<Arc<dyn CacheTier>> {
        Ok(Arc::new(HostCache::new(geo)))
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("trt-warm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// Looks Zipf-like keys up until the cache holds some; returns the keys it holds, sorted.
    fn serve_some(inst: &InstanceCaches) -> Vec<i64> {
        let keys: Vec<i64> = (0..3000i64).map(|i| (i * i * 7919) % 5000).collect();
        let mut out = vec![0f32; keys.len() * DIM];
        for part in keys.chunks(300) {
            inst.lookup(0, part, &mut out[..part.len() * DIM]).unwrap();
        }
        inst.lookup(1, &[1, 2], &mut out[..2 * DIM]).unwrap();
        let mut held = inst.caches[0].held_keys().unwrap();
        held.sort_unstable();
        held
    }

    #[test]
    fn a_restart_holds_the_keys_it_held_with_the_tables_rows() {
        let d = tmp("round");
        let held = {
            let inst = store("s", &d, 5000, 0.0).attach_caches(&cpu).unwrap();
            serve_some(&inst)
        }; // dropped: saved
        assert!(held.len() > 100, "the cache filled: {}", held.len());
        let file = d.join("state/s.cpu.cache_keys");
        assert!(file.exists(), "saved at unload");
        let again = store("s", &d, 5000, 0.0);
        let inst = again.attach_caches(&cpu).unwrap();
        let mut warm = inst.caches[0].held_keys().unwrap();
        warm.sort_unstable();
        assert_eq!(warm, held, "the same keys, in a cache of the same geometry");
        assert!(inst.caches[1].held_keys().unwrap().is_empty(), "a table without rows has none");
        // every one a hit, with the table's rows
        let hits0 = inst.caches[0].counters().hits;
        let mut out = vec![0f32; held.len() * DIM];
        inst.lookup(0, &held, &mut out).unwrap();
        assert_eq!(inst.caches[0].counters().hits - hits0, held.len() as u64);
        for (k, r) in held.iter().zip(out.chunks(DIM)) {
            let want: Vec<f32> = (0..DIM).map(|j| *k as f32 + j as f32 * 0.25).collect();
            assert_eq!(r, &want[..], "key {k}");
        }
        drop(inst);
        std::fs::remove_dir_all(d).unwrap();
    }

    /// A store of `store`'s table with pinned caches holding the keys of `keys`.
    fn pinned(dir: &Path, keys: PathBuf) -> Arc<EmbeddingStore> {
        let base = store("other", dir, 5000, 0.0);
        let cfg = StoreConfig {
            cache_eviction: crate::CacheEviction::Pinned,
            pinned_keys: Some(keys),
            cache_state: None,
            ..base.config.clone()
        };
        EmbeddingStore::open(cfg, None).unwrap()
    }

    #[test]
    fn pinned_caches_hold_their_file_s_keys_and_take_no_miss_in() {
        let d = tmp("pinned");
        let held = serve_some(&store("s", &d, 5000, 0.0).attach_caches(&cpu).unwrap());
        // another store's name, the same tables: pinned keys come from any store's file
        let inst = pinned(&d, d.join("state/s.cpu.cache_keys")).attach_caches(&cpu).unwrap();
        let pinned_now = || {
            let mut k = inst.caches[0].held_keys().unwrap();
            k.sort_unstable();
            k
        };
        assert_eq!(pinned_now(), held, "the file's keys");
        // keys it does not hold, looked up again and again: each read below, none taken in
        let cold: Vec<i64> =
            (0..5000).filter(|k| held.binary_search(k).is_err()).take(400).collect();
        let mut out = vec![0f32; cold.len() * DIM];
        for _ in 0..3 {
            inst.lookup(0, &cold, &mut out).unwrap();
        }
        inst.flush();
        assert_eq!(pinned_now(), held, "no miss taken in");
        assert_eq!(inst.caches[0].counters().hits, 0);
        for (k, r) in cold.iter().zip(out.chunks(DIM)) {
            let want: Vec<f32> = (0..DIM).map(|j| *k as f32 + j as f32 * 0.25).collect();
            assert_eq!(r, &want[..], "key {k}");
        }
        drop(inst);
        // no file: a warning, and every lookup served from below
        let inst = pinned(&d, d.join("missing.cache_keys")).attach_caches(&cpu).unwrap();
        inst.lookup(0, &held[..10], &mut out[..10 * DIM]).unwrap();
        assert!(inst.caches[0].held_keys().unwrap().is_empty());
        assert_eq!(out[DIM], held[1] as f32);
        drop(inst);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn an_unusable_file_is_refused_and_the_caches_start_empty() {
        let d = tmp("refused");
        drop(serve_some(&store("s", &d, 5000, 0.0).attach_caches(&cpu).unwrap()));
        let file = d.join("state/s.cpu.cache_keys");
        let good = std::fs::read(&file).unwrap();
        let s = store("s", &d, 5000, 0.0);
        assert!(read(&s, "s", &file).is_ok());
        // cut short
        std::fs::write(&file, &good[..good.len() - 8]).unwrap();
        assert!(read(&s, "s", &file).unwrap_err().contains("cut short"));
        std::fs::write(&file, &good[..20]).unwrap();
        assert!(read(&s, "s", &file).unwrap_err().contains("no header"));
        // damaged
        let mut bad = good.clone();
        let last = bad.len() - 3;
        bad[last] ^= 0x40;
        std::fs::write(&file, &bad).unwrap();
        assert!(read(&s, "s", &file).unwrap_err().contains("damaged"));
        // another store's, or other tables
        std::fs::write(&file, &good).unwrap();
        let e = read(&s, "other", &file).unwrap_err();
        assert!(e.contains("written for store 's'") && e.contains("not for store 'other'"), "{e}");
        let e = read(&store("s", &d, 4000, 0.0), "s", &file).unwrap_err();
        assert!(e.contains("t0 (5000 rows of 4)") && e.contains("t0 (4000 rows of 4)"), "{e}");
        // not a state file; missing
        std::fs::write(&file, b"hello\nend\n").unwrap();
        assert!(read(&s, "s", &file).unwrap_err().contains("not a cache state file"));
        std::fs::remove_file(&file).unwrap();
        assert!(read(&s, "s", &file).unwrap_err().contains("cannot read"));
        // each case loads with empty caches and serves
        for body in [&good[..good.len() - 8], &bad[..]] {
            std::fs::write(&file, body).unwrap();
            let inst = store("s", &d, 5000, 0.0).attach_caches(&cpu).unwrap();
            assert!(inst.caches[0].held_keys().unwrap().is_empty());
            let mut out = vec![0f32; DIM];
            inst.lookup(0, &[7], &mut out).unwrap();
            assert_eq!(out, [7.0, 7.25, 7.5, 7.75]);
            std::mem::forget(inst); // no save over the file the next case writes
        }
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn saves_on_its_period_while_serving() {
        let d = tmp("period");
        let inst = store("p", &d, 5000, 0.2).attach_caches(&cpu).unwrap();
        let held = serve_some(&inst);
        let file = d.join("state/p.cpu.cache_keys");
        // a save may have run while it served: the next ones hold what it holds now
        let s = store("p", &d, 5000, 0.0);
        let t0 = Instant::now();
        let mut saved = Vec::new();
        while saved != held && t0.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(50));
            if let Ok(mut k) = read(&s, "p", &file) {
                saved = k.remove(0);
                saved.sort_unstable();
            }
        }
        assert_eq!(saved, held, "saved while serving");
        drop(inst);
        std::fs::remove_dir_all(d).unwrap();
    }
}
