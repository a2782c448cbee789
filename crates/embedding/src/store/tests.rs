#[cfg(feature = "gpu")]
use super::below::fetch_parallel;
use super::*;
use crate::cache::HostCache;
use crate::keys::Zipf;
use crate::table::{write_table, VectorType};
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

fn row(key: i64, version: u32, dim: usize) -> Vec<f32> {
    (0..dim).map(|j| key as f32 * 100.0 + version as f32 + j as f32 * 1e-3).collect()
}

fn make_store(
    name: &str,
    rows: usize,
    dim: usize,
    ratio: f64,
    threshold: f64,
) -> (Arc<EmbeddingStore>, PathBuf) {
    make_placed_store(name, rows, dim, ratio, threshold, Default::default())
}

fn make_placed_store(
    name: &str,
    rows: usize,
    dim: usize,
    ratio: f64,
    threshold: f64,
    placement: crate::store_config::Placement,
) -> (Arc<EmbeddingStore>, PathBuf) {
    make_store_in(name, rows, dim, ratio, threshold, placement, Default::default())
}

fn make_store_in(
    name: &str,
    rows: usize,
    dim: usize,
    ratio: f64,
    threshold: f64,
    placement: crate::store_config::Placement,
    host_memory: crate::table::HostRows,
) -> (Arc<EmbeddingStore>, PathBuf) {
    let dir = std::env::temp_dir().join(format!("trt-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let keys: Vec<i64> = (0..rows as i64).collect();
    let vecs: Vec<f32> = keys.iter().flat_map(|&k| row(k, 0, dim)).collect();
    write_table(&dir.join("t0"), &keys, bytemuck::cast_slice(&vecs), dim, VectorType::F32).unwrap();
    let cfg = StoreConfig {
        cache_ratio: ratio,
        hit_rate_threshold: threshold,
        host_memory,
        placement,
        ..StoreConfig::with_tables(vec![
            TableConfig {
                name: "t0".into(),
                dim,
                path: Some(dir.join("t0")),
                format: None,
                default_value: 0.0,
            },
            TableConfig {
                name: "empty".into(),
                dim: 2,
                path: None,
                format: None,
                default_value: -1.0,
            },
        ])
    };
    (EmbeddingStore::open(cfg, None).unwrap(), dir)
}

fn cpu(geo: CacheGeometry) -> Result<Arc<dyn CacheTier>> {
    Ok(Arc::new(HostCache::new(geo)))
}

#[cfg(feature = "gpu")]
#[test]
fn parallel_reads_below_the_cache_equal_one_reader() {
    // t0 has dim 2 like the empty table, so one batch covers both
    let (store, dir) = make_store("parallel", 3000, 2, 0.1, 1.1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (n0, n1) = (4100usize, 1500usize);
    let keys: Vec<i64> =
        (0..n0).map(|_| rng.gen_range(0..3100)).chain((0..n1).map(|i| i as i64)).collect();
    let groups = [(0usize, 0..n0), (1usize, n0..n0 + n1)];
    let mut rows = vec![7f32; keys.len() * 2];
    let found =
        fetch_parallel(&store, &groups, &keys, &mut rows, 2, EmbeddingStore::read_below_cache)
            .unwrap();
    let mut want = vec![7f32; keys.len() * 2];
    let mut want_found = store.fetch_below_cache(0, &keys[..n0], &mut want[..n0 * 2]).unwrap();
    want_found.extend(store.fetch_below_cache(1, &keys[n0..], &mut want[n0 * 2..]).unwrap());
    assert_eq!(found, want_found);
    assert_eq!(rows, want);
    assert!(
        found[..n0].iter().any(|f| !f) && found[..n0].iter().any(|&f| f),
        "keys past the table are not found"
    );
    assert_eq!(&rows[n0 * 2..n0 * 2 + 2], &[-1.0, -1.0], "the empty table's default vector");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn lookups_go_through_the_tiers() {
    let (store, dir) = make_store("tiers", 1000, 4, 0.1, 1.1);
    let inst = store.attach_caches(&cpu).unwrap();
    let keys = [5i64, 999, 5000, 5];
    let mut out = vec![0f32; 16];
    inst.lookup(0, &keys, &mut out).unwrap();
    assert_eq!(out[..4], row(5, 0, 4)[..]);
    assert_eq!(out[4..8], row(999, 0, 4)[..]);
    assert_eq!(out[8..12], [0.0; 4], "unknown key gets the default vector");
    // threshold 1.1 > any hit rate: fills are synchronous, so the second lookup hits
    inst.lookup(0, &keys, &mut out).unwrap();
    let c = store.counters(0);
    assert_eq!(c.keys.load(Ordering::Relaxed), 8);
    assert!(c.cache_hits.load(Ordering::Relaxed) >= 3, "{}", c.cache_hits.load(Ordering::Relaxed));
    assert_eq!(c.defaults.load(Ordering::Relaxed), 2);
    let mut two = [0f32; 2];
    inst.lookup(1, &[3], &mut two).unwrap();
    assert_eq!(two, [-1.0, -1.0]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn updates_reach_every_instance_cache() {
    let (store, dir) = make_store("upd", 100, 4, 1.0, 1.1);
    let a = store.attach_caches(&cpu).unwrap();
    let b = store.attach_caches(&cpu).unwrap();
    let mut out = vec![0f32; 4];
    a.lookup(0, &[7], &mut out).unwrap();
    b.lookup(0, &[7], &mut out).unwrap();
    store.update(0, &[7, 1000], &[row(7, 3, 4), row(1000, 1, 4)].concat()).unwrap();
    for inst in [&a, &b] {
        inst.lookup(0, &[7], &mut out).unwrap();
        assert_eq!(out, row(7, 3, 4));
        inst.lookup(0, &[1000], &mut out).unwrap();
        assert_eq!(out, row(1000, 1, 4), "a new key is served after the update");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn async_fills_land_after_flush() {
    let (store, dir) = make_store("async", 1000, 4, 0.5, 0.0);
    let inst = store.attach_caches(&cpu).unwrap();
    let keys: Vec<i64> = (0..50).collect();
    let mut out = vec![0f32; 200];
    inst.lookup(0, &keys, &mut out).unwrap();
    inst.flush();
    let before = store.counters(0).cache_hits.load(Ordering::Relaxed);
    inst.lookup(0, &keys, &mut out).unwrap();
    assert_eq!(store.counters(0).cache_hits.load(Ordering::Relaxed) - before, 50);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Readers on two instances and writers updating random keys, through the whole store:
/// every row returned is a whole row of its key and never older than what was
/// committed before the lookup began (a fill racing an update must not leave a
/// superseded row in a cache).
#[test]
fn concurrent_lookups_and_updates_through_the_store() {
    use std::sync::atomic::AtomicU32;
    const ROWS: usize = 400;
    const DIM: usize = 8;
    let (store, dir) = make_store("conc", ROWS, DIM, 0.25, 0.5);
    let insts = [store.attach_caches(&cpu).unwrap(), store.attach_caches(&cpu).unwrap()];
    let committed: Arc<Vec<AtomicU32>> = Arc::new((0..ROWS).map(|_| AtomicU32::new(0)).collect());
    let key_locks: Arc<Vec<parking_lot::Mutex<()>>> =
        Arc::new((0..ROWS).map(|_| parking_lot::Mutex::new(())).collect());
    let zipf = Arc::new(Zipf::new(ROWS, 1.1));
    let mut handles = Vec::new();
    for t in 0..6u64 {
        let (store, inst, committed, key_locks, zipf) = (
            store.clone(),
            insts[t as usize % 2].clone(),
            committed.clone(),
            key_locks.clone(),
            zipf.clone(),
        );
        handles.push(std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(t);
            let mut checked = 0usize;
            for _ in 0..2000 {
                if t == 0 || t == 1 {
                    let k = zipf.rank(rng.gen());
                    let _g = key_locks[k].lock();
                    let v = committed[k].load(Ordering::SeqCst) + 1;
                    store.update(0, &[k as i64], &row(k as i64, v, DIM)).unwrap();
                    committed[k].store(v, Ordering::SeqCst);
                } else {
                    let keys: Vec<i64> = (0..16).map(|_| zipf.rank(rng.gen()) as i64).collect();
                    let floors: Vec<u32> = keys
                        .iter()
                        .map(|&k| committed[k as usize].load(Ordering::SeqCst))
                        .collect();
                    let mut out = vec![0f32; keys.len() * DIM];
                    inst.lookup(0, &keys, &mut out).unwrap();
                    for (i, &k) in keys.iter().enumerate() {
                        let got = &out[i * DIM..(i + 1) * DIM];
                        let v = (got[0] - k as f32 * 100.0).round();
                        assert!(
                            v >= floors[i] as f32,
                            "stale row for key {k}: version {v} < {}",
                            floors[i]
                        );
                        assert_eq!(
                            got,
                            &row(k, v as u32, DIM)[..],
                            "wrong or torn row for key {k}"
                        );
                        checked += 1;
                    }
                }
            }
            checked
        }));
    }
    let checked: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(checked > 10_000);
    let c = store.counters(0);
    assert!(c.cache_hits.load(Ordering::Relaxed) > 0);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn zipf_hit_rate_is_reported() {
    let (store, dir) = make_store("zipf", 20_000, 4, 0.05, 1.1);
    let inst = store.attach_caches(&cpu).unwrap();
    let zipf = Zipf::new(20_000, 1.05);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let mut out = vec![0f32; 256 * 4];
    for _ in 0..200 {
        let keys: Vec<i64> = (0..256).map(|_| zipf.rank(rng.gen()) as i64).collect();
        inst.lookup(0, &keys, &mut out).unwrap();
    }
    let c = store.counters(0);
    let rate = c.cache_hits.load(Ordering::Relaxed) as f64 / c.keys.load(Ordering::Relaxed) as f64;
    println!("Zipf(1.05) over 20000 keys, cache 5% of rows: hit rate {rate:.3}");
    // the 1000 hottest of 20000 Zipf(1.05) keys carry well over half the traffic
    assert!(rate > 0.5 && rate < 1.0, "hit rate {rate}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_store_wide_cache_share_caches_small_tables_whole() {
    let rows = [3, 1_000, 40_000, 1_000_000, 1_000_000];
    let per = cache_rows(&rows, 0.1, CacheAllocation::PerTable, &[]);
    assert_eq!(per, [1, 100, 4_000, 100_000, 100_000]);
    let store = cache_rows(&rows, 0.1, CacheAllocation::Store, &[9, 9, 9, 1, 8]);
    let budget = (rows.iter().sum::<usize>() as f64 * 0.1).floor() as usize;
    assert!(store.iter().sum::<usize>() <= budget, "never above the budget: {store:?}");
    assert!(budget - store.iter().sum::<usize>() < rows.len(), "the budget is used: {store:?}");
    assert_eq!(&store[..2], &[2 * 3, 2 * 1_000], "small tables whole, at half load");
    assert!(
        store[2] > rows[2] && store[2] < 2 * rows[2],
        "whole, at what load the budget leaves: {store:?}"
    );
    assert!(store[3].abs_diff(store[4]) <= 1, "large tables share the rest equally: {store:?}");
    assert_eq!(CacheAllocation::parse("store").unwrap(), CacheAllocation::Store);
    assert!(CacheAllocation::parse("most")
        .unwrap_err()
        .message()
        .contains("per_table, store or lookups"));
}

#[test]
fn a_store_wide_share_by_lookups_gives_the_large_tables_slots_by_their_keys_a_sample() {
    let rows = [3, 1_000, 1_000_000, 1_000_000, 1_000_000];
    let budget = (rows.iter().sum::<usize>() as f64 * 0.1).floor() as usize;
    let by = cache_rows(&rows, 0.1, CacheAllocation::Lookups, &[1, 1, 1, 3, 6]);
    assert!(by.iter().sum::<usize>() <= budget && budget - by.iter().sum::<usize>() < rows.len());
    assert_eq!(&by[..2], &[2 * 3, 2 * 1_000], "small tables whole, as Store");
    let (one, three, six) = (by[2] as f64, by[3] as f64, by[4] as f64);
    assert!((three / one - 3.0).abs() < 1e-3 && (six / one - 6.0).abs() < 1e-3, "{by:?}");
    // a table its weight would give more than WHOLE_ROOM slots a row is held there
    let capped = cache_rows(&[100, 1_000_000], 0.1, CacheAllocation::Lookups, &[1_000_000, 1]);
    assert_eq!(capped[0], 200, "{capped:?}");
    assert_eq!(capped[1], 100_010 - 200, "the rest to the other: {capped:?}");
    // every weight one (or none given): the same as Store
    let rows = [7, 40, 123_456, 999_999, 1_000_001];
    let store = cache_rows(&rows, 0.1, CacheAllocation::Store, &[]);
    assert_eq!(cache_rows(&rows, 0.1, CacheAllocation::Lookups, &[]), store);
    assert_eq!(cache_rows(&rows, 0.1, CacheAllocation::Lookups, &[1; 5]), store);
    assert_eq!(CacheAllocation::parse(" lookups ").unwrap(), CacheAllocation::Lookups);
}

#[test]
fn each_table_can_have_its_own_cache_share() {
    let dir = std::env::temp_dir().join(format!("trt-store-shares-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dim = 4;
    let tables: Vec<TableConfig> = [("items", 10_000usize), ("categories", 100)]
        .iter()
        .map(|&(name, rows)| {
            let keys: Vec<i64> = (0..rows as i64).collect();
            let vecs: Vec<f32> = keys.iter().flat_map(|&k| row(k, 0, dim)).collect();
            write_table(&dir.join(name), &keys, bytemuck::cast_slice(&vecs), dim, VectorType::F32)
                .unwrap();
            TableConfig {
                name: name.into(),
                dim,
                path: Some(dir.join(name)),
                format: None,
                default_value: 0.0,
            }
        })
        .collect();
    let cfg = |ratios: Vec<f64>, allocation| StoreConfig {
        cache_ratio: 0.5,
        cache_ratios: ratios,
        cache_allocation: allocation,
        ..StoreConfig::with_tables(tables.clone())
    };
    // the items at 10%, the categories whole; the store's own share applies to neither
    let store = EmbeddingStore::open(cfg(vec![0.1, 1.0], CacheAllocation::PerTable), None).unwrap();
    let slots = |t| store.cache_geometry(t).capacity();
    assert_eq!(slots(0), CacheGeometry::for_rows(1_000, dim).capacity());
    assert_eq!(slots(1), CacheGeometry::for_rows(100, dim).capacity());
    let caches = store.attach_caches(&cpu).unwrap();
    let keys: Vec<i64> = (0..100).map(|k| k * 97).collect();
    for _ in 0..3 {
        let mut out = vec![0f32; keys.len() * dim];
        caches.lookup(1, &keys.iter().map(|k| k % 100).collect::<Vec<_>>(), &mut out).unwrap();
        let want: Vec<f32> = keys.iter().flat_map(|k| row(k % 100, 0, dim)).collect();
        assert_eq!(out, want);
        caches.lookup(0, &keys, &mut out).unwrap();
        assert_eq!(out, keys.iter().flat_map(|&k| row(k, 0, dim)).collect::<Vec<f32>>());
    }
    drop((caches, store));
    // refused, naming what is wrong
    let refused = |ratios, allocation| {
        EmbeddingStore::open(cfg(ratios, allocation), None).err().unwrap().message().to_string()
    };
    let e = refused(vec![0.1], CacheAllocation::PerTable);
    assert!(e.contains("1 fractions for 2 tables"), "{e}");
    let e = refused(vec![0.1, 0.0], CacheAllocation::PerTable);
    assert!(e.contains("'categories' has 0"), "{e}");
    let e = refused(vec![1.5, 1.0], CacheAllocation::PerTable);
    assert!(e.contains("'items' has 1.5"), "{e}");
    let e = refused(vec![0.1, 1.0], CacheAllocation::Store);
    assert!(e.contains("per_table"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn config_errors_name_the_table() {
    let dir = std::env::temp_dir().join(format!("trt-store-bad-{}", std::process::id()));
    write_table(&dir, &[1, 2], bytemuck::cast_slice(&[0f32; 6]), 3, VectorType::F32).unwrap();
    let cfg = |dim| StoreConfig {
        replicate_share: 0.0,
        ..StoreConfig::with_tables(vec![TableConfig {
            name: "users".into(),
            dim,
            path: Some(dir.clone()),
            format: None,
            default_value: 0.0,
        }])
    };
    let e = EmbeddingStore::open(cfg(4), None).err().unwrap();
    assert!(e.message().contains("'users'") && e.message().contains("dim 3"), "{e}");
    assert!(EmbeddingStore::open(cfg(3), None).is_ok());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn acknowledged_updates_survive_a_reopen_and_a_compaction() {
    let (store, dir) = make_store("durable", 100, 4, 0.0, 0.9);
    let cfg = store.config.clone();
    let read = |store: &Arc<EmbeddingStore>, keys: &[i64]| {
        let mut out = vec![0f32; keys.len() * 4];
        store.attach_caches_none().lookup(0, keys, &mut out).unwrap();
        out
    };
    store.update(0, &[1, 500], &[row(1, 1, 4), row(500, 1, 4)].concat()).unwrap();
    assert!(store.durable().is_err(), "the table with no files and no update_log_dir has no log");
    drop(store);
    // a restart: the files still hold version 0, the log version 1
    let store = EmbeddingStore::open(cfg.clone(), None).unwrap();
    assert_eq!(read(&store, &[1, 500, 2]), [row(1, 1, 4), row(500, 1, 4), row(2, 0, 4)].concat());
    assert_eq!(store.counters(0).replayed_rows.load(Ordering::Relaxed), 2);
    store.compact(0).unwrap();
    assert_eq!(store.host(0).overlay_rows(), 0, "the compaction reclaims the overlay");
    assert_eq!(store.host_rows(0), 101);
    assert_eq!(read(&store, &[1, 500, 2]), [row(1, 1, 4), row(500, 1, 4), row(2, 0, 4)].concat());
    store.update(0, &[2], &row(2, 2, 4)).unwrap();
    drop(store);
    // a restart after the compaction: the snapshot, then the newer log
    let store = EmbeddingStore::open(cfg, None).unwrap();
    assert_eq!(read(&store, &[1, 500, 2]), [row(1, 1, 4), row(500, 1, 4), row(2, 2, 4)].concat());
    assert_eq!(
        store.counters(0).replayed_rows.load(Ordering::Relaxed),
        1,
        "only what came after the snapshot"
    );
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_compactor_keeps_the_overlay_bounded() {
    let (store, dir) = make_store("compactor", 50, 2, 0.0, 0.9);
    let mut cfg = store.config.clone();
    drop(store);
    cfg.compaction_rows = 100;
    let store = EmbeddingStore::open(cfg, None).unwrap();
    for round in 0..20i64 {
        let keys: Vec<i64> = (0..50).collect();
        let vals: Vec<f32> = keys.iter().flat_map(|&k| row(k, round as u32, 2)).collect();
        store.update(0, &keys, &vals).unwrap();
    }
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    // the compactor resets the overlay, then counts the compaction: wait for both
    let done = |s: &EmbeddingStore| {
        s.host(0).overlay_rows() < 100 && s.counters(0).compactions.load(Ordering::Relaxed) > 0
    };
    while !done(&store) && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(store.counters(0).compactions.load(Ordering::Relaxed) > 0);
    assert!(store.host(0).overlay_rows() < 100 + 50, "overlay {}", store.host(0).overlay_rows());
    let mut out = vec![0f32; 2];
    store.attach_caches_none().lookup(0, &[7], &mut out).unwrap();
    assert_eq!(out, row(7, 19, 2));
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_stream_that_leaves_redis_to_its_publisher_needs_an_update_log() {
    let spec = |write_remote| crate::stream::StreamSpec {
        addr: "127.0.0.1:1".into(),
        stream: "updates".into(),
        group: "g".into(),
        start: "$".into(),
        write_remote,
    };
    let cfg = |write_remote| StoreConfig {
        cache_ratio: 0.0,
        update_stream: Some(spec(write_remote)),
        replicate_share: 0.0,
        ..StoreConfig::with_tables(vec![TableConfig {
            name: "fileless".into(),
            dim: 4,
            path: None,
            format: None,
            default_value: 0.0,
        }])
    };
    let e = match EmbeddingStore::open(cfg(false), None) {
        Err(e) => e,
        Ok(_) => panic!("a fileless table without a log opened"),
    };
    assert!(
        e.message().contains("update_stream_write_remote") && e.message().contains("'fileless'"),
        "{e}"
    );
}

/// Sharded rows: a lookup reading rows in place holds the update order, so an update waits
/// for it (and the lookups after the update read it whole); replicated stores take no hold.
#[test]
fn sharded_lookups_and_updates_take_turns() {
    use crate::store_config::Placement;
    let (replicated, dir_r) = make_store("order-replicated", 16, 4, 1.0, 1.0);
    assert!(replicated.attach_caches_none().update_order().is_none());
    let (store, dir) = make_placed_store("order-sharded", 16, 4, 1.0, 1.0, Placement::Sharded);
    let caches = store.attach_caches_none();
    let held = caches.update_order().expect("sharded rows order lookups with updates");
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || {
            store.update(0, &[3], &row(3, 1, 4)).unwrap();
            tx.send(()).unwrap();
        })
    };
    // the update cannot land while the lookup holds the order
    assert!(rx.recv_timeout(std::time::Duration::from_millis(200)).is_err());
    drop(held);
    rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the update lands after the lookup");
    writer.join().unwrap();
    let mut out = vec![0f32; 4];
    store.host(0).get(3, &mut out);
    assert_eq!(out, row(3, 1, 4));
    for d in [dir, dir_r] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[cfg(feature = "gpu")]
#[test]
fn gpu_miss_reads_are_refused_for_a_table_not_loaded_from_files() {
    // checked before any table's rows are page-locked, so no GPU is needed to see it
    let (store, dir) = make_store("gpureads", 64, 4, 0.5, 0.9);
    let e = store.gpu_host_rows(0).err().expect("a table filled only by updates");
    let want = "parameter 'gpucache_miss_reads' is gpu, but table 'empty' was not loaded from files with keys 0..rows in order";
    assert!(e.message().contains(want), "{e}");
    assert!(!store.host_rows_current(), "nothing registered: every lookup reads on the host");
    let _ = std::fs::remove_dir_all(dir);
}

/// A table file cut or rewritten while its model serves (a deploy copying a new table over the
/// old one): rows read from the file's mapping fail the lookup, naming the table and the file,
/// and the process lives on (without the guard, the read past the cut is a SIGBUS that ends
/// it, and this test with it); rows copied at load (`huge_pages`) stay the ones loaded.
#[test]
fn a_table_file_cut_or_rewritten_under_the_store_never_ends_the_process() {
    use crate::store_config::Placement;
    use crate::table::HostRows;
    let (dim, rows) = (256, 4096); // 1 KiB rows: a cut leaves whole pages past the new end
    for host_memory in [HostRows::Mapped, HostRows::HugePages] {
        for rewrite in [false, true] {
            let name = format!("cut-{host_memory:?}-{rewrite}");
            let (store, dir) =
                make_store_in(&name, rows, dim, 0.01, 1.1, Placement::Replicated, host_memory);
            let inst = store.attach_caches(&cpu).unwrap();
            let mut out = vec![0f32; dim];
            inst.lookup(0, &[4000], &mut out).unwrap();
            assert_eq!(out, row(4000, 0, dim));
            let path = dir.join("t0").join("vectors.npy");
            if rewrite {
                // in place at its full size, other rows (after the clock's tick: a file's
                // times move in steps of a few ms)
                std::thread::sleep(std::time::Duration::from_millis(50));
                let keys: Vec<i64> = (0..rows as i64).collect();
                let vecs: Vec<f32> = keys.iter().flat_map(|&k| row(k, 9, dim)).collect();
                let t = dir.join("t0");
                write_table(&t, &keys, bytemuck::cast_slice(&vecs), dim, VectorType::F32).unwrap();
            } else {
                // to its header and first 1024 rows, as `cp small/vectors.npy` over it does
                let head = std::fs::read(&path).unwrap();
                let at = crate::table::parse_npy_header(&head).unwrap().data_offset;
                let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                file.set_len((at + 1024 * dim * 4) as u64).unwrap();
            }
            let got = inst.lookup(0, &[3000], &mut out);
            if host_memory == HostRows::HugePages {
                got.unwrap();
                assert_eq!(out, row(3000, 0, dim), "the rows loaded, whatever the file says now");
                let _ = std::fs::remove_dir_all(&dir);
                continue;
            }
            let e = got.unwrap_err();
            let m = e.message();
            assert!(m.contains("table 't0'") && m.contains("vectors.npy"), "{m}");
            let why = if rewrite { "changed since it was loaded" } else { "cut (truncated)" };
            assert!(m.contains(why), "{m}");
            // a row the file still holds fails too: the file is not the one loaded
            let e = inst.lookup(0, &[7], &mut out).unwrap_err();
            assert!(e.message().contains("table 't0'"), "{e}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[test]
fn a_gpu_cache_keeps_a_key_index_where_it_costs_at_most_a_quarter_of_the_cache() {
    // a 10% cache of rows of 128 fp32: 0.1 x (16 + 512) bytes a row against 4 for the index
    let (store, dir) = make_store("key-index", 10_000, 128, 0.1, 0.0);
    let geo = store.cache_geometry(0);
    assert_eq!(store.cache_index(), CacheIndex::Off, "off unless asked");
    assert_eq!(store.cache_index_rows(0, &geo), 0);
    let dense = store.host(0).dense_rows();
    assert_eq!(dense, Some(10_000), "keys 0..rows in order");
    let bytes = |g: &CacheGeometry| g.capacity() * (16 + 128 * 4);
    assert_eq!(CacheIndex::Auto.rows(dense, bytes(&geo)), 10_000, "every key indexed");
    // a 1% cache: the index would be 1.5 times the cache
    let small = CacheGeometry::for_rows(100, 128);
    assert_eq!(CacheIndex::Auto.rows(dense, bytes(&small)), 0);
    std::fs::remove_dir_all(dir).unwrap();
    let bytes = 1_000 * 16;
    assert_eq!(CacheIndex::Auto.rows(Some(1_000), bytes), 1_000, "4,000 bytes <= 16,000 / 4");
    assert_eq!(CacheIndex::Auto.rows(Some(1_001), bytes), 0);
    assert_eq!(CacheIndex::On.rows(Some(1_001), bytes), 1_001);
    assert_eq!(CacheIndex::Off.rows(Some(10), bytes), 0);
    // keys that are not row numbers: no index covers them
    assert_eq!(CacheIndex::On.rows(None, bytes), 0);
}
