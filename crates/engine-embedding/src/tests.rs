use super::*;
use std::path::Path;
use triton_rust_core::config::ModelConfig;
use triton_rust_core::engine::{EngineKind, Opened};
use triton_rust_embedding::{CacheEviction, CacheIndex, CacheRows};

#[test]
fn secrets_compare_whole() {
    assert!(same_secret(b"s3cret", b"s3cret"));
    assert!(!same_secret(b"s3cre", b"s3cret"));
    assert!(!same_secret(b"s3cretX", b"s3cret"));
    assert!(!same_secret(b"", b"s3cret"));
    assert!(!same_secret(b"s3creT", b"s3cret"));
}

fn cfg(params: &[(&str, &str)]) -> ModelConfig {
    let mut c = ModelConfig { name: "upd".into(), ..Default::default() };
    for (k, v) in params {
        c.parameters.insert(k.to_string(), v.to_string());
    }
    c
}

#[test]
fn the_key_upload_is_read_from_the_config_and_checked() {
    let settings = |extra: &[(&str, &str)]| {
        let mut p = vec![
            ("embedding_table_names", "a"),
            ("embedding_vecsize_per_table", "4"),
            ("embedding_interface", "batched"),
        ];
        p.extend_from_slice(extra);
        StoreSettings::from_config(&cfg(&p), Path::new("/nonexistent"), &Default::default())
    };
    assert_eq!(
        settings(&[]).unwrap().key_upload,
        (128 << 10, 8),
        "1 MiB pieces on up to 8 tasks, as measured"
    );
    assert_eq!(
        settings(&[("gpu_key_piece", "262144"), ("gpu_key_upload_tasks", "4")]).unwrap().key_upload,
        (262144, 4)
    );
    let e = settings(&[("gpu_key_piece", "100")]).unwrap_err();
    assert!(
        e.message().contains("'gpu_key_piece'") && e.message().contains("at least 1024"),
        "{e}"
    );
    assert!(settings(&[("gpu_key_upload_tasks", "1.5")])
        .unwrap_err()
        .message()
        .contains("'gpu_key_upload_tasks'"));
    assert!(settings(&[("gpu_key_upload_tasks", "0")]).is_err());
}

/// The settings of a store of one table ("a", dim 4) with `extra` parameters.
fn one_table(extra: &[(&str, &str)]) -> Result<StoreSettings> {
    one_table_on(&[], extra)
}

/// [`one_table`] of a model whose instance groups are of `kinds`.
fn one_table_on(kinds: &[&str], extra: &[(&str, &str)]) -> Result<StoreSettings> {
    let mut p = vec![("embedding_table_names", "a"), ("embedding_vecsize_per_table", "4")];
    p.extend_from_slice(extra);
    let mut c = cfg(&p);
    c.instance_kinds = kinds.iter().map(|k| k.to_string()).collect();
    StoreSettings::from_config(&c, Path::new("/nonexistent"), &Default::default())
}

#[test]
fn gpu_caches_are_shared_per_device_unless_the_config_says_per_instance() {
    let sharing = |extra: &[(&str, &str)]| one_table(extra).map(|s| s.cache_sharing);
    assert_eq!(sharing(&[]).unwrap(), CacheSharing::Device, "one cache per GPU, as HPS");
    assert_eq!(sharing(&[("gpucache_sharing", " instance ")]).unwrap(), CacheSharing::Instance);
    assert_eq!(sharing(&[("gpucache_sharing", "device")]).unwrap(), CacheSharing::Device);
    let e = sharing(&[("gpucache_sharing", "model")]).unwrap_err();
    assert!(e.message().contains("'gpucache_sharing' is 'model'"), "{e}");
}

#[test]
fn gpu_caches_keep_fp32_rows_unless_the_config_says_fp16() {
    let rows = |extra: &[(&str, &str)]| one_table(extra).map(|s| s.store.cache_rows);
    assert_eq!(rows(&[]).unwrap(), CacheRows::F32, "as the tables hold them, as HPS");
    assert_eq!(rows(&[("gpucache_row_type", " fp16 ")]).unwrap(), CacheRows::F16);
    assert_eq!(rows(&[("gpucache_row_type", "fp32")]).unwrap(), CacheRows::F32);
    let e = rows(&[("gpucache_row_type", "bf16")]).unwrap_err();
    assert!(e.message().contains("gpucache_row_type must be fp32 or fp16; got 'bf16'"), "{e}");
}

#[test]
fn each_table_may_name_its_own_cache_share() {
    let shares = |extra: &[(&str, &str)]| one_table(extra).map(|s| s.store.cache_ratios);
    assert_eq!(shares(&[]).unwrap(), Vec::<f64>::new(), "gpucacheper for every table, as HPS");
    assert_eq!(shares(&[("gpucacheper_per_table", " 0.25 ")]).unwrap(), [0.25]);
    let e = shares(&[("gpucacheper_per_table", "0.1,all")]).unwrap_err();
    assert!(e.message().contains("'gpucacheper_per_table' = '0.1,all'"), "{e}");
    // sharded placement needs every table whole, whichever parameter says it
    let p = [
        ("gpucache_placement", "sharded"),
        ("gpucacheper", "1.0"),
        ("gpucacheper_per_table", "0.5"),
    ];
    let e = one_table_on(&["KIND_GPU"], &p).unwrap_err();
    assert!(e.message().contains("table 'a' caches 0.5"), "{e}");
}

#[test]
fn cache_key_index_parameter() {
    let index = |extra: &[(&str, &str)]| one_table(extra).map(|s| s.store.cache_index);
    assert_eq!(index(&[]).unwrap(), CacheIndex::Off);
    assert_eq!(index(&[("gpucache_key_index", " auto ")]).unwrap(), CacheIndex::Auto);
    assert_eq!(index(&[("gpucache_key_index", "on")]).unwrap(), CacheIndex::On);
    let e = index(&[("gpucache_key_index", "yes")]).unwrap_err();
    assert!(e.message().contains("gpucache_key_index must be auto, on or off; got 'yes'"), "{e}");
}

#[test]
fn hit_stamp_every_parameter() {
    let every = |extra: &[(&str, &str)]| one_table(extra).map(|s| s.store.hit_stamp_every);
    assert_eq!(every(&[]).unwrap(), 1, "every hit stamped, as the CPU cache stamps");
    assert_eq!(every(&[("gpucache_hit_stamp_every", "8")]).unwrap(), 8);
    assert_eq!(every(&[("gpucache_hit_stamp_every", "0")]).unwrap(), 0);
    for bad in ["6", "2048", "-1", "0.5"] {
        let e = every(&[("gpucache_hit_stamp_every", bad)]).unwrap_err();
        assert!(e.message().contains("'gpucache_hit_stamp_every'"), "{bad}: {e}");
    }
}

#[test]
fn cache_policy_parameter() {
    let policy = |extra: &[(&str, &str)]| one_table(extra).map(|s| s.store.cache_eviction);
    assert_eq!(policy(&[]).unwrap(), CacheEviction::Lru, "every miss goes in, as HPS");
    assert_eq!(policy(&[("gpucache_policy", " lfu ")]).unwrap(), CacheEviction::Lfu);
    let e = policy(&[("gpucache_policy", "fifo")]).unwrap_err();
    assert!(e.message().contains("gpucache_policy must be lru, lfu or pinned; got 'fifo'"), "{e}");
    // pinned: the file of keys required, read by no other policy, and nothing to save
    let pinned = [("gpucache_policy", "pinned"), ("gpucache_pinned_keys", "hot.cache_keys")];
    let s = one_table(&pinned).unwrap();
    assert_eq!(s.store.cache_eviction, CacheEviction::Pinned);
    assert!(s.store.pinned_keys.unwrap().ends_with("hot.cache_keys"));
    let e = policy(&[("gpucache_policy", "pinned")]).unwrap_err();
    assert!(e.message().contains("set parameter 'gpucache_pinned_keys'"), "{e}");
    let e = policy(&[("gpucache_pinned_keys", "hot.cache_keys")]).unwrap_err();
    assert!(e.message().contains("read only by gpucache_policy pinned; the policy is lru"), "{e}");
    let e = policy(&[pinned[0], pinned[1], ("cache_state_dir", "state")]).unwrap_err();
    assert!(e.message().contains("nothing to save in cache_state_dir"), "{e}");
}

#[test]
fn miss_reads_parameter() {
    use crate::MissReads;
    let reads = |extra: &[(&str, &str)]| one_table(extra).map(|s| s.miss_reads);
    assert_eq!(reads(&[]).unwrap(), MissReads::Cpu, "host threads, as HPS");
    assert_eq!(reads(&[("gpucache_miss_reads", " gpu ")]).unwrap(), MissReads::Gpu);
    assert_eq!(reads(&[("gpucache_miss_reads", "both")]).unwrap(), MissReads::Both);
    let e = reads(&[("gpucache_miss_reads", "dma")]).unwrap_err();
    assert!(e.message().contains("parameter 'gpucache_miss_reads' is 'dma'; use cpu"), "{e}");
}

#[test]
fn models_sharing_a_store_must_ask_the_same_cache_rows_and_policy() {
    let settings = |rows: &str, policy: &str| {
        let extra = [
            ("sparse_files", "none"),
            ("store_name", "cache_rows_agree"),
            ("gpucache_row_type", rows),
            ("gpucache_policy", policy),
        ];
        one_table(&extra).unwrap()
    };
    let stores = Stores::default();
    let first = shared_store(&stores, &settings("fp16", "lfu")).unwrap();
    let again = shared_store(&stores, &settings("fp16", "lfu")).unwrap();
    assert!(Arc::ptr_eq(&first, &again), "the same store for the same settings");
    let e = shared_store(&stores, &settings("fp32", "lfu")).err().expect("other cache rows");
    assert!(
        e.message()
            .contains("store 'cache_rows_agree' is already loaded with gpucache_row_type fp16"),
        "{e}"
    );
    let e = shared_store(&stores, &settings("fp16", "lru")).err().expect("another policy");
    assert!(
        e.message().contains("store 'cache_rows_agree' is already loaded with gpucache_policy lfu"),
        "{e}"
    );
}

#[test]
fn an_update_model_needs_a_credential_or_says_it_is_open() {
    let e = Credential::from_config(&cfg(&[])).unwrap_err();
    assert!(
        e.message().contains("update_credential_file")
            && e.message().contains("allow_unauthenticated_updates"),
        "{e}"
    );
    assert_eq!(
        Credential::from_config(&cfg(&[("allow_unauthenticated_updates", "true")])).unwrap(),
        Credential::Open
    );
    std::env::set_var("TRT_TEST_UPDATE_SECRET", " tok3n \n");
    let c = Credential::from_config(&cfg(&[("update_credential_env", "TRT_TEST_UPDATE_SECRET")]))
        .unwrap();
    assert!(matches!(&c, Credential::Secret { secret, .. } if secret == b"tok3n"));
    assert!(!format!("{c:?}").contains("tok3n"), "the secret never appears in debug output");
    let e =
        Credential::from_config(&cfg(&[("update_credential_env", "TRT_TEST_NOT_SET_ANYWHERE")]))
            .unwrap_err();
    assert!(e.message().contains("TRT_TEST_NOT_SET_ANYWHERE"), "{e}");
    let e = Credential::from_config(&cfg(&[("update_credential_file", "/nonexistent/secret")]))
        .unwrap_err();
    assert!(e.message().contains("/nonexistent/secret"), "{e}");
}

#[test]
fn settings_are_parsed_once_per_model_however_many_instances_it_has() {
    let mut c = cfg(&[
        ("embedding_table_names", "a,b"),
        ("embedding_vecsize_per_table", "4,4"),
        ("sparse_files", "none,none"),
        ("embedding_interface", "batched"),
        ("store_name", "parsed_once"),
    ]);
    c.max_batch_size = 8;
    let (shared, opened) = (Shared::default(), Opened::default());
    let backend = Default::default();
    let load = ModelLoad {
        config: &c,
        backend: &backend,
        model_file: Path::new("/nonexistent"),
        shared: &shared,
        opened: &opened,
    };
    let before = settings::PARSED.with(|n| n.get());
    // described (as for auto-complete), then loaded: the description's settings kept
    let described = EmbeddingKind.describe(&load).unwrap().unwrap();
    let model = EmbeddingKind.load(&load).unwrap();
    assert_eq!(described.outputs, model.signature().outputs);
    let engines: Vec<_> = (0..3).map(|_| model.instance(Device::Cpu).unwrap()).collect();
    assert_eq!(engines.len(), 3);
    assert_eq!(
        settings::PARSED.with(|n| n.get()) - before,
        1,
        "one parse for the model's description, its load and its 3 instances"
    );
    assert_eq!(model.signature().outputs[0].shape, vec![-1, 2, 4]);
    // a second model naming the same store gets that store, through the backend's registry
    let again = EmbeddingKind.load(&load).unwrap();
    let (a, b) = (model.metrics_source().unwrap(), again.metrics_source().unwrap());
    assert!(std::ptr::eq(Arc::as_ptr(&a) as *const u8, Arc::as_ptr(&b) as *const u8), "one store");
}

#[test]
fn the_pooled_interface_reads_hotness_and_combiner_strictly() {
    let pooled = |extra: &[(&str, &str)]| {
        let mut p = vec![
            ("embedding_table_names", "a,b,c"),
            ("embedding_vecsize_per_table", "4"),
            ("embedding_interface", "pooled"),
        ];
        p.extend_from_slice(extra);
        StoreSettings::from_config(&cfg(&p), Path::new("/nonexistent"), &Default::default())
    };
    let s = pooled(&[("embedding_hotness_per_table", "3,1,4")]).unwrap();
    assert_eq!(s.pooling, Some(Pooling { hotness: vec![3, 1, 4], combiner: Combiner::Sum }));
    assert_eq!(s.store.hotness, vec![3, 1, 4], "the store weighs sharded copies by it");
    let s =
        pooled(&[("embedding_hotness_per_table", "2"), ("embedding_combiner", "mean")]).unwrap();
    assert_eq!(s.pooling, Some(Pooling { hotness: vec![2, 2, 2], combiner: Combiner::Mean }));
    for (extra, says) in [
        (vec![], "needs parameter 'embedding_hotness_per_table'"),
        (vec![("embedding_hotness_per_table", "3,x,4")], "one whole number of at least 1"),
        (vec![("embedding_hotness_per_table", "3,0,4")], "one whole number of at least 1"),
        (vec![("embedding_hotness_per_table", "3,1")], "lists 2 counts for 3 tables"),
        (
            vec![("embedding_hotness_per_table", "3"), ("embedding_combiner", "max")],
            "'embedding_combiner' is 'max'; use sum or mean",
        ),
    ] {
        let e = pooled(&extra).unwrap_err();
        assert!(e.message().contains(says), "{extra:?}: {e}");
    }
    let e = one_table(&[("embedding_interface", "batched"), ("embedding_combiner", "sum")])
        .unwrap_err();
    assert!(e.message().contains("applies to embedding_interface pooled only"), "{e}");
}

#[test]
fn bags_go_to_the_gpu_table_after_table_with_where_each_starts() {
    use crate::pool::Bags;
    // two samples, tables of hotness 2 and 1: sample 0 [5, -1 | 7], sample 1 [8, 9 | -1]
    let pooling = Pooling { hotness: vec![2, 1], combiner: Combiner::Sum };
    let fixed = Bags::fixed(&pooling, &[5, PAD, 7, 8, 9, PAD]);
    let (flat, counts, offsets) = fixed.table_major();
    assert_eq!(flat, [5, 8, 9, 7]);
    assert_eq!(counts, [3, 1]);
    // bags (t0,b0) (t0,b1) (t1,b0) (t1,b1): rows 0..1, 1..3, 3..4, 4..4 (empty)
    assert_eq!(offsets, [0, 1, 3, 4, 4]);
    // the same bags ragged: lengths [batch, tables]
    let ragged = Bags::ragged(2, &[5, 7, 8, 9], &[1, 1, 2, 0]).unwrap();
    assert_eq!(ragged.table_major(), (flat, counts, offsets));
    assert_eq!((ragged.keys(0), ragged.keys(1)), (&[5, 8, 9][..], &[7][..]));
    let e = Bags::ragged(2, &[5, 7, 8], &[1, 1, 2, 0]).err().unwrap();
    assert!(e.message().contains("more than the 3 keys"), "{e}");
    let e = Bags::ragged(2, &[5, 7, 8, 9, 1], &[1, 1, 2, 0]).err().unwrap();
    assert!(e.message().contains("sum to 4 but 5 keys"), "{e}");
    assert!(Bags::ragged(2, &[5, 6], &[1, -1])
        .err()
        .unwrap()
        .message()
        .contains("negative length -1"));
}

#[test]
#[ignore = "a timing, not a test: cargo test --release -p triton_rust_engine_embedding -- --ignored --nocapture"]
fn time_bags_at_mlperf_hotness() {
    use crate::pool::Bags;
    let hotness =
        vec![3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1];
    let pooling = Pooling { hotness, combiner: Combiner::Sum };
    let keys: Vec<i64> = (0..4096 * 214).map(|i| (i * 7919) % 40_000).collect();
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let bags = Bags::fixed(&pooling, &keys);
        println!(
            "fresh bags of 4096 x 214 keys: {} us ({} keys)",
            t.elapsed().as_micros(),
            bags.table_major().0.len()
        );
    }
    let mut bags = Bags::default();
    for _ in 0..3 {
        let t = std::time::Instant::now();
        bags.refill_fixed(&pooling, &keys);
        println!("refilled bags of 4096 x 214 keys: {} us", t.elapsed().as_micros());
    }
}

#[test]
fn ragged_bag_starts_are_the_lengths_summed_and_malformed_lengths_are_refused() {
    use crate::pool::{bag_starts, Bags};
    // 2 samples x 3 tables
    let lengths = [2, 0, 1, 3, 1, 0];
    assert_eq!(bag_starts(7, &lengths).unwrap(), vec![0, 2, 2, 3, 6, 7, 7]);
    let keys: Vec<i64> = (10..17).collect();
    let bags = Bags::ragged(3, &keys, &lengths).unwrap();
    // table after table: table 0 holds sample 0's [10, 11] and sample 1's [13, 14, 15]
    assert_eq!(bags.keys(0), &[10, 11, 13, 14, 15]);
    assert_eq!((bags.keys(1), bags.keys(2)), (&[16][..], &[12][..]));
    let e = bag_starts(6, &lengths).unwrap_err();
    assert!(e.message().contains("need more than the 6 keys"), "{e}");
    let e = bag_starts(9, &lengths).unwrap_err();
    assert!(e.message().contains("sum to 7 but 9 keys"), "{e}");
    let e = bag_starts(7, &[2, -1, 6]).unwrap_err();
    assert!(e.message().contains("negative length -1"), "{e}");
}

/// The embedding model `c` describes, loaded in a backend of its own (no model file).
fn load_alone(c: &ModelConfig) -> Result<Box<dyn LoadedModel>> {
    let (shared, backend, opened) = (Shared::default(), Default::default(), Opened::default());
    let load = ModelLoad {
        config: c,
        backend: &backend,
        model_file: Path::new("/x"),
        shared: &shared,
        opened: &opened,
    };
    EmbeddingKind.load(&load)
}

#[test]
fn which_models_take_keys_in_gpu_memory() {
    let takes = |interface: &str, extra: &[(&str, &str)]| {
        let mut p = vec![
            ("embedding_table_names", "a,b"),
            ("embedding_vecsize_per_table", "4,4"),
            ("sparse_files", "none,none"),
            ("embedding_interface", interface),
        ];
        if interface == "pooled" {
            p.push(("embedding_hotness_per_table", "3,2"));
        }
        p.extend_from_slice(extra);
        let store_name = format!("device_inputs_{interface}_{}", extra.len());
        p.push(("store_name", &store_name));
        let mut c = cfg(&p);
        c.max_batch_size = 8;
        let model = load_alone(&c).unwrap();
        (model.accepts_device_inputs(Device::Cpu), model.accepts_device_inputs(Device::Gpu(0)))
    };
    let gpu = cfg!(feature = "gpu");
    assert_eq!(
        takes("pooled", &[]),
        (false, gpu),
        "fixed hotness: the keys are read where they are"
    );
    assert_eq!(takes("batched", &[]), (false, gpu));
    // a vocabulary check reads every key on the host, per request
    assert_eq!(takes("pooled", &[("vocabulary_size_per_table", "10,10")]), (false, false));
}

#[test]
fn hps_device_lists_are_parsed_and_checked_against_the_placement() {
    use crate::settings::check_device;
    use triton_rust_core::engine::Device;
    let on = |kind: &str, list: &str| one_table_on(&[kind], &[("deployed_device_list", list)]);
    assert_eq!(on("KIND_GPU", "0,1").unwrap().devices, Some(vec![0, 1]));
    assert_eq!(on("KIND_GPU", "[1, 0]").unwrap().devices, Some(vec![1, 0]), "HPS's JSON list");
    assert_eq!(one_table(&[]).unwrap().devices, None);
    for (list, words) in
        [("0,x", "'x' is not a GPU id"), ("-1", "-1 is not a GPU id"), ("1,1", "named twice")]
    {
        let e = on("KIND_GPU", list).unwrap_err();
        assert!(
            e.message().contains("deployed_device_list") && e.message().contains(words),
            "{list}: {e}"
        );
    }
    let cpu = on("KIND_CPU", "0").unwrap_err();
    assert!(
        cpu.message().contains("use no GPU") && cpu.message().contains("instance_group"),
        "{cpu}"
    );
    // an instance where the list says, on a GPU that exists
    assert!(check_device(Some(&[0, 1]), Device::Gpu(1), 2).is_ok());
    assert!(check_device(None, Device::Gpu(5), 2).is_ok(), "no list: Triton's placement alone");
    let elsewhere = check_device(Some(&[0]), Device::Gpu(1), 2).unwrap_err();
    assert!(elsewhere.message().contains("placed an instance on GPU 1"), "{elsewhere}");
    let missing = check_device(Some(&[0, 3]), Device::Gpu(0), 2).unwrap_err();
    assert!(
        missing.message().contains("deployed_device_list") && missing.message().contains("GPU 3"),
        "{missing}"
    );
}

#[test]
fn sharded_placement_is_refused_where_it_cannot_hold() {
    let on = |kind: &str, extra: &[(&str, &str)]| {
        let mut p = vec![("gpucache_placement", "sharded")];
        p.extend_from_slice(extra);
        one_table_on(&[kind], &p)
    };
    let cpu = on("KIND_CPU", &[("gpucacheper", "1.0")]).unwrap_err();
    assert!(
        cpu.message().contains("gpucache_placement") && cpu.message().contains("KIND_CPU"),
        "{cpu}"
    );
    let part = on("KIND_GPU", &[("gpucacheper", "0.5")]).unwrap_err();
    assert!(part.message().contains("gpucacheper to 1.0"), "{part}");
    let typo =
        on("KIND_GPU", &[("gpucacheper", "1.0"), ("gpucache_placement", "shard")]).unwrap_err();
    assert!(typo.message().contains("replicated or sharded"), "{typo}");
    let ok = on("KIND_GPU", &[("gpucacheper", "1.0")]).unwrap();
    assert_eq!(ok.store.placement, triton_rust_embedding::Placement::Sharded);
    assert_eq!(
        one_table(&[]).unwrap().store.placement,
        triton_rust_embedding::Placement::Replicated
    );
}

/// A one-table store on a GPU instance, sharded, with one more parameter.
fn sharded_with(key: &str, value: &str) -> Result<StoreSettings> {
    let p = [("gpucache_placement", "sharded"), ("gpucacheper", "1.0"), (key, value)];
    one_table_on(&["KIND_GPU"], &p)
}

#[test]
fn sharded_replicate_share_is_read_and_bounded() {
    let share =
        |v: &str| sharded_with("gpucache_sharded_replicate", v).map(|s| s.store.replicate_share);
    let plain = one_table(&[]).unwrap().store;
    assert_eq!(plain.replicate_share, 0.35);
    assert!(plain.hotness.is_empty(), "one key a table: every table weighs one lookup");
    assert_eq!(share(" 0 ").unwrap(), 0.0);
    assert_eq!(share("0.25").unwrap(), 0.25);
    for bad in ["0.6", "-0.1", "NaN"] {
        let e = share(bad).unwrap_err();
        assert!(
            e.message().contains("gpucache_sharded_replicate") && e.message().contains("0 to 0.5"),
            "{bad}: {e}"
        );
    }
    assert!(share("a tenth").unwrap_err().message().contains("must be a number"));
}

#[test]
fn sharded_memory_is_read_in_gb_and_refused_below_zero() {
    let memory =
        |v: &str| sharded_with("gpucache_sharded_memory_gb", v).map(|s| s.store.sharded_memory);
    assert_eq!(one_table(&[]).unwrap().store.sharded_memory, 0, "no cap unless set");
    assert_eq!(memory("71.5").unwrap(), 71_500_000_000);
    assert_eq!(memory(" 0 ").unwrap(), 0);
    for bad in ["-1", "inf", "NaN"] {
        let e = memory(bad).unwrap_err();
        assert!(
            e.message().contains("gpucache_sharded_memory_gb") && e.message().contains("0 or more"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn the_hps_interface_gives_fp16_rows_when_its_output_says_so() {
    use triton_rust_core::batch::BatchData;
    use triton_rust_core::config::TensorConfig;
    let open = |name: &str, dims: &str, out: DataType| {
        let mut c = cfg(&[
            ("embedding_table_names", "a,b"),
            ("embedding_vecsize_per_table", dims),
            ("sparse_files", "none,none"),
            ("default_value_for_each_table", "0.1,-2.5"),
            ("store_name", name),
        ]);
        c.outputs =
            vec![TensorConfig { name: "ROWS".into(), dtype: out, dims: vec![-1], reshape: None }];
        load_alone(&c)
    };
    let model = open("hps_fp16", "4,4", DataType::F16).unwrap();
    assert_eq!(model.signature().outputs[0].dtype, DataType::F16);
    // 2 keys of table a, 1 of b: every key unknown, each row its table's default
    let keys: Vec<u8> = [3i64, 9, 7].iter().flat_map(|k| k.to_le_bytes()).collect();
    let numkeys: Vec<u8> = [2i32, 1].iter().flat_map(|n| n.to_le_bytes()).collect();
    let inputs = [
        BatchTensor {
            name: "KEYS".into(),
            dtype: DataType::I64,
            shape: vec![3],
            data: BatchData::Borrowed(Bytes::Host(&keys)),
        },
        BatchTensor {
            name: "NUMKEYS".into(),
            dtype: DataType::I32,
            shape: vec![2],
            data: BatchData::Borrowed(Bytes::Host(&numkeys)),
        },
    ];
    let mut engine = model.instance(Device::Cpu).unwrap();
    let mut got = None;
    engine
        .run(&inputs, &["ROWS"], &mut |o| {
            let halves: Vec<half::f16> = bytemuck::pod_collect_to_vec(o.data.host().unwrap());
            got = Some((o.dtype, o.shape.to_vec(), halves));
            Ok(())
        })
        .unwrap();
    let (dtype, shape, rows) = got.expect("the rows");
    assert_eq!((dtype, shape), (DataType::F16, vec![12]));
    let want: Vec<f32> = [0.1f32; 8].into_iter().chain([-2.5; 4]).collect();
    assert_eq!(rows, want.iter().map(|&v| half::f16::from_f32(v)).collect::<Vec<_>>());
    // tables of two dims: fp16 refused, naming the output
    let e = open("hps_fp16_dims", "4,8", DataType::F16).err().expect("refused");
    assert!(e.message().contains("'ROWS'") && e.message().contains("[4, 8]"), "{e}");
    let e = open("hps_i32", "4,4", DataType::I32).err().expect("refused");
    assert!(e.message().contains("TYPE_FP32 or TYPE_FP16"), "{e}");
}

#[test]
fn host_threads_read_misses_when_a_cache_holds_part_of_its_rows() {
    let reads = |extra: &[(&str, &str)]| one_table(extra).unwrap().host_threads_read_misses();
    assert!(reads(&[("gpucacheper", "0.1")]), "a 10% cache, misses read by host threads");
    assert!(!reads(&[("gpucacheper", "1.0")]), "every row in the GPU");
    assert!(!reads(&[("gpucacheper", "0.1"), ("gpucache_miss_reads", "gpu")]), "the GPU reads");
    assert!(reads(&[("gpucacheper", "0.1"), ("gpucache_miss_reads", "both")]));
}
