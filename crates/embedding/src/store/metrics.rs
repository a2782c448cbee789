//! The store's metrics: per table counters, tier sizes and each cache (a GPU's shared one, each CPU instance's).

use super::*;

impl triton_rust_core::telemetry::MetricsSource for EmbeddingStore {
    fn samples(&self) -> Vec<triton_rust_core::telemetry::MetricSample> {
        use triton_rust_core::telemetry::{MetricKind::*, MetricSample};
        let caches: Vec<Arc<InstanceCaches>> =
            self.caches.lock().iter().filter_map(Weak::upgrade).collect();
        let mut out = Vec::new();
        for (i, t) in self.tables.iter().enumerate() {
            let c = &t.counters;
            let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
            let table = || vec![("table", t.config.name.clone())];
            let tier =
                |tier: &str| vec![("table", t.config.name.clone()), ("tier", tier.to_string())];
            let mut push = |family, help, kind, labels, value| {
                out.push(MetricSample { family, help, kind, labels, value })
            };
            // the hits before the keys: a lookup counts its keys first, so no sample holds
            // hits whose keys it lacks (a hit rate from two samples never passes 1)
            let hit_counts =
                [get(&c.cache_hits), get(&c.host_hits), get(&c.remote_hits), get(&c.defaults)];
            let keys = get(&c.keys);
            push(
                "rust_embedding_lookup_keys_total",
                "Keys looked up in the embedding store",
                Counter,
                table(),
                keys,
            );
            push(
                "rust_embedding_lookups_total",
                "Lookup calls to the embedding store",
                Counter,
                table(),
                get(&c.lookups),
            );
            for (name, hits, ns) in [
                ("cache", hit_counts[0], &c.cache_ns),
                ("host", hit_counts[1], &c.host_ns),
                ("redis", hit_counts[2], &c.remote_ns),
            ] {
                push(
                    "rust_embedding_hits_total",
                    "Keys answered by each tier of the embedding store",
                    Counter,
                    tier(name),
                    hits,
                );
                push(
                    "rust_embedding_tier_seconds_total",
                    "Time spent in each tier of the embedding store",
                    Counter,
                    tier(name),
                    get(ns) / 1e9,
                );
            }
            push(
                "rust_embedding_hits_total",
                "Keys answered by each tier of the embedding store",
                Counter,
                tier("default"),
                hit_counts[3],
            );
            push(
                "rust_embedding_cache_hit_rate",
                "Cache hits / keys looked up since load",
                Gauge,
                table(),
                if keys > 0.0 { hit_counts[0] / keys } else { 0.0 },
            );
            let (mut evictions, mut occupied) = (0u64, 0u64);
            for inst in &caches {
                if let Some(cache) = inst.cache(i) {
                    let cc = cache.counters();
                    evictions += cc.evictions;
                    occupied += cc.occupied;
                }
            }
            push(
                "rust_embedding_cache_evictions_total",
                "Rows evicted from the embedding caches",
                Counter,
                table(),
                evictions as f64,
            );
            push(
                "rust_embedding_cache_rows",
                "Rows held by the embedding caches (all instances)",
                Gauge,
                table(),
                occupied as f64,
            );
            push(
                "rust_embedding_updates_total",
                "Update calls applied to the embedding store",
                Counter,
                table(),
                get(&c.updates),
            );
            push(
                "rust_embedding_updated_keys_total",
                "Rows written by updates",
                Counter,
                table(),
                get(&c.updated_keys),
            );
            push(
                "rust_embedding_update_lag_seconds_total",
                "Time from an update's arrival until it is visible in every tier, summed",
                Counter,
                table(),
                get(&c.update_ns) / 1e9,
            );
            push("rust_embedding_redis_errors_total", "Lookups and updates that could not reach the Redis tier (down, or backing off after a failure)", Counter, table(), get(&c.remote_errors));
            push(
                "rust_embedding_cache_fills_dropped_total",
                "Cache fills skipped (queue full or raced with an update)",
                Counter,
                table(),
                get(&c.fills_dropped),
            );
            push(
                "rust_embedding_replayed_rows",
                "Rows replayed from the update log when the table was loaded",
                Gauge,
                table(),
                get(&c.replayed_rows),
            );
            push(
                "rust_embedding_compactions_total",
                "Compactions of the update log into new table files",
                Counter,
                table(),
                get(&c.compactions),
            );
            push("rust_embedding_overlay_rows", "Rows written by updates since the table's last compaction (host memory beyond the files)", Gauge, table(), t.host.read().overlay_rows() as f64);
        }
        if let Some(f) = self.follower.lock().as_ref() {
            let c = &f.counters;
            let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
            let mut push = |family, help, kind, value| {
                out.push(MetricSample { family, help, kind, labels: Vec::new(), value })
            };
            push(
                "rust_embedding_stream_applied_total",
                "Update stream entries applied (durably) and acknowledged",
                Counter,
                get(&c.applied_entries),
            );
            push(
                "rust_embedding_stream_applied_rows_total",
                "Rows written by update stream entries",
                Counter,
                get(&c.applied_rows),
            );
            push(
                "rust_embedding_stream_rejected_total",
                "Update stream entries skipped as malformed",
                Counter,
                get(&c.rejected_entries),
            );
            push(
                "rust_embedding_stream_errors_total",
                "Failures reaching the update stream (reconnected after a back-off)",
                Counter,
                get(&c.errors),
            );
            if c.measured.load(Ordering::Relaxed) {
                push(
                    "rust_embedding_stream_lag",
                    "Update stream entries not yet delivered to this node",
                    Gauge,
                    get(&c.lag),
                );
                push(
                    "rust_embedding_stream_pending",
                    "Update stream entries delivered and not yet acknowledged",
                    Gauge,
                    get(&c.pending),
                );
            }
            push(
                "rust_embedding_stream_connected",
                "1 while the update stream is reachable",
                Gauge,
                c.connected.load(Ordering::Relaxed) as u8 as f64,
            );
        }
        out.push(MetricSample {
            family: "rust_embedding_updates_refused_total",
            help: "Update requests refused for a missing or wrong credential",
            kind: Counter,
            labels: Vec::new(),
            value: self.refused_updates.load(Ordering::Relaxed) as f64,
        });
        out
    }
}
